#!/usr/bin/env python3
"""A tiny pure-PyTorch OPT with Hugging Face module names (model.decoder.layers[i].fc1 / activation_fn / fc2, ...,
as transformers' modeling_opt.py: pre-LayerNorm, word_embed_proj_dim == hidden_size), loading a Hugging Face
folder (config.json + model.safetensors or a sharded checkpoint; F32, F16 or BF16 read as float32), such as
tests/make_opt_checkpoint.py writes. Test support for profiler/python/trace_hooks.py, whose find_ffns takes the
OPT-style FFN (a module with fc1 and activation_fn) without needing transformers."""
import os
import sys

import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hf_opt_reference import POSITION_OFFSET, check_config, load  # noqa: E402  (the numpy reference's reader)


class OPTLearnedPositionalEmbedding(nn.Embedding):
    """Position p reads row p + 2 (OPT's offset)."""

    def __init__(self, num_positions, dim):
        super().__init__(num_positions + POSITION_OFFSET, dim)
        self.offset = POSITION_OFFSET

    def forward(self, position_ids):
        return super().forward(position_ids + self.offset)


class OPTAttention(nn.Module):
    def __init__(self, c):
        super().__init__()
        d = c["hidden_size"]
        self.nh = c["num_attention_heads"]
        self.hd = d // self.nh
        self.scaling = self.hd ** -0.5
        self.q_proj, self.k_proj = nn.Linear(d, d), nn.Linear(d, d)
        self.v_proj, self.out_proj = nn.Linear(d, d), nn.Linear(d, d)

    def forward(self, x):
        B, T, _ = x.shape
        q = (self.q_proj(x) * self.scaling).view(B, T, self.nh, self.hd).transpose(1, 2)
        k = self.k_proj(x).view(B, T, self.nh, self.hd).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.nh, self.hd).transpose(1, 2)
        s = q @ k.transpose(-1, -2) + torch.triu(torch.full((T, T), float("-inf"), device=x.device), 1)
        o = torch.softmax(s, dim=-1) @ v
        return self.out_proj(o.transpose(1, 2).reshape(B, T, -1))


class OPTDecoderLayer(nn.Module):
    def __init__(self, c):
        super().__init__()
        d = c["hidden_size"]
        self.self_attn = OPTAttention(c)
        self.self_attn_layer_norm = nn.LayerNorm(d, eps=1e-5)
        self.fc1, self.fc2 = nn.Linear(d, c["ffn_dim"]), nn.Linear(c["ffn_dim"], d)
        self.activation_fn = nn.ReLU()
        self.final_layer_norm = nn.LayerNorm(d, eps=1e-5)

    def forward(self, x):
        x = x + self.self_attn(self.self_attn_layer_norm(x))
        return x + self.fc2(self.activation_fn(self.fc1(self.final_layer_norm(x))))


class OPTDecoder(nn.Module):
    def __init__(self, c):
        super().__init__()
        d = c["hidden_size"]
        self.embed_tokens = nn.Embedding(c["vocab_size"], d)
        self.embed_positions = OPTLearnedPositionalEmbedding(c["max_position_embeddings"], d)
        self.layers = nn.ModuleList(OPTDecoderLayer(c) for _ in range(c["num_hidden_layers"]))
        self.final_layer_norm = nn.LayerNorm(d, eps=1e-5)

    def forward(self, input_ids):
        pos = torch.arange(input_ids.shape[1], device=input_ids.device).unsqueeze(0)
        x = self.embed_tokens(input_ids) + self.embed_positions(pos)
        for layer in self.layers:
            x = layer(x)
        return self.final_layer_norm(x)


class OPTModel(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.decoder = OPTDecoder(c)


class OPTForCausalLM(nn.Module):
    def __init__(self, c):
        super().__init__()
        check_config(c)
        self.config, self.model = c, OPTModel(c)
        self.lm_head = nn.Linear(c["hidden_size"], c["vocab_size"], bias=False)

    def forward(self, input_ids):
        """Logits [B, T, vocab] (a tensor, as tests/torch_llama.py's model returns)."""
        return self.lm_head(self.model.decoder(input_ids))


def load_opt(folder):
    cfg, tensors = load(folder)
    m = OPTForCausalLM(cfg)
    state = {k: torch.from_numpy(v.copy()) for k, v in tensors.items()}
    if cfg.get("tie_word_embeddings", True):  # as transformers: a tied head is the token embedding
        state["lm_head.weight"] = state["model.decoder.embed_tokens.weight"]
    m.load_state_dict(state, strict=True)
    return m.eval()
