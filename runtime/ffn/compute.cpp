// FlashFfn, the arithmetic over loaded bundles: coefficients h_k = act(gate_k) * (up_k . x) over the threads, the
// down projection in slot order, and prompt blocks (the union of a pass's sets read once, each token computed as
// alone).
#include <algorithm>

#include "formats/core/error.h"
#include "runtime/ffn/internal.h"
#include "runtime/parallel.h"

namespace nl {
using namespace ffn_detail;

kernels::BundleAct FlashFfn::bundle_act(GateFrom from) const {
  kernels::BundleAct a;
  a.gate = from == GateFrom::kGiven          ? kernels::BundleGate::kGiven
           : from == GateFrom::kBundleSparse ? kernels::BundleGate::kRelu
           : m_.config.act == FfnAct::kGelu  ? kernels::BundleGate::kGelu
                                             : kernels::BundleGate::kSilu;
  a.floor = m_.config.gate_floor();
  a.up_relu = m_.config.act == FfnAct::kDRelu;
  a.plain = m_.bundle_kind == BundleKind::kPlain;
  return a;
}

void FlashFfn::coefficients(size_t j0, size_t j1, const uint32_t* ids, GateFrom from) {
  // kernels::ffn_bundles's first phase, number for number: h_k = g_k * u_k, zero when g_k is zero.
  kernels::BundleAct act = bundle_act(from);
  const void* xr = xq_.row(xrow_);
  constexpr size_t kC = kernels::kBundleChunk;
  const uint8_t* b[kC];
  float g[kC], h[kC], bias[kC];
  const bool own_bias = cur_slot_bias_ && from != GateFrom::kGiven;  // plain bundles' own rows: fc1's bias
  if (own_bias) act.bias = bias;
  size_t ks[kC];
  auto index = [&](size_t j) { return ids ? size_t(ids[j]) : j; };  // position j of the range -> active index
  for (size_t c = j0; c < j1; c += kC) {
    const size_t m = std::min(kC, j1 - c);
    for (size_t i = 0; i < m; ++i) {
      const size_t k = ks[i] = index(c + i);
      b[i] = bundles_[k];
      if (from == GateFrom::kGiven) g[i] = g_by_slot_[active_[k]];
      if (own_bias) bias[i] = cur_slot_bias_[active_[k]];
    }
    if (c + kC < j1) {  // the next chunk's first bundles, requested while this one is computed
      const uint8_t* nb[kernels::kRowBlock];
      const size_t mn = std::min<size_t>(kernels::kRowBlock, j1 - c - kC);
      for (size_t i = 0; i < mn; ++i) nb[i] = bundles_[index(c + kC + i)];
      kernels::prefetch_bundles(m_.dtype, m_.config.dim, act.gate, nb, int(mn));
    }
    kernels::bundle_coefficients(m_.dtype, m_.config.dim, xr, act, g, b, int(m), h);
    for (size_t i = 0; i < m; ++i) h_[ks[i]] = h[i];
  }
}

void FlashFfn::coefficients_parallel(size_t k0, size_t k1, GateFrom from) {
  constexpr size_t kC = kernels::kBundleChunk;
  const long chunks = long((k1 - k0 + kC - 1) / kC);
  parallel_for(chunks, long(k1 - k0) * m_.config.dim > kOverlapParallelWork, [&](long c) {
    coefficients(k0 + size_t(c) * kC, std::min(k1, k0 + size_t(c + 1) * kC), nullptr, from);
  });
}

void FlashFfn::compute_range(int layer, size_t k0, size_t k1, GateFrom from, float* out, bool accumulate) {
  for (size_t k = k0; k < k1; ++k) bundles_[k] = bundle(layer, active_[k]);
  coefficients_parallel(k0, k1, from);
  // The neurons ffn_bundles keeps (with the gate from the bundle, those whose h is not zero), in slot order.
  hd_.clear();
  downs_.clear();
  for (size_t k = k0; k < k1; ++k)
    if (from != GateFrom::kBundleSparse || h_[k] != 0.0f) {
      hd_.push_back(h_[k]);
      downs_.push_back(bundles_[k] + down_off_);
    }
  kernels::down_project(m_.dtype, out, m_.config.dim, hd_.data(), downs_.data(), int(hd_.size()), accumulate);
}

void FlashFfn::ffn_block(int layer, int n, const float* x, float* out) {
  const ModelConfig& c = m_.config;
  const int dim = c.dim, hidden = c.hidden_dim;
  const bool predict = opt_.select == SelectMode::kLowRank && phase_ == LowRankPhase::kPredict;
  const bool gates = !gate_view_.empty();
  xq_.prepare(m_.dtype, x, n, dim);
  if (gates) {
    // Every token's gate in one matrix product (the same numbers as one token at a time).
    blk_g_.resize(size_t(n) * size_t(hidden));
    auto t0 = Clock::now();
    kernels::matmul(blk_g_.data(), xq_, gate_view_[size_t(layer)], n);
    add_gate_bias(layer, blk_g_.data(), n);
    if (!up_view_.empty()) {
      blk_u_.resize(size_t(n) * size_t(hidden));
      kernels::matmul(blk_u_.data(), xq_, up_view_[size_t(layer)], n);
    }
    const double each = since(t0) / n;
    if (!predict)
      for (int t = 0; t < n; ++t) batch_[size_t(t)].compute_seconds += each;
  }
  blk_active_.resize(size_t(n));
  GateFrom from = GateFrom::kGiven;
  for (int t = 0; t < n; ++t) {
    CountersSwap swap(&token_, &batch_[size_t(t)]);
    u_by_slot_ = up_view_.empty() ? nullptr : blk_u_.data() + size_t(t) * size_t(hidden);
    from = select_token(layer, t, x + size_t(t) * dim, gates ? blk_g_.data() + size_t(t) * size_t(hidden) : nullptr);
    blk_active_[size_t(t)].swap(active_);
    token_.active += blk_active_[size_t(t)].size();  // token t's own set (token_ is its counters here)
  }
  // The union of the block's sets, read once.
  active_.clear();
  for (const auto& a : blk_active_) active_.insert(active_.end(), a.begin(), a.end());
  std::sort(active_.begin(), active_.end());
  active_.erase(std::unique(active_.begin(), active_.end()), active_.end());
  blk_k_.assign(size_t(n), 0);
  auto compute = [&](int t, size_t k1) {
    // Token t's active indices [blk_k_[t], k1) as its own pass computes them (active_ is token t's meanwhile); its
    // first call starts at index 0 and overwrites its output, later ones continue the sums.
    active_.swap(blk_active_[size_t(t)]);
    xrow_ = t;
    g_by_slot_ = gates ? blk_g_.data() + size_t(t) * size_t(hidden) : nullptr;
    bundles_.resize(active_.size());
    h_.resize(active_.size());
    compute_range(layer, blk_k_[size_t(t)], k1, from, out + size_t(t) * dim, blk_k_[size_t(t)] > 0);
    active_.swap(blk_active_[size_t(t)]);
    blk_k_[size_t(t)] = k1;
  };
  // The union's reads and compute, shared evenly by the block's tokens (its active count is not: each token counted
  // its own set above).
  FlashCounters io;
  {
    CountersSwap swap(&token_, &io);
    load_batches(layer, [&](uint32_t slot_end, bool last) {
      for (int t = 0; t < n; ++t) {
        const auto& a = blk_active_[size_t(t)];
        const size_t k0 = blk_k_[size_t(t)];
        const size_t k1 =
            last ? a.size() : size_t(std::lower_bound(a.begin() + std::ptrdiff_t(k0), a.end(), slot_end) - a.begin());
        if (k1 > k0 || (last && k0 == 0)) compute(t, k1);  // a token with no neuron still gets its zero output
      }
    });
  }
  xrow_ = 0;
  for (int t = 0; t < n; ++t) {
    FlashCounters& b = batch_[size_t(t)];
    // Whole figures: the remainder goes to the block's first tokens.
    auto share = [&](uint64_t v) { return v / uint64_t(n) + (uint64_t(t) < v % uint64_t(n) ? 1 : 0); };
    b.reads += share(io.reads);
    b.bytes_read += share(io.bytes_read);
    b.bytes_needed += share(io.bytes_needed);
    b.cache_hits += share(io.cache_hits);
    b.io_seconds += io.io_seconds / n;
    b.io_busy_seconds += io.io_busy_seconds / n;
    b.verify_seconds += io.verify_seconds / n;
    b.compute_seconds += io.compute_seconds / n;
  }
}

}  // namespace nl
