#!/usr/bin/env python3
"""Phi (model_type phi, Hugging Face modeling_phi.py: Phi-1 / 1.5 / 2) end to end on random-weight checkpoints written
by tests/make_phi_checkpoint.py, against the independent numpy forward tests/hf_phi_reference.py:

- pack from f32 / bf16 sharded (tied, another rotary share) checkpoints into every dtype: manifest 1.7, model.arch phi,
  ffn_act gelu, model.rope_dims (partial rotary), plain bundles (fc1 row + fc2 column);
- nl-run generate: greedy tokens equal the reference's and logits within 1e-4 (f32; 2e-2 at f16) for --select dense
  and gate under every --overlap and 1 / 2 threads; bf16 / q8_0 / q4_0 give the same tokens on every path; every I/O
  engine too;
- GeLU gives no exact zeros, so selection is CATS-style: --select threshold:T for a sweep of T prints what each costs
  (neurons kept, |act| mass kept, greedy agreement with the dense run, first-step logit error against the
  reference); T = 0 keeps every neuron and gives the dense tokens; calibrated thresholds (nl-profile --activation
  calibrated:0.3 -> pack --act-threshold-from) keep about 30 %;
- nl-profile run --activation abs>0.05 masks equal the reference's |gelu(fc1 x + b1)| > 0.05 (bits within 1e-5 of the
  threshold excepted, and counted), trace_hooks.py on the torch module tree (tests/torch_phi.py) too; --select trace
  with every neuron replays the gate's logits; a permuted export computes the same function;
- refusals, each exit 3 with one line naming the file: qk_layernorm, the erf GeLU, an odd rotary dimension, a 1.6
  manifest naming phi; --select lowrank (exit 2: nothing to predict); convert --to llama2c refuses Phi by name;
- llama.cpp's own phi2 on the same weights (scripts/gguf_from_image.py, where llama.cpp is built): the same greedy
  tokens at f32 / f16 / bf16, the agreement printed for q8_0 / q4_0; a tied Phi is refused (phi2 needs an output).

  check_phi.py SOURCE_DIR BINARY_DIR
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
import hf_phi_reference as ref  # noqa: E402
from nl_check import Checks, llamacpp_dir, masks_of, torch_ok  # noqa: E402

work = tempfile.mkdtemp(prefix="nl-phi.")
prompt = [1, 17, 300, 5, 99, 41]
c = Checks(build, work, prompt, steps=20)
L, R, P, check, run, generate, rel_err = c.L, c.R, c.P, c.check, c.run, c.generate, c.rel_err


def make(name, *args):
    return c.make_checkpoint("make_phi_checkpoint.py", name, *args)


try:
    ck = make("phi")
    cfg, t = ref.load(ck)
    n_layers = cfg["num_hidden_layers"]
    images = {}
    for dtype in ("f32", "f16", "bf16", "q8_0", "q4_0"):
        img = os.path.join(work, "phi_%s.nlw" % dtype)
        r = run(L, "pack", "--model", ck, "--dtype", dtype, "--out", img, "-q")
        if r.returncode:
            check("pack --dtype %s" % dtype, False, r.stderr.strip())
            continue
        images[dtype] = img
        m = json.load(open(img + ".json"))["model"]
        man = json.load(open(img + ".json"))
        check("%s: manifest 1.7, model.arch phi, ffn_act gelu, rope_dims 8 of head_dim 16, plain bundles" % dtype,
              man["version_minor"] == 7 and m.get("arch") == "phi" and m["ffn_act"] == "gelu"
              and m.get("rope_dims") == 8 and man["bundle"]["kind"] == "plain" and not m["shared_classifier"],
              str(m) + str(man["bundle"]))

    runs = c.paths_agree(images, lambda tokens: ref.forward(cfg, t, tokens))

    # A sharded bf16 checkpoint, tied embeddings, a quarter of each head rotary.
    ck2 = make("phi_shards", "--dtype", "bf16", "--shards", "3", "--tie", "--rotary", "0.25", "--seed", "2")
    cfg2, t2 = ref.load(ck2)
    img2 = os.path.join(work, "shards.nlw")
    r = run(L, "pack", "--model", os.path.join(ck2, "model.safetensors.index.json"), "--out", img2, "-q")
    j, lg = generate(img2, "--select", "gate", npy=os.path.join(work, "s.npy")) if r.returncode == 0 else (
        {"error": r.stderr.strip()}, None)
    if lg is not None:
        want = ref.forward(cfg2, t2, prompt + j["generated"][:-1])[len(prompt) - 1:]
        err = rel_err(lg, want)
        m = json.load(open(img2 + ".json"))["model"]
        check("bf16 3-shard checkpoint, tied, rope_dims 4: tokens equal the reference's, logits within 1e-4 (%.2e)" %
              err, [int(v) for v in want.argmax(1)] == j["generated"] and err <= 1e-4 and m.get("rope_dims") == 4
              and m["shared_classifier"], str(j["generated"]) + str(m))
    else:
        check("bf16 3-shard checkpoint packs and runs", False, j.get("error"))

    f32 = images.get("f32")
    base = runs.get(("f32", "gate", "none", 1))
    if f32 and base:
        gen, lg, gate_active = base
        c.engines_agree(f32, gen)
        forwards = len(prompt) + c.steps - 1
        check("--select gate on GeLU reads every neuron (%d = %d forwards x %d layers x %d)" % (
            gate_active, forwards, n_layers, cfg["intermediate_size"]),
            gate_active == forwards * n_layers * cfg["intermediate_size"])

        # CATS: what each threshold costs.
        print("CATS on the random Phi (f32, %d steps): T, kept, |act| mass kept, greedy agreement with dense, "
              "first-step logit error" % c.steps)
        kept_by_t = {}
        first = ref.forward(cfg, t, prompt)[-1]
        for thr in (0.0, 0.02, 0.05, 0.1, 0.2, 0.4):
            jt, lt = generate(f32, "--select", "threshold:%g" % thr, npy=os.path.join(work, "c.npy"))
            th = jt.get("threshold", {})
            if lt is None or "kept_fraction" not in th:
                check("--select threshold:%g runs" % thr, False, jt.get("error", jt))
                continue
            e0 = float(np.max(np.abs(lt[0] - first)) / np.max(np.abs(first)))
            kept_by_t[thr] = th["kept_fraction"]
            print("  T %-5g kept %.4f  mass %.4f  agreement %.2f (prefix %d)  error %.3e" % (
                thr, th["kept_fraction"], th["mass_recall"], th["token_agreement"], th["agreeing_prefix"], e0))
            if thr == 0.0:
                check("threshold:0 keeps every neuron (%.4f) and gives the dense tokens" % th["kept_fraction"],
                      th["kept_fraction"] > 0.999 and jt["generated"] == gen and e0 <= 1e-4)
        for share in (1.0, 0.3):  # CATS by count: topk:F keeps ceil(F x 256) neurons per layer-token
            jk = generate(f32, "--select", "topk:%g" % share)[0]
            th = jk.get("threshold", {})
            want = -(-int(share * 256 * 1000) // 1000) / 256.0
            print("  topk:%g kept %s  mass %s  agreement %s" % (share, th.get("kept_fraction"), th.get("mass_recall"),
                                                              th.get("token_agreement")))
            check("topk:%g keeps exactly %.4f of the neurons%s" % (share, want, ", the dense tokens" if share == 1 else
                                                                  ""), th.get("kept_fraction") == want and
                  (share < 1 or jk.get("generated") == gen), jk.get("error", th))
        ks = [kept_by_t[k] for k in sorted(kept_by_t)]
        check("a higher threshold keeps fewer neurons (%s)" % ", ".join("%.3f" % k for k in ks),
              len(ks) == 6 and all(a >= b for a, b in zip(ks, ks[1:])) and ks[-1] < ks[0])

        ids = os.path.join(work, "phi.ids")
        rng = np.random.default_rng(5)
        open(ids, "w").write(" ".join(map(str, rng.integers(3, cfg["vocab_size"], 300))) + "\n")
        cal = os.path.join(work, "cal.h5")
        r = run(P, "run", "--model", ck, "--token-ids", ids, "--seq-len", "64", "--out", cal, "--json", "-q")
        rule = json.loads(r.stdout).get("activation", "") if r.returncode == 0 else ""
        check("nl-profile run's auto rule on GeLU is CATS calibrated:0.3 (%s)" % rule, "calibrated:0.3" in rule,
              r.stderr.strip())
        cimg = os.path.join(work, "cats.nlw")
        r = run(L, "pack", "--model", ck, "--act-threshold-from", cal, "--out", cimg, "-q")
        jc = generate(cimg, "--select", "threshold")[0] if r.returncode == 0 else {"error": r.stderr.strip()}
        kept = jc.get("threshold", {}).get("kept_fraction")
        check("pack --act-threshold-from the calibrated trace -> --select threshold keeps %s of the neurons "
              "(agreement with dense %s)" % (kept, jc.get("threshold", {}).get("token_agreement")),
              kept is not None and 0.1 < kept < 0.6, jc.get("error", ""))

        if torch_ok():
            tr = os.path.join(work, "abs.h5")
            r = run(P, "run", "--model", ck, "--token-ids", ids, "--seq-len", "64", "--activation", "abs>0.05",
                    "--out", tr, "-q")
            if r.returncode == 0:
                masks, toks, bounds = masks_of(tr, n_layers)
                diff = near = total = 0
                for a, b in zip(bounds[:-1], bounds[1:]):
                    for lay, act in enumerate(ref.activations(cfg, t, [int(v) for v in toks[a:b]])):
                        d = (np.abs(act) > 0.05) != masks[lay][a:b]
                        diff += int(d.sum())
                        near += int((d & (np.abs(np.abs(act) - 0.05) < 1e-5)).sum())
                        total += d.size
                check("nl-profile abs>0.05 masks equal the reference's |gelu(fc1 x + b1)| > 0.05 (%d of %d bits "
                      "differ, %d of them within 1e-5 of the threshold)" % (diff, total, near), diff == near)
                import trace_hooks
                from torch_phi import load_phi
                rec = trace_hooks.TraceRecorder(load_phi(ck), "abs>0.05")
                for seq in trace_hooks.corpus_from_token_files([ids], 64):
                    rec.run(seq)
                rec.write(tr + ".py.h5", model_name="torch_phi")
                pm, _, _ = masks_of(tr + ".py.h5", n_layers)
                d = sum(int((pm[lay] != masks[lay]).sum()) for lay in range(n_layers))
                check("trace_hooks.py on the torch Phi module tree (mlp.fc1 + activation_fn) equals nl-profile "
                      "(%d bits differ)" % d, d <= max(1, total // 10000))
            else:
                check("nl-profile run --activation abs>0.05", False, r.stderr.strip())
        else:
            print("SKIP masks against the reference and trace_hooks.py (no torch/h5py for %s)" % sys.executable)

        # Every neuron from a trace: the gate's logits.
        gids = os.path.join(work, "gen.ids")
        open(gids, "w").write(" ".join(map(str, prompt + gen[:-1])) + "\n")
        gtr = os.path.join(work, "gen.h5")
        r = run(P, "run", "--model", ck, "--token-ids", gids, "--no-bos", "--seq-len", "64", "--activation", "abs>0",
                "--out", gtr, "-q")
        jt, lt = generate(f32, "--select", "trace:" + gtr, npy=os.path.join(work, "t.npy")) if r.returncode == 0 \
            else ({"error": r.stderr.strip()}, None)
        if lt is not None:
            diff = float(np.max(np.abs(lt - lg)) / np.max(np.abs(lg)))
            check("--select trace with every neuron: the gate's tokens and logits (%.2e)" % diff,
                  jt["generated"] == gen and diff <= 1e-6)
        else:
            check("--select trace runs", False, jt.get("error"))

        lay = os.path.join(work, "layout.json")
        exp = os.path.join(work, "permuted")
        r = run(L, "solve", "--trace", cal, "--method", "greedy", "--bundle-bytes", "512", "--out", lay, "--quiet")
        r = r if r.returncode else run(L, "pack", "--model", ck, "--layout", lay, "--out",
                                       os.path.join(work, "perm.nlw"), "--export-permuted", exp, "-q")
        if r.returncode == 0:
            cp, tp = ref.load(exp)
            a, b = ref.forward(cfg, t, prompt), ref.forward(cp, tp, prompt)
            d = float(np.max(np.abs(a - b)) / np.max(np.abs(a)))
            moved = not np.array_equal(t["model.layers.0.mlp.fc1.bias"], tp["model.layers.0.mlp.fc1.bias"])
            check("pack --export-permuted: the permuted Phi folder computes the same logits (%.2e), q/k rows "
                  "round-trip through the partial rotary permutation" % d, d <= 1e-5 and moved)
        else:
            check("solve + pack --export-permuted", False, r.stderr.strip())

        r = run(R, "generate", "--image", f32, "--select", "lowrank:8", "--steps", "2", "-q")
        check("--select lowrank refused on GeLU (exit 2, pointing at threshold)",
              r.returncode == 2 and "gelu" in r.stderr and "threshold" in r.stderr, r.stderr.strip())
        c.refused("a 1.6 manifest naming phi", [R, "generate", "--image", c.edited_manifest(
            f32, lambda m: m.update(version_minor=6)), "--steps", "2", "-q"], "bad.nlw.json", ["1.7"])
        c.refused("edited rope_dims", [R, "generate", "--image", c.edited_manifest(
            f32, lambda m: m["model"].update(rope_dims=4)), "--steps", "2", "-q"], "bad.nlw.json")

    # llama.cpp's own phi2 (src/models/phi2.cpp) on the same weights (scripts/gguf_from_image.py): the same greedy
    # tokens, where llama.cpp is built (scripts/llamacpp.sh).
    ldir = llamacpp_dir()
    ids_bin = os.path.join(ldir, "bin", "llama-ids")
    if os.access(ids_bin, os.X_OK) and os.path.isfile(os.path.join(ldir, "gguf-py", "gguf", "__init__.py")):
        for dtype in ("f32", "f16", "bf16", "q8_0", "q4_0"):
            if dtype not in images:
                continue
            gg = os.path.join(work, "phi_%s.gguf" % dtype)
            r = run(sys.executable, os.path.join(src, "scripts", "gguf_from_image.py"), "--image", images[dtype],
                    "--out", gg)
            r = r if r.returncode else run(ids_bin, "-m", gg, "--prompt-tokens", ",".join(map(str, prompt)), "-n",
                                           str(c.steps), "-t", "2", "--kv", "f32")
            ll = json.loads(r.stdout.strip().splitlines()[-1])["tokens"] if r.returncode == 0 else None
            mine = runs.get((dtype, "gate", "none", 1), [None])[0]
            same = sum(a == b for a, b in zip(ll or [], mine or []))
            prefix = next((i for i, (a, b) in enumerate(zip(ll or [], mine or [])) if a != b), same)
            print("  %s: llama.cpp phi2 vs nl-run: %d/%d greedy tokens equal, first %d identical" % (
                dtype, same, c.steps, prefix))
            if dtype in ("f32", "f16", "bf16"):  # unquantized: the same function, so the same tokens
                check("%s: llama.cpp's phi2 gives nl-run's %d greedy tokens" % (dtype, c.steps),
                      ll is not None and ll == mine, r.stderr.strip()[-300:] + " %s vs %s" % (ll, mine))
    else:
        print("SKIP llama.cpp's phi2 agreement (llama.cpp not built: scripts/llamacpp.sh)")

    c.configs_refused(ck, [
        ("qk_layernorm true", {"qk_layernorm": True}, ["qk_layernorm"]),
        ("hidden_act gelu (the erf form)", {"hidden_act": "gelu"}, ["gelu"]),
        ("partial_rotary_factor 0.1 (1 rotary dimension)", {"partial_rotary_factor": 0.1}, ["rope_dims"])])
    r = run(P, "convert", "--model", ck, "--to", "llama2c", "--out", os.path.join(work, "o.bin"), "-q")
    check("convert --to llama2c refused (exit 2, naming phi)", r.returncode == 2 and "phi" in r.stderr, r.stderr)
    if os.path.exists(img2 + ".json"):  # the tied checkpoint's image: llama.cpp's phi2 needs an output matrix
        r = run(sys.executable, os.path.join(src, "scripts", "gguf_from_image.py"), "--image", img2, "--out",
                os.path.join(work, "o.gguf"))
        check("gguf_from_image.py refuses a tied Phi (exit 3, naming the untied classifier phi2 needs)",
              r.returncode == 3 and "untied classifier" in r.stderr, "exit %d: %s" % (r.returncode, r.stderr.strip()))
    sys.exit(c.summary("check_phi"))
finally:
    shutil.rmtree(work, ignore_errors=True)
