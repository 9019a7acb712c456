#!/usr/bin/env python3
"""Independent Hugging Face-convention OPT forward in numpy (transformers' modeling_opt.py, OPTForCausalLM with
do_layer_norm_before, word_embed_proj_dim == hidden_size, ReLU FFN), computed in float64.

Usage: hf_opt_reference.py CHECKPOINT_DIR TOKEN [TOKEN ...]
Prints a JSON list with the float32 logits of every position. Reads model.safetensors (with
tests/hf_llama_reference.py's reader) or a sharded checkpoint (model.safetensors.index.json); F32, F16 and BF16
tensors. Test support for OPT checkpoints such as tests/make_opt_checkpoint.py writes; firing() gives the ReLU
masks (fc1 x + b1 > 0) per layer, the neurons trace_hooks.py records with rule relu>0.
"""
import json
import os
import struct
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_llama_reference  # noqa: E402  (the single-file safetensors reader)

POSITION_OFFSET = 2  # OPTLearnedPositionalEmbedding: position p reads row p + 2


def read_shard(path):
    """{name: float32 array} of one safetensors file."""
    raw = open(path, "rb").read()
    (n,) = struct.unpack("<Q", raw[:8])
    t = {}
    for k, v in json.loads(raw[8:8 + n]).items():
        if k == "__metadata__":
            continue
        b, e = v["data_offsets"]
        buf = raw[8 + n + b:8 + n + e]
        if v["dtype"] == "BF16":
            a = (np.frombuffer(buf, "<u2").astype(np.uint32) << 16).view(np.float32)
        else:
            a = np.frombuffer(buf, {"F32": "<f4", "F16": "<f2"}[v["dtype"]]).astype(np.float32)
        t[k] = a.reshape(v["shape"])
    return t


def load(d):
    """(config, {name: float32 array}) of a single-file or sharded checkpoint folder."""
    index = os.path.join(d, "model.safetensors.index.json")
    if not os.path.exists(index):
        return hf_llama_reference.load(d)
    cfg = json.load(open(os.path.join(d, "config.json")))
    weight_map = json.load(open(index))["weight_map"]
    t = {}
    for shard in sorted(set(weight_map.values())):
        for k, v in read_shard(os.path.join(d, shard)).items():
            if weight_map.get(k) != shard:
                raise ValueError(f"{d}: {k} is in {shard}, the index says {weight_map.get(k)}")
            t[k] = v
    missing = set(weight_map) - set(t)
    if missing:
        raise ValueError(f"{d}: tensors the index lists are in no shard: {sorted(missing)}")
    return cfg, t


def check_config(cfg):
    dim = cfg["hidden_size"]
    if not cfg.get("do_layer_norm_before", True) or cfg.get("word_embed_proj_dim", dim) != dim \
            or cfg.get("activation_function", "relu") != "relu":
        raise ValueError("only pre-LayerNorm OPT with word_embed_proj_dim == hidden_size and ReLU is supported")


def layer_norm(x, t, name, eps=1e-5):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * t[name + ".weight"] + t[name + ".bias"]


def linear(x, t, name):
    return x @ t[name + ".weight"].T.astype(np.float64) + t[name + ".bias"]


def run(cfg, t, tokens):
    """(float64 hidden states after the final LayerNorm [T, dim], per layer fc1 x + b1 [T, ffn])."""
    check_config(cfg)
    dim, nh = cfg["hidden_size"], cfg["num_attention_heads"]
    hd, T = dim // nh, len(tokens)
    x = t["model.decoder.embed_tokens.weight"][tokens].astype(np.float64) \
        + t["model.decoder.embed_positions.weight"][np.arange(T) + POSITION_OFFSET]
    pre = []
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.decoder.layers.{i}."
        h = layer_norm(x, t, p + "self_attn_layer_norm")
        q = (linear(h, t, p + "self_attn.q_proj") * hd ** -0.5).reshape(T, nh, hd).transpose(1, 0, 2)
        k = linear(h, t, p + "self_attn.k_proj").reshape(T, nh, hd).transpose(1, 0, 2)
        v = linear(h, t, p + "self_attn.v_proj").reshape(T, nh, hd).transpose(1, 0, 2)
        s = q @ k.transpose(0, 2, 1) + np.triu(np.full((T, T), -np.inf), 1)
        s = np.exp(s - s.max(-1, keepdims=True))
        s /= s.sum(-1, keepdims=True)
        x = x + linear((s @ v).transpose(1, 0, 2).reshape(T, dim), t, p + "self_attn.out_proj")
        a = linear(layer_norm(x, t, p + "final_layer_norm"), t, p + "fc1")
        pre.append(a)
        x = x + linear(np.maximum(a, 0.0), t, p + "fc2")
    return layer_norm(x, t, "model.decoder.final_layer_norm"), pre


def forward(cfg, t, tokens):
    """float32 logits [T, vocab]."""
    x, _ = run(cfg, t, tokens)
    head = t["model.decoder.embed_tokens.weight"] if cfg.get("tie_word_embeddings", True) else t["lm_head.weight"]
    return (x @ head.T.astype(np.float64)).astype(np.float32)


def firing(cfg, t, tokens):
    """Per layer, bool [T, ffn]: fc1 x + b1 > 0 (the ReLU neurons that fire)."""
    return [a > 0 for a in run(cfg, t, tokens)[1]]


if __name__ == "__main__":
    cfg, t = load(sys.argv[1])
    print(json.dumps(forward(cfg, t, [int(a) for a in sys.argv[2:]]).tolist()))
