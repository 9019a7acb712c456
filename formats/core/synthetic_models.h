// The whole synthetic models (issue 18 item 9): the one table of the random-weight shapes that nl-layout pack
// --synthetic-shape writes, bench/kernel_bench times and bench/e2e/run.py reads (nl-layout pack
// --list-synthetic-models). All use a gated ReLU FFN (ProSparse / TurboSparse-like: exact zeros, so --select gate is
// exact). Header-only.
#pragma once
#include <map>
#include <string>

#include "formats/core/model_weights.h"

namespace nl {

struct SyntheticModel {
  ModelConfig config;
  const char* what;  // the real model whose shape it has
};

inline ModelConfig synthetic_model_config(int dim, int layers, int heads, int kv_heads, int hidden, int vocab, int seq,
                                          float theta) {
  ModelConfig c;
  c.dim = dim;
  c.n_layers = layers;
  c.n_heads = heads;
  c.n_kv_heads = kv_heads;
  c.hidden_dim = hidden;
  c.vocab_size = vocab;
  c.seq_len = seq;
  c.rope_theta = theta;
  c.norm_eps = 1e-5f;
  c.act = FfnAct::kRelu;
  c.shared_classifier = false;
  return c;
}

inline const std::map<std::string, SyntheticModel>& synthetic_models() {
  static const std::map<std::string, SyntheticModel> m = {
      {"llama2-7b",
       {synthetic_model_config(4096, 32, 32, 32, 11008, 32000, 4096, 10000.0f), "Llama-2-7B / ProSparse shape"}},
      {"mistral-7b",
       {synthetic_model_config(4096, 32, 32, 8, 14336, 32000, 4096, 1000000.0f), "Mistral-7B / TurboSparse shape"}},
      {"llama-1b", {synthetic_model_config(2048, 22, 32, 4, 5632, 32000, 2048, 10000.0f), "TinyLlama-1.1B shape"}},
      {"tiny-test", {synthetic_model_config(64, 2, 4, 2, 256, 512, 128, 10000.0f), "tiny shape for tests"}},
  };
  return m;
}

}  // namespace nl
