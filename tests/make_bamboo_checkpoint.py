#!/usr/bin/env python3
"""Writes a deterministic random-weight TurboSparse-Mistral checkpoint in Hugging Face form: model_type bamboo
(PowerInfer's modeling_bamboo.py, BambooForCausalLM: the Mistral block whose BambooMLP computes
down(relu(gate x) * relu(up x)), hidden_act relu), with each layer's activation predictor inside the checkpoint as
TurboSparse ships it: model.layers.{l}.mlp.predictor.fc1.weight [rank][dim] and fc2.weight [ffn][rank] (no biases;
the model's mask is round(sigmoid(fc2 relu(fc1 r))) on the residual r entering the FFN before its norm). config.json
plus model.safetensors, or with --shards N the shards and model.safetensors.index.json. numpy only; the same arguments
give byte-identical files.

Usage: make_bamboo_checkpoint.py OUT_DIR [--dim 64] [--ffn 256] [--layers 2] [--heads 4] [--kv-heads 2]
                                 [--vocab 512] [--max-pos 64] [--window 8] [--rank 16] [--dtype f32|f16|bf16]
                                 [--shards N] [--seed 1] [--tie/--no-tie]

Weights: linear N(0, in**-0.5), norms 1 + N(0, 0.1), embeddings N(0, 0.1); the predictor's fc1 N(0, dim**-0.5) and
fc2 N(0, rank**-0.5) (random: about half of the neurons predicted). Test support for tests/check_turbosparse.py with
the numpy forward tests/hf_llama_reference.py.
"""
import numpy as np

from make_opt_checkpoint import Init, encoded, shape_parser, write_checkpoint


def tensors(a, rng):
    """[(name, float32 array)] in file order."""
    w = Init(rng, a.dim)
    normal = w.normal
    hd = a.dim // a.heads
    normal("model.embed_tokens.weight", (a.vocab, a.dim), 0.0, 0.1)
    for i in range(a.layers):
        p = f"model.layers.{i}."
        normal(p + "input_layernorm.weight", (a.dim,), 1.0, 0.1)
        for proj, rows in (("q_proj", a.dim), ("k_proj", a.kv_heads * hd), ("v_proj", a.kv_heads * hd),
                           ("o_proj", a.dim)):
            normal(p + "self_attn." + proj + ".weight", (rows, a.dim), 0.0, a.dim ** -0.5)
        normal(p + "post_attention_layernorm.weight", (a.dim,), 1.0, 0.1)
        normal(p + "mlp.gate_proj.weight", (a.ffn, a.dim), 0.0, a.dim ** -0.5)
        normal(p + "mlp.up_proj.weight", (a.ffn, a.dim), 0.0, a.dim ** -0.5)
        normal(p + "mlp.down_proj.weight", (a.dim, a.ffn), 0.0, a.ffn ** -0.5)
        normal(p + "mlp.predictor.fc1.weight", (a.rank, a.dim), 0.0, a.dim ** -0.5)
        normal(p + "mlp.predictor.fc2.weight", (a.ffn, a.rank), 0.0, a.rank ** -0.5)
    normal("model.norm.weight", (a.dim,), 1.0, 0.1)
    if not a.tie:
        normal("lm_head.weight", (a.vocab, a.dim), 0.0, a.dim ** -0.5)
    return w.out


def main():
    p = shape_parser(__doc__, 64, False, "tie lm_head to embed_tokens; --no-tie (default) writes lm_head.weight")
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--window", type=int, default=8)
    p.add_argument("--rank", type=int, default=16)
    a = p.parse_args()
    if a.heads % a.kv_heads:
        p.error("--heads must be a multiple of --kv-heads")
    items, torch_dtype = encoded(p, a, tensors)
    cfg = {"model_type": "bamboo", "architectures": ["BambooForCausalLM"], "hidden_act": "relu",
           "hidden_size": a.dim, "intermediate_size": a.ffn, "num_hidden_layers": a.layers,
           "num_attention_heads": a.heads, "num_key_value_heads": a.kv_heads, "vocab_size": a.vocab,
           "max_position_embeddings": a.max_pos, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
           "sliding_window": a.window, "tie_word_embeddings": a.tie, "torch_dtype": torch_dtype,
           "bos_token_id": 1, "eos_token_id": 2}
    write_checkpoint(a.out_dir, cfg, items, a.shards)


if __name__ == "__main__":
    main()
