// llama2.c `.bin` reader and writer (legacy export, fp32). See llama2c.h for the layout.
#include "formats/llama2c.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "formats/core/atomic_file.h"
#include "formats/core/error.h"

namespace nl {
namespace {

constexpr int32_t kMaxDim = 1 << 20;         // far beyond any real model; guards the size arithmetic
constexpr int32_t kMaxLayers = 4096;
constexpr int32_t kMaxSeq = 1 << 22;
constexpr uint32_t kExportMagic = 0x616b3432;  // "ak42": llama2.c's newer versioned exports

struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

void read_exact(int fd, const std::string& path, uint64_t& offset, void* dst, uint64_t n) {
  char* p = static_cast<char*>(dst);
  while (n > 0) {
    ssize_t r = ::pread(fd, p, n > (1u << 30) ? (1u << 30) : n, off_t(offset));
    if (r < 0) throw IoError(path, errno_text("read"));
    if (r == 0) throw InputError(path, "file ends early (truncated)");
    p += r;
    n -= uint64_t(r);
    offset += uint64_t(r);
  }
}

void read_floats(int fd, const std::string& path, uint64_t& offset, std::vector<float>& v, uint64_t n) {
  v.resize(n);
  read_exact(fd, path, offset, v.data(), n * sizeof(float));
}

}  // namespace

ModelWeights read_llama2c(const std::string& path) {
  Fd f;
  f.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (f.fd < 0) throw IoError(path, errno_text("cannot open"));
  struct stat st;
  if (::fstat(f.fd, &st) != 0) throw IoError(path, errno_text("stat"));
  const uint64_t file_size = uint64_t(st.st_size);
  if (S_ISDIR(st.st_mode)) throw InputError(path, "is a directory, expected a llama2.c .bin file");
  if (file_size < 28) throw InputError(path, "too small for a llama2.c header (" + std::to_string(file_size) + " bytes)");

  int32_t h[7];
  uint64_t off = 0;
  read_exact(f.fd, path, off, h, sizeof h);
  if (uint32_t(h[0]) == kExportMagic)
    throw InputError(path, "llama2.c versioned export (magic 'ak42', version " + std::to_string(h[1]) +
                               ") is not supported; export with the legacy format (version 0)");
  const char* names[7] = {"dim", "hidden_dim", "n_layers", "n_heads", "n_kv_heads", "vocab_size", "seq_len"};
  for (int i = 0; i < 7; ++i) {
    const int64_t v = i == 5 ? std::llabs(int64_t(h[i])) : int64_t(h[i]);
    const int64_t limit = i == 2 ? kMaxLayers : i == 6 ? kMaxSeq : kMaxDim;
    if (v <= 0 || v > limit)
      throw InputError(path, std::string("header field ") + names[i] + " = " + std::to_string(h[i]) +
                                 " is out of range (1.." + std::to_string(limit) + "); not a llama2.c model?");
  }
  ModelWeights w;
  w.source = path;
  ModelConfig& c = w.config;
  c.dim = h[0];
  c.hidden_dim = h[1];
  c.n_layers = h[2];
  c.n_heads = h[3];
  c.n_kv_heads = h[4];
  c.shared_classifier = h[5] > 0;
  c.vocab_size = int(std::llabs(int64_t(h[5])));
  c.seq_len = h[6];
  c.act = FfnAct::kSilu;
  if (std::string p = model_config_problem(c); !p.empty()) throw InputError(path, "header: " + p);

  const uint64_t dim = uint64_t(c.dim), kv = uint64_t(c.kv_dim()), hid = uint64_t(c.hidden_dim),
                 voc = uint64_t(c.vocab_size), nl_ = uint64_t(c.n_layers), hd = uint64_t(c.head_dim());
  const uint64_t per_layer = dim + dim * dim * 2 + kv * dim * 2 + dim + hid * dim * 3;
  const uint64_t rope_tables = uint64_t(c.seq_len) * hd;  // freq_cis_real + freq_cis_imag, [seq][hd/2] each
  const uint64_t floats = voc * dim + nl_ * per_layer + dim + rope_tables + (c.shared_classifier ? 0 : voc * dim);
  const uint64_t expected = 28 + floats * 4;
  if (expected != file_size)
    throw InputError(path, "file has " + std::to_string(file_size) + " bytes but its header (dim " +
                               std::to_string(c.dim) + ", hidden " + std::to_string(c.hidden_dim) + ", " +
                               std::to_string(c.n_layers) + " layers, vocab " + std::to_string(h[5]) + ", seq_len " +
                               std::to_string(c.seq_len) + ") implies " + std::to_string(expected) +
                               (expected > file_size ? " (truncated)" : " (trailing data)"));

  read_floats(f.fd, path, off, w.tok_embeddings, voc * dim);
  w.layers.resize(nl_);
  // llama2.c stores each kind of tensor for all layers together.
  for (auto& L : w.layers) read_floats(f.fd, path, off, L.rms_att, dim);
  for (auto& L : w.layers) read_floats(f.fd, path, off, L.wq, dim * dim);
  for (auto& L : w.layers) read_floats(f.fd, path, off, L.wk, kv * dim);
  for (auto& L : w.layers) read_floats(f.fd, path, off, L.wv, kv * dim);
  for (auto& L : w.layers) read_floats(f.fd, path, off, L.wo, dim * dim);
  for (auto& L : w.layers) read_floats(f.fd, path, off, L.rms_ffn, dim);
  for (auto& L : w.layers) read_floats(f.fd, path, off, L.w_gate, hid * dim);
  for (auto& L : w.layers) read_floats(f.fd, path, off, L.w_down, dim * hid);
  for (auto& L : w.layers) read_floats(f.fd, path, off, L.w_up, hid * dim);
  read_floats(f.fd, path, off, w.rms_final, dim);
  off += rope_tables * 4;  // precomputed RoPE tables: the forward computes its own
  if (!c.shared_classifier) read_floats(f.fd, path, off, w.wcls, voc * dim);
  return w;
}

void write_llama2c(const std::string& path, const ModelWeights& w) {
  const ModelConfig& c = w.config;
  if (c.act != FfnAct::kSilu) throw UsageError(path + ": llama2.c files cannot store a ReLU FFN (no field for it)");
  if (c.rope_theta != 10000.0f || c.norm_eps != 1e-5f)
    throw UsageError(path + ": llama2.c files assume rope_theta 10000 and norm_eps 1e-5");
  for (const auto& L : w.layers)
    if (L.w_gate.empty()) throw UsageError(path + ": the model's FFN weights are not in memory");
  AtomicWriter out(path);
  const int32_t h[7] = {c.dim, c.hidden_dim, c.n_layers, c.n_heads, c.n_kv_heads,
                        c.shared_classifier ? c.vocab_size : -c.vocab_size, c.seq_len};
  out.write(h, sizeof h);
  auto put = [&out](const std::vector<float>& v) { out.write(v.data(), v.size() * sizeof(float)); };
  put(w.tok_embeddings);
  for (const auto& L : w.layers) put(L.rms_att);
  for (const auto& L : w.layers) put(L.wq);
  for (const auto& L : w.layers) put(L.wk);
  for (const auto& L : w.layers) put(L.wv);
  for (const auto& L : w.layers) put(L.wo);
  for (const auto& L : w.layers) put(L.rms_ffn);
  for (const auto& L : w.layers) put(L.w_gate);
  for (const auto& L : w.layers) put(L.w_down);
  for (const auto& L : w.layers) put(L.w_up);
  put(w.rms_final);
  // RoPE tables as llama2.c's export.py writes them (readers ignore them, but the size must match).
  const int hd = c.head_dim(), half = hd / 2;
  std::vector<float> re(size_t(c.seq_len) * half), im(size_t(c.seq_len) * half);
  for (int pos = 0; pos < c.seq_len; ++pos)
    for (int j = 0; j < half; ++j) {
      const float freq = 1.0f / std::pow(10000.0f, float(2 * j) / float(hd));
      re[size_t(pos) * half + j] = std::cos(float(pos) * freq);
      im[size_t(pos) * half + j] = std::sin(float(pos) * freq);
    }
  put(re);
  put(im);
  if (!c.shared_classifier) put(w.wcls);
  out.commit();
}

}  // namespace nl
