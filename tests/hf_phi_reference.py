#!/usr/bin/env python3
"""Independent Hugging Face-convention Phi forward in numpy (transformers' modeling_phi.py, PhiForCausalLM as
Phi-2: x + attention(LN x) + MLP(LN x) on the same LayerNorm output, partial rotate_half RoPE on the first
int(head_dim * partial_rotary_factor) dims of each head, gelu_new FFN, lm_head with a bias), computed in float64.

Usage: hf_phi_reference.py CHECKPOINT_DIR TOKEN [TOKEN ...]
Prints a JSON list with the float32 logits of every position. Reads model.safetensors or a sharded checkpoint
(with tests/hf_opt_reference.py's reader); F32, F16 and BF16 tensors. Test support for Phi checkpoints such as
tests/make_phi_checkpoint.py writes; activations() gives the FFN activations gelu_new(fc1 x + b1) per layer, whose
|a| > X masks trace_hooks.py records with rule abs>X.
"""
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hf_opt_reference import layer_norm, linear, load  # noqa: E402  (the single/sharded reader, helpers)


def rotary_dims(cfg):
    """The dims of each head RoPE turns: int(head_dim * partial_rotary_factor)."""
    return int(cfg["hidden_size"] // cfg["num_attention_heads"] * cfg.get("partial_rotary_factor", 0.5))


def check_config(cfg):
    if cfg.get("qk_layernorm", False):
        raise ValueError("Phi with qk_layernorm is not supported")
    if cfg.get("hidden_act", "gelu_new") not in ("gelu_new", "gelu_pytorch_tanh"):
        raise ValueError(f"Phi hidden_act '{cfg.get('hidden_act')}': only gelu_new / gelu_pytorch_tanh are supported")
    nh = cfg["num_attention_heads"]
    if (cfg.get("num_key_value_heads") or nh) != nh:
        raise ValueError("Phi with num_key_value_heads != num_attention_heads is not supported")
    rot = rotary_dims(cfg)
    if rot < 2 or rot % 2 or rot > cfg["hidden_size"] // nh:
        raise ValueError(f"partial_rotary_factor gives {rot} rotary dims: need an even count from 2 to head_dim")


def gelu_new(v):
    return 0.5 * v * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (v + 0.044715 * v ** 3)))


def rope(x, cos, sin):
    """rotate_half RoPE on the first cos.shape[-1] dims of x [heads, T, head_dim]; the rest pass unchanged."""
    r = cos.shape[-1]
    xr, xp = x[..., :r], x[..., r:]
    half = np.concatenate([-xr[..., r // 2:], xr[..., :r // 2]], axis=-1)
    return np.concatenate([xr * cos + half * sin, xp], axis=-1)


def run(cfg, t, tokens):
    """(float64 hidden states after the final LayerNorm [T, dim], per layer gelu_new(fc1 x + b1) [T, ffn])."""
    check_config(cfg)
    dim, nh = cfg["hidden_size"], cfg["num_attention_heads"]
    hd, T, eps = dim // nh, len(tokens), cfg.get("layer_norm_eps", 1e-5)
    rot, theta = rotary_dims(cfg), cfg.get("rope_theta", 10000.0)
    inv = 1.0 / theta ** (np.arange(0, rot, 2) / rot)
    ang = np.outer(np.arange(T), inv)
    emb = np.concatenate([ang, ang], axis=-1)
    cos, sin = np.cos(emb), np.sin(emb)
    x = t["model.embed_tokens.weight"][tokens].astype(np.float64)
    acts = []
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        h = layer_norm(x, t, p + "input_layernorm", eps)
        q = linear(h, t, p + "self_attn.q_proj").reshape(T, nh, hd).transpose(1, 0, 2)
        k = linear(h, t, p + "self_attn.k_proj").reshape(T, nh, hd).transpose(1, 0, 2)
        v = linear(h, t, p + "self_attn.v_proj").reshape(T, nh, hd).transpose(1, 0, 2)
        q, k = rope(q, cos, sin), rope(k, cos, sin)
        s = q @ k.transpose(0, 2, 1) / np.sqrt(hd) + np.triu(np.full((T, T), -np.inf), 1)
        s = np.exp(s - s.max(-1, keepdims=True))
        s /= s.sum(-1, keepdims=True)
        attn = linear((s @ v).transpose(1, 0, 2).reshape(T, dim), t, p + "self_attn.dense")
        a = gelu_new(linear(h, t, p + "mlp.fc1"))
        acts.append(a)
        x = x + attn + linear(a, t, p + "mlp.fc2")
    return layer_norm(x, t, "model.final_layernorm", eps), acts


def forward(cfg, t, tokens):
    """float32 logits [T, vocab]."""
    x, _ = run(cfg, t, tokens)
    head = t["model.embed_tokens.weight"] if cfg.get("tie_word_embeddings", False) else t["lm_head.weight"]
    return (x @ head.T.astype(np.float64) + t["lm_head.bias"]).astype(np.float32)


def activations(cfg, t, tokens):
    """Per layer, float32 [T, ffn]: gelu_new(fc1 x + b1), the FFN activations."""
    return [a.astype(np.float32) for a in run(cfg, t, tokens)[1]]


if __name__ == "__main__":
    cfg, t = load(sys.argv[1])
    print(json.dumps(forward(cfg, t, [int(a) for a in sys.argv[2:]]).tolist()))
