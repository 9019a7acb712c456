#!/usr/bin/env python3
"""Stored activation predictors: `nl-layout pack --predictor FILE` and `nl-run generate --select predictor` on the
bundled tiny-relu model. The predictor files are PowerInfer-form ReLU MLPs (blk.{l}.fc1.weight [rank][dim],
blk.{l}.fc2.weight [hidden][rank]) built here from each layer's gate matrix G: fc1 = [V_R; -V_R], fc2 = [G V_R^T,
-G V_R^T], so fc2 relu(fc1 x) = G V_R^T V_R x exactly (the rank-R projection of the gate). With R = dim the scores are
the gate itself (on the FFN's normalised input: packed with --predictor-input ffn_norm):
  - full rank: recall 1 and precision 1 against the exact rule, the gate's tokens, the factors in the memory plan;
  - rank 16: recall and precision reported in (0, 1], the JSON names the stored source;
  - deployed (predictor:0): the full-rank predictor reads the gate's neurons with no gate rows in DRAM (the memory
    plan holds the predictor instead), recall not measured; predictor:1e30 reads nothing; predictor+trace: the
    trace's tokens and reads with the predictor run and charged;
  - manifest 1.6 with predictor {rank, dtype} (f32 image: f32; f16 and q8_0 images: f16), a "predictor" region;
  - refused: a file missing a tensor or with a wrong shape (pack exit 3 naming it), --select predictor on an image
    without one (exit 2), an edited predictor rank (exit 3, image id), a damaged predictor region (exit 3, checksum).

  check_predictor.py SOURCE_DIR BINARY_DIR
"""
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile

import numpy as np

src, build = sys.argv[1], sys.argv[2]
sys.path.insert(0, os.path.join(src, "tests"))
import hf_llama_reference as ref  # noqa: E402
from nl_check import llamacpp_dir  # noqa: E402

L, R, P = (os.path.join(build, "cli", b) for b in ("nl-layout", "nl-run", "nl-profile"))
model = os.path.join(src, "datasets", "tiny-relu", "model")
work = tempfile.mkdtemp(prefix="nl-predictor.")
fails = passes = 0
prompt = "1,400,35,87"


def check(name, ok, detail=""):
    global fails, passes
    passes += ok
    fails += not ok
    print(("PASS " if ok else "FAIL ") + name + ("" if ok else " " + detail))


def run(*cmd):
    return subprocess.run(list(cmd), capture_output=True, text=True)


def write_safetensors(path, tensors):
    hdr, off, blobs = {}, 0, []
    for k in sorted(tensors):
        a = np.ascontiguousarray(tensors[k], dtype=np.float32)
        b = a.tobytes()
        hdr[k] = {"dtype": "F32", "shape": list(a.shape), "data_offsets": [off, off + len(b)]}
        off += len(b)
        blobs.append(b)
    h = json.dumps(hdr).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


cfg, t = ref.load(model)
layers, dim, hidden = cfg["num_hidden_layers"], cfg["hidden_size"], cfg["intermediate_size"]


def predictor(rank):
    out = {}
    for lay in range(layers):
        g = t["model.layers.%d.mlp.gate_proj.weight" % lay].astype(np.float64)
        v = np.linalg.svd(g, full_matrices=False)[2][:rank]
        gv = g @ v.T
        out["blk.%d.fc1.weight" % lay] = np.concatenate([v, -v])
        out["blk.%d.fc2.weight" % lay] = np.concatenate([gv, -gv], 1)
    return out


def generate(img, select, *extra):
    r = run(R, "generate", "--image", img, "--select", select, "--prompt-tokens", prompt, "--steps", "12", "--json",
            "-q", *extra)
    return json.loads(r.stdout) if r.returncode == 0 else r


