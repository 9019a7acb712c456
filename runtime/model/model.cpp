// The forward pass (Llama family and OPT) over ModelWeights: one implementation for a block of n tokens, so the
// single-token path (n = 1) and the sequence path compute each token with exactly the same operations.
#include "runtime/model/model.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "formats/core/error.h"
#include "runtime/model/typed_kernels.h"
#include "runtime/parallel.h"

namespace nl {

namespace {

std::string size_problem(const char* name, size_t have, size_t want) {
  if (have == want) return "";
  return std::string(name) + " has " + std::to_string(have) + " values, expected " + std::to_string(want);
}

}  // namespace

std::string model_weights_problem(const ModelWeights& w, bool need_ffn) {
  const ModelConfig& c = w.config;
  if (std::string p = model_config_problem(c); !p.empty()) return p;
  if (w.layers.size() != size_t(c.n_layers))
    return "has " + std::to_string(w.layers.size()) + " layers, config says " + std::to_string(c.n_layers);
  for (const DenseTensorSpec& t : dense_tensor_specs(c))
    if (std::string p = size_problem(t.name.c_str(), t.in(w).size(), size_t(t.elems())); !p.empty()) return p;
  const size_t dim = size_t(c.dim), hid = size_t(c.hidden_dim);
  for (const LayerWeights& l : w.layers) {
    const bool empty_ffn = l.w_gate.empty() && l.w_up.empty() && l.w_down.empty();
    if (need_ffn || !empty_ffn) {
      std::string p = size_problem("gate", l.w_gate.size(), c.ffn_gated() ? hid * dim : 0);
      if (p.empty()) p = size_problem("up", l.w_up.size(), hid * dim);
      if (p.empty()) p = size_problem("down", l.w_down.size(), dim * hid);
      if (!p.empty()) return p;
    }
  }
  return "";
}

void DenseFfn::ffn(int layer, int pos0, int n, const float* x, float* out, FfnObserver* observer) {
  const ModelConfig& c = w_.config;
  const LayerWeights& L = w_.layers[size_t(layer)];
  const size_t hid = size_t(c.hidden_dim), total = size_t(n) * hid;
  if (gate_.size() < total) {
    gate_.resize(total);
    up_.resize(total);
  }
  if (!c.ffn_gated()) {  // OPT: h = relu(up x + b_up); Phi: gelu(up x + b_up)
    kernels::matmul(up_.data(), x, L.w_up.data(), n, c.dim, c.hidden_dim);
    for (size_t i = 0; i < total; ++i) up_[i] = ffn_act_plain(c.act, up_[i] + L.b_up[i % hid]);
    if (observer) observer->on_ffn(layer, pos0, n, up_.data(), up_.data());
    kernels::matmul_acc64(out, up_.data(), L.w_down.data(), n, c.hidden_dim, c.dim);
    return;
  }
  kernels::matmul(gate_.data(), x, L.w_gate.data(), n, c.dim, c.hidden_dim);
  kernels::matmul(up_.data(), x, L.w_up.data(), n, c.dim, c.hidden_dim);
  if (ffn_act_sparse(c.act)) {
    const float floor = c.gate_floor();
    for (size_t i = 0; i < total; ++i) gate_[i] = gate_[i] > floor ? gate_[i] : 0.0f;
    if (c.act == FfnAct::kDRelu)
      for (size_t i = 0; i < total; ++i) up_[i] = up_[i] > 0.0f ? up_[i] : 0.0f;
  } else {
    for (size_t i = 0; i < total; ++i) gate_[i] = ffn_act_smooth(c.act, gate_[i]);
  }
  for (size_t i = 0; i < total; ++i) up_[i] *= gate_[i];  // up_ now holds h
  if (observer) observer->on_ffn(layer, pos0, n, gate_.data(), up_.data());
  // The sum over neurons in double: a permuted model (nl-layout pack --export-permuted) gives the same numbers.
  kernels::matmul_acc64(out, up_.data(), L.w_down.data(), n, c.hidden_dim, c.dim);
}

Model::Model(const ModelWeights& w, int max_seq) {
  if (std::string p = model_weights_problem(w, false); !p.empty()) throw InputError(w.source, p);
  v_ = view_of(w);
  if (model_weights_problem(w, true).empty()) dense_ = std::make_unique<DenseFfn>(w);
  ffn_ = dense_.get();
  init(max_seq);
}

Model::Model(const ModelView& v, int max_seq) : v_(v) {
  if (std::string p = model_view_problem(v); !p.empty()) throw InputError(v.source, p);
  init(max_seq);
}

Model::~Model() = default;

void Model::init(int max_seq) {
  const ModelConfig& c = v_.config;
  xq_ = std::make_unique<kernels::PreparedX>();
  max_seq_ = max_seq > 0 ? std::min(max_seq, c.seq_len) : c.seq_len;
  const size_t kv_total = size_t(c.n_layers) * size_t(max_seq_) * size_t(c.kv_dim());
  key_cache_.assign(kv_total, 0.0f);
  value_cache_.assign(kv_total, 0.0f);
  // RoPE angles as llama2.c computes them: pair j of a head turns by pos * theta^(-2j/head_dim) (Phi's partial
  // rotary: j < rope_dims / 2, theta^(-2j/rope_dims)).
  const int hd = c.rope_dim(), half = hd / 2;
  rope_cos_.resize(size_t(max_seq_) * half);
  rope_sin_.resize(size_t(max_seq_) * half);
  for (int pos = 0; pos < max_seq_; ++pos)
    for (int j = 0; j < half; ++j) {
      const float freq = 1.0f / std::pow(c.rope_theta, float(2 * j) / float(hd));
      const float val = float(pos) * freq;
      rope_cos_[size_t(pos) * half + j] = std::cos(val);
      rope_sin_[size_t(pos) * half + j] = std::sin(val);
    }
}

void Model::ensure_scratch(int n) {
  const ModelConfig& c = v_.config;
  const size_t need = size_t(n) * c.dim;
  if (x_.size() >= need) return;
  x_.resize(need);
  xb_.resize(need);
  q_.resize(need);
  att_out_.resize(need);
  tmp_.resize(need);
  k_.resize(size_t(n) * c.kv_dim());
  vv_.resize(size_t(n) * c.kv_dim());
}

void Model::check_token(int token) const {
  if (token < 0 || token >= v_.config.vocab_size)
    throw UsageError("token id " + std::to_string(token) + " is outside the vocabulary (0.." +
                     std::to_string(v_.config.vocab_size - 1) + ")");
}

void Model::reserve(int n) {
  if (n <= 0) return;
  ensure_scratch(n);
  logits_.resize(size_t(v_.config.vocab_size));
  // Quantized activation records of n rows (zeros: sizes only), then the provider's own scratch.
  for (const LayerView& L : v_.layers)
    if (image_dtype_quantized(L.wq.dtype)) {
      xq_->prepare(L.wq.dtype, xb_.data(), n, v_.config.dim);
      break;
    }
  if (ffn_) ffn_->reserve(n);
}

const float* Model::forward_token(int token, int pos) {
  logits_.resize(size_t(v_.config.vocab_size));
  pass(&token, 1, pos, logits_.data(), false);
  return logits_.data();
}

const float* Model::forward_prompt(const int* tokens, int n, int pos0) {
  logits_.resize(size_t(v_.config.vocab_size));
  pass(tokens, n, pos0, logits_.data(), true);
  return logits_.data();
}

void Model::forward_sequence(const int* tokens, int n, int pos0, float* logits) {
  pass(tokens, n, pos0, logits, false);
}

void Model::pass(const int* tokens, int n, int pos0, float* logits, bool last_only) {
  const ModelConfig& c = v_.config;
  if (n <= 0) return;
  if (pos0 < 0 || pos0 + n > max_seq_)
    throw UsageError("positions " + std::to_string(pos0) + ".." + std::to_string(pos0 + n - 1) +
                     " exceed the context of " + std::to_string(max_seq_));
  for (int t = 0; t < n; ++t) check_token(tokens[t]);
  ensure_scratch(n);
  const int dim = c.dim, kv_dim = c.kv_dim(), hd = c.head_dim(), rot = c.rope_dim(), half = rot / 2;
  const int group = c.n_heads / c.n_kv_heads;
  const float att_scale = 1.0f / std::sqrt(float(hd));

  for (int t = 0; t < n; ++t) kernels::dequantize_row(v_.tok_embeddings, tokens[t], x_.data() + size_t(t) * dim);
  if (c.learned_positions())  // OPT: the learned position's row, offset 2
    for (int t = 0; t < n; ++t) {
      kernels::dequantize_row(v_.pos_embeddings, pos0 + t + kOptPositionOffset, tmp_.data());
      for (int i = 0; i < dim; ++i) x_[size_t(t) * dim + i] += tmp_[size_t(i)];
    }
  // RMSNorm, or OPT's / Phi's LayerNorm with its bias, of the tokens' rows of x_ into xb_.
  // Rows t0 .. n-1 (every row by default).
  auto norm = [&](const float* g, const float* b, int t0 = 0) {
    for (int t = t0; t < n; ++t) {
      float* o = xb_.data() + size_t(t) * dim;
      const float* in = x_.data() + size_t(t) * dim;
      if (b)
        kernels::layernorm(o, in, g, b, dim, c.norm_eps);
      else
        kernels::rmsnorm(o, in, g, dim, c.norm_eps);
    }
  };
  // y[t][i] += bias[i] for t < n (OPT's biases; nothing when bias is null).
  auto add_bias = [n](float* y, const float* bias, int width) {
    if (!bias) return;
    for (int t = 0; t < n; ++t)
      for (int i = 0; i < width; ++i) y[size_t(t) * width + i] += bias[i];
  };

  if (!ffn_) throw UsageError(v_.source + ": the model has no FFN weights in memory and no FFN provider is set");
  const size_t att_stride = size_t(pos0 + n);
  att_.resize(size_t(omp_get_max_threads()) * att_stride);
  ffn_->set_residual(x_.data());

  for (int l = 0; l < c.n_layers; ++l) {
    const LayerView& L = v_.layers[size_t(l)];
    if (ffn_->wants_layer_input()) {  // the FFN's input as it will be (parallel block: the attention's)
      if (c.parallel_block())
        norm(L.rms_att, L.att_norm_b);
      else
        norm(L.rms_ffn, L.ffn_norm_b);
      ffn_->layer_start(l, pos0, n, xb_.data());
    }
    norm(L.rms_att, L.att_norm_b);
    if (image_dtype_quantized(L.wq.dtype) && L.wk.dtype == L.wq.dtype && L.wv.dtype == L.wq.dtype) {
      // One quantization of the activations for the three products (the numbers matmul(x) would prepare itself).
      kernels::PreparedX& xq = *xq_;
      xq.prepare(L.wq.dtype, xb_.data(), n, dim);
      kernels::matmul(q_.data(), xq, L.wq, n);
      kernels::matmul(k_.data(), xq, L.wk, n);
      kernels::matmul(vv_.data(), xq, L.wv, n);
    } else {
      kernels::matmul(q_.data(), xb_.data(), L.wq, n);
      kernels::matmul(k_.data(), xb_.data(), L.wk, n);
      kernels::matmul(vv_.data(), xb_.data(), L.wv, n);
    }
    add_bias(q_.data(), L.bq, dim);
    add_bias(k_.data(), L.bk, kv_dim);
    add_bias(vv_.data(), L.bv, kv_dim);

    // RoPE on interleaved pairs (Llama family), then append k and v to the cache.
    float* kc = key_cache_.data() + size_t(l) * max_seq_ * kv_dim;
    float* vc = value_cache_.data() + size_t(l) * max_seq_ * kv_dim;
    for (int t = 0; t < n; ++t) {
      const float* cs = rope_cos_.data() + size_t(pos0 + t) * half;
      const float* sn = rope_sin_.data() + size_t(pos0 + t) * half;
      auto rotate = [&](float* vec, int width) {
        for (int i = 0; i < width; i += 2) {
          if (i % hd >= rot) continue;  // partial rotary: the head's other dimensions pass
          const int j = (i % hd) / 2;
          const float v0 = vec[i], v1 = vec[i + 1];
          vec[i] = v0 * cs[j] - v1 * sn[j];
          vec[i + 1] = v0 * sn[j] + v1 * cs[j];
        }
      };
      if (c.rope()) {
        rotate(q_.data() + size_t(t) * dim, dim);
        rotate(k_.data() + size_t(t) * kv_dim, kv_dim);
      }
      std::copy_n(k_.data() + size_t(t) * kv_dim, kv_dim, kc + size_t(pos0 + t) * kv_dim);
      std::copy_n(vv_.data() + size_t(t) * kv_dim, kv_dim, vc + size_t(pos0 + t) * kv_dim);
    }

    // Causal grouped-query attention: query t sees positions 0 .. pos0+t. Each (token, head) is computed whole by one
    // thread, so the split is free to follow the work: from a few dozen positions on, decode's heads run in parallel
    // (a serial attention was a growing share of a 2-thread token). Round robin over (token, head): a prompt's later
    // tokens attend over more positions, and contiguous blocks gave the last thread most of the work.
    const long att_work = long(n) * c.n_heads * (pos0 + n) * hd;
    const auto head = [&](int t, int h) {
      float* att = att_.data() + size_t(omp_get_thread_num()) * att_stride;
      const float* q = q_.data() + size_t(t) * dim + size_t(h) * hd;
      const int kvh = h / group;
      // Positions first .. pos0 + t: every earlier one, or the last sliding_window (Mistral).
      const int last = pos0 + t, first = c.sliding_window > 0 ? std::max(0, last - c.sliding_window + 1) : 0;
      kernels::attend(att_out_.data() + size_t(t) * dim + size_t(h) * hd, q,
                      kc + size_t(first) * kv_dim + size_t(kvh) * hd, vc + size_t(first) * kv_dim + size_t(kvh) * hd,
                      size_t(kv_dim), last - first + 1, hd, att_scale, att);
    };
    if (parallel_worth(att_work > (1L << 14))) {
#pragma omp parallel for collapse(2) schedule(static, 1)
      for (int t = 0; t < n; ++t)
        for (int h = 0; h < c.n_heads; ++h) head(t, h);
    } else {
      for (int t = 0; t < n; ++t)
        for (int h = 0; h < c.n_heads; ++h) head(t, h);
    }
    if (image_dtype_quantized(L.wo.dtype)) {  // the numbers matmul(att_out_) would prepare itself, in reused buffers
      xq_->prepare(L.wo.dtype, att_out_.data(), n, dim);
      kernels::matmul(tmp_.data(), *xq_, L.wo, n);
    } else {
      kernels::matmul(tmp_.data(), att_out_.data(), L.wo, n);
    }
    add_bias(tmp_.data(), L.bo, dim);
    for (size_t i = 0; i < size_t(n) * dim; ++i) x_[i] += tmp_[i];

    if (!c.parallel_block()) norm(L.rms_ffn, L.ffn_norm_b);  // parallel: xb_ still holds the attention's input
    ffn_->ffn(l, pos0, n, xb_.data(), tmp_.data(), observer_);
    add_bias(tmp_.data(), L.b_down, dim);
    for (size_t i = 0; i < size_t(n) * dim; ++i) x_[i] += tmp_[i];
  }

  if (!logits) return;
  const int t0 = last_only ? n - 1 : 0;  // a prompt needs only its last token's logits
  norm(v_.rms_final, v_.final_norm_b, t0);
  kernels::matmul(logits, xb_.data() + size_t(t0) * dim, v_.classifier, n - t0);
  if (v_.cls_b)
    for (int t = 0; t < n - t0; ++t)
      for (int i = 0; i < c.vocab_size; ++i) logits[size_t(t) * size_t(c.vocab_size) + size_t(i)] += v_.cls_b[i];
}

}  // namespace nl
