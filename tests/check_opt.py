#!/usr/bin/env python3
"""OPT (model_type opt, Hugging Face modeling_opt.py) end to end on random-weight checkpoints written by
tests/make_opt_checkpoint.py, against the independent numpy forward tests/hf_opt_reference.py:

- pack from f32 / bf16 sharded (untied lm_head) checkpoints into every dtype: manifest 1.7, model.arch opt, plain
  bundles (an fc1 row and an fc2 column, two rows' bytes);
- nl-run generate: greedy tokens equal the reference's and logits within 1e-4 (f32; 2e-2 at f16) for --select dense
  and gate under every --overlap and 1 / 2 threads; bf16 / q8_0 / q4_0 give the same tokens on every path;
- nl-profile run records relu>0 masks equal to the reference's fc1 x + b1 > 0 bit for bit, trace_hooks.py on the
  torch module tree (tests/torch_opt.py) too; --select trace replays them to the gate's logits; every I/O engine gives
  the same tokens; threshold and lowrank run; a permuted export (pack --layout --export-permuted) computes the same
  function;
- refusals, each exit 3 with one line naming the file: OPT-350M's post-LayerNorm block and project_in / project_out,
  non-ReLU activations, an edited arch (image id), a 1.6 manifest naming opt; convert --to llama2c and
  gguf_from_image.py refuse OPT by name.

  check_opt.py SOURCE_DIR BINARY_DIR
"""
import json
import os
import shutil
import sys
import tempfile

import numpy as np

src, build = sys.argv[1], sys.argv[2]
sys.path.insert(0, os.path.join(src, "tests"))
sys.path.insert(0, os.path.join(src, "profiler", "python"))
import hf_opt_reference as ref  # noqa: E402
from nl_check import Checks, masks_of, torch_ok  # noqa: E402

work = tempfile.mkdtemp(prefix="nl-opt.")
prompt = [2, 17, 300, 5, 99, 41]
c = Checks(build, work, prompt, steps=20)
L, R, P, check, run, generate, rel_err = c.L, c.R, c.P, c.check, c.run, c.generate, c.rel_err


def make(name, *args):
    return c.make_checkpoint("make_opt_checkpoint.py", name, "--max-pos", "128", *args)


