// llama2.c `.bin` reader and writer (legacy export, fp32). See llama2c.h for the layout.
#include "formats/llama2c.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "formats/core/atomic_file.h"
#include "formats/core/error.h"
#include "formats/model_source.h"

namespace nl {
namespace {

constexpr int32_t kMaxDim = 1 << 20;  // far beyond any real model; guards the size arithmetic
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
  pread_exact(fd, path, offset, dst, n);
  offset += n;
}

void read_floats(int fd, const std::string& path, uint64_t& offset, std::vector<float>& v, uint64_t n) {
  v.resize(n);
  const uint64_t at = offset;
  read_exact(fd, path, offset, v.data(), n * sizeof(float));
  check_finite(path, "the weights at byte " + std::to_string(at), v.data(), n);
}

// RoPE tables as llama2.c's export.py writes them (freq_cis_real then freq_cis_imag, [seq_len][head_dim/2] each;
// readers ignore them, but the file size must match), computed a few positions at a time.
void write_rope_tables(AtomicWriter& out, const ModelConfig& c) {
  const int hd = c.head_dim(), half = hd / 2;
  std::vector<float> freq(static_cast<size_t>(half)), row(static_cast<size_t>(half));
  for (int j = 0; j < half; ++j) freq[size_t(j)] = 1.0f / std::pow(10000.0f, float(2 * j) / float(hd));
  for (int part = 0; part < 2; ++part)
    for (int pos = 0; pos < c.seq_len; ++pos) {
      for (int j = 0; j < half; ++j) {
        const float a = float(pos) * freq[size_t(j)];
        row[size_t(j)] = part == 0 ? std::cos(a) : std::sin(a);
      }
      out.write(row.data(), row.size() * sizeof(float));
    }
}

}  // namespace

namespace {

// The file's header, checked against its size, and where each group of tensors starts (llama2.c stores each kind
// of tensor for all layers together).
class Llama2cSource : public ModelSource {
 public:
  explicit Llama2cSource(const std::string& path) {
    path_ = path;
    f_.fd = open_regular_input(path);
    struct stat st;
    if (::fstat(f_.fd, &st) != 0) throw IoError(path, errno_text("stat"));
    const uint64_t file_size = uint64_t(st.st_size);
    if (S_ISDIR(st.st_mode)) throw InputError(path, "is a directory, expected a llama2.c .bin file");
    if (file_size < 28)
      throw InputError(path, "too small for a llama2.c header (" + std::to_string(file_size) + " bytes)");

    int32_t h[7];
    uint64_t off = 0;
    read_exact(f_.fd, path, off, h, sizeof h);
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
    ModelConfig& c = config_;
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

    dim_ = uint64_t(c.dim), kv_ = uint64_t(c.kv_dim()), hid_ = uint64_t(c.hidden_dim);
    const uint64_t voc = uint64_t(c.vocab_size), nl_ = uint64_t(c.n_layers), hd = uint64_t(c.head_dim());
    const uint64_t per_layer = dim_ + dim_ * dim_ * 2 + kv_ * dim_ * 2 + dim_ + hid_ * dim_ * 3;
    const uint64_t rope_tables = uint64_t(c.seq_len) * hd;  // freq_cis_real + freq_cis_imag, [seq][hd/2] each
    const uint64_t floats = voc * dim_ + nl_ * per_layer + dim_ + rope_tables + (c.shared_classifier ? 0 : voc * dim_);
    const uint64_t expected = 28 + floats * 4;
    if (expected != file_size)
      throw InputError(path, "file has " + std::to_string(file_size) + " bytes but its header (dim " +
                                 std::to_string(c.dim) + ", hidden " + std::to_string(c.hidden_dim) + ", " +
                                 std::to_string(c.n_layers) + " layers, vocab " + std::to_string(h[5]) + ", seq_len " +
                                 std::to_string(c.seq_len) + ") implies " + std::to_string(expected) +
                                 (expected > file_size ? " (truncated)" : " (trailing data)"));
    uint64_t o = 28;
    auto group = [&](uint64_t floats_per_layer) {
      const uint64_t start = o;
      o += nl_ * floats_per_layer * 4;
      return start;
    };
    embed_ = o;
    o += voc * dim_ * 4;
    rms_att_ = group(dim_);
    wq_ = group(dim_ * dim_);
    wk_ = group(kv_ * dim_);
    wv_ = group(kv_ * dim_);
    wo_ = group(dim_ * dim_);
    rms_ffn_ = group(dim_);
    w1_ = group(hid_ * dim_);
    w2_ = group(dim_ * hid_);
    w3_ = group(hid_ * dim_);
    rms_final_ = o;
    o += dim_ * 4 + rope_tables * 4;  // precomputed RoPE tables: the forward computes its own
    wcls_ = o;
  }

  ModelWeights read_dense() override {
    ModelWeights w;
    w.source = path_;
    w.config = config_;
    const uint64_t voc = uint64_t(config_.vocab_size);
    at(embed_, 0, voc * dim_, w.tok_embeddings);
    w.layers.resize(size_t(config_.n_layers));
    for (size_t l = 0; l < w.layers.size(); ++l) {
      LayerWeights& L = w.layers[l];
      at(rms_att_, l, dim_, L.rms_att);
      at(wq_, l, dim_ * dim_, L.wq);
      at(wk_, l, kv_ * dim_, L.wk);
      at(wv_, l, kv_ * dim_, L.wv);
      at(wo_, l, dim_ * dim_, L.wo);
      at(rms_ffn_, l, dim_, L.rms_ffn);
    }
    at(rms_final_, 0, dim_, w.rms_final);
    if (!config_.shared_classifier) at(wcls_, 0, voc * dim_, w.wcls);
    return w;
  }

