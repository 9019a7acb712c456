#!/usr/bin/env python3
"""GGUF in: `nl-layout pack --model X.gguf` and `nl-profile run --model X.gguf` on GGUFs written by llama.cpp's own
gguf-py (scripts/gguf_from_image.py) from the bundled tiny-relu model, against the same weights read from the Hugging
Face folder:
  - smallthinker (one expert, gated ReLU: how llama.cpp holds our ReLU models) at f32 / f16 / bf16: every image region
    (dense weights and each FFN layer) byte-identical to the image packed from the folder, the same manifest model
    config, the same nl-run tokens; q8_0 / q4_0: the dense region identical (the blocks read and requantized come back
    unchanged), the gate and up rows of every bundle identical (down is requantized along hidden by the GGUF writer,
    so it differs, and so may the tokens): nl-run runs the image;
  - llama (SiLU) from the same weights read as SiLU: regions identical to the SiLU folder's image, ffn_act silu;
  - nl-profile run on the f32 GGUF: the trace's masks equal the folder's bit for bit;
  - bad input: a truncated GGUF, a text file named .gguf, a GGUF with an unsupported architecture: exit 3, one line
    naming the file, no output left.
Exit 77 (skipped) when llama.cpp's gguf-py is not there (scripts/llamacpp.sh fetches it; ./run.sh test does).

  check_gguf_in.py SOURCE_DIR BINARY_DIR
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np

src, build = sys.argv[1], sys.argv[2]
L, R, P = (os.path.join(build, "cli", b) for b in ("nl-layout", "nl-run", "nl-profile"))
G = os.path.join(src, "scripts", "gguf_from_image.py")
model = os.path.join(src, "datasets", "tiny-relu", "model")
sys.path.insert(0, os.path.join(src, "tests"))
from nl_check import llamacpp_dir  # noqa: E402

gguf_py = os.path.join(llamacpp_dir(), "gguf-py")
if not os.path.isfile(os.path.join(gguf_py, "gguf", "__init__.py")):
    print("check_gguf_in: skipped: llama.cpp's gguf-py not found in %s (scripts/llamacpp.sh fetches it)" % gguf_py)
    sys.exit(77)
work = tempfile.mkdtemp(prefix="nl-gguf-in.")
fails = passes = 0
prompt = "1,400,35,87"


def check(name, ok, detail=""):
    global fails, passes
    passes += ok
    fails += not ok
    print(("PASS " if ok else "FAIL ") + name + ("" if ok else " " + detail))


def run(*cmd):
    return subprocess.run(list(cmd), capture_output=True, text=True)


def pack(model_path, out, dtype):
    r = run(L, "pack", "--model", model_path, "--dtype", dtype, "--out", out, "-q")
    if r.returncode:
        check("pack %s --dtype %s" % (os.path.basename(model_path), dtype), False, r.stderr.strip())
        return None
    return json.load(open(out + ".json"))


def tokens(img):
    r = run(R, "generate", "--image", img, "--prompt-tokens", prompt, "--steps", "12", "--json", "-q")
    return json.loads(r.stdout)["generated"] if r.returncode == 0 else r.stderr.strip()


def regions(man):
    return [(r["name"], r["bytes"], r["xxh64"]) for r in man["regions"]]


def bundles(img, man, layer):
    reg = man["regions"][1 + layer]
    b = np.fromfile(img, dtype=np.uint8, count=reg["bytes"], offset=reg["offset"])
    return b.reshape(man["model"]["hidden_dim"], man["bundle"]["bytes"])


def to_gguf(img, out, *extra):
    r = run(sys.executable, G, "--image", img, "--out", out, "--gguf-py", gguf_py, *extra)
    if r.returncode:
        check("gguf_from_image %s" % os.path.basename(out), False, r.stderr.strip())
    return r.returncode == 0


try:
    for dtype in ("f32", "f16", "bf16", "q8_0", "q4_0"):
        base = os.path.join(work, "hf_%s.nlw" % dtype)
        mb = pack(model, base, dtype)
        g = os.path.join(work, "st_%s.gguf" % dtype)
        if mb is None or not to_gguf(base, g):
            continue
        img = os.path.join(work, "gguf_%s.nlw" % dtype)
        mg = pack(g, img, dtype)
        if mg is None:
            continue
        check("smallthinker %s: the model config read from the GGUF is the folder's" % dtype,
              mg["model"] == mb["model"], "%s vs %s" % (mg["model"], mb["model"]))
        if dtype in ("f32", "f16", "bf16"):
            check("smallthinker %s: every region byte-identical to the folder's image" % dtype,
                  regions(mg) == regions(mb))
            tb, tg = tokens(base), tokens(img)
            check("smallthinker %s: nl-run gives the folder image's tokens" % dtype, tb == tg and isinstance(tb, list),
                  "%s vs %s" % (tg, tb))
        else:
            check("%s: the dense region byte-identical (blocks read and requantized come back unchanged)" % dtype,
                  regions(mg)[0] == regions(mb)[0])
            rb = mb["bundle"]["bytes"] // 3
            same = all(np.array_equal(bundles(img, mg, lay)[:, :2 * rb], bundles(base, mb, lay)[:, :2 * rb])
                       for lay in range(mb["model"]["n_layers"]))
            check("%s: every bundle's gate and up rows byte-identical" % dtype, same)
            tg = tokens(img)
            check("%s: nl-run runs the GGUF's image (%s)" % (dtype, tg), isinstance(tg, list) and len(tg) == 12)

    # The llama architecture (SiLU): the same weights read as a SiLU model from a Hugging Face folder.
    silu = os.path.join(work, "silu")
    os.makedirs(silu)
    shutil.copy(os.path.join(model, "model.safetensors"), silu)
    cfg = json.load(open(os.path.join(model, "config.json")))
    json.dump(dict(cfg, hidden_act="silu"), open(os.path.join(silu, "config.json"), "w"))
    for dtype in ("f16", "q8_0"):
        ms = pack(silu, os.path.join(work, "silu_%s.nlw" % dtype), dtype)
        g = os.path.join(work, "llama_%s.gguf" % dtype)
        if ms is None or not to_gguf(os.path.join(work, "silu_%s.nlw" % dtype), g):
            continue
        ml = pack(g, os.path.join(work, "llama_%s.nlw" % dtype), dtype)
        if ml is None:
            continue
        check("llama %s: ffn_act silu and the folder's config" % dtype, ml["model"] == ms["model"],
              "%s vs %s" % (ml["model"], ms["model"]))
        if dtype == "f16":
            check("llama f16: every region byte-identical to the SiLU folder's image", regions(ml) == regions(ms))
            a, b = tokens(os.path.join(work, "llama_f16.nlw")), tokens(os.path.join(work, "silu_f16.nlw"))
            check("llama f16: nl-run gives the folder image's tokens", a == b and isinstance(a, list), "%s vs %s" % (a, b))
        else:
            check("llama q8_0: the dense region byte-identical", regions(ml)[0] == regions(ms)[0])

    # nl-profile run straight from a GGUF (f32: the folder's weights exactly).
    ids = os.path.join(work, "ids.txt")
    open(ids, "w").write(" ".join(str(v) for v in range(3, 200, 7)) + "\n" + " ".join(str(v) for v in range(900, 600, -11))
                         + "\n")
    traces = []
    for m in (model, os.path.join(work, "st_f32.gguf")):
        out = os.path.join(work, "t%d.h5" % len(traces))
        r = run(P, "run", "--model", m, "--token-ids", ids, "--seq-len", "64", "--out", out, "--json", "-q")
        check("nl-profile run --model %s" % os.path.basename(m), r.returncode == 0, r.stderr.strip())
        traces.append(out)
    try:
        import h5py
        with h5py.File(traces[0], "r") as a, h5py.File(traces[1], "r") as b:
            same = all(np.array_equal(a["layers/%d/mask" % lay][...], b["layers/%d/mask" % lay][...])
                       for lay in range(cfg["num_hidden_layers"]))
        check("nl-profile run: the GGUF's trace masks equal the folder's bit for bit", same)
    except ImportError:
        print("SKIP the trace comparison (no h5py for %s)" % sys.executable)

    # Bad input: exit 3, one line naming the file, no image left.
    g = os.path.join(work, "st_f32.gguf")
    data = open(g, "rb").read()
    cut = os.path.join(work, "cut.gguf")
    open(cut, "wb").write(data[:len(data) // 2])
    text = os.path.join(work, "text.gguf")
    open(text, "w").write("this is not a GGUF file, only text padding it out\n")
    arch = os.path.join(work, "arch.gguf")
    k = data.index(b"smallthinker")
    open(arch, "wb").write(data[:k] + b"smallthinkes" + data[k + 12:])  # the architecture's name, same length
    for label, path, want in (("truncated", cut, "past the end"), ("text", text, "not a GGUF file"),
                              ("unknown architecture", arch, "smallthinkes")):
        out = os.path.join(work, "bad.nlw")
        r = run(L, "pack", "--model", path, "--out", out, "-q")
        check("bad GGUF (%s): exit 3, one line naming the file" % label,
              r.returncode == 3 and r.stderr.count("\n") == 1 and path in r.stderr and want in r.stderr
              and not os.path.exists(out), "exit %d: %s" % (r.returncode, r.stderr))
    print("check_gguf_in: %d passed, %d failed" % (passes, fails))
    sys.exit(1 if fails else 0)
finally:
    shutil.rmtree(work, ignore_errors=True)