try:
    full, low = os.path.join(work, "full.safetensors"), os.path.join(work, "low.safetensors")
    write_safetensors(full, predictor(dim))
    write_safetensors(low, predictor(16))
    img = os.path.join(work, "p.nlw")
    r = run(L, "pack", "--model", model, "--predictor-input", "ffn_norm", "--predictor", full, "--out", img, "-q")
    check("pack --predictor (rank %d)" % (2 * dim), r.returncode == 0, r.stderr.strip())
    man = json.load(open(img + ".json"))
    check("manifest 1.6: predictor rank %d, dtype f32, a 'predictor' region" % (2 * dim),
          man["version_minor"] == 6 and man["predictor"]["rank"] == 2 * dim and man["predictor"]["dtype"] == "f32"
          and man["regions"][-1]["name"] == "predictor", str(man.get("predictor")))
    gate = generate(img, "gate")
    p = generate(img, "predictor", "--target-recall", "1")
    if isinstance(p, dict) and isinstance(gate, dict):
        pr = p["predictor"]
        check("full rank: recall %.4f, precision %.4f (both 1)" % (pr["recall"], pr["precision"]),
              pr["recall"] == 1.0 and pr["precision"] >= 0.999)
        check("full rank: the gate's tokens", p["generated"] == gate["generated"],
              "%s vs %s" % (p["generated"], gate["generated"]))
        factors = (man["regions"][-1]["bytes"] + 4095) // 4096 * 4096
        check("the predictor region is in the memory plan (+%d bytes of FFN rows in DRAM)" % factors,
              p["memory"]["ffn_resident_bytes"] == gate["memory"]["ffn_resident_bytes"] + factors,
              "%d vs %d" % (p["memory"]["ffn_resident_bytes"], gate["memory"]["ffn_resident_bytes"]))
        check("the JSON names the stored source", pr.get("source", "").startswith("stored: "), str(pr.get("source")))
        # Deployed (predictor:T): no gate rows in DRAM, no calibration; score > 0 is the gate's own rule here.
        d = generate(img, "predictor:0")
        if isinstance(d, dict):
            dp = d["predictor"]
            check("predictor:0, full rank: the gate's tokens, %d neurons read (the gate's %d), recall not measured" % (
                d["totals"]["active"], gate["totals"]["active"]),
                d["generated"] == gate["generated"] and dp["deployed"] and dp["recall"] is None
                and abs(d["totals"]["active"] - gate["totals"]["active"]) <= gate["totals"]["active"] // 100)
            check("predictor:0 holds the predictor and no gate rows (%d bytes of FFN rows in DRAM, the gate's %d)" % (
                d["memory"]["ffn_resident_bytes"], gate["memory"]["ffn_resident_bytes"]),
                d["memory"]["ffn_resident_bytes"] == factors)
            n = generate(img, "predictor:1e30")
            check("predictor:1e30 reads nothing and still generates", isinstance(n, dict)
                  and n["totals"]["active"] == 0 and len(n["generated"]) == 12, str(n)[:300])
        else:
            check("--select predictor:0 runs", False, d.stderr)
        # predictor+trace (benchmarks): the trace's sets and tokens, the predictor run and charged.
        tr = os.path.join(work, "t.h5")
        r = run(P, "run", "--model", model, "--tokenizer", os.path.join(model, "tokenizer.model"), "--text",
                "/usr/share/common-licenses/GPL-3", "--max-tokens", "400", "--seq-len", "64", "--out", tr, "-q")
        a, b = (generate(img, s + tr) if r.returncode == 0 else r for s in ("trace:", "predictor+trace:"))
        if isinstance(a, dict) and isinstance(b, dict):
            check("predictor+trace: the trace's tokens and %d neurons, the predictor paid (in the memory plan: +%d "
                  "bytes; %.1f neurons per layer-token at score > 0, discarded)" % (
                      b["totals"]["active"], b["memory"]["ffn_resident_bytes"] - a["memory"]["ffn_resident_bytes"],
                      b["predictor"]["predicted_per_layer_token"]),
                  b["generated"] == a["generated"] and b["totals"]["active"] == a["totals"]["active"]
                  and b["memory"]["ffn_resident_bytes"] == a["memory"]["ffn_resident_bytes"] + factors
                  and b["predictor"]["paid"])
        else:
            check("trace: and predictor+trace: run", False, str(a if not isinstance(a, dict) else b)[:300])
        r = run(R, "generate", "--image", img, "--select", "predictor:x", "--steps", "2", "-q")
        check("predictor:x refused (exit 2)", r.returncode == 2 and "predictor:T" in r.stderr, r.stderr.strip())
    else:
        check("--select gate and predictor run", False, (p if not isinstance(p, dict) else gate).stderr)
    # The same predictor as a GGUF (PowerInfer's tensor names; written with llama.cpp's gguf-py when present).
    gguf_py = os.path.join(llamacpp_dir(), "gguf-py")
    if os.path.isfile(os.path.join(gguf_py, "gguf", "__init__.py")):
        sys.path.insert(0, gguf_py)
        import gguf
        gp = os.path.join(work, "full.gguf")
        gw = gguf.GGUFWriter(gp, "llama")
        for k, v in sorted(predictor(dim).items()):
            gw.add_tensor(k, np.ascontiguousarray(v, dtype=np.float32))
        gw.write_header_to_file()
        gw.write_kv_data_to_file()
        gw.write_tensors_to_file()
        gw.close()
        img3 = os.path.join(work, "pg.nlw")
        r = run(L, "pack", "--model", model, "--predictor-input", "ffn_norm", "--predictor", gp, "--out", img3, "-q")
        m3 = json.load(open(img3 + ".json")) if r.returncode == 0 else {}
        check("pack --predictor X.gguf: the predictor region equals the safetensors file's",
              m3.get("regions", [{}])[-1].get("xxh64") == man["regions"][-1]["xxh64"], r.stderr.strip())
    else:
        print("SKIP pack --predictor X.gguf (llama.cpp's gguf-py not found in %s)" % gguf_py)
    for dtype in ("f16", "q8_0"):
        img2 = os.path.join(work, "low_%s.nlw" % dtype)
        r = run(L, "pack", "--model", model, "--predictor-input", "ffn_norm", "--predictor", low, "--dtype", dtype, "--out", img2, "-q")
        m2 = json.load(open(img2 + ".json")) if r.returncode == 0 else {}
        check("%s image: predictor rank 32 stored as f16" % dtype,
              m2.get("predictor", {}).get("rank") == 32 and m2["predictor"]["dtype"] == "f16", r.stderr.strip())
        q = generate(img2, "predictor", "--target-recall", "0.99")
        ok = isinstance(q, dict) and 0 < q["predictor"]["recall"] <= 1 and 0 < q["predictor"]["precision"] <= 1
        check("%s rank 32: recall %s, precision %s reported" % (
            dtype, q["predictor"]["recall"] if ok else "-", q["predictor"]["precision"] if ok else "-"), ok,
            q.stderr if not isinstance(q, dict) else "")
    # Refusals.
    bad = predictor(4)
    del bad["blk.2.fc2.weight"]
    write_safetensors(os.path.join(work, "missing.safetensors"), bad)
    bad = predictor(4)
    bad["blk.1.fc1.weight"] = bad["blk.1.fc1.weight"][:, :-1]
    write_safetensors(os.path.join(work, "shape.safetensors"), bad)
    for label, f, want in (("missing tensor", "missing.safetensors", "blk.2.fc2.weight"),
                           ("wrong shape", "shape.safetensors", "blk.1.fc1.weight")):
        out = os.path.join(work, "bad.nlw")
        r = run(L, "pack", "--model", model, "--predictor", os.path.join(work, f), "--out", out, "-q")
        check("pack --predictor, %s: exit 3 naming %s, no image" % (label, want),
              r.returncode == 3 and want in r.stderr and r.stderr.count("\n") == 1 and not os.path.exists(out),
              "exit %d: %s" % (r.returncode, r.stderr))
    plain = os.path.join(work, "plain.nlw")
    run(L, "pack", "--model", model, "--out", plain, "-q")
    r = run(R, "generate", "--image", plain, "--select", "predictor", "--steps", "2", "--prompt-tokens", prompt, "-q")
    check("--select predictor without a stored one: exit 2", r.returncode == 2 and "no stored predictor" in r.stderr,
          "exit %d: %s" % (r.returncode, r.stderr))
    edited = json.load(open(img + ".json"))
    edited["predictor"]["rank"] = 8
    edited["image"]["file"] = "e.nlw"
    shutil.copy(img, os.path.join(work, "e.nlw"))
    json.dump(edited, open(os.path.join(work, "e.nlw.json"), "w"))
    r = run(R, "generate", "--image", os.path.join(work, "e.nlw"), "--steps", "2", "--prompt-tokens", prompt, "-q")
    check("edited predictor rank: refused (exit 3)", r.returncode == 3, "exit %d: %s" % (r.returncode, r.stderr))
    dmg = os.path.join(work, "d.nlw")
    shutil.copy(img, dmg)
    mj = json.load(open(img + ".json"))
    mj["image"]["file"] = "d.nlw"
    json.dump(mj, open(dmg + ".json", "w"))
    with open(dmg, "r+b") as f:
        f.seek(man["regions"][-1]["offset"] + 100)
        b = f.read(1)
        f.seek(man["regions"][-1]["offset"] + 100)
        f.write(bytes([b[0] ^ 0xFF]))
    r = run(R, "generate", "--image", dmg, "--select", "predictor", "--steps", "2", "--prompt-tokens", prompt, "-q")
    check("damaged predictor region: exit 3 naming the checksum", r.returncode == 3 and "predictor" in r.stderr,
          "exit %d: %s" % (r.returncode, r.stderr))
    # A whole synthetic model carries a (random) predictor too (the 7B benchmark rows pay for one); an FFN-only
    # shape has no model to predict for.
    rng = np.random.default_rng(3)
    syn = os.path.join(work, "syn.safetensors")
    write_safetensors(syn, {k: rng.standard_normal(s) * 0.1 for lay in range(2) for k, s in (
        ("blk.%d.fc1.weight" % lay, (8, 64)), ("blk.%d.fc2.weight" % lay, (256, 8)))})
    simg = os.path.join(work, "syn.nlw")
    r = run(L, "pack", "--synthetic-shape", "tiny-test", "--predictor", syn, "--out", simg, "-q")
    sj = generate(simg, "predictor:0") if r.returncode == 0 else r
    check("pack --synthetic-shape tiny-test --predictor: rank 8 stored, predictor:0 runs",
          isinstance(sj, dict) and json.load(open(simg + ".json"))["predictor"]["rank"] == 8
          and sj["predictor"]["deployed"], str(sj)[:300])
    r = run(L, "pack", "--synthetic-shape", "tiny-test", "--predictor", "random:8", "--out", simg, "-q")
    man = json.load(open(simg + ".json")) if r.returncode == 0 else {}
    check("pack --synthetic-shape tiny-test --predictor random:8: a random rank-8 predictor, labelled synthetic",
          man.get("predictor", {}).get("rank") == 8 and "synthetic" in man.get("predictor", {}).get("source", ""),
          r.stderr.strip() + str(man.get("predictor")))
    for bad, want in (("random:0", "rank R >= 1"), ("random:x", "rank R >= 1")):
        r = run(L, "pack", "--synthetic-shape", "tiny-test", "--predictor", bad, "--out", simg + "2", "-q")
        check("--predictor %s refused (exit 2)" % bad, r.returncode == 2 and want in r.stderr, r.stderr.strip())
    r = run(L, "pack", "--model", model, "--predictor", "random:8", "--out", simg + "3", "-q")
    check("--predictor random:R with a real model refused (exit 2)", r.returncode == 2 and "synthetic" in r.stderr,
          r.stderr.strip())
    r = run(L, "pack", "--synthetic-shape", "opt-6.7b", "--layers", "2", "--predictor", syn, "--out",
            os.path.join(work, "ffn.nlw"), "-q")
    check("pack --predictor on an FFN-only synthetic shape: exit 2", r.returncode == 2 and "FFN-only" in r.stderr,
          "exit %d: %s" % (r.returncode, r.stderr.strip()))
    print("check_predictor: %d passed, %d failed" % (passes, fails))
    sys.exit(1 if fails else 0)
finally:
    shutil.rmtree(work, ignore_errors=True)
