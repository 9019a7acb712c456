#!/usr/bin/env python3
"""TurboSparse-Mistral as published (model_type bamboo, PowerInfer's modeling_bamboo.py) end to end on a random-weight
checkpoint written by tests/make_bamboo_checkpoint.py (2 shards, GQA, sliding window, the predictor inside the
checkpoint), against the independent numpy forward tests/hf_llama_reference.py:

- pack reads it as Mistral with dReLU (model.ffn_act drelu, the window), and `--predictor CHECKPOINT` finds its
  model.layers.{l}.mlp.predictor.fc1/fc2.weight: manifest 1.8, predictor {rank, input residual};
- dense and gate under every overlap and 1 / 2 threads: the reference's greedy tokens, logits within 1e-4 (f32);
- `--select predictor:0` computes exactly the model with TurboSparse's own mask round(sigmoid(fc2 relu(fc1 r))) on
  the residual r entering the FFN before its norm: logits within 1e-4 of the reference masked that way, its greedy
  tokens, under overlap none and cross (the read-ahead predicts from the layer input) and on 2 threads; the same
  predictor packed with `--predictor-input ffn_norm` computes the reference masked on the FFN's normalised input
  instead, and differs from the residual one (the check tells the two inputs apart);
- `--select predictor` (calibrated against the exact dReLU rule) reports recall and precision;
- PowerInfer's sparse-model GGUF (magic PWRI, written here with llama.cpp's gguf-py): arch bamboo with only the
  transposed ffn_down_t and the predictor as blk.{l}.fc1/fc2 packs to the folder's FFN and dense regions byte for
  byte (f32) and its predictor region equal to the one read from the checkpoint; a PWRI llama file reads as ReLU (the
  FFN PowerInfer runs for it), the same weights in a plain GGUF as llama.cpp's SiLU (skipped, and recorded, without
  gguf-py);
- refusals (exit 3, one line naming the file): model_type bamboo with another hidden_act, a checkpoint without
  predictor tensors as --predictor, an edited predictor.input (image id), predictor.input in a 1.7 manifest.

  check_turbosparse.py SOURCE_DIR BINARY_DIR
"""
import json
import os
import shutil
import sys
import tempfile

import numpy as np

src, build = sys.argv[1], sys.argv[2]
sys.path.insert(0, os.path.join(src, "tests"))
import hf_llama_reference as ref  # noqa: E402
from hf_opt_reference import load  # noqa: E402
from nl_check import Checks, llamacpp_dir  # noqa: E402

work = tempfile.mkdtemp(prefix="nl-turbosparse.")
prompt = [1, 17, 300, 5, 99, 41, 7, 250, 3, 66]  # longer than the window (8)
c = Checks(build, work, prompt, steps=20)
L, R, check, run, generate, rel_err = c.L, c.R, c.check, c.run, c.generate, c.rel_err


def sigmoid(v):
    return 1.0 / (1.0 + np.exp(-v))


def predictor_mask(t, on_residual):
    """TurboSparse's mask, torch.round(sigmoid(fc2 relu(fc1 v))) (round half to even: 0.5 -> 0), on the residual
    or on the FFN's normalised input."""
    def mask(layer, resid, h):
        p = "model.layers.%d.mlp.predictor." % layer
        v = resid if on_residual else h
        s = np.maximum(v @ t[p + "fc1.weight"].T.astype(np.float64), 0) @ t[p + "fc2.weight"].T.astype(np.float64)
        return np.round(sigmoid(s))
    return mask


def regions(man):
    return [(r["name"], r["xxh64"]) for r in man["regions"]]


