// Helpers shared by the model and profiler tests: greedy generation and small random models (tests that need the
// bundled llama2.c models in datasets/ find them through NL_MODELS_DIR, tests/skip_util.h).
#pragma once
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "runtime/model/model.h"

namespace nl::test {

inline int argmax(const float* v, int n) { return int(std::max_element(v, v + n) - v); }

// Greedy generation from `first`, as reference-greedy.json describes it: stop after `max_pos` positions or when
// token 1 or 2 is the argmax. Returns the tokens fed; `logits` receives the logits of the first `keep` positions.
inline std::vector<int> greedy(Model& m, int first, int max_pos, int keep, std::vector<std::vector<float>>* logits) {
  std::vector<int> fed{first};
  const int vocab = m.config().vocab_size;
  for (int pos = 0; pos < max_pos; ++pos) {
    const float* l = m.forward_token(fed.back(), pos);
    if (logits && pos < keep) logits->emplace_back(l, l + vocab);
    const int next = argmax(l, vocab);
    if (next == 1 || next == 2 || pos + 1 == max_pos) break;
    fed.push_back(next);
  }
  return fed;
}

}  // namespace nl::test

#include <random>

namespace nl::test {

// A small random Llama model (weights ~ N(0, 0.3)), for tests that need shapes the shared models lack.
inline ModelWeights random_weights(ModelConfig c, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd(0.0f, 0.3f);
  auto fill = [&](std::vector<float>& v, size_t n) {
    v.resize(n);
    for (float& x : v) x = nd(rng);
  };
  ModelWeights w;
  w.config = c;
  w.source = "random";
  const size_t dim = size_t(c.dim), kv = size_t(c.kv_dim()), hid = size_t(c.hidden_dim), voc = size_t(c.vocab_size);
  fill(w.tok_embeddings, voc * dim);
  w.layers.resize(size_t(c.n_layers));
  for (auto& L : w.layers) {
    fill(L.rms_att, dim);
    fill(L.wq, dim * dim);
    fill(L.wk, kv * dim);
    fill(L.wv, kv * dim);
    fill(L.wo, dim * dim);
    fill(L.rms_ffn, dim);
    fill(L.w_gate, hid * dim);
    fill(L.w_up, hid * dim);
    fill(L.w_down, dim * hid);
    for (float& g : L.rms_att) g = 1.0f + 0.1f * g;
    for (float& g : L.rms_ffn) g = 1.0f + 0.1f * g;
  }
  fill(w.rms_final, dim);
  if (!c.shared_classifier) fill(w.wcls, voc * dim);
  return w;
}

// Random weights of any architecture (OPT, Phi: every tensor dense_tensor_specs lists, plain FFN), norms near 1.
inline ModelWeights random_arch_weights(ModelConfig c, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd(0.0f, 0.3f);
  ModelWeights w;
  w.config = c;
  w.source = "random";
  w.layers.resize(size_t(c.n_layers));
  for (const DenseTensorSpec& t : dense_tensor_specs(c)) {
    std::vector<float>& v = t.in(w);
    v.resize(size_t(t.elems()));
    const bool norm = t.name.find("rms_") != std::string::npos;
    for (float& x : v) x = norm ? 1.0f + 0.1f * nd(rng) : nd(rng);
  }
  const size_t mat = size_t(c.dim) * size_t(c.hidden_dim);
  for (auto& L : w.layers) {
    for (auto* m : {&L.w_gate, &L.w_up, &L.w_down}) {
      if (m == &L.w_gate && !c.ffn_gated()) continue;
      m->resize(mat);
      for (float& x : *m) x = nd(rng);
    }
  }
  return w;
}

// A small OPT (learned positions, LayerNorm, biases) or Phi (parallel block, partial rotary, GeLU) config.
inline ModelConfig small_arch_config(ModelArch arch) {
  ModelConfig c;
  c.arch = arch;
  c.dim = 32;
  c.hidden_dim = 37;
  c.n_layers = 2;
  c.n_heads = 4;
  c.n_kv_heads = 4;
  c.vocab_size = 19;
  c.seq_len = 64;
  c.act = arch == ModelArch::kPhi ? FfnAct::kGelu : FfnAct::kRelu;
  c.rope_dims = arch == ModelArch::kPhi ? 4 : 0;
  c.shared_classifier = arch == ModelArch::kOpt;
  return c;
}

inline ModelConfig small_config(FfnAct act = FfnAct::kSilu, bool shared = true) {
  ModelConfig c;
  c.dim = 24;
  c.hidden_dim = 37;  // not a multiple of 8: exercises the kernel tails
  c.n_layers = 2;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.vocab_size = 19;
  c.seq_len = 64;
  c.act = act;
  c.shared_classifier = shared;
  return c;
}

inline float max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  float m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(a[i] - b[i]));
  return m;
}

}  // namespace nl::test
