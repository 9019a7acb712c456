// Shared by the libFuzzer harnesses: feed bytes to a reader through a real file, and turn anything but the
// toolkit's own one-line error (nl::Error naming the file) into a crash the fuzzer reports.
#pragma once
#include <fcntl.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>

#include "formats/core/error.h"

namespace nl::fuzz {

// A per-process scratch path under $TMPDIR (libFuzzer -fork/-jobs run several processes side by side).
inline std::string scratch_path(const char* name) {
  const char* dir = std::getenv("TMPDIR");
  return std::string(dir && *dir ? dir : "/tmp") + "/nl_fuzz_" + std::to_string(::getpid()) + "_" + name;
}

// Writes the input as a plain file (readers take paths: the fuzzer exercises the same code the CLIs run).
inline void write_bytes(const std::string& path, const uint8_t* data, size_t size) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) std::abort();
  size_t off = 0;
  while (off < size) {
    ssize_t w = ::write(fd, data + off, size - off);
    if (w <= 0) std::abort();
    off += size_t(w);
  }
  ::close(fd);
}

// Runs `f`; a toolkit error must be one line that names `path`. Any other exception is a finding.
template <class F>
void expect_clean(const std::string& path, F&& f) {
  try {
    f();
  } catch (const nl::Error& e) {
    const std::string m = e.what();
    if (m.find('\n') != std::string::npos || m.find(path) == std::string::npos) {
      std::fprintf(stderr, "error message is not one line naming %s: %s\n", path.c_str(), m.c_str());
      std::abort();
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "reader let a non-toolkit exception escape: %s\n", e.what());
    std::abort();
  }
}

}  // namespace nl::fuzz

#include "formats/core/model_weights.h"

namespace nl::fuzz {

// The tiny model of the seed corpus (fuzz/make_corpus.cpp) and of the safetensors harness' config.json: small
// enough that a whole checkpoint is a few kilobytes, so the fuzzer mutates headers rather than weights.
inline ModelConfig tiny_config() {
  ModelConfig c;
  c.dim = 8;
  c.hidden_dim = 6;
  c.n_layers = 2;
  c.n_heads = 2;
  c.n_kv_heads = 1;
  c.vocab_size = 7;
  c.seq_len = 4;
  return c;
}

// Deterministic small weights for tiny_config().
inline ModelWeights tiny_weights() {
  ModelWeights w;
  w.config = tiny_config();
  const ModelConfig& c = w.config;
  const size_t d = size_t(c.dim), kv = size_t(c.kv_dim()), h = size_t(c.hidden_dim), v = size_t(c.vocab_size);
  float x = 0.25f;
  auto fill = [&x](std::vector<float>& a, size_t n) {
    a.resize(n);
    for (auto& e : a) e = (x = x * 0.75f + 0.125f) - 0.5f;
  };
  fill(w.tok_embeddings, v * d);
  w.layers.resize(size_t(c.n_layers));
  for (auto& L : w.layers) {
    fill(L.rms_att, d), fill(L.wq, d * d), fill(L.wk, kv * d), fill(L.wv, kv * d), fill(L.wo, d * d);
    fill(L.rms_ffn, d), fill(L.w_gate, h * d), fill(L.w_up, h * d), fill(L.w_down, d * h);
  }
  fill(w.rms_final, d);
  return w;
}

// Deterministic small weights of another architecture (OPT: learned positions, biases; Phi: parallel block, partial
// rotary, GeLU, classifier bias) with tiny_config()'s sizes: every tensor dense_tensor_specs lists, a plain FFN.
inline ModelWeights tiny_arch_weights(ModelArch arch) {
  ModelWeights w;
  w.config = tiny_config();
  ModelConfig& c = w.config;
  c.arch = arch;
  c.n_kv_heads = c.n_heads;
  c.act = arch == ModelArch::kPhi ? FfnAct::kGelu : FfnAct::kRelu;
  c.rope_dims = arch == ModelArch::kPhi ? 2 : 0;
  c.shared_classifier = arch == ModelArch::kOpt;
  float x = 0.25f;
  auto fill = [&x](std::vector<float>& a, size_t n) {
    a.resize(n);
    for (auto& e : a) e = (x = x * 0.75f + 0.125f) - 0.5f;
  };
  w.layers.resize(size_t(c.n_layers));
  for (const DenseTensorSpec& t : dense_tensor_specs(c)) fill(t.in(w), size_t(t.elems()));
  for (auto& L : w.layers) fill(L.w_up, size_t(c.hidden_dim * c.dim)), fill(L.w_down, size_t(c.dim * c.hidden_dim));
  return w;
}

}  // namespace nl::fuzz
