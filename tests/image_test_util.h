// Test helpers for flash images: small random models with known weights, and file mutation helpers.
#pragma once
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "formats/core/atomic_file.h"
#include "formats/core/model_weights.h"

namespace nl::test {

inline ModelConfig small_config(int dim = 64, int hidden = 96, int layers = 2) {
  ModelConfig c;
  c.dim = dim;
  c.hidden_dim = hidden;
  c.n_layers = layers;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.vocab_size = 50;
  c.seq_len = 32;
  c.act = FfnAct::kRelu;
  c.shared_classifier = false;
  return c;
}

// Values spread over many binades, including ones that need rounding in f16/bf16 and a few subnormal halves.
inline std::vector<float> random_floats(size_t n, std::mt19937_64& rng) {
  std::vector<float> v(n);
  std::normal_distribution<float> nd(0.0f, 0.5f);
  for (size_t i = 0; i < n; ++i) {
    float x = nd(rng);
    if (i % 97 == 5) x *= 1e-6f;
    v[i] = x;
  }
  return v;
}

inline ModelWeights random_weights(const ModelConfig& c, uint64_t seed, bool gated = true) {
  std::mt19937_64 rng(seed);
  ModelWeights w;
  w.config = c;
  w.source = "random";
  const size_t dim = size_t(c.dim), hidden = size_t(c.hidden_dim), kv = size_t(c.kv_dim());
  w.tok_embeddings = random_floats(size_t(c.vocab_size) * dim, rng);
  w.layers.resize(size_t(c.n_layers));
  for (auto& l : w.layers) {
    l.rms_att = random_floats(dim, rng);
    l.wq = random_floats(dim * dim, rng);
    l.wk = random_floats(kv * dim, rng);
    l.wv = random_floats(kv * dim, rng);
    l.wo = random_floats(dim * dim, rng);
    l.rms_ffn = random_floats(dim, rng);
    if (gated) l.w_gate = random_floats(hidden * dim, rng);
    l.w_up = random_floats(hidden * dim, rng);
    l.w_down = random_floats(dim * hidden, rng);
  }
  w.rms_final = random_floats(dim, rng);
  if (!c.shared_classifier) w.wcls = random_floats(size_t(c.vocab_size) * dim, rng);
  return w;
}

inline std::vector<std::vector<uint32_t>> random_order(const ModelConfig& c, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<std::vector<uint32_t>> o(size_t(c.n_layers));
  for (auto& v : o) {
    v.resize(size_t(c.hidden_dim));
    for (uint32_t i = 0; i < v.size(); ++i) v[i] = i;
    std::shuffle(v.begin(), v.end(), rng);
  }
  return o;
}

inline void write_text(const std::string& path, const std::string& s) { write_file_atomic(path, s); }

inline void flip_byte(const std::string& path, uint64_t offset) {
  int fd = ::open(path.c_str(), O_RDWR);
  unsigned char b = 0;
  (void)!::pread(fd, &b, 1, off_t(offset));
  b ^= 0x5a;
  (void)!::pwrite(fd, &b, 1, off_t(offset));
  ::close(fd);
}

inline void truncate_to(const std::string& path, uint64_t bytes) { (void)!::truncate(path.c_str(), off_t(bytes)); }

inline void copy_file(const std::string& from, const std::string& to) { write_file_atomic(to, read_file(from)); }

}  // namespace nl::test
