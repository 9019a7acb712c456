#!/usr/bin/env python3
"""A tiny pure-PyTorch Phi with Hugging Face module names (model.layers[i].input_layernorm, .self_attn.{q_proj,
k_proj, v_proj, dense}, .mlp.fc1 / activation_fn / fc2, model.final_layernorm, lm_head with a bias, as
transformers' modeling_phi.py PhiForCausalLM: parallel attention + MLP on one LayerNorm, partial rotate_half RoPE),
loading a Hugging Face folder (config.json + model.safetensors or a sharded checkpoint; F32, F16 or BF16 read as
float32), such as tests/make_phi_checkpoint.py writes. Test support for profiler/python/trace_hooks.py, whose
find_ffns takes the Phi MLP (a module with fc1 and activation_fn) without needing transformers."""
import math
import os
import sys

import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hf_phi_reference import check_config, load, rotary_dims  # noqa: E402  (the numpy reference's reader)


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat([-x[..., h:], x[..., :h]], dim=-1)


class PhiAttention(nn.Module):
    def __init__(self, c):
        super().__init__()
        d = c["hidden_size"]
        self.nh = c["num_attention_heads"]
        self.hd = d // self.nh
        self.rot, self.theta = rotary_dims(c), c.get("rope_theta", 10000.0)
        self.q_proj, self.k_proj = nn.Linear(d, d), nn.Linear(d, d)
        self.v_proj, self.dense = nn.Linear(d, d), nn.Linear(d, d)

    def forward(self, x):
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.nh, self.hd).transpose(1, 2)
        k = self.k_proj(x).view(B, T, self.nh, self.hd).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.nh, self.hd).transpose(1, 2)
        inv = 1.0 / (self.theta ** (torch.arange(0, self.rot, 2, dtype=torch.float32) / self.rot))
        ang = torch.outer(torch.arange(T, dtype=torch.float32), inv)
        emb = torch.cat([ang, ang], dim=-1).to(x.device)
        cos, sin = emb.cos(), emb.sin()
        r = self.rot  # RoPE on the first r dims of each head; the rest pass unchanged
        q = torch.cat([q[..., :r] * cos + rotate_half(q[..., :r]) * sin, q[..., r:]], dim=-1)
        k = torch.cat([k[..., :r] * cos + rotate_half(k[..., :r]) * sin, k[..., r:]], dim=-1)
        s = q @ k.transpose(-1, -2) / math.sqrt(self.hd)
        s = s + torch.triu(torch.full((T, T), float("-inf"), device=x.device), 1)
        o = torch.softmax(s, dim=-1) @ v
        return self.dense(o.transpose(1, 2).reshape(B, T, -1))


class PhiMLP(nn.Module):
    def __init__(self, c):
        super().__init__()
        d, h = c["hidden_size"], c["intermediate_size"]
        self.fc1, self.fc2 = nn.Linear(d, h), nn.Linear(h, d)
        self.activation_fn = nn.GELU(approximate="tanh")  # gelu_new == gelu_pytorch_tanh

    def forward(self, x):
        return self.fc2(self.activation_fn(self.fc1(x)))


class PhiDecoderLayer(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.input_layernorm = nn.LayerNorm(c["hidden_size"], eps=c.get("layer_norm_eps", 1e-5))
        self.self_attn, self.mlp = PhiAttention(c), PhiMLP(c)

    def forward(self, x):
        h = self.input_layernorm(x)
        return x + self.self_attn(h) + self.mlp(h)


class PhiModel(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.embed_tokens = nn.Embedding(c["vocab_size"], c["hidden_size"])
        self.layers = nn.ModuleList(PhiDecoderLayer(c) for _ in range(c["num_hidden_layers"]))
        self.final_layernorm = nn.LayerNorm(c["hidden_size"], eps=c.get("layer_norm_eps", 1e-5))

    def forward(self, input_ids):
        x = self.embed_tokens(input_ids)
        for layer in self.layers:
            x = layer(x)
        return self.final_layernorm(x)


class PhiForCausalLM(nn.Module):
    def __init__(self, c):
        super().__init__()
        check_config(c)
        self.config, self.model = c, PhiModel(c)
        self.lm_head = nn.Linear(c["hidden_size"], c["vocab_size"])

    def forward(self, input_ids):
        """Logits [B, T, vocab] (a tensor, as tests/torch_llama.py's model returns)."""
        return self.lm_head(self.model(input_ids))


def load_phi(folder):
    cfg, tensors = load(folder)
    m = PhiForCausalLM(cfg)
    state = {k: torch.from_numpy(v.copy()) for k, v in tensors.items()}
    if cfg.get("tie_word_embeddings", False):  # as transformers: a tied head's weight is the token embedding
        state["lm_head.weight"] = state["model.embed_tokens.weight"]
    m.load_state_dict(state, strict=True)
    return m.eval()
