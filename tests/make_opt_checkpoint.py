#!/usr/bin/env python3
"""Writes a deterministic random-weight OPT checkpoint in Hugging Face form (model_type opt, OPTForCausalLM with
do_layer_norm_before, word_embed_proj_dim == hidden_size, ReLU FFN): config.json plus model.safetensors, or with
--shards N > 1 the shards model-0000K-of-0000N.safetensors and model.safetensors.index.json, as transformers'
save_pretrained lays them out. numpy only; the same arguments give byte-identical files.

Usage: make_opt_checkpoint.py OUT_DIR [--dim 64] [--ffn 256] [--layers 2] [--heads 4] [--vocab 512]
                              [--max-pos 64] [--dtype f32|f16|bf16] [--shards N] [--seed 1] [--tie/--no-tie]

The weights make a healthy random net: linear weights N(0, in**-0.5), biases N(0, 0.02) but fc1's N(-0.1, 0.1)
(about half of the ReLU neurons off), LayerNorm weights 1 + N(0, 0.1) and biases N(0, 0.05), token embeddings
N(0, 0.1), learned positions N(0, 0.05) (max_pos + 2 rows: OPT's positions are offset by 2). Test support for the
OPT readers, with tests/hf_opt_reference.py (numpy forward) and tests/torch_opt.py (torch module tree).
"""
import argparse
import json
import os
import struct

import numpy as np

DTYPES = {"f32": ("F32", "float32"), "f16": ("F16", "float16"), "bf16": ("BF16", "bfloat16")}


class Init:
    """The random initialisers of the checkpoint writers (this one and make_phi_checkpoint.py): each call appends
    (name, float32 array) to `out`, in file order, drawing from `rng` in that order."""

    def __init__(self, rng, dim):
        self.rng, self.dim, self.out = rng, dim, []

    def normal(self, name, shape, mean, std):
        self.out.append((name, (mean + std * self.rng.standard_normal(shape)).astype(np.float32)))

    def linear(self, name, n_out, n_in):
        self.normal(name + ".weight", (n_out, n_in), 0.0, n_in ** -0.5)
        self.normal(name + ".bias", (n_out,), 0.0, 0.02)

    def layer_norm(self, name):
        self.normal(name + ".weight", (self.dim,), 1.0, 0.1)
        self.normal(name + ".bias", (self.dim,), 0.0, 0.05)


def tensors(a, rng):
    """[(name, float32 array)] in file order."""
    w = Init(rng, a.dim)
    normal, linear, layer_norm = w.normal, w.linear, w.layer_norm

    normal("model.decoder.embed_tokens.weight", (a.vocab, a.dim), 0.0, 0.1)
    normal("model.decoder.embed_positions.weight", (a.max_pos + 2, a.dim), 0.0, 0.05)
    for i in range(a.layers):
        p = f"model.decoder.layers.{i}."
        for proj in ("q_proj", "k_proj", "v_proj", "out_proj"):
            linear(p + "self_attn." + proj, a.dim, a.dim)
        layer_norm(p + "self_attn_layer_norm")
        normal(p + "fc1.weight", (a.ffn, a.dim), 0.0, a.dim ** -0.5)
        normal(p + "fc1.bias", (a.ffn,), -0.1, 0.1)
        linear(p + "fc2", a.dim, a.ffn)
        layer_norm(p + "final_layer_norm")
    layer_norm("model.decoder.final_layer_norm")
    if not a.tie:
        normal("lm_head.weight", (a.vocab, a.dim), 0.0, a.dim ** -0.5)
    return w.out


def encode(x, dtype):
    """Little-endian bytes of float32 array x as F32, F16 (IEEE half) or BF16 (round to nearest even)."""
    if dtype == "F32":
        return x.astype("<f4").tobytes()
    if dtype == "F16":
        return x.astype("<f2").tobytes()
    u = x.astype("<f4").view(np.uint32)
    return ((u + np.uint32(0x7FFF) + ((u >> 16) & np.uint32(1))) >> 16).astype("<u2").tobytes()


