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
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_opt_checkpoint import Init, encoded, shape_parser, write_checkpoint  # noqa: E402  (the checkpoint writer)


def tensors(a, rng):
    """[(name, float32 array)] in file order."""
    w = Init(rng, a.dim)
    normal, linear, layer_norm = w.normal, w.linear, w.layer_norm

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
    return w.out


def main():
    p = shape_parser(__doc__, 128, False, "tie lm_head.weight to embed_tokens (lm_head.bias is still written); "
                     "default --no-tie, as Phi-2")
    p.add_argument("--rotary", type=float, default=0.5, help="partial_rotary_factor")
    a = p.parse_args()
    rot = int(a.dim // max(1, a.heads) * a.rotary)
    if rot < 2 or rot % 2 or rot > a.dim // max(1, a.heads):
        p.error(f"--rotary {a.rotary} gives {rot} rotary dims of head_dim {a.dim // max(1, a.heads)}: "
                "need an even count from 2 to head_dim")
    items, torch_dtype = encoded(p, a, tensors)
    cfg = {"model_type": "phi", "architectures": ["PhiForCausalLM"], "hidden_size": a.dim,
           "intermediate_size": a.ffn, "num_hidden_layers": a.layers, "num_attention_heads": a.heads,
           "num_key_value_heads": a.heads, "vocab_size": a.vocab, "max_position_embeddings": a.max_pos,
           "partial_rotary_factor": a.rotary, "rope_theta": 10000.0, "layer_norm_eps": 1e-5,
           "hidden_act": "gelu_new", "qk_layernorm": False, "tie_word_embeddings": a.tie,
           "torch_dtype": torch_dtype, "bos_token_id": 1, "eos_token_id": 2}
    write_checkpoint(a.out_dir, cfg, items, a.shards)

if __name__ == "__main__":
    main()