def powerinfer_gguf(ck, cfg, t, folder_img):
    """The checkpoint as PowerInfer's sparse GGUF (PWRI), packed against the folder's image."""
    gguf_py = os.path.join(llamacpp_dir(), "gguf-py")
    if not os.path.isfile(os.path.join(gguf_py, "gguf", "__init__.py")):
        why = "PowerInfer GGUF checks: llama.cpp's gguf-py not found in %s (scripts/llamacpp.sh fetches it)" % gguf_py
        print("SKIP " + why)
        os.makedirs(os.path.join(build, "tests", "skipped"), exist_ok=True)
        open(os.path.join(build, "tests", "skipped", "turbosparse.txt"), "a").write(why + "\n")
        return
    sys.path.insert(0, gguf_py)
    import gguf

    nh, nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]

    def permute(w, heads):  # llama.cpp's convert_hf_to_gguf LlamaModel.permute (rotate_half -> interleaved pairs)
        return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)

    def write(path, arch, magic, down_t):
        gw = gguf.GGUFWriter(path, arch)
        gw.add_context_length(cfg["max_position_embeddings"])
        gw.add_embedding_length(cfg["hidden_size"])
        gw.add_block_count(cfg["num_hidden_layers"])
        gw.add_feed_forward_length(cfg["intermediate_size"])
        gw.add_head_count(nh)
        gw.add_head_count_kv(nkv)
        gw.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
        gw.add_rope_dimension_count(cfg["hidden_size"] // nh)
        gw.add_rope_freq_base(cfg["rope_theta"])
        ten = {"token_embd.weight": t["model.embed_tokens.weight"], "output_norm.weight": t["model.norm.weight"],
               "output.weight": t["lm_head.weight"]}
        for lay in range(cfg["num_hidden_layers"]):
            p, b = "model.layers.%d." % lay, "blk.%d." % lay
            ten.update({b + "attn_norm.weight": t[p + "input_layernorm.weight"],
                        b + "attn_q.weight": permute(t[p + "self_attn.q_proj.weight"], nh),
                        b + "attn_k.weight": permute(t[p + "self_attn.k_proj.weight"], nkv),
                        b + "attn_v.weight": t[p + "self_attn.v_proj.weight"],
                        b + "attn_output.weight": t[p + "self_attn.o_proj.weight"],
                        b + "ffn_norm.weight": t[p + "post_attention_layernorm.weight"],
                        b + "ffn_gate.weight": t[p + "mlp.gate_proj.weight"],
                        b + "ffn_up.weight": t[p + "mlp.up_proj.weight"],
                        b + "fc1.weight": t[p + "mlp.predictor.fc1.weight"],
                        b + "fc2.weight": t[p + "mlp.predictor.fc2.weight"]})
            if down_t:
                ten[b + "ffn_down_t.weight"] = np.ascontiguousarray(t[p + "mlp.down_proj.weight"].T)
            else:
                ten[b + "ffn_down.weight"] = t[p + "mlp.down_proj.weight"]
        for k in sorted(ten):
            gw.add_tensor(k, np.ascontiguousarray(ten[k], dtype=np.float32))
        gw.write_header_to_file()
        gw.write_kv_data_to_file()
        gw.write_tensors_to_file()
        gw.close()
        if magic != b"GGUF":
            with open(path, "r+b") as f:
                f.write(magic)

    base = json.load(open(folder_img + ".json"))
    pw = os.path.join(work, "bamboo.gguf")
    write(pw, "bamboo", b"PWRI", True)
    out = os.path.join(work, "pw.nlw")
    r = run(L, "pack", "--model", pw, "--predictor", pw, "--out", out, "-q")
    check("pack a PWRI bamboo GGUF (ffn_down_t only) with --predictor from it", r.returncode == 0, r.stderr.strip())
    if r.returncode == 0:
        m = json.load(open(out + ".json"))
        want = {k: v for k, v in base["model"].items() if k != "sliding_window"}  # GGUF has no window key
        check("PWRI bamboo: ffn_act drelu and the folder's config (no window: GGUF has no key for it)",
              m["model"] == want, "%s vs %s" % (m["model"], want))
        check("PWRI bamboo: dense, FFN and predictor regions byte-identical to the folder image's",
              regions(m) == regions(base), "%s vs %s" % (regions(m), regions(base)))
        check("PWRI bamboo: predictor input residual (PowerInfer's ffn_inp)",
              m["predictor"].get("input") == "residual", str(m["predictor"]))
    for magic, act in ((b"PWRI", "relu"), (b"GGUF", "silu")):
        g = os.path.join(work, "llama_%s.gguf" % magic.decode())
        write(g, "llama", magic, False)
        r = run(L, "pack", "--model", g, "--out", g + ".nlw", "-q")
        m = json.load(open(g + ".nlw.json")) if r.returncode == 0 else {}
        check("a %s llama file reads as %s" % (magic.decode(), act), m.get("model", {}).get("ffn_act") == act,
              r.stderr.strip() + str(m.get("model")))


try:
    ck = c.make_checkpoint("make_bamboo_checkpoint.py", "bamboo", "--shards", "2", "--max-pos", "128")
    cfg, t = load(ck)
    images = {}
    for dtype in ("f32", "f16"):
        img = os.path.join(work, "ts_%s.nlw" % dtype)
        r = run(L, "pack", "--model", ck, "--predictor", ck, "--dtype", dtype, "--out", img, "-q")
        if r.returncode:
            check("pack --dtype %s --predictor CHECKPOINT" % dtype, False, r.stderr.strip())
            continue
        images[dtype] = img
        man = json.load(open(img + ".json"))
        check("%s: manifest 1.8, ffn_act drelu, sliding_window 8, predictor rank 16 reading the residual" % dtype,
              man["version_minor"] == 8 and man["model"].get("ffn_act") == "drelu"
              and man["model"].get("sliding_window") == 8 and man["predictor"]["rank"] == 16
              and man["predictor"].get("input") == "residual", str(man["model"]) + str(man.get("predictor")))
    c.paths_agree(images, lambda tokens: ref.forward(cfg, t, tokens))

    n = len(prompt)
    img = images["f32"]
    runs = {}
    for overlap, threads in (("none", 1), ("cross", 1), ("none", 2)):
        j, lg = generate(img, "--select", "predictor:0", "--overlap", overlap, "--threads", str(threads),
                         npy=os.path.join(work, "p.npy"))
        if "error" in j:
            check("predictor:0 --overlap %s --threads %d runs" % (overlap, threads), False, j["error"])
            continue
        runs[(overlap, threads)] = (j["generated"], lg)
    if ("none", 1) in runs:
        gen, lg = runs[("none", 1)]
        want = ref.forward(cfg, t, prompt + gen[:-1], predictor_mask(t, True))[n - 1:]
        err = max(rel_err(v[1], want) for v in runs.values())
        greedy = [int(v) for v in want.argmax(1)]
        check("predictor:0 (overlap none / cross, 1 / 2 threads): logits within 1e-4 of the reference masked by "
              "TurboSparse's own rule on the residual (max relative error %.2e)" % err, err <= 1e-4)
        check("predictor:0: the masked reference's greedy tokens on every path",
              all(v[0] == greedy for v in runs.values()), str({k: v[0] for k, v in runs.items()}) + str(greedy))
        dense = ref.forward(cfg, t, prompt + gen[:-1])[n - 1:]
        print("  predictor:0 vs the unmasked model: max relative logit error %.2e, greedy agreement %d/%d" % (
            rel_err(lg, dense), sum(int(d.argmax()) == g for d, g in zip(dense, gen)), len(gen)))

    wrong = os.path.join(work, "ts_norm.nlw")
    r = run(L, "pack", "--model", ck, "--predictor", ck, "--predictor-input", "ffn_norm", "--out", wrong, "-q")
    check("pack --predictor-input ffn_norm", r.returncode == 0, r.stderr.strip())
    if r.returncode == 0:
        man = json.load(open(wrong + ".json"))
        check("ffn_norm predictor: manifest 1.6 (as before 1.8) without predictor.input",
              man["version_minor"] == 6 and "input" not in man["predictor"], str(man["predictor"]))
        j, lg = generate(wrong, "--select", "predictor:0", npy=os.path.join(work, "w.npy"))
        if "error" in j:
            check("ffn_norm predictor:0 runs", False, j["error"])
        else:
            toks = prompt + j["generated"][:-1]
            on_norm = ref.forward(cfg, t, toks, predictor_mask(t, False))[n - 1:]
            on_resid = ref.forward(cfg, t, toks, predictor_mask(t, True))[n - 1:]
            e_norm, e_resid = rel_err(lg, on_norm), rel_err(lg, on_resid)
            check("ffn_norm predictor:0 computes the reference masked on the FFN's input (%.2e) and not the one "
                  "masked on the residual (%.2e)" % (e_norm, e_resid), e_norm <= 1e-4 and e_resid > 1e-2)

    j, _ = generate(img, "--select", "predictor")
    if "error" in j:
        check("--select predictor (calibrated) runs", False, j["error"])
    else:
        p = j.get("predictor", {})
        print("  --select predictor (calibrated on the residual scores): recall %s, precision %s, %s predicted per "
              "layer-token of %d, agreeing prefix %s" % (p.get("recall"), p.get("precision"),
                                                         p.get("predicted_per_layer_token"),
                                                         cfg["intermediate_size"], p.get("agreeing_prefix")))
        check("--select predictor reports recall and precision in (0, 1]",
              0 < p.get("recall", 0) <= 1 and 0 < p.get("precision", 0) <= 1, str(p))

    powerinfer_gguf(ck, cfg, t, img)

    c.configs_refused(ck, [("bamboo with hidden_act silu", {"hidden_act": "silu"}, ["bamboo", "silu"])])
    plain = c.make_checkpoint("make_opt_checkpoint.py", "opt")
    c.refused("pack --predictor CHECKPOINT without predictor tensors",
              [L, "pack", "--model", ck, "--predictor", plain, "--out", os.path.join(work, "x.nlw"), "-q"],
              "model.safetensors", ["holds no predictor"])

    def drop_input(m):
        del m["predictor"]["input"]
    c.refused("a manifest whose predictor.input was removed (image id)",
              [R, "generate", "--image", c.edited_manifest(img, drop_input), "--prompt-tokens", "1,2", "--steps", "1"],
              "bad.nlw.json", ["id"])

    def minor7(m):
        m["version_minor"] = 7
    c.refused("predictor.input in a 1.7 manifest",
              [R, "generate", "--image", c.edited_manifest(img, minor7), "--prompt-tokens", "1,2", "--steps", "1"],
              "bad.nlw.json", ["predictor.input"])
finally:
    shutil.rmtree(work, ignore_errors=True)
sys.exit(c.summary("check_turbosparse"))
