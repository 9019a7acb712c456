// The whole synthetic models (issue 18 item 9): the one table of the random-weight shapes that nl-layout pack
// --synthetic-shape writes, bench/kernel_bench times and bench/e2e/run.py reads (nl-layout pack
// --list-synthetic-models). The Llama shapes use a gated ReLU FFN (ProSparse / TurboSparse-like: exact zeros, so
// --select gate is exact); the OPT shapes are OPT (plain ReLU FFN with biases). Header-only.
#pragma once
#include <cstdio>
#include <map>
#include <string>

#include "formats/core/image.h"
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

// OPT's shape (learned positions, LayerNorm, biases, a plain ReLU FFN: formats/core/model_weights.h), tied classifier.
inline ModelConfig synthetic_opt_config(int dim, int layers, int heads, int hidden) {
  ModelConfig c = synthetic_model_config(dim, layers, heads, heads, hidden, 50272, 2048, 10000.0f);
  c.arch = ModelArch::kOpt;
  c.shared_classifier = true;
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
      // OPT as OPT (model.arch opt, two-vector bundles); "opt-6.7b" alone names the FFN-only shape below.
      {"opt-1.3b-model", {synthetic_opt_config(2048, 24, 32, 8192), "OPT-1.3B shape (OPT architecture)"}},
      {"opt-6.7b-model", {synthetic_opt_config(4096, 32, 32, 16384), "OPT-6.7B shape (OPT architecture)"}},
  };
  return m;
}

// FFN-only shapes of the paper's models (Neuralink, ASPLOS 2025): width, neurons per layer, bundle kind
// (nl-layout pack --synthetic-shape NAME writes their FFN images). Keys are the workload preset names
// (configs/workloads/*.json), so a synthetic trace and a synthetic image pair up by name.
struct SyntheticFfnShape {
  int dim = 0, hidden = 0;
  BundleKind kind = BundleKind::kPlain;
};
inline const std::map<std::string, SyntheticFfnShape>& synthetic_ffn_shapes() {
  static const std::map<std::string, SyntheticFfnShape> m = {
      {"opt-350m", {1024, 4096, BundleKind::kPlain}},                 // 4 KiB f16 bundles
      {"opt-6.7b", {4096, 16384, BundleKind::kPlain}},                // 16 KiB
      {"llama2-7b-prosparse", {4096, 11008, BundleKind::kGated}},     // 24 KiB
      {"mistral-7b-turbosparse", {4096, 14336, BundleKind::kGated}},  // 24 KiB
  };
  return m;
}

// The FFN geometry of a shape: a whole synthetic model's name (gated), an FFN-only shape's name, or
// DIMxHIDDEN[xplain|xgated] (plain when omitted). False when `s` is none of these.
inline bool synthetic_ffn_shape_parse(const std::string& s, SyntheticFfnShape* out) {
  if (auto it = synthetic_models().find(s); it != synthetic_models().end()) {
    *out = {it->second.config.dim, it->second.config.hidden_dim, bundle_kind_of(it->second.config)};
    return true;
  }
  if (auto it = synthetic_ffn_shapes().find(s); it != synthetic_ffn_shapes().end()) {
    *out = it->second;
    return true;
  }
  SyntheticFfnShape r;
  char kind[16] = {0};
  int used = 0;
  const int got = std::sscanf(s.c_str(), "%dx%d%n", &r.dim, &r.hidden, &used);
  if (got == 2 && size_t(used) < s.size()) {
    if (std::sscanf(s.c_str() + used, "x%15s", kind) != 1) r.dim = 0;
  }
  const std::string k = kind;
  if (got != 2 || r.dim <= 0 || r.hidden <= 0 || (!k.empty() && k != "plain" && k != "gated")) return false;
  r.kind = k == "gated" ? BundleKind::kGated : BundleKind::kPlain;
  *out = r;
  return true;
}

// "whole models (a, b, ...), FFN-only shapes (c, d, ...)": for messages naming what a shape may be.
inline std::string synthetic_shape_names() {
  std::string names, models;
  for (const auto& [n, v] : synthetic_ffn_shapes()) names += (names.empty() ? "" : ", ") + n;
  for (const auto& [n, v] : synthetic_models()) models += (models.empty() ? "" : ", ") + n;
  return "a whole model (" + models + "), an FFN-only shape (" + names + ")";
}

}  // namespace nl