def write_safetensors(path, items):
    """items: [(name, dtype, shape, bytes)]. The header is padded with spaces to a multiple of 8 bytes."""
    header, off = {}, 0
    for name, dtype, shape, raw in items:
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [off, off + len(raw)]}
        off += len(raw)
    header["__metadata__"] = {"format": "pt"}
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        for *_, raw in items:
            f.write(raw)


def shape_parser(doc, max_pos, tie, tie_help):
    """The options both checkpoint writers take (shape, dtype, shards, seed, tied head)."""
    p = argparse.ArgumentParser(description=doc.split("\n")[0])
    p.add_argument("out_dir")
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--ffn", type=int, default=256)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--vocab", type=int, default=512)
    p.add_argument("--max-pos", type=int, default=max_pos)
    p.add_argument("--dtype", choices=sorted(DTYPES), default="f32")
    p.add_argument("--shards", type=int, default=1)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--tie", action=argparse.BooleanOptionalAction, default=tie, help=tie_help)
    return p


def encoded(p, a, tensors):
    """The tensors of `a`'s checkpoint as (name, dtype, shape, bytes), checked against --heads and --shards, and the
    config's torch_dtype."""
    if a.dim % a.heads:
        p.error("--dim must be a multiple of --heads")
    st_dtype, torch_dtype = DTYPES[a.dtype]
    items = [(n, st_dtype, x.shape, encode(x, st_dtype)) for n, x in tensors(a, np.random.default_rng(a.seed))]
    if not 1 <= a.shards <= len(items):
        p.error(f"--shards must be 1..{len(items)} (the tensor count)")
    return items, torch_dtype


def main():
    p = shape_parser(__doc__, 64, True, "tie lm_head to embed_tokens (default); --no-tie writes its own lm_head.weight")
    a = p.parse_args()
    items, torch_dtype = encoded(p, a, tensors)
    cfg = {"model_type": "opt", "architectures": ["OPTForCausalLM"], "hidden_size": a.dim, "ffn_dim": a.ffn,
           "num_hidden_layers": a.layers, "num_attention_heads": a.heads, "vocab_size": a.vocab,
           "max_position_embeddings": a.max_pos, "word_embed_proj_dim": a.dim, "do_layer_norm_before": True,
           "activation_function": "relu", "enable_bias": True, "layer_norm_elementwise_affine": True,
           "tie_word_embeddings": a.tie, "torch_dtype": torch_dtype, "bos_token_id": 2, "eos_token_id": 2,
           "pad_token_id": 1}
    write_checkpoint(a.out_dir, cfg, items, a.shards)


def write_checkpoint(out_dir, cfg, items, shards):
    """config.json, then the tensors `items` ([(name, dtype, shape, bytes)], file order) in model.safetensors or, for
    shards > 1, in contiguous runs (as even in count as they divide) over model-0000K-of-0000N.safetensors with
    model.safetensors.index.json, as transformers' save_pretrained lays a sharded checkpoint out."""
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")
    if shards == 1:
        write_safetensors(os.path.join(out_dir, "model.safetensors"), items)
        return
    names = [f"model-{k + 1:05d}-of-{shards:05d}.safetensors" for k in range(shards)]
    shard_of = [i * shards // len(items) for i in range(len(items))]
    for k, name in enumerate(names):
        write_safetensors(os.path.join(out_dir, name), [it for it, s in zip(items, shard_of) if s == k])
    index = {"metadata": {"total_size": sum(len(it[3]) for it in items)},
             "weight_map": {it[0]: names[s] for it, s in zip(items, shard_of)}}
    with open(os.path.join(out_dir, "model.safetensors.index.json"), "w") as f:
        json.dump(index, f, indent=2)
        f.write("\n")

if __name__ == "__main__":
    main()
