#!/usr/bin/env python3
"""A tiny pure-PyTorch Llama with Hugging Face module names (model.layers[i].mlp.gate_proj / act_fn, ...), loading
a Hugging Face folder written by `nl-profile convert` (config.json + model.safetensors, rotate_half RoPE). Test
support for profiler/python/trace_hooks.py, which needs transformers-style module trees but not transformers."""
import json
import math
import os
import sys

import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hf_llama_reference import load  # noqa: E402  (the safetensors reader shared with the numpy reference)


class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.ones(dim)), eps

    def forward(self, x):
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat([-x[..., h:], x[..., :h]], dim=-1)


class Attention(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.nh, self.nkv = c["num_attention_heads"], c.get("num_key_value_heads", c["num_attention_heads"])
        self.hd = c["hidden_size"] // self.nh
        self.theta = c.get("rope_theta", 10000.0)
        d = c["hidden_size"]
        self.q_proj = nn.Linear(d, self.nh * self.hd, bias=False)
        self.k_proj = nn.Linear(d, self.nkv * self.hd, bias=False)
        self.v_proj = nn.Linear(d, self.nkv * self.hd, bias=False)
        self.o_proj = nn.Linear(self.nh * self.hd, d, bias=False)

    def forward(self, x):
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.nh, self.hd).transpose(1, 2)
        k = self.k_proj(x).view(B, T, self.nkv, self.hd).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.nkv, self.hd).transpose(1, 2)
        inv = 1.0 / (self.theta ** (torch.arange(0, self.hd, 2, dtype=torch.float32) / self.hd))
        ang = torch.outer(torch.arange(T, dtype=torch.float32), inv)
        emb = torch.cat([ang, ang], dim=-1)
        cos, sin = emb.cos(), emb.sin()
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        k = k.repeat_interleave(self.nh // self.nkv, dim=1)
        v = v.repeat_interleave(self.nh // self.nkv, dim=1)
        s = q @ k.transpose(-1, -2) / math.sqrt(self.hd)
        s = s + torch.triu(torch.full((T, T), float("-inf")), 1)
        o = torch.softmax(s, dim=-1) @ v
        return self.o_proj(o.transpose(1, 2).reshape(B, T, -1))


class MLP(nn.Module):
    def __init__(self, c):
        super().__init__()
        d, h = c["hidden_size"], c["intermediate_size"]
        self.gate_proj = nn.Linear(d, h, bias=False)
        self.up_proj = nn.Linear(d, h, bias=False)
        self.down_proj = nn.Linear(h, d, bias=False)
        name, t = c.get("hidden_act", "silu"), c.get("hidden_act_param", 0.0)
        # fatrelu as ProSparse / vLLM's FatreluAndMul (gate x where it exceeds t, else 0); drelu as TurboSparse
        # (relu on gate and up).
        self.act_fn = {"silu": nn.SiLU(), "relu": nn.ReLU(), "drelu": nn.ReLU(),
                       "fatrelu": nn.Threshold(t, 0.0)}[name]
        self.up_act = nn.ReLU() if name == "drelu" else nn.Identity()

    def forward(self, x):
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_act(self.up_proj(x)))


class Layer(nn.Module):
    def __init__(self, c):
        super().__init__()
        eps = c.get("rms_norm_eps", 1e-6)
        self.input_layernorm, self.post_attention_layernorm = RMSNorm(c["hidden_size"], eps), RMSNorm(c["hidden_size"], eps)
        self.self_attn, self.mlp = Attention(c), MLP(c)

    def forward(self, x):
        x = x + self.self_attn(self.input_layernorm(x))
        return x + self.mlp(self.post_attention_layernorm(x))


class Inner(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.embed_tokens = nn.Embedding(c["vocab_size"], c["hidden_size"])
        self.layers = nn.ModuleList(Layer(c) for _ in range(c["num_hidden_layers"]))
        self.norm = RMSNorm(c["hidden_size"], c.get("rms_norm_eps", 1e-6))


class LlamaForCausalLM(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.config, self.model = c, Inner(c)
        self.lm_head = nn.Linear(c["hidden_size"], c["vocab_size"], bias=False)

    def forward(self, input_ids):
        x = self.model.embed_tokens(input_ids)
        for layer in self.model.layers:
            x = layer(x)
        return self.lm_head(self.model.norm(x))


def load_llama(folder):
    cfg, tensors = load(folder)
    m = LlamaForCausalLM(cfg)
    state = {k: torch.from_numpy(v.copy()) for k, v in tensors.items()}
    if "lm_head.weight" not in state:
        state["lm_head.weight"] = state["model.embed_tokens.weight"]
    m.load_state_dict(state, strict=True)
    return m.eval()
