#!/usr/bin/env python3
"""nl-run generate --logits FILE.npy and --top-logits K against an independent numpy forward written from the
Hugging Face modeling code (tests/hf_llama_reference.py), on the bundled tiny-relu checkpoint packed as f32: the
greedy tokens must be the reference's (every step), every logit within 1e-4 of the reference relative to the
step's largest |logit|, for --select dense and gate and every --overlap mode; --top-logits must list the .npy's
largest values; the .npy must load with numpy as float32 [generated, vocab]. Users check fidelity the same way.

  check_logits_reference.py SOURCE_DIR BINARY_DIR
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np

src, build = sys.argv[1], sys.argv[2]
sys.path.insert(0, os.path.join(src, "tests"))
import hf_llama_reference as ref  # noqa: E402

L, R = os.path.join(build, "cli", "nl-layout"), os.path.join(build, "cli", "nl-run")
model = os.path.join(src, "datasets", "tiny-relu", "model")
work = tempfile.mkdtemp(prefix="nl-logits.")
fails = passes = 0
prompt = [1, 400, 35, 87]
steps = 12


def check(name, ok, detail=""):
    global fails, passes
    passes += ok
    fails += not ok
    print(("PASS " if ok else "FAIL ") + name + ("" if ok else " " + detail))


try:
    r = subprocess.run([L, "pack", "--model", model, "--out", os.path.join(work, "m.nlw"), "-q"], capture_output=True,
                       text=True)
    if r.returncode:
        sys.exit("check_logits_reference: pack failed: " + r.stderr)
    cfg, t = ref.load(model)
    for select in ("dense", "gate"):
        for overlap in ("none", "layer", "cross", "both"):
            if select == "dense" and overlap != "none":
                continue
            name = "--select %s --overlap %s" % (select, overlap)
            npy = os.path.join(work, "l_%s_%s.npy" % (select, overlap))
            r = subprocess.run([R, "generate", "--image", os.path.join(work, "m.nlw"), "--select", select, "--overlap",
                                overlap, "--prompt-tokens", ",".join(map(str, prompt)), "--steps", str(steps),
                                "--logits", npy, "--top-logits", "5", "--json", "-q"], capture_output=True, text=True)
            if r.returncode:
                check(name + " runs", False, r.stderr.strip())
                continue
            j = json.loads(r.stdout)
            gen = j["generated"]
            lg = np.load(npy)
            check(name + ": .npy is float32 [%d, %d]" % (len(gen), cfg["vocab_size"]),
                  lg.dtype == np.float32 and lg.shape == (len(gen), cfg["vocab_size"]), str((lg.dtype, lg.shape)))
            # The reference over the prompt and the generated tokens (the last is never fed back).
            want = ref.forward(cfg, t, prompt + gen[:-1])[len(prompt) - 1:]
            greedy = [int(v) for v in want.argmax(1)]
            check(name + ": greedy tokens equal the reference's (%d/%d)" % (
                sum(a == b for a, b in zip(gen, greedy)), len(gen)), gen == greedy, "%s vs %s" % (gen, greedy))
            err = max(float(np.max(np.abs(lg[i] - want[i])) / np.max(np.abs(want[i]))) for i in range(len(gen)))
            check(name + ": logits within 1e-4 of the reference (max relative error %.2e)" % err, err <= 1e-4)
            top_ok = all([p[0] for p in j["top_logits"][i]] == [int(v) for v in np.argsort(-lg[i], kind="stable")[:5]]
                         and all(abs(p[1] - float(lg[i][p[0]])) <= 1e-6 * max(1.0, abs(p[1]))
                                 for p in j["top_logits"][i]) for i in range(len(gen)))
            check(name + ": --top-logits lists the .npy's five largest", top_ok)
    print("check_logits_reference: %d passed, %d failed" % (passes, fails))
    sys.exit(1 if fails else 0)
finally:
    shutil.rmtree(work, ignore_errors=True)
