// Packing from a streaming model source (formats/model_source.h), and the permutation helpers of the streaming
// permuted export.
#include "formats/model_source.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>

#include "formats/core/error.h"
#include "formats/predictor_file.h"

namespace nl {

void check_finite(const std::string& path, const std::string& what, const float* v, uint64_t n, uint64_t first) {
  for (uint64_t i = 0; i < n; ++i)
    if (!std::isfinite(v[i]))
      throw InputError(path, what + " element " + std::to_string(first + i) + " is " +
                                 (std::isnan(v[i]) ? "NaN" : "infinite") + ": weights must be finite");
}

void ffn_order_check(const std::vector<std::vector<uint32_t>>& order, const ModelConfig& c) {
  if (order.empty()) return;
  if (order.size() != size_t(c.n_layers))
    throw UsageError("cannot permute: the layout has " + std::to_string(order.size()) + " layers, the model has " +
                     std::to_string(c.n_layers));
  for (size_t l = 0; l < order.size(); ++l) {
    std::vector<char> seen(size_t(c.hidden_dim), 0);
    bool ok = order[l].size() == seen.size();
    for (size_t s = 0; ok && s < order[l].size(); ++s) {
      const uint32_t n = order[l][s];
      ok = n < seen.size() && !seen[n];
      if (ok) seen[n] = 1;
    }
    if (!ok)
      throw UsageError("cannot permute: layout layer " + std::to_string(l) + " is not a permutation of the model's " +
                       std::to_string(c.hidden_dim) + " neurons");
  }
}

void ffn_permute(ModelWeights& w, const std::vector<std::vector<uint32_t>>& order) {
  ffn_order_check(order, w.config);
  if (order.empty()) return;
  const size_t dim = size_t(w.config.dim), hid = size_t(w.config.hidden_dim);
  for (size_t l = 0; l < w.layers.size(); ++l) {
    LayerWeights& L = w.layers[l];
    // Per neuron: its gate and up rows (gated FFNs), its fc1 bias (OPT) and its down column move together.
    auto rows = [&](std::vector<float>& m, size_t cols) {
      if (m.empty()) return;
      std::vector<float> p(m.size());
      for (size_t s = 0; s < hid; ++s) std::copy_n(m.data() + size_t(order[l][s]) * cols, cols, p.data() + s * cols);
      m.swap(p);
    };
    rows(L.w_gate, dim);
    rows(L.w_up, dim);
    rows(L.b_up, 1);
    std::vector<float> d(L.w_down.size());
    for (size_t s = 0; s < hid; ++s)
      for (size_t o = 0; o < dim; ++o) d[o * hid + s] = L.w_down[o * hid + order[l][s]];
    L.w_down.swap(d);
  }
}

namespace {
// Half a MiB at a time: AtomicWriter copies a write of 1 MiB or more into its buffer whole.
void write_floats(AtomicWriter& out, const float* p, size_t n) {
  constexpr size_t kChunk = size_t(1) << 17;
  for (size_t i = 0; i < n; i += kChunk) out.write(p + i, std::min(kChunk, n - i) * sizeof(float));
}
}  // namespace

void write_rows_permuted(AtomicWriter& out, const std::vector<float>& m, size_t cols,
                         const std::vector<uint32_t>& order) {
  if (order.empty()) {
    write_floats(out, m.data(), m.size());
    return;
  }
  for (uint32_t n : order) write_floats(out, m.data() + size_t(n) * cols, cols);  // AtomicWriter buffers the rows
}

void write_cols_permuted(AtomicWriter& out, const std::vector<float>& m, size_t cols,
                         const std::vector<uint32_t>& order) {
  if (order.empty()) {
    write_floats(out, m.data(), m.size());
    return;
  }
  std::vector<float> row(cols);
  for (size_t r = 0; r < m.size() / cols; ++r) {
    const float* in = m.data() + r * cols;
    for (size_t s = 0; s < cols; ++s) row[s] = in[order[s]];
    write_floats(out, row.data(), cols);
  }
}

void pread_exact(int fd, const std::string& path, uint64_t offset, void* dst, uint64_t n) {
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

ModelWeights read_llama_dense(const ModelConfig& c, const std::string& source,
                              const std::function<std::string(const char* role, int layer)>& name,
                              const TensorLoad& load, bool rotate_half_qk) {
  ModelWeights w;
  w.source = source;
  w.config = c;
  const uint64_t dim = uint64_t(c.dim), kv = uint64_t(c.kv_dim()), voc = uint64_t(c.vocab_size);
  load(name("embed", -1), voc, dim, w.tok_embeddings);
  w.layers.resize(size_t(c.n_layers));
  for (int i = 0; i < c.n_layers; ++i) {
    LayerWeights& L = w.layers[size_t(i)];
    load(name("attn_norm", i), dim, 0, L.rms_att);
    load(name("q", i), dim, dim, L.wq);
    load(name("k", i), kv, dim, L.wk);
    load(name("v", i), kv, dim, L.wv);
    load(name("o", i), dim, dim, L.wo);
    load(name("ffn_norm", i), dim, 0, L.rms_ffn);
    if (rotate_half_qk) {
      L.wq = permute_rope_rows(L.wq, c.n_heads, c.head_dim(), c.dim, false);
      L.wk = permute_rope_rows(L.wk, c.n_kv_heads, c.head_dim(), c.dim, false);
    }
  }
  load(name("final_norm", -1), dim, 0, w.rms_final);
  if (!c.shared_classifier) load(name("output", -1), voc, dim, w.wcls);
  return w;
}

ImageManifest image_write_source(const std::string& out, ModelSource& src, const ModelWeights& dense, ImageSpec spec,
                                 const ProgressFn& progress, StoredErrors* errors, const PredictorFile* predictor) {
  spec.config = src.config();
  spec.bundle_kind = bundle_kind_of(spec.config);
  ImageWriter iw(out, std::move(spec));
  iw.set_progress(progress);
  iw.set_error_stats(errors);
  image_add_dense_weights(iw, dense);
  LayerWeights f;
  for (int l = 0; l < src.config().n_layers; ++l) {
    src.read_ffn(l, &f);
    iw.add_layer(l, f.w_gate.data(), f.w_up.data(), f.w_down.data());
  }
  if (predictor) predictor->write_to(iw);
  return iw.commit();
}

}  // namespace nl
