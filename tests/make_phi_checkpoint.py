#!/usr/bin/env python3
"""Writes a deterministic random-weight Phi checkpoint in Hugging Face form (model_type phi, PhiForCausalLM as
Phi-2: parallel attention + MLP block on one LayerNorm, partial rotate_half RoPE, biases everywhere, gelu_new FFN,
lm_head with a bias): config.json plus model.safetensors, or with --shards N > 1 the shards
model-0000K-of-0000N.safetensors and model.safetensors.index.json, as transformers' save_pretrained lays them out.
numpy only; the same arguments give byte-identical files.

Usage: make_phi_checkpoint.py OUT_DIR [--dim 64] [--ffn 256] [--layers 2] [--heads 4] [--vocab 512]
                              [--max-pos 128] [--rotary 0.5] [--dtype f32|f16|bf16] [--shards N] [--seed 1]
                              [--tie/--no-tie]

--rotary is partial_rotary_factor: RoPE turns the first int(head_dim * factor) dims of each head, which must be
even and at least 2. The weights are scaled as tests/make_opt_checkpoint.py's: linear weights N(0, in**-0.5),
biases N(0, 0.02) but fc1's N(-0.1, 0.1), LayerNorm weights 1 + N(0, 0.1) and biases N(0, 0.05), token embeddings
N(0, 0.1), lm_head.weight N(0, dim**-0.5) and lm_head.bias N(0, 0.02). --tie (Phi-2 does not) omits
lm_head.weight but still writes lm_head.bias. Test support for the Phi readers, with tests/hf_phi_reference.py
(numpy forward) and tests/torch_phi.py (torch module tree).
"""
import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_opt_checkpoint import DTYPES, encode, write_safetensors  # noqa: E402  (the safetensors writer)


def tensors(a, rng):
    """[(name, float32 array)] in file order."""
    out = []

    def normal(name, shape, mean, std):
        out.append((name, (mean + std * rng.standard_normal(shape)).astype(np.float32)))

    def linear(name, n_out, n_in):
        normal(name + ".weight", (n_out, n_in), 0.0, n_in ** -0.5)
        normal(name + ".bias", (n_out,), 0.0, 0.02)

    def layer_norm(name):
        normal(name + ".weight", (a.dim,), 1.0, 0.1)
        normal(name + ".bias", (a.dim,), 0.0, 0.05)

    normal("model.embed_tokens.weight", (a.vocab, a.dim), 0.0, 0.1)
    for i in range(a.layers):
        p = f"model.layers.{i}."
        layer_norm(p + "input_layernorm")
        for proj in ("q_proj", "k_proj", "v_proj", "dense"):
            linear(p + "self_attn." + proj, a.dim, a.dim)
        normal(p + "mlp.fc1.weight", (a.ffn, a.dim), 0.0, a.dim ** -0.5)
        normal(p + "mlp.fc1.bias", (a.ffn,), -0.1, 0.1)
        linear(p + "mlp.fc2", a.dim, a.ffn)
    layer_norm("model.final_layernorm")
    if not a.tie:
        normal("lm_head.weight", (a.vocab, a.dim), 0.0, a.dim ** -0.5)
    normal("lm_head.bias", (a.vocab,), 0.0, 0.02)
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("out_dir")
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--ffn", type=int, default=256)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--vocab", type=int, default=512)
    p.add_argument("--max-pos", type=int, default=128)
    p.add_argument("--rotary", type=float, default=0.5, help="partial_rotary_factor")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="f32")
    p.add_argument("--shards", type=int, default=1)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--tie", action=argparse.BooleanOptionalAction, default=False,
                   help="tie lm_head.weight to embed_tokens (lm_head.bias is still written); default --no-tie, "
                        "as Phi-2")
    a = p.parse_args()
    if a.dim % a.heads:
        p.error("--dim must be a multiple of --heads")
    rot = int(a.dim // a.heads * a.rotary)
    if rot < 2 or rot % 2 or rot > a.dim // a.heads:
        p.error(f"--rotary {a.rotary} gives {rot} rotary dims of head_dim {a.dim // a.heads}: "
                "need an even count from 2 to head_dim")
    st_dtype, torch_dtype = DTYPES[a.dtype]
    items = [(n, st_dtype, x.shape, encode(x, st_dtype)) for n, x in tensors(a, np.random.default_rng(a.seed))]
    if not 1 <= a.shards <= len(items):
        p.error(f"--shards must be 1..{len(items)} (the tensor count)")

    os.makedirs(a.out_dir, exist_ok=True)
    cfg = {"model_type": "phi", "architectures": ["PhiForCausalLM"], "hidden_size": a.dim,
           "intermediate_size": a.ffn, "num_hidden_layers": a.layers, "num_attention_heads": a.heads,
           "num_key_value_heads": a.heads, "vocab_size": a.vocab, "max_position_embeddings": a.max_pos,
           "partial_rotary_factor": a.rotary, "rope_theta": 10000.0, "layer_norm_eps": 1e-5,
           "hidden_act": "gelu_new", "qk_layernorm": False, "tie_word_embeddings": a.tie,
           "torch_dtype": torch_dtype, "bos_token_id": 1, "eos_token_id": 2}
    with open(os.path.join(a.out_dir, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")
    if a.shards == 1:
        write_safetensors(os.path.join(a.out_dir, "model.safetensors"), items)
        return
    # Contiguous runs of tensors in file order, as even in count as they divide.
    names = [f"model-{k + 1:05d}-of-{a.shards:05d}.safetensors" for k in range(a.shards)]
    shard_of = [i * a.shards // len(items) for i in range(len(items))]
    for k, name in enumerate(names):
        write_safetensors(os.path.join(a.out_dir, name), [it for it, s in zip(items, shard_of) if s == k])
    index = {"metadata": {"total_size": sum(len(it[3]) for it in items)},
             "weight_map": {it[0]: names[s] for it, s in zip(items, shard_of)}}
    with open(os.path.join(a.out_dir, "model.safetensors.index.json"), "w") as f:
        json.dump(index, f, indent=2)
        f.write("\n")


if __name__ == "__main__":
    main()