  void read_ffn(int layer, LayerWeights* lw) override {
    at(w1_, size_t(layer), hid_ * dim_, lw->w_gate);
    at(w2_, size_t(layer), dim_ * hid_, lw->w_down);
    at(w3_, size_t(layer), hid_ * dim_, lw->w_up);
  }

  // In file order: everything before w1 (header, embeddings, attention, norms) copied, then w1 (gate), w2 (down)
  // and w3 (up) one layer's matrix at a time, rms_final copied, the RoPE tables recomputed (as write_llama2c does,
  // so both writers give the same bytes), the classifier copied.
  void write_permuted(const std::string& out_path, const std::vector<std::vector<uint32_t>>& order,
                      const ProgressFn& progress) override {
    ffn_order_check(order, config_);
    AtomicWriter out(out_path);
    copy(out, 0, w1_);
    const size_t n_layers = size_t(config_.n_layers);
    const uint64_t total = 3 * uint64_t(n_layers);
    uint64_t done = 0;
    std::vector<float> m;
    auto perm = [&order](size_t l) -> const std::vector<uint32_t>& {
      static const std::vector<uint32_t> identity;
      return order.empty() ? identity : order[l];
    };
    for (uint64_t group : {w1_, w2_, w3_})
      for (size_t l = 0; l < n_layers; ++l) {
        at(group, l, hid_ * dim_, m);
        if (group == w2_)
          write_cols_permuted(out, m, size_t(hid_), perm(l));
        else
          write_rows_permuted(out, m, size_t(dim_), perm(l));
        if (progress) progress(++done, total);
      }
    copy(out, rms_final_, rms_final_ + dim_ * 4);
    write_rope_tables(out, config_);
    if (!config_.shared_classifier) copy(out, wcls_, wcls_ + uint64_t(config_.vocab_size) * dim_ * 4);
    out.commit();
  }

 private:
  Fd f_;
  uint64_t dim_ = 0, kv_ = 0, hid_ = 0;
  uint64_t embed_ = 0, rms_att_ = 0, wq_ = 0, wk_ = 0, wv_ = 0, wo_ = 0, rms_ffn_ = 0, w1_ = 0, w2_ = 0, w3_ = 0,
           rms_final_ = 0, wcls_ = 0;

  // Tensor `layer` of the group starting at `group` (n floats each).
  void at(uint64_t group, size_t layer, uint64_t n, std::vector<float>& v) {
    uint64_t off = group + uint64_t(layer) * n * 4;
    read_floats(f_.fd, path_, off, v, n);
  }

  // Bytes [begin, end) of the file to `out`, half a MiB at a time.
  void copy(AtomicWriter& out, uint64_t begin, uint64_t end) {
    std::vector<char> buf(size_t(1) << 19);
    while (begin < end) {
      const uint64_t n = std::min<uint64_t>(buf.size(), end - begin);
      read_exact(f_.fd, path_, begin, buf.data(), n);  // advances begin
      out.write(buf.data(), size_t(n));
    }
  }
};

}  // namespace

std::unique_ptr<ModelSource> open_llama2c_source(const std::string& path) {
  return std::make_unique<Llama2cSource>(path);
}

ModelWeights read_model_source(ModelSource& src) {
  ModelWeights w = src.read_dense();
  for (int l = 0; l < w.config.n_layers; ++l) src.read_ffn(l, &w.layers[size_t(l)]);
  return w;
}

ModelWeights read_llama2c(const std::string& path) {
  Llama2cSource src(path);
  return read_model_source(src);
}

void write_llama2c(const std::string& path, const ModelWeights& w) {
  const ModelConfig& c = w.config;
  if (c.arch != ModelArch::kLlama)
    throw UsageError(path + ": llama2.c files hold Llama models only, not " + model_arch_name(c.arch));
  if (c.sliding_window > 0)
    throw UsageError(path + ": llama2.c files cannot store a sliding attention window (Mistral; no field for it)");
  if (c.act != FfnAct::kSilu)
    throw UsageError(path + ": llama2.c files cannot store a " + ffn_act_name(c.act) + " FFN (no field for it)");
  if (c.rope_theta != 10000.0f || c.norm_eps != 1e-5f)
    throw UsageError(path + ": llama2.c files assume rope_theta 10000 and norm_eps 1e-5");
  for (const auto& L : w.layers)
    if (L.w_gate.empty()) throw UsageError(path + ": the model's FFN weights are not in memory");
  AtomicWriter out(path);
  const int32_t h[7] = {c.dim,     c.hidden_dim, c.n_layers,
                        c.n_heads, c.n_kv_heads, c.shared_classifier ? c.vocab_size : -c.vocab_size,
                        c.seq_len};
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
  write_rope_tables(out, c);
  if (!c.shared_classifier) put(w.wcls);
  out.commit();
}

}  // namespace nl
