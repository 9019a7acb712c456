// llama2.c model files (`.bin`, legacy "version 0" export): a header of 7 int32 (dim, hidden_dim, n_layers,
// n_heads, n_kv_heads, vocab_size, seq_len; a negative vocab_size means a separate classifier follows), then fp32
// weights in llama2.c order. The reader checks the header and the exact file size before allocating anything.
#pragma once
#include <string>

#include "formats/core/model_weights.h"

namespace nl {

// Reads a llama2.c `.bin`. Throws InputError (naming the file) on a bad header or a size mismatch, IoError when
// the file cannot be read. The model uses SiLU and the llama2.c defaults (rope_theta 10000, norm_eps 1e-5).
ModelWeights read_llama2c(const std::string& path);

// Writes `w` as a llama2.c legacy `.bin` (atomic). Requires the FFN weights and act == silu (the format has no
// field for the activation), rope_theta 10000 and norm_eps 1e-5; throws UsageError otherwise.
void write_llama2c(const std::string& path, const ModelWeights& w);

}  // namespace nl
