// Sparse FFN from the flash image (runtime/flash_ffn.h).
#include "runtime/flash_ffn.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>

#include "formats/core/error.h"
#include "formats/core/quant.h"

namespace nl {

namespace {
using Clock = std::chrono::steady_clock;
double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

void add(FlashCounters& a, const FlashCounters& b) {
  a.active += b.active;
  a.reads += b.reads;
  a.bytes_read += b.bytes_read;
  a.bytes_needed += b.bytes_needed;
  a.cache_hits += b.cache_hits;
  a.io_seconds += b.io_seconds;
  a.compute_seconds += b.compute_seconds;
}
}  // namespace

bool cache_policy_mode_parse(const std::string& s, CachePolicyMode* out) {
  if (s == "manifest")
    *out = CachePolicyMode::kManifest;
  else if (s == "linking-aligned")
    *out = CachePolicyMode::kLinkingAligned;
  else if (s == "all")
    *out = CachePolicyMode::kAll;
  else
    return false;
  return true;
}

const char* cache_policy_mode_name(CachePolicyMode m) {
  switch (m) {
    case CachePolicyMode::kManifest:
      return "manifest";
    case CachePolicyMode::kLinkingAligned:
      return "linking-aligned";
    case CachePolicyMode::kAll:
      return "all";
  }
  return "?";
}

FlashFfn::FlashFfn(FlashImage& image, const FlashFfnOptions& o) : img_(image), opt_(o), m_(image.manifest()) {
  const ModelConfig& c = m_.config;
  const uint32_t hidden = uint32_t(c.hidden_dim);
  for (int l = 0; l < c.n_layers; ++l) {
    PlannerConfig pc;
    pc.n_slots = hidden;
    pc.bundle_bytes = m_.bundle_bytes;
    pc.region_offset = m_.ffn(l).offset;
    pc.block_bytes = uint32_t(kIoBlock);
    pc.gap = o.gap;
    pc.cost = o.cost;
    planners_.emplace_back(pc);
    std::vector<uint32_t> inv(hidden);
    for (uint32_t s = 0; s < hidden; ++s) inv[m_.order[size_t(l)][s]] = s;
    slot_of_.push_back(std::move(inv));
  }
  make_caches();
  if (o.select == SelectMode::kLowRank) {
    if (c.act != FfnAct::kRelu)
      throw UsageError(
          "--select lowrank predicts ReLU sparsity; this model's FFN activation is SiLU (every neuron fires)");
    if (o.lowrank_rank < 1) throw UsageError("--select lowrank:R needs R >= 1");
  }
  row_bytes_ = image_row_bytes(m_.dtype, size_t(c.dim));
  if (image_dtype_quantized(m_.dtype) && c.dim % kQuantBlock != 0)
    throw InputError(img_.manifest_path(), "dim " + std::to_string(c.dim) + " is not a multiple of 32 (" +
                                               image_dtype_name(m_.dtype) + " bundles)");
  if (o.select == SelectMode::kThreshold && o.act_threshold.size() != size_t(c.n_layers))
    throw UsageError("--select threshold needs one threshold per layer (" + std::to_string(c.n_layers) + ")");
  if (o.select == SelectMode::kTrace) {
    if (m_.bundle_kind != BundleKind::kGated)
      throw UsageError("--select trace needs a gated FFN image (this one has plain bundles)");
    trace_active_.resize(size_t(c.n_layers));
  }
  if (o.select == SelectMode::kGate || o.select == SelectMode::kLowRank || o.select == SelectMode::kDense ||
      o.select == SelectMode::kThreshold) {
    if (m_.bundle_kind != BundleKind::kGated)
      throw UsageError("--select gate|dense|lowrank|threshold needs a gated FFN image (this one has plain bundles)");
    const size_t dim = size_t(c.dim);
    for (int l = 0; l < c.n_layers; ++l) {
      AlignedBuffer buf;
      img_.read_region(size_t(1 + l), &buf);  // checksummed here, once
      if (o.select == SelectMode::kLowRank) {
        // The predictor is fitted on f32 gate rows, decoded for the fit only.
        std::vector<float> g(size_t(hidden) * dim);
        const WeightView gv{m_.dtype, buf.data(), int(hidden), c.dim, size_t(m_.bundle_bytes)};
        for (uint32_t s = 0; s < hidden; ++s) kernels::dequantize_row(gv, int(s), g.data() + s * dim);
        lowrank_.push_back(lowrank_fit(g.data(), int(hidden), int(dim), o.lowrank_rank, 1 + uint64_t(l)));
      }
      if (o.select == SelectMode::kDense) {
        dense_.emplace_back(m_.dtype, c.dim, int(hidden), buf.data(), size_t(m_.bundle_bytes));
      } else {
        // Only the gate rows stay in DRAM, in the stored dtype.
        std::vector<uint8_t> g(size_t(hidden) * row_bytes_);
        for (uint32_t s = 0; s < hidden; ++s)
          std::memcpy(g.data() + s * row_bytes_, buf.data() + s * m_.bundle_bytes, row_bytes_);
        gate_bytes_.push_back(std::move(g));
      }
    }
    for (auto& g : gate_bytes_) gate_view_.push_back({m_.dtype, g.data(), int(hidden), c.dim, row_bytes_});
    threshold_.assign(size_t(c.n_layers), -std::numeric_limits<float>::infinity());
    calib_.resize(size_t(c.n_layers));
  }
}

void FlashFfn::make_caches() {
  const ModelConfig& c = m_.config;
  const uint32_t hidden = uint32_t(c.hidden_dim);
  caches_.clear();
  store_.assign(size_t(c.n_layers), {});
  pinned_bundles_ = pinned_reads_ = pinned_bytes_read_ = 0;
  for (int l = 0; l < c.n_layers; ++l) {
    CacheConfig cc = opt_.cache;
    cc.capacity = cache_capacity_for_ratio(opt_.cache_ratio, hidden);
    cc.seed = cache_seed_for_layer(opt_.cache.seed, uint32_t(l));
    switch (opt_.cache_policy) {
      case CachePolicyMode::kManifest:
        if (!m_.cache_policy.empty())
          cache_apply_policy(cc, m_.cache_policy[size_t(l)].admission, m_.cache_policy[size_t(l)].pinned,
                             m_.cache_policy[size_t(l)].small_fraction);
        break;
      case CachePolicyMode::kLinkingAligned:
        cc.linking_aligned = true;
        break;
      case CachePolicyMode::kAll:
        cc.linking_aligned = false;
        break;
    }
    caches_.push_back(cc.capacity > 0 || cc.window_tokens > 0 ? std::make_unique<SlotCache>(hidden, cc) : nullptr);
    load_pinned(l, cc.pinned);
  }
}

void FlashFfn::load_pinned(int layer, const std::vector<uint32_t>& pinned) {
  SlotCache* cache = caches_[size_t(layer)].get();
  if (!cache || pinned.empty()) return;
  // The cache holds the listed slots that fit its capacity (hottest first); nothing else is resident yet.
  active_.clear();
  for (uint32_t s : pinned)
    if (cache->resident(s) && !store_[size_t(layer)].count(s)) active_.push_back(s);
  if (active_.empty()) return;
  std::sort(active_.begin(), active_.end());
  active_.erase(std::unique(active_.begin(), active_.end()), active_.end());
  planners_[size_t(layer)].plan(active_.data(), active_.size(), nullptr, plan_);  // no cache: not a token
  uint64_t total = 0;
  read_pos_.resize(plan_.reads.size());
  spans_.clear();
  for (size_t i = 0; i < plan_.reads.size(); ++i) {
    read_pos_[i] = total;
    total += plan_.reads[i].length;
  }
  staging_.resize(std::max<uint64_t>(total, 1));
  for (size_t i = 0; i < plan_.reads.size(); ++i)
    spans_.push_back({plan_.reads[i].offset, plan_.reads[i].length, staging_.data() + read_pos_[i]});
  img_.io().read(spans_.data(), spans_.size());
  auto& st = store_[size_t(layer)];
  for (uint32_t s : active_) {
    const uint8_t* b = bundle(layer, s);
    st.emplace(s, std::vector<uint8_t>(b, b + m_.bundle_bytes));
  }
  pinned_bundles_ += active_.size();
  pinned_reads_ += plan_.reads.size();
  pinned_bytes_read_ += plan_.bytes_read;
  plan_.clear();
}

void FlashFfn::set_phase(LowRankPhase p, double target_recall) {
  if (opt_.select != SelectMode::kLowRank) throw InternalError("set_phase outside --select lowrank");
  if (phase_ == LowRankPhase::kCalibrate) {
    // Per layer: at most floor((1 - target) * n) of the n recorded firing neurons may score below the threshold.
    for (size_t l = 0; l < calib_.size(); ++l) {
      auto& v = calib_[l];
      if (v.empty()) {
        threshold_[l] = std::numeric_limits<float>::infinity();
        continue;
      }
      std::sort(v.begin(), v.end());
      const size_t miss = size_t(std::floor((1.0 - target_recall) * double(v.size())));
      threshold_[l] = v[std::min(miss, v.size() - 1)];
      v.clear();
    }
  }
  phase_ = p;
  make_caches();
  total_ = token_ = FlashCounters{};
  per_token_.clear();
  pred_ = PredictorCounters{};
}

void FlashFfn::set_trace_active(int layer, const std::vector<uint32_t>& neurons) {
  if (opt_.select != SelectMode::kTrace) throw InternalError("set_trace_active outside --select trace");
  auto& a = trace_active_[size_t(layer)];
  a.clear();
  for (uint32_t n : neurons) {
    if (n >= slot_of_[size_t(layer)].size()) throw InternalError("trace: neuron index out of range");
    a.push_back(slot_of_[size_t(layer)][n]);
  }
  std::sort(a.begin(), a.end());
}

void FlashFfn::set_thresholds(const std::vector<float>& t) {
  if (opt_.select != SelectMode::kThreshold || t.size() != opt_.act_threshold.size())
    throw InternalError("set_thresholds outside --select threshold or with the wrong layer count");
  opt_.act_threshold = t;
  make_caches();
  total_ = token_ = FlashCounters{};
  per_token_.clear();
  thr_ = ThresholdCounters{};
}

const uint8_t* FlashFfn::bundle(int layer, uint32_t slot) const {
  // In one of this token's reads?
  auto it = std::upper_bound(plan_.reads.begin(), plan_.reads.end(), slot,
                             [](uint32_t s, const ReadOp& r) { return s < r.slot_begin; });
  if (it != plan_.reads.begin()) {
    const size_t ri = size_t(it - plan_.reads.begin()) - 1;
    const ReadOp& r = plan_.reads[ri];
    if (slot < r.slot_end)
      return staging_.data() + read_pos_[ri] + (m_.ffn(layer).offset + uint64_t(slot) * m_.bundle_bytes - r.offset);
  }
  auto s = store_[size_t(layer)].find(slot);
  if (s == store_[size_t(layer)].end())
    throw InternalError("slot " + std::to_string(slot) + " of layer " + std::to_string(layer) +
                        " neither read nor cached");
  return s->second.data();
}

void FlashFfn::load(int layer) {
  SlotCache* cache = caches_[size_t(layer)].get();
  if (cache) {
    // Drop bytes of slots evicted by the previous token's update (not earlier: that token's FFN still used them).
    auto& st = store_[size_t(layer)];
    for (auto it = st.begin(); it != st.end();) it = cache->resident(it->first) ? std::next(it) : st.erase(it);
  }
  planners_[size_t(layer)].plan(active_.data(), active_.size(), cache, plan_);
  uint64_t total = 0;
  read_pos_.resize(plan_.reads.size());
  for (size_t i = 0; i < plan_.reads.size(); ++i) {
    read_pos_[i] = total;
    total += plan_.reads[i].length;
  }
  staging_.resize(std::max<uint64_t>(total, 1));
  spans_.clear();
  for (size_t i = 0; i < plan_.reads.size(); ++i)
    spans_.push_back({plan_.reads[i].offset, plan_.reads[i].length, staging_.data() + read_pos_[i]});
  auto t0 = Clock::now();
  if (!spans_.empty()) img_.io().read(spans_.data(), spans_.size());
  token_.io_seconds += since(t0);
  token_.active += plan_.active;
  token_.reads += plan_.reads.size();
  token_.bytes_read += plan_.bytes_read;
  token_.bytes_needed += uint64_t(plan_.needed) * m_.bundle_bytes;
  token_.cache_hits += plan_.hits.size();
  if (cache) {
    // plan() has already recorded this token in the cache (hits, admissions, window). Keep the bytes of newly resident
    // slots (any slot this token's reads covered may be admitted, gap slots included).
    auto& st = store_[size_t(layer)];
    for (const ReadOp& r : plan_.reads)
      for (uint32_t s = r.slot_begin; s < r.slot_end; ++s)
        if (cache->resident(s) && !st.count(s)) {
          const uint8_t* b = bundle(layer, s);
          st.emplace(s, std::vector<uint8_t>(b, b + m_.bundle_bytes));
        }
  }
}

void FlashFfn::replay_layer(int layer, const std::vector<uint32_t>& neurons) {
  active_.clear();
  for (uint32_t n : neurons) {
    if (n >= slot_of_[size_t(layer)].size()) throw InternalError("replay: neuron index out of range");
    active_.push_back(slot_of_[size_t(layer)][n]);
  }
  std::sort(active_.begin(), active_.end());
  load(layer);
}

void FlashFfn::end_token() {
  if (batch_.empty()) batch_.push_back(token_);
  for (FlashCounters& t : batch_) {
    t.tokens = 1;
    per_token_.push_back(t);
    add(total_, t);
    ++total_.tokens;
  }
  batch_.clear();
  token_ = FlashCounters{};
}

void FlashFfn::compute(int layer, float* out, bool gate_in_bundle) {
  const size_t n = active_.size();
  bundles_.resize(n);
  h_.resize(n);
  for (size_t i = 0; i < n; ++i) {
    bundles_[i] = bundle(layer, active_[i]);
    h_[i] = g_[active_[i]];  // the gate values of the listed neurons, in list order
  }
  kernels::ffn_bundles(m_.dtype, m_.config.dim, xq_, gate_in_bundle ? nullptr : h_.data(), bundles_.data(), int(n),
                       out);
}

void FlashFfn::ffn(int layer, int pos0, int n_tokens, const float* x, float* out, FfnObserver* observer) {
  (void)pos0;
  (void)observer;
  if (opt_.select == SelectMode::kReplay)
    throw UsageError("the model forward needs --select gate, dense, lowrank, trace or threshold");
  const bool predict = opt_.select == SelectMode::kLowRank && phase_ == LowRankPhase::kPredict;
  const ModelConfig& c = m_.config;
  const int dim = c.dim, hidden = c.hidden_dim;
  g_.resize(size_t(hidden));
  if (n_tokens > 1 && batch_.size() < size_t(n_tokens)) batch_.resize(size_t(n_tokens));
  if (opt_.select == SelectMode::kDense) {
    // Every token of the pass at once over the re-laid-out bundles (gate's numbers); the time split evenly.
    const auto t0 = Clock::now();
    dense_[size_t(layer)].ffn(x, n_tokens, c.act, out);
    const double each = since(t0) / n_tokens;
    for (int t = 0; t < n_tokens; ++t) (n_tokens > 1 ? batch_[size_t(t)] : token_).compute_seconds += each;
    return;
  }
  for (int t = 0; t < n_tokens; ++t) {
    // Token t of a batch accounts into its own counters (token_ holds them while it runs).
    struct Swap {
      FlashFfn* f;
      FlashCounters* c;
      ~Swap() {
        if (c) std::swap(f->token_, *c);
      }
    } swap{this, n_tokens > 1 ? &batch_[size_t(t)] : nullptr};
    if (swap.c) std::swap(token_, *swap.c);
    const float* xt = x + size_t(t) * dim;
    float* ot = out + size_t(t) * dim;
    xq_.prepare(m_.dtype, xt, 1, dim);
    if (predict) {
      // Measurement only (untimed): the exact gate, to count which predicted neurons really fire.
      kernels::matmul(g_.data(), xq_, gate_view_[size_t(layer)], 1);
      auto t0 = Clock::now();
      const LowRankFactors& f = lowrank_[size_t(layer)];
      score_.resize(size_t(hidden));
      tmp_.resize(size_t(f.rank));
      f.predict(xt, score_.data(), tmp_.data());
      const float thr = threshold_[size_t(layer)];
      active_.clear();
      for (int s = 0; s < hidden; ++s)
        if (score_[size_t(s)] >= thr) active_.push_back(uint32_t(s));
      token_.compute_seconds += since(t0);
      for (int s = 0; s < hidden; ++s) {
        const bool fires = g_[size_t(s)] > 0.0f, chosen = score_[size_t(s)] >= thr;
        pred_.truly_active += fires;
        pred_.true_positive += fires && chosen;
      }
      pred_.predicted += active_.size();
      load(layer);
      t0 = Clock::now();
      compute(layer, ot, true);
      token_.compute_seconds += since(t0);
      continue;
    }
    if (opt_.select == SelectMode::kTrace) {
      // The given neurons' bundles; each gate from the bundle's own row (no gate rows in DRAM), in the stored dtype.
      // ReLU: ffn_bundles applies the gate itself (zeros add nothing); SiLU: the gates first, then the same sum.
      active_ = trace_active_[size_t(layer)];
      load(layer);
      auto t0 = Clock::now();
      if (c.act == FfnAct::kRelu) {
        compute(layer, ot, true);
      } else {
        for (uint32_t s : active_) {
          const float gv = kernels::row_dot(m_.dtype, bundle(layer, s), xq_.row(0), dim);
          g_[s] = gv / (1.0f + std::exp(-gv));
        }
        compute(layer, ot, false);
      }
      token_.compute_seconds += since(t0);
      continue;
    }
    auto t0 = Clock::now();
    kernels::matmul(g_.data(), xq_, gate_view_[size_t(layer)], 1);
    active_.clear();
    for (int s = 0; s < hidden; ++s) {
      if (c.act == FfnAct::kRelu) {
        if (g_[size_t(s)] > 0.0f) active_.push_back(uint32_t(s));
      } else {
        g_[size_t(s)] = g_[size_t(s)] / (1.0f + std::exp(-g_[size_t(s)]));
        active_.push_back(uint32_t(s));
      }
    }
    if (opt_.select == SelectMode::kThreshold) {
      // CATS: keep |act| > t (ReLU: act > max(0, t)); the mass kept is measured on the same activations.
      const float thr = opt_.act_threshold[size_t(layer)];
      size_t k = 0;
      for (int s = 0; s < hidden; ++s)
        thr_.mass_total += std::fabs(double(c.act == FfnAct::kRelu ? std::max(0.0f, g_[size_t(s)]) : g_[size_t(s)]));
      for (uint32_t s : active_) {
        const float a = std::fabs(g_[s]);
        if (a > thr) {
          active_[k++] = s;
          thr_.mass_kept += double(a);
        }
      }
      active_.resize(k);
      thr_.kept += k;
      thr_.total += uint64_t(hidden);
    }
    token_.compute_seconds += since(t0);
    if (opt_.select == SelectMode::kLowRank && phase_ == LowRankPhase::kCalibrate) {
      const LowRankFactors& f = lowrank_[size_t(layer)];
      score_.resize(size_t(hidden));
      tmp_.resize(size_t(f.rank));
      f.predict(xt, score_.data(), tmp_.data());
      for (uint32_t s : active_) calib_[size_t(layer)].push_back(score_[s]);
      calib_samples_ += active_.size();
    }
    if (opt_.select != SelectMode::kDense) load(layer);
    t0 = Clock::now();
    compute(layer, ot, false);
    token_.compute_seconds += since(t0);
  }
}

}  // namespace nl
