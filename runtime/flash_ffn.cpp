// Sparse FFN from the flash image (runtime/flash_ffn.h).
#include "runtime/flash_ffn.h"

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <thread>

#include "formats/core/error.h"
#include "formats/core/quant.h"

namespace nl {

namespace {
using Clock = std::chrono::steady_clock;
// --overlap layer: bundles a computing thread claims at a time.
constexpr size_t kClaimChunk = 8;
// --overlap layer: below this many multiply-adds (bundles x dim) a layer's bundles are computed on the waiting thread
// alone; a region whose workers idle through the I/O costs more than it saves on small layers.
constexpr long kOverlapParallelWork = 1L << 18;
double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

void add(FlashCounters& a, const FlashCounters& b) {
  a.active += b.active;
  a.reads += b.reads;
  a.bytes_read += b.bytes_read;
  a.bytes_needed += b.bytes_needed;
  a.cache_hits += b.cache_hits;
  a.io_seconds += b.io_seconds;
  a.compute_seconds += b.compute_seconds;
  a.io_busy_seconds += b.io_busy_seconds;
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

bool overlap_mode_parse(const std::string& s, OverlapMode* out) {
  if (s == "none")
    *out = OverlapMode::kNone;
  else if (s == "layer")
    *out = OverlapMode::kLayer;
  else if (s == "cross")
    *out = OverlapMode::kCross;
  else if (s == "both")
    *out = OverlapMode::kBoth;
  else
    return false;
  return true;
}

const char* overlap_mode_name(OverlapMode m) {
  switch (m) {
    case OverlapMode::kNone:
      return "none";
    case OverlapMode::kLayer:
      return "layer";
    case OverlapMode::kCross:
      return "cross";
    case OverlapMode::kBoth:
      return "both";
  }
  return "?";
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
  prev_needed_.resize(size_t(c.n_layers));
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
  ov_ = OverlapCounters{};
  prev_needed_.assign(prev_needed_.size(), {});
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
  ov_ = OverlapCounters{};
  prev_needed_.assign(prev_needed_.size(), {});
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
  const double io = since(t0);
  token_.io_seconds += io;
  token_.io_busy_seconds += io;
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
  const bool overlapped = opt_.overlap != OverlapMode::kNone && opt_.select != SelectMode::kDense;
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
      prev_needed_[size_t(layer)] = active_;
      if (overlapped) {
        load_compute_overlapped(layer, ot, GateFrom::kBundleRelu);
        continue;
      }
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
      prev_needed_[size_t(layer)] = active_;
      if (overlapped) {
        load_compute_overlapped(layer, ot, c.act == FfnAct::kRelu ? GateFrom::kBundleRelu : GateFrom::kBundleSilu);
        continue;
      }
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
    if (opt_.select != SelectMode::kDense) {
      prev_needed_[size_t(layer)] = active_;
      if (overlapped) {
        load_compute_overlapped(layer, ot, GateFrom::kGiven);
        continue;
      }
      load(layer);
    }
    t0 = Clock::now();
    compute(layer, ot, false);
    token_.compute_seconds += since(t0);
  }
}

bool FlashFfn::wants_layer_input() const {
  return (opt_.overlap == OverlapMode::kCross || opt_.overlap == OverlapMode::kBoth) &&
         opt_.select != SelectMode::kDense && opt_.select != SelectMode::kReplay;
}

void FlashFfn::layer_start(int layer, int pos0, int n_tokens, const float* x) {
  (void)pos0;
  // Decode only: a prompt block's FFN reads are planned per token after its attention.
  if (!wants_layer_input() || n_tokens != 1) return;
  if (pf_layer_ >= 0) throw InternalError("read-ahead started while another layer's is pending");
  const SlotCache* cache = caches_[size_t(layer)].get();
  auto t0 = Clock::now();
  pf_pred_.clear();
  if (opt_.select == SelectMode::kLowRank && phase_ == LowRankPhase::kPredict) {
    // The low-rank gate on the layer input (normalised as the FFN's input), with the predict phase's threshold.
    const LowRankFactors& f = lowrank_[size_t(layer)];
    score_.resize(size_t(m_.config.hidden_dim));
    tmp_.resize(size_t(f.rank));
    f.predict(x, score_.data(), tmp_.data());
    const float thr = threshold_[size_t(layer)];
    for (int s = 0; s < m_.config.hidden_dim; ++s)
      if (score_[size_t(s)] >= thr && !(cache && cache->resident(uint32_t(s)))) pf_pred_.push_back(uint32_t(s));
  } else {
    // No weight-based predictor in this mode: the layer's previous token's set (temporal locality).
    for (uint32_t s : prev_needed_[size_t(layer)])
      if (!(cache && cache->resident(s))) pf_pred_.push_back(s);
  }
  token_.compute_seconds += since(t0);
  ++ov_.prefetches;
  ov_.predicted += pf_pred_.size();
  pf_plan_.clear();
  if (pf_pred_.empty()) return;
  planners_[size_t(layer)].plan(pf_pred_.data(), pf_pred_.size(), nullptr, pf_plan_);  // no cache: not a token
  uint64_t total = 0;
  pf_pos_.resize(pf_plan_.reads.size());
  for (size_t i = 0; i < pf_plan_.reads.size(); ++i) {
    pf_pos_[i] = total;
    total += pf_plan_.reads[i].length;
  }
  pf_staging_.resize(std::max<uint64_t>(total, 1));
  std::vector<ReadSpan> spans(pf_plan_.reads.size());
  for (size_t i = 0; i < spans.size(); ++i)
    spans[i] = {pf_plan_.reads[i].offset, pf_plan_.reads[i].length, pf_staging_.data() + pf_pos_[i]};
  pf_done_.assign(spans.size(), 0);
  pf_t0_ = Clock::now();
  pf_first_id_ = img_.io().submit(spans.data(), spans.size());
  pf_layer_ = layer;
  ov_.prefetch_bytes += pf_plan_.bytes_read;
  token_.reads += pf_plan_.reads.size();
  token_.bytes_read += pf_plan_.bytes_read;
}

void FlashFfn::bundle_coefficients(size_t k0, size_t k1, GateFrom from) {
  const int dim = m_.config.dim;
  const ImageDtype dt = m_.dtype;
  const void* xr = xq_.row(0);
  const size_t rb = row_bytes_;
  // kernels::ffn_bundles's first phase, number for number: h_i = g_i * (up_i . x), zero when g_i is zero.
  for (size_t k = k0; k < k1; ++k) {
    const size_t i = idx_[k];
    const uint8_t* b = bundles_[i];
    float gi;
    if (from == GateFrom::kGiven) {
      gi = g_[active_[i]];
    } else {
      gi = kernels::row_dot(dt, b, xr, dim);
      if (from == GateFrom::kBundleRelu) {
        if (!(gi > 0.0f)) gi = 0.0f;
      } else {
        gi = gi / (1.0f + std::exp(-gi));
      }
    }
    h_[i] = gi == 0.0f ? 0.0f : gi * kernels::row_dot(dt, b + rb, xr, dim);
  }
}

void FlashFfn::load_compute_overlapped(int layer, float* out, GateFrom from) {
  const int dim = m_.config.dim;
  IoEngine& io = img_.io();
  SlotCache* cache = caches_[size_t(layer)].get();
  const bool per_read = opt_.overlap == OverlapMode::kLayer || opt_.overlap == OverlapMode::kBoth;
  const bool pf = pf_layer_ == layer;
  if (pf_layer_ >= 0 && !pf) throw InternalError("read-ahead of another layer still pending");
  auto tc = Clock::now();
  double comp_s = 0, wait = 0;
  if (pf) {
    for (uint32_t s : active_)
      if (!(cache && cache->resident(s))) {
        ++ov_.needed;
        ov_.predicted_needed += std::binary_search(pf_pred_.begin(), pf_pred_.end(), s);
      }
  }
  if (cache) {
    // As load(): drop bytes of slots evicted by the previous token's update.
    auto& st = store_[size_t(layer)];
    for (auto it = st.begin(); it != st.end();) it = cache->resident(it->first) ? std::next(it) : st.erase(it);
  }
  planners_[size_t(layer)].plan(active_.data(), active_.size(), cache, plan_);
  const size_t R = plan_.reads.size();
  uint64_t total = 0;
  read_pos_.resize(R);
  for (size_t i = 0; i < R; ++i) {
    read_pos_[i] = total;
    total += plan_.reads[i].length;
  }
  staging_.resize(std::max<uint64_t>(total, 1));
  // Each exact read: pieces already read ahead (copied when their read-ahead span lands) and late pieces (read now).
  spans_.clear();
  span_read_.clear();
  copies_.clear();
  outstanding_.assign(R, 0);
  uint64_t late_bytes = 0;
  size_t pj = 0;
  const auto& pr = pf_plan_.reads;
  for (size_t ri = 0; ri < R; ++ri) {
    const uint64_t a = plan_.reads[ri].offset, b = a + plan_.reads[ri].length;
    uint64_t cur = a;
    auto late = [&](uint64_t lo, uint64_t hi) {
      spans_.push_back({lo, hi - lo, staging_.data() + read_pos_[ri] + (lo - a)});
      span_read_.push_back(uint32_t(ri));
      ++outstanding_[ri];
      late_bytes += hi - lo;
    };
    if (pf) {
      while (pj < pr.size() && pr[pj].offset + pr[pj].length <= a) ++pj;
      for (size_t k = pj; k < pr.size() && pr[k].offset < b; ++k) {
        const uint64_t lo = std::max(cur, pr[k].offset), hi = std::min(b, pr[k].offset + pr[k].length);
        if (hi <= lo) continue;
        if (lo > cur) late(cur, lo);
        copies_.push_back(
            {uint32_t(k), uint32_t(ri), pf_pos_[k] + (lo - pr[k].offset), read_pos_[ri] + (lo - a), hi - lo});
        ++outstanding_[ri];
        ov_.prefetch_used_bytes += hi - lo;
        cur = hi;
      }
    }
    if (cur < b) late(cur, b);
  }
  if (pf) ov_.late_bytes += late_bytes;
  token_.active += plan_.active;
  token_.bytes_needed += uint64_t(plan_.needed) * m_.bundle_bytes;
  token_.cache_hits += plan_.hits.size();
  token_.reads += spans_.size();
  token_.bytes_read += late_bytes;
  const auto t_io0 = pf ? pf_t0_ : Clock::now();
  late_first_id_ = spans_.empty() ? 0 : io.submit(spans_.data(), spans_.size());

  // Active indices per exact read (both ascending); the others are cache hits, in DRAM now.
  const size_t n = active_.size();
  h_.resize(n);
  bundles_.resize(n);
  read_active_.resize(R);
  hits_.clear();
  {
    size_t i = 0;
    for (size_t ri = 0; ri < R; ++ri) {
      const size_t gap0 = i;
      while (i < n && active_[i] < plan_.reads[ri].slot_begin) ++i;
      if (i > gap0) hits_.push_back({gap0, i});
      const size_t lo = i;
      while (i < n && active_[i] < plan_.reads[ri].slot_end) ++i;
      read_active_[ri] = {lo, i};
    }
    if (i < n) hits_.push_back({i, n});
  }
  // Bundles ready to compute (cache hits, then each read's as it completes), published in idx_ and claimed in
  // chunks by whichever thread is free: with threads, one OpenMP region per layer, the first thread waiting on the
  // I/O and publishing, the others computing; with one thread, the published bundles after each wait.
  std::atomic<size_t> pub{0}, claim{0};
  std::atomic<bool> stop{false};
  auto publish = [&](size_t lo, size_t hi) {
    size_t p = pub.load(std::memory_order_relaxed);
    for (size_t i = lo; i < hi; ++i) {
      bundles_[i] = bundle(layer, active_[i]);
      idx_[p++] = uint32_t(i);
    }
    pub.store(p, std::memory_order_release);
    if (io.in_flight() > 0) ov_.bundles_in_flight += hi - lo;
    ov_.bundles_computed += hi - lo;
  };
  // Computes published bundles; all = keep going until every bundle of the layer is claimed.
  // `idle` (per thread) gets the time spent with nothing published to compute: waiting on the I/O.
  auto work = [&](bool all, double* idle) {
    bool idling = false;
    Clock::time_point t_idle;
    for (;;) {
      size_t c = claim.load(std::memory_order_relaxed);
      const size_t p = pub.load(std::memory_order_acquire);
      if (c >= p) {
        if (!all || c >= n || stop.load(std::memory_order_relaxed)) {
          if (idling) *idle += since(t_idle);
          return;
        }
        if (!idling) idling = true, t_idle = Clock::now();
        std::this_thread::yield();
        continue;
      }
      if (idling) *idle += since(t_idle), idling = false;
      const size_t e = std::min(p, c + kClaimChunk);
      if (claim.compare_exchange_weak(c, e, std::memory_order_relaxed)) bundle_coefficients(c, e, from);
    }
  };
  idx_.resize(n);
  if (per_read) {
    for (auto [lo, hi] : hits_) publish(lo, hi);
  }
  // Copies grouped by read-ahead span (copies_ is in offset order, so by span too).
  auto copies_of = [&](size_t k) {
    auto lo =
        std::lower_bound(copies_.begin(), copies_.end(), k, [](const Copy& c, size_t kk) { return c.pf_read < kk; });
    auto hi = lo;
    while (hi != copies_.end() && hi->pf_read == k) ++hi;
    return std::make_pair(lo, hi);
  };
  auto ready = [&](size_t ri) {
    if (per_read) publish(read_active_[ri].first, read_active_[ri].second);
  };
  const int threads = per_read && long(n) * dim > kOverlapParallelWork ? omp_get_max_threads() : 1;
  // Waits on the engine until every read (and read-ahead) of the layer is in. With one thread `wait` is the time
  // blocked in it; with several, the time the computing threads had nothing to compute (the exposed I/O).
  std::vector<double> idle(size_t(threads), 0.0);
  auto io_loop = [&] {
    std::vector<uint64_t> done;
    while (io.pending() > 0) {
      done.clear();
      auto tw = Clock::now();
      io.wait_some(&done);
      if (threads == 1) wait += since(tw);
      for (uint64_t id : done) {
        if (pf && id >= pf_first_id_ && id < pf_first_id_ + pr.size()) {
          const size_t k = size_t(id - pf_first_id_);
          pf_done_[k] = 1;
          auto [c0, c1] = copies_of(k);
          for (auto c = c0; c != c1; ++c) {
            std::memcpy(staging_.data() + c->dst, pf_staging_.data() + c->src, c->bytes);
            if (--outstanding_[c->read] == 0) ready(c->read);
          }
        } else if (!spans_.empty() && id >= late_first_id_ && id < late_first_id_ + spans_.size()) {
          const uint32_t ri = span_read_[size_t(id - late_first_id_)];
          if (--outstanding_[ri] == 0) ready(ri);
        } else {
          throw InternalError("overlap: completion of a read this layer did not issue");
        }
      }
      if (threads == 1) work(false, &idle[0]);
    }
  };
  if (threads > 1) {
    std::exception_ptr err;
#pragma omp parallel num_threads(threads)
    {
      if (omp_get_thread_num() == 0) {
        try {
          io_loop();
        } catch (...) {
          err = std::current_exception();
          stop.store(true);
        }
      }
      work(true, &idle[size_t(omp_get_thread_num())]);
    }
    if (err) std::rethrow_exception(err);
    wait = *std::min_element(idle.begin() + 1, idle.end());
  } else {
    io_loop();
    if (per_read) work(true, &idle[0]);
  }
  comp_s += since(tc) - wait;                            // planning included, as load() + compute() count it
  const double busy = io.async() ? since(t_io0) : wait;  // a synchronous engine reads only while waited on
  pf_layer_ = -1;
  auto tc2 = Clock::now();
  for (uint32_t o : outstanding_)
    if (o != 0) throw InternalError("overlap: a read never completed");
  if (per_read) {
    // The down projection once, in slot order, over the neurons ffn_bundles would keep: the same sum as compute().
    size_t k = 0;
    const size_t rb2 = 2 * row_bytes_;
    for (size_t i = 0; i < n; ++i)
      if (from != GateFrom::kBundleRelu || h_[i] != 0.0f) {
        h_[k] = h_[i];
        bundles_[k++] = bundle(layer, active_[i]) + rb2;
      }
    kernels::down_project(m_.dtype, out, dim, h_.data(), bundles_.data(), int(k));
  } else if (from == GateFrom::kBundleSilu) {
    for (uint32_t s : active_) {
      const float gv = kernels::row_dot(m_.dtype, bundle(layer, s), xq_.row(0), dim);
      g_[s] = gv / (1.0f + std::exp(-gv));
    }
    compute(layer, out, false);
  } else {
    compute(layer, out, from == GateFrom::kBundleRelu);
  }
  comp_s += since(tc2);
  if (cache) {
    // As load(): keep the bytes of newly resident slots.
    auto& st = store_[size_t(layer)];
    for (const ReadOp& r : plan_.reads)
      for (uint32_t s = r.slot_begin; s < r.slot_end; ++s)
        if (cache->resident(s) && !st.count(s)) {
          const uint8_t* b = bundle(layer, s);
          st.emplace(s, std::vector<uint8_t>(b, b + m_.bundle_bytes));
        }
  }
  ++ov_.layer_tokens;
  ov_.io_busy_seconds += busy;
  ov_.io_wait_seconds += wait;
  token_.io_seconds += wait;
  token_.io_busy_seconds += busy;
  token_.compute_seconds += comp_s;
}

}  // namespace nl
