#!/usr/bin/env python3
"""Independent Hugging Face-convention Llama forward in numpy (rotate_half RoPE, as transformers' LlamaModel), and
Mistral's (model_type mistral: the same block with sliding-window attention, key j visible from query i when
i - sliding_window < j <= i, as transformers' masking_utils.sliding_window_overlay), and Bamboo's (TurboSparse-
Mistral, PowerInfer's modeling_bamboo.py: Mistral whose BambooMLP applies hidden_act relu to both projections, dReLU).
forward's `ffn_mask(layer, residual, h)`, when given, returns a 0/1 mask [T][hidden] multiplied into the FFN's
activations (a predictor's choice: `residual` is the stream entering the FFN before its norm, `h` the FFN's input).

Usage: hf_llama_reference.py CHECKPOINT_DIR TOKEN [TOKEN ...]
Prints a JSON list with the float32 logits of every position. Used by tests/test_model_formats.cpp to prove
that the toolkit's safetensors writer/reader follow the real HF layout, not only their own round trip.
"""
import json
import struct
import sys

import numpy as np


def load(d):
    cfg = json.load(open(f"{d}/config.json"))
    raw = open(f"{d}/model.safetensors", "rb").read()
    (n,) = struct.unpack("<Q", raw[:8])
    hdr = json.loads(raw[8:8 + n])
    dt = {"F32": np.float32, "F16": np.float16}
    t = {}
    for k, v in hdr.items():
        if k == "__metadata__":
            continue
        b, e = v["data_offsets"]
        buf = raw[8 + n + b:8 + n + e]
        if v["dtype"] == "BF16":
            a = (np.frombuffer(buf, np.uint16).astype(np.uint32) << 16).view(np.float32)
        else:
            a = np.frombuffer(buf, dt[v["dtype"]]).astype(np.float32)
        t[k] = a.reshape(v["shape"])
    return cfg, t


def rmsnorm(x, g, eps):
    return g * (x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps))


def rotate_half(x):
    h = x.shape[-1] // 2
    return np.concatenate([-x[..., h:], x[..., :h]], axis=-1)


def forward(cfg, t, tokens, ffn_mask=None):
    dim, nh = cfg["hidden_size"], cfg["num_attention_heads"]
    nkv = cfg.get("num_key_value_heads", nh)
    hd, eps = dim // nh, cfg.get("rms_norm_eps", 1e-6)
    theta = cfg.get("rope_theta", 10000.0)
    T = len(tokens)
    inv = 1.0 / (theta ** (np.arange(0, hd, 2, dtype=np.float32) / hd))
    ang = np.outer(np.arange(T, dtype=np.float32), inv)
    emb = np.concatenate([ang, ang], axis=-1)
    cos, sin = np.cos(emb), np.sin(emb)
    x = t["model.embed_tokens.weight"][tokens].astype(np.float64)
    # The gated MLP of modeling_llama.py, act_fn(gate x) * (up x), with the sparse families' activations: fatrelu
    # (ProSparse; vLLM's FatreluAndMul: gate x where gate x > hidden_act_param, else 0) and drelu (TurboSparse:
    # relu(gate x) * relu(up x)).
    name = cfg.get("hidden_act", "silu")
    if cfg.get("model_type") == "bamboo":
        assert name == "relu", name
        name = "drelu"
    t_fat = cfg.get("hidden_act_param", 0.0)
    act = {"silu": lambda v: v / (1 + np.exp(-v)), "relu": lambda v: np.maximum(v, 0),
           "fatrelu": lambda v: np.where(v > t_fat, v, 0.0), "drelu": lambda v: np.maximum(v, 0)}[name]
    up_act = (lambda v: np.maximum(v, 0)) if name == "drelu" else (lambda v: v)
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        h = rmsnorm(x, t[p + "input_layernorm.weight"], eps)
        q = (h @ t[p + "self_attn.q_proj.weight"].T).reshape(T, nh, hd).transpose(1, 0, 2)
        k = (h @ t[p + "self_attn.k_proj.weight"].T).reshape(T, nkv, hd).transpose(1, 0, 2)
        v = (h @ t[p + "self_attn.v_proj.weight"].T).reshape(T, nkv, hd).transpose(1, 0, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        k = np.repeat(k, nh // nkv, axis=0)
        v = np.repeat(v, nh // nkv, axis=0)
        s = q @ k.transpose(0, 2, 1) / np.sqrt(hd)
        s = s + np.triu(np.full((T, T), -np.inf), 1)
        w = cfg.get("sliding_window") if cfg.get("model_type") in ("mistral", "bamboo") else None
        if w:
            s = s + np.tril(np.full((T, T), -np.inf), -w)  # j <= i - w masked
        s = np.exp(s - s.max(-1, keepdims=True))
        s /= s.sum(-1, keepdims=True)
        o = (s @ v).transpose(1, 0, 2).reshape(T, dim)
        x = x + o @ t[p + "self_attn.o_proj.weight"].T
        h = rmsnorm(x, t[p + "post_attention_layernorm.weight"], eps)
        g = act(h @ t[p + "mlp.gate_proj.weight"].T) * up_act(h @ t[p + "mlp.up_proj.weight"].T)
        if ffn_mask is not None:
            g = g * ffn_mask(i, x, h)
        x = x + g @ t[p + "mlp.down_proj.weight"].T
    x = rmsnorm(x, t["model.norm.weight"], eps)
    head = t["model.embed_tokens.weight"] if cfg.get("tie_word_embeddings", False) else t["lm_head.weight"]
    return (x @ head.T).astype(np.float32)


if __name__ == "__main__":
    cfg, t = load(sys.argv[1])
    print(json.dumps(forward(cfg, t, [int(a) for a in sys.argv[2:]]).tolist()))
