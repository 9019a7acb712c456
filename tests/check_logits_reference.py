#!/usr/bin/env python3
"""nl-run generate --logits FILE.npy and --top-logits K against an independent numpy forward written from the
Hugging Face modeling code (tests/hf_llama_reference.py), on the bundled tiny-relu checkpoint packed as f32: the
greedy tokens must be the reference's (every step), every logit within 1e-4 of the reference relative to the
step's largest |logit|, for --select dense and gate and every --overlap mode; --top-logits must list the .npy's
largest values; the .npy must load with numpy as float32 [generated, vocab]. The same weights read as Mistral
(model_type mistral, sliding_window 5) follow the windowed reference; read with ProSparse's fatrelu and TurboSparse's
drelu activations they follow the reference of those, and the profiler's exact rule replayed gives the same output.
Users check fidelity the same way.

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

sys.path.insert(0, os.path.join(src, "profiler", "python"))
try:
    import h5py  # noqa: F401
    import torch  # noqa: F401
    torch_ok = True
except ImportError:
    torch_ok = False

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


def generate_json(img, select):
    """nl-run generate --json on the test prompt: the parsed JSON, or {"error": stderr}."""
    r = subprocess.run([R, "generate", "--image", img, "--select", select, "--prompt-tokens",
                        ",".join(map(str, prompt)), "--steps", str(steps), "--json", "-q"], capture_output=True,
                       text=True)
    return json.loads(r.stdout) if r.returncode == 0 else {"error": r.stderr.strip()}


def edited_refused(img, what, edits):
    """Each (label, edit, message) of `edits` applied to a copy of img's manifest: nl-run must refuse it (exit 3)
    naming `message`."""
    for label, edit, want_msg in edits:
        bad = json.load(open(img + ".json"))
        edit(bad)
        shutil.copy(img, os.path.join(work, "bad.nlw"))
        bad["image"]["file"] = "bad.nlw"
        json.dump(bad, open(os.path.join(work, "bad.nlw.json"), "w"))
        r = subprocess.run([R, "generate", "--image", os.path.join(work, "bad.nlw"), "--steps", "2", "-q"],
                           capture_output=True, text=True)
        check("%s manifest, %s: refused (exit 3, naming %s)" % (what, label, want_msg),
              r.returncode == 3 and want_msg in r.stderr, "exit %d: %s" % (r.returncode, r.stderr.strip()))


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
    # Mistral (model_type mistral, sliding_window 5): the same weights with a window shorter than the prompt (a
    # batched prefill across the window) and the 21 positions run; the logits must follow the windowed reference and
    # differ from the unwindowed model's (the window is used).
    mprompt = prompt + [12, 99, 250, 7, 300]
    mdir = os.path.join(work, "mistral")
    os.makedirs(mdir)
    shutil.copy(os.path.join(model, "model.safetensors"), mdir)
    mc = dict(cfg, model_type="mistral", sliding_window=5, architectures=["MistralForCausalLM"])
    json.dump(mc, open(os.path.join(mdir, "config.json"), "w"))
    # nl-profile convert keeps the window in a Hugging Face folder and refuses a llama2.c file (no field for it).
    P = os.path.join(build, "cli", "nl-profile")
    r = subprocess.run([P, "convert", "--model", mdir, "--out", os.path.join(work, "mistral_hf"), "-q"],
                       capture_output=True, text=True)
    conv = json.load(open(os.path.join(work, "mistral_hf", "config.json"))) if r.returncode == 0 else {}
    check("mistral: convert --to hf keeps model_type mistral and sliding_window 5",
          conv.get("model_type") == "mistral" and conv.get("sliding_window") == 5, r.stderr.strip() + str(conv))
    r = subprocess.run([P, "convert", "--model", mdir, "--to", "llama2c", "--out", os.path.join(work, "m.bin"), "-q"],
                       capture_output=True, text=True)
    check("mistral: convert --to llama2c refused (exit 2, no field for the window)",
          r.returncode == 2 and "sliding attention window" in r.stderr, "exit %d: %s" % (r.returncode, r.stderr))
    for dtype in ("f32", "f16"):
        img = os.path.join(work, "mistral_%s.nlw" % dtype)
        r = subprocess.run([L, "pack", "--model", mdir, "--dtype", dtype, "--out", img, "-q"], capture_output=True,
                           text=True)
        if r.returncode:
            check("mistral %s pack" % dtype, False, r.stderr.strip())
            continue
        man = json.load(open(img + ".json"))
        check("mistral %s: manifest 1.4 with model.sliding_window 5" % dtype,
              man["version_minor"] == 4 and man["model"].get("sliding_window") == 5, str(man["model"]))
        npy = os.path.join(work, "mistral_%s.npy" % dtype)
        r = subprocess.run([R, "generate", "--image", img, "--select", "gate", "--prompt-tokens",
                            ",".join(map(str, mprompt)), "--steps", str(steps), "--logits", npy, "--json", "-q"],
                           capture_output=True, text=True)
        if r.returncode:
            check("mistral %s runs" % dtype, False, r.stderr.strip())
            continue
        gen = json.loads(r.stdout)["generated"]
        lg = np.load(npy)
        want = ref.forward(mc, t, mprompt + gen[:-1])[len(mprompt) - 1:]
        plain = ref.forward(cfg, t, mprompt + gen[:-1])[len(mprompt) - 1:]
        tol = 1e-4 if dtype == "f32" else 2e-2  # f16 weights against the f32 reference
        err = max(float(np.max(np.abs(lg[i] - want[i])) / np.max(np.abs(want[i]))) for i in range(len(gen)))
        far = max(float(np.max(np.abs(plain[i] - want[i])) / np.max(np.abs(want[i]))) for i in range(len(gen)))
        check("mistral %s: logits within %g of the windowed reference (max relative error %.2e)" % (dtype, tol, err),
              err <= tol)
        check("mistral %s: the window changes the logits (%.2e from the unwindowed model, > 10x the error)" %
              (dtype, far), far > 10 * err and far > 1e-3)
        if dtype == "f32":
            greedy = [int(v) for v in want.argmax(1)]
            check("mistral f32: greedy tokens equal the windowed reference's", gen == greedy, "%s vs %s" % (gen, greedy))
            # The id covers the window; a 1.3 manifest cannot carry one (a reader that predates it would ignore it).
            edited_refused(img, "mistral", (
                ("window edited", lambda m: m["model"].update(sliding_window=6), "image id"),
                ("version 1.3", lambda m: m.update(version_minor=3), "sliding_window")))
    # The sparse Llama families: ProSparse's fatrelu (hidden_act_param 0.1: about a fifth of the positive gates of
    # these weights fall below it) and TurboSparse's drelu, on the same weights. Logits follow the reference's and
    # differ from the ReLU model's; the profiler's exact rule (fatrelu>0.1, drelu>0) recorded on the generated
    # sequence, replayed by --select trace, gives the gate's tokens and logits with no more neurons (dReLU: fewer,
    # the gate alone over-selects); the manifest is 1.5 and its id covers the threshold.
    resident = {}
    for fam, extra in (("fatrelu", {"hidden_act_param": 0.1}), ("drelu", {})):
        fdir = os.path.join(work, fam)
        os.makedirs(fdir)
        shutil.copy(os.path.join(model, "model.safetensors"), fdir)
        fc = dict(cfg, hidden_act=fam, **extra)
        json.dump(fc, open(os.path.join(fdir, "config.json"), "w"))
        r = subprocess.run([P, "convert", "--model", fdir, "--out", os.path.join(work, fam + "_hf"), "-q"],
                           capture_output=True, text=True)
        conv = json.load(open(os.path.join(work, fam + "_hf", "config.json"))) if r.returncode == 0 else {}
        check("%s: convert --to hf keeps hidden_act%s" % (fam, " and hidden_act_param" if extra else ""),
              conv.get("hidden_act") == fam and all(conv.get(k) == v for k, v in extra.items()),
              r.stderr.strip() + str(conv))
        if extra:  # a fatrelu config without its threshold, or a negative one: exit 3 naming config.json
            for label, bad_cfg in (("without hidden_act_param", dict(cfg, hidden_act=fam)),
                                   ("with hidden_act_param -1", dict(cfg, hidden_act=fam, hidden_act_param=-1.0))):
                bdir = os.path.join(work, "bad_" + fam)
                shutil.rmtree(bdir, ignore_errors=True)
                os.makedirs(bdir)
                shutil.copy(os.path.join(model, "model.safetensors"), bdir)
                json.dump(bad_cfg, open(os.path.join(bdir, "config.json"), "w"))
                r = subprocess.run([L, "pack", "--model", bdir, "--out", os.path.join(work, "bad_f.nlw"), "-q"],
                                   capture_output=True, text=True)
                check("fatrelu %s: pack refused (exit 3, one line naming config.json)" % label,
                      r.returncode == 3 and "config.json" in r.stderr and "hidden_act_param" in r.stderr
                      and r.stderr.count("\n") == 1 and not os.path.exists(os.path.join(work, "bad_f.nlw")),
                      "exit %d: %s" % (r.returncode, r.stderr))
        r = subprocess.run([P, "convert", "--model", fdir, "--to", "llama2c", "--out", os.path.join(work, "f.bin"),
                            "-q"], capture_output=True, text=True)
        check("%s: convert --to llama2c refused (exit 2)" % fam, r.returncode == 2 and fam in r.stderr,
              "exit %d: %s" % (r.returncode, r.stderr))
        for dtype in ("f32", "f16", "bf16", "q8_0", "q4_0"):
            img = os.path.join(work, "%s_%s.nlw" % (fam, dtype))
            r = subprocess.run([L, "pack", "--model", fdir, "--dtype", dtype, "--out", img, "-q"], capture_output=True,
                               text=True)
            if r.returncode:
                check("%s %s pack" % (fam, dtype), False, r.stderr.strip())
                continue
            man = json.load(open(img + ".json"))
            thr_ok = abs(man["model"].get("fatrelu_threshold", 0.0) - extra.get("hidden_act_param", 0.0)) < 1e-7
            check("%s %s: manifest 1.5, ffn_act %s%s" % (fam, dtype, fam, ", fatrelu_threshold 0.1" if extra else ""),
                  man["version_minor"] == 5 and man["model"]["ffn_act"] == fam and thr_ok
                  and ("fatrelu_threshold" in man["model"]) == bool(extra), str(man["model"]))
            runs = {}
            for select, overlap in (("gate", "none"), ("gate", "layer"), ("gate", "both"), ("dense", "none")):
                npy = os.path.join(work, "%s_%s_%s_%s.npy" % (fam, dtype, select, overlap))
                r = subprocess.run([R, "generate", "--image", img, "--select", select, "--overlap", overlap,
                                    "--prompt-tokens", ",".join(map(str, prompt)), "--steps", str(steps), "--logits",
                                    npy, "--json", "-q"], capture_output=True, text=True)
                if r.returncode:
                    check("%s %s --select %s --overlap %s runs" % (fam, dtype, select, overlap), False, r.stderr)
                    continue
                j = json.loads(r.stdout)
                runs[(select, overlap)] = (j["generated"], np.load(npy), j["totals"]["active"])
                if select == "gate" and overlap == "none":
                    resident[(fam, dtype)] = j["memory"]["ffn_resident_bytes"]
            if len(runs) != 4:
                continue
            gen, lg, gate_active = runs[("gate", "none")]
            check("%s %s: --select gate (overlap none / layer / both) and dense give the same tokens" % (fam, dtype),
                  all(v[0] == gen for v in runs.values()), str({k: v[0] for k, v in runs.items()}))
            want = ref.forward(fc, t, prompt + gen[:-1])[len(prompt) - 1:]
            if dtype not in ("f32", "f16"):
                continue  # bf16 / quantized: the same tokens on every path above (the reference is checked at f16)
            tol = 1e-4 if dtype == "f32" else 2e-2
            err = max(float(np.max(np.abs(lg[i] - want[i])) / np.max(np.abs(want[i]))) for i in range(len(gen)))
            check("%s %s: logits within %g of the reference (max relative error %.2e)" % (fam, dtype, tol, err),
                  err <= tol)
            if dtype != "f32":
                continue
            greedy = [int(v) for v in want.argmax(1)]
            check("%s f32: greedy tokens equal the reference's" % fam, gen == greedy, "%s vs %s" % (gen, greedy))
            plain = ref.forward(cfg, t, prompt + gen[:-1])[len(prompt) - 1:]
            far = max(float(np.max(np.abs(plain[i] - want[i])) / np.max(np.abs(want[i]))) for i in range(len(gen)))
            check("%s f32: the activation changes the logits (%.2e from the ReLU model's, > 10x the error)" %
                  (fam, far), far > 10 * err and far > 1e-3)
            # The profiler's exact rule on the generated sequence, replayed.
            ids = os.path.join(work, fam + ".ids")
            open(ids, "w").write(" ".join(map(str, prompt[1:] + gen[:-1])) + "\n")
            tr = os.path.join(work, fam + ".h5")
            r = subprocess.run([P, "run", "--model", fdir, "--token-ids", ids, "--seq-len", "64", "--out", tr,
                                "--json", "-q"], capture_output=True, text=True)
            rule = json.loads(r.stdout).get("activation") if r.returncode == 0 else None
            want_rule = "fatrelu>0.1" if extra else "drelu>0"
            check("%s: nl-profile run records the exact rule %s" % (fam, want_rule), rule == want_rule,
                  "exit %d: %s %s" % (r.returncode, rule, r.stderr.strip()))
            # The PyTorch hooks (profiler/python/trace_hooks.py) on the tiny torch Llama with the family's MLP record
            # the same masks bit for bit (relu>0 sees fatrelu's zeros; drelu>0 hooks up_proj too).
            if torch_ok:
                import h5py
                import trace_hooks
                from torch_llama import load_llama
                rec = trace_hooks.TraceRecorder(load_llama(fdir), "drelu>0" if fam == "drelu" else "relu>0")
                for seq in trace_hooks.corpus_from_token_files([ids], 64):
                    rec.run(seq)
                rec.write(tr + ".py.h5", model_name="torch_llama")
                with h5py.File(tr, "r") as fc_, h5py.File(tr + ".py.h5", "r") as fp_:
                    same = all(np.array_equal(fc_["layers/%d/mask" % lay][...], fp_["layers/%d/mask" % lay][...])
                               for lay in range(cfg["num_hidden_layers"]))
                check("%s: trace_hooks.py's masks equal nl-profile's bit for bit" % fam, same)
            else:
                print("SKIP %s: trace_hooks.py's masks (no torch/h5py for %s)" % (fam, sys.executable))
            npy = os.path.join(work, fam + "_trace.npy")
            r = subprocess.run([R, "generate", "--image", img, "--select", "trace:" + tr, "--prompt-tokens",
                                ",".join(map(str, prompt)), "--steps", str(steps), "--logits", npy, "--json", "-q"],
                               capture_output=True, text=True)
            if r.returncode:
                check("%s: --select trace runs" % fam, False, r.stderr.strip())
                continue
            jt = json.loads(r.stdout)
            lt = np.load(npy)
            diff = float(np.max(np.abs(lt - lg)) / np.max(np.abs(lg)))
            check("%s: the trace's sets give the gate's tokens and logits (max relative difference %.2e)" % (fam, diff),
                  jt["generated"] == gen and diff <= 1e-6, "%s vs %s" % (jt["generated"], gen))
            ta = jt["totals"]["active"]
            jc = generate_json(img, "threshold:0.05")
            check("%s: --select threshold:0.05 runs and reads no more than the exact sets (%s vs %d)" % (
                fam, jc.get("totals", {}).get("active"), ta), jc.get("totals", {}).get("active", ta + 1) <= ta,
                jc.get("error", ""))
            check("%s: --select gate reads the exact sets (%d neurons, the trace's %d)" % (fam, gate_active, ta),
                  ta == gate_active)
            if fam == "drelu":
                # The gate alone (nl-profile's abs>0: relu(gate x) != 0) names more neurons; replayed, they give the
                # same tokens (the extra ones add exactly nothing) and read more. The up rows in DRAM are what makes
                # --select gate exact, and the memory plan counts them.
                tg = os.path.join(work, "drelu_gate.h5")
                r = subprocess.run([P, "run", "--model", fdir, "--token-ids", ids, "--seq-len", "64", "--activation",
                                    "abs>0", "--out", tg, "-q"], capture_output=True, text=True)
                r = r if r.returncode else subprocess.run(
                    [R, "generate", "--image", img, "--select", "trace:" + tg, "--prompt-tokens",
                     ",".join(map(str, prompt)), "--steps", str(steps), "--json", "-q"], capture_output=True, text=True)
                jg = json.loads(r.stdout) if r.returncode == 0 else {}
                over = jg.get("totals", {}).get("active")
                check("drelu: gate x > 0 alone names more neurons (%s vs %d), same tokens" % (over, ta),
                      over is not None and over > ta and jg.get("generated") == gen, r.stderr.strip())
                check("drelu: the gate and up rows in DRAM are counted (%d bytes, twice fatrelu's %d)" %
                      (resident[("drelu", "f32")], resident[("fatrelu", "f32")]),
                      resident[("drelu", "f32")] == 2 * resident[("fatrelu", "f32")])
            if fam == "fatrelu":
                edited_refused(img, "fatrelu", (
                    ("threshold edited", lambda m: m["model"].update(fatrelu_threshold=0.2), "image id"),
                    ("version 1.4", lambda m: m.update(version_minor=4), "format version 1.5")))
    # MobiLlama-style CATS on a SiLU model (the same weights read as SiLU): per-layer thresholds calibrated to keep
    # 30 % of the profile text's activations (nl-profile --activation calibrated:0.3), recorded by pack
    # --act-threshold-from, run by --select threshold: the share kept on the prompt, the mass recall and the
    # agreement with the exact run are reported.
    sdir = os.path.join(work, "silu")
    os.makedirs(sdir)
    shutil.copy(os.path.join(model, "model.safetensors"), sdir)
    json.dump(dict(cfg, hidden_act="silu"), open(os.path.join(sdir, "config.json"), "w"))
    cal = os.path.join(work, "silu_cal.h5")
    r = subprocess.run([P, "run", "--model", sdir, "--tokenizer", os.path.join(model, "tokenizer.model"), "--text",
                        os.path.join(src, "README.md"), "--max-tokens", "2048", "--activation", "calibrated:0.3",
                        "--out", cal, "-q"], capture_output=True, text=True)
    simg = os.path.join(work, "silu_cats.nlw")
    r = r if r.returncode else subprocess.run([L, "pack", "--model", sdir, "--dtype", "f16", "--act-threshold-from",
                                               cal, "--out", simg, "-q"], capture_output=True, text=True)
    js = generate_json(simg, "threshold") if r.returncode == 0 else {"error": r.stderr.strip()}
    th = js.get("threshold", {})
    kept = th.get("kept_fraction")
    check("SiLU + CATS calibrated:0.3: --select threshold keeps %s of the neurons (mass recall %s, token agreement "
          "with the exact run %s)" % (kept, th.get("mass_recall"), th.get("token_agreement")),
          kept is not None and 0.1 < kept < 0.6, js.get("error", "") + str(th))
    print("check_logits_reference: %d passed, %d failed" % (passes, fails))
    sys.exit(1 if fails else 0)
finally:
    shutil.rmtree(work, ignore_errors=True)