try:
    ck = make("opt")
    cfg, t = ref.load(ck)
    images = {}
    for dtype in ("f32", "f16", "bf16", "q8_0", "q4_0"):
        img = os.path.join(work, "opt_%s.nlw" % dtype)
        r = run(L, "pack", "--model", ck, "--dtype", dtype, "--out", img, "-q")
        if r.returncode:
            check("pack --dtype %s" % dtype, False, r.stderr.strip())
            continue
        images[dtype] = img
        man = json.load(open(img + ".json"))
        row = {"f32": 256, "f16": 128, "bf16": 128, "q8_0": 68, "q4_0": 36}[dtype]
        check("%s: manifest 1.7, model.arch opt, plain bundles of %d bytes (fc1 row + fc2 column)" % (dtype, 2 * row),
              man["version_minor"] == 7 and man["model"].get("arch") == "opt" and man["bundle"]["kind"] == "plain"
              and man["bundle"]["bytes"] == 2 * row, str(man["model"]) + str(man["bundle"]))

    runs = c.paths_agree(images, lambda tokens: ref.forward(cfg, t, tokens))

    # A sharded bf16 checkpoint with an untied lm_head: the f32 image follows the reference of the same bf16 values.
    ck2 = make("opt_shards", "--dtype", "bf16", "--shards", "3", "--no-tie", "--seed", "2")
    cfg2, t2 = ref.load(ck2)
    img2 = os.path.join(work, "shards.nlw")
    r = run(L, "pack", "--model", os.path.join(ck2, "model.safetensors.index.json"), "--out", img2, "-q")
    j, lg = generate(img2, "--select", "gate", npy=os.path.join(work, "s.npy")) if r.returncode == 0 else (
        {"error": r.stderr.strip()}, None)
    if lg is not None:
        want = ref.forward(cfg2, t2, prompt + j["generated"][:-1])[len(prompt) - 1:]
        err = rel_err(lg, want)
        man = json.load(open(img2 + ".json"))
        check("bf16 3-shard checkpoint, untied lm_head: tokens equal the reference's, logits within 1e-4 (%.2e)" % err,
              [int(v) for v in want.argmax(1)] == j["generated"] and err <= 1e-4
              and not man["model"]["shared_classifier"], str(j["generated"]))
    else:
        check("bf16 3-shard checkpoint packs and runs", False, j.get("error"))

    # The profiler's exact rule, against the reference's fc1 x + b1 > 0.
    ids = os.path.join(work, "opt.ids")
    rng = np.random.default_rng(5)
    open(ids, "w").write(" ".join(map(str, rng.integers(3, cfg["vocab_size"], 300))) + "\n")
    tr = os.path.join(work, "opt.h5")
    r = run(P, "run", "--model", ck, "--token-ids", ids, "--seq-len", "64", "--out", tr, "--json", "-q")
    rule = json.loads(r.stdout).get("activation") if r.returncode == 0 else None
    check("nl-profile run records relu>0 (fc1 x + b1 > 0)", rule == "relu>0", r.stderr.strip())
    if torch_ok() and rule:
        masks, toks, bounds = masks_of(tr, cfg["num_hidden_layers"])
        diff = total = 0
        for a, b in zip(bounds[:-1], bounds[1:]):
            for lay, fr in enumerate(ref.firing(cfg, t, [int(v) for v in toks[a:b]])):
                diff += int((fr != masks[lay][a:b]).sum())
                total += fr.size
        check("nl-profile's masks equal the reference's fc1 x + b1 > 0 (%d of %d bits differ; %.1f %% fire)" %
              (diff, total, 100.0 * sum(float(m.mean()) for m in masks) / len(masks)), diff == 0 and total > 0)
        import trace_hooks
        from torch_opt import load_opt
        rec = trace_hooks.TraceRecorder(load_opt(ck), "relu>0")
        for seq in trace_hooks.corpus_from_token_files([ids], 64):
            rec.run(seq)
        rec.write(tr + ".py.h5", model_name="torch_opt")
        pm = masks_of(tr + ".py.h5", cfg["num_hidden_layers"])[0]
        same = all(np.array_equal(a, b) for a, b in zip(masks, pm))
        check("trace_hooks.py on the torch OPT module tree (fc1 + activation_fn) equals nl-profile bit for bit", same)
    else:
        print("SKIP masks against the reference and trace_hooks.py (no torch/h5py for %s)" % sys.executable)

    # --select trace replays the profiler's exact sets of the generated sequence: the gate's logits.
    f32 = images.get("f32")
    base = runs.get(("f32", "gate", "none", 1))
    if f32 and base:
        gen, lg, gate_active = base
        gids = os.path.join(work, "gen.ids")
        open(gids, "w").write(" ".join(map(str, prompt + gen[:-1])) + "\n")  # OPT's BOS (2) is the prompt's own
        gtr = os.path.join(work, "gen.h5")
        r = run(P, "run", "--model", ck, "--token-ids", gids, "--no-bos", "--seq-len", "64", "--out", gtr, "-q")
        jt, lt = generate(f32, "--select", "trace:" + gtr, npy=os.path.join(work, "t.npy")) if r.returncode == 0 \
            else ({"error": r.stderr.strip()}, None)
        if lt is not None:
            diff = float(np.max(np.abs(lt - lg)) / np.max(np.abs(lg)))
            check("--select trace: the gate's tokens and logits (%.2e), the same neurons (%d, the gate's %d)" % (
                diff, jt["totals"]["active"], gate_active),
                  jt["generated"] == gen and diff <= 1e-6 and jt["totals"]["active"] == gate_active)
        else:
            check("--select trace runs", False, jt.get("error"))
        c.engines_agree(f32, gen)
        jc, _ = generate(f32, "--select", "threshold:0.05")
        check("--select threshold:0.05 reads no more than the exact sets (%s of %d)" % (
            jc.get("totals", {}).get("active"), gate_active),
            jc.get("totals", {}).get("active", gate_active + 1) <= gate_active, jc.get("error", ""))
        jl, _ = generate(f32, "--select", "lowrank:16", "--calibrate-steps", "24")
        pr = jl.get("predictor", {})
        check("--select lowrank:16 runs with fc1's bias in its scores (recall %s, precision %s)" % (
            pr.get("recall"), pr.get("precision")), pr.get("recall", 0) >= 0.8, jl.get("error", "") + str(pr))

        # A permuted export computes the same function (fc1 rows, fc1 bias and fc2 columns move together).
        r = run(L, "solve", "--trace", tr, "--method", "greedy+ls", "--bundle-for", ck, "--dtype", "f16", "--out",
                os.path.join(work, "bf.json"), "--quiet")
        bb = json.load(open(os.path.join(work, "bf.json"))).get("parameters", {}).get("bundle_bytes") \
            if r.returncode == 0 else r.stderr.strip()
        check("solve --bundle-for the OPT folder prices two-vector bundles (%s bytes at f16: fc1 row + fc2 "
              "column)" % bb, bb == 2 * 64 * 2)
        lay = os.path.join(work, "layout.json")
        exp = os.path.join(work, "permuted")
        r = run(L, "solve", "--trace", tr, "--method", "greedy", "--bundle-bytes", "512", "--out", lay, "--quiet")
        r = r if r.returncode else run(L, "pack", "--model", ck, "--layout", lay, "--out",
                                       os.path.join(work, "perm.nlw"), "--export-permuted", exp, "-q")
        if r.returncode == 0:
            cp, tp = ref.load(exp)
            a = ref.forward(cfg, t, prompt)
            b = ref.forward(cp, tp, prompt)
            moved = not np.array_equal(t["model.decoder.layers.0.fc1.bias"], tp["model.decoder.layers.0.fc1.bias"])
            d = float(np.max(np.abs(a - b)) / np.max(np.abs(a)))
            check("pack --export-permuted: the permuted OPT folder computes the same logits (%.2e), fc1's bias moved "
                  "with its rows" % d, d <= 1e-5 and moved)
            jp, _ = generate(os.path.join(work, "perm.nlw"), "--select", "gate")
            check("the permuted image generates the same tokens", jp.get("generated") == gen, jp)
        else:
            check("solve + pack --export-permuted", False, r.stderr.strip())

        c.refused("edited arch", [R, "generate", "--image", c.edited_manifest(f32, lambda m: m["model"].update(
            arch="llama")), "--steps", "2", "-q"], "bad.nlw.json", [])
        c.refused("a 1.6 manifest naming opt", [R, "generate", "--image", c.edited_manifest(
            f32, lambda m: m.update(version_minor=6)), "--steps", "2", "-q"], "bad.nlw.json", ["1.7"])

    # A whole synthetic OPT (the e2e harness's opt-1.3b cell), one layer, q4_0: packed as OPT, it generates.
    simg = os.path.join(work, "syn.nlw")
    r = run(L, "pack", "--synthetic-shape", "opt-1.3b-model", "--layers", "1", "--dtype", "q4_0", "--out", simg, "-q")
    man = json.load(open(simg + ".json")) if r.returncode == 0 else {}
    c.prompt, steps_saved, c.steps = [2, 100, 200], c.steps, 4
    js = generate(simg, "--select", "gate")[0] if man else {"error": r.stderr.strip()}
    c.prompt, c.steps = prompt, steps_saved
    check("pack --synthetic-shape opt-1.3b-model: model.arch opt, plain bundles, and it generates (%s)" %
          js.get("generated"), man.get("model", {}).get("arch") == "opt" and man.get("bundle", {}).get("kind") ==
          "plain" and len(js.get("generated", [])) == 4, js.get("error", ""))

    # What OPT variants are refused, by name.
    c.configs_refused(ck, [
        ("do_layer_norm_before false (OPT-350M)", {"do_layer_norm_before": False}, ["do_layer_norm_before"]),
        ("word_embed_proj_dim 32 (project_in / project_out)", {"word_embed_proj_dim": 32}, ["word_embed_proj_dim"]),
        ("activation_function gelu", {"activation_function": "gelu"}, ["gelu"])])
    r = run(P, "convert", "--model", ck, "--to", "llama2c", "--out", os.path.join(work, "o.bin"), "-q")
    check("convert --to llama2c refused (exit 2, naming opt)", r.returncode == 2 and "opt" in r.stderr, r.stderr)
    if f32:
        r = run(sys.executable, os.path.join(src, "scripts", "gguf_from_image.py"), "--image", f32, "--out",
                os.path.join(work, "o.gguf"))
        check("gguf_from_image.py refuses OPT by name (exit 3)", r.returncode == 3 and "arch opt" in r.stderr,
              "exit %d: %s" % (r.returncode, r.stderr.strip()))
    sys.exit(c.summary("check_opt"))
finally:
    shutil.rmtree(work, ignore_errors=True)
