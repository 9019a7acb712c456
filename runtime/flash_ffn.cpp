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

#include "formats/core/enum_names.h"
#include "formats/core/error.h"
#include "formats/core/quant.h"
#include "runtime/memory.h"
#include "runtime/parallel.h"

namespace nl {

namespace {
using Clock = std::chrono::steady_clock;
// --overlap layer: bundles a computing thread claims at a time.
constexpr size_t kClaimChunk = 8;
// --overlap layer: below this many multiply-adds (bundles x dim) a layer's bundles are computed on the waiting thread
// alone; a region whose workers idle through the I/O costs more than it saves on small layers.
constexpr long kOverlapParallelWork = 1L << 18;
// --overlap cross: reads ahead beyond what the layer's attention hides only when at least this share of the
// previous token's predicted slots were needed (a read-ahead beyond the window costs its unused share's device time).
// Measured (docs/runtime.md): real small-relu, about a third needed, cross went from 1.29x to 1.17x of none's time;
// synthetic Mistral-7B, 85-88 % needed, waited 3-5 % longer for reads when every layer was cut at the window.
constexpr double kReadAheadPrecision = 0.5;
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
  a.verify_seconds += b.verify_seconds;
  a.replica_reads += b.replica_reads;
}
}  // namespace

namespace {
constexpr EnumName<CachePolicyMode> kCachePolicyModeNames[] = {{CachePolicyMode::kManifest, "manifest"},
                                                               {CachePolicyMode::kLinkingAligned, "linking-aligned"},
                                                               {CachePolicyMode::kAll, "all"}};
constexpr EnumName<OverlapMode> kOverlapModeNames[] = {{OverlapMode::kNone, "none"},
                                                       {OverlapMode::kLayer, "layer"},
                                                       {OverlapMode::kCross, "cross"},
                                                       {OverlapMode::kBoth, "both"}};
}  // namespace

bool cache_policy_mode_parse(const std::string& s, CachePolicyMode* out) {
  return enum_parse(kCachePolicyModeNames, s, out);
}

bool overlap_mode_parse(const std::string& s, OverlapMode* out) { return enum_parse(kOverlapModeNames, s, out); }

const char* overlap_mode_name(OverlapMode m) { return enum_name(kOverlapModeNames, m); }

const char* cache_policy_mode_name(CachePolicyMode m) { return enum_name(kCachePolicyModeNames, m); }

FlashFfn::FlashFfn(FlashImage& image, const FlashFfnOptions& o) : img_(image), opt_(o), m_(image.manifest()) {
  const ModelConfig& c = m_.config;
  const uint32_t hidden = uint32_t(c.hidden_dim);
  if (m_.replicated()) {
    if (o.select == SelectMode::kLowRank || o.select == SelectMode::kDense)
      throw UsageError(std::string("--select ") + (o.select == SelectMode::kDense ? "dense" : "lowrank") +
                       " does not read replicated images (" + img_.manifest_path() +
                       " holds flash replicas): use gate, threshold, trace or replay, or pack without replicas");
    if (o.overlap == OverlapMode::kCross || o.overlap == OverlapMode::kBoth)
      throw UsageError("--overlap " + std::string(overlap_mode_name(o.overlap)) + " does not read replicated images (" +
                       img_.manifest_path() + " holds flash replicas): use --overlap layer or none");
  }
  if (o.verify_reads) sums_ = img_.bundle_sums();
  const FfnStaging fs = ffn_staging(m_, o.read_batch_bytes, o.read_ahead_bytes);  // as memory_plan charges them
  staging_cap_ = fs.batch;
  opt_.read_ahead_bytes = fs.read_ahead;
  for (int l = 0; l < c.n_layers; ++l) {
    PlannerConfig pc;
    pc.n_slots = m_.n_slots(l);
    pc.bundle_bytes = m_.bundle_bytes;
    pc.region_offset = m_.ffn(l).offset;
    pc.block_bytes = uint32_t(kIoBlock);
    pc.gap = o.gap;
    pc.cost = o.cost;
    pc.max_read_bytes = staging_cap_;
    planners_.emplace_back(pc);
    const auto& order = m_.order[size_t(l)];
    if (order.size() != hidden) {  // the manifest was checked: each neuron once or twice
      rep_.push_back(std::make_unique<ReplicaMap>(ReplicaMap::from_order(order, hidden)));
      cover_.push_back(std::make_unique<ReplicaCover>(*rep_.back(), pc));
      slot_of_.push_back(rep_.back()->first);
      std::vector<uint32_t> firsts(rep_.back()->first);
      std::sort(firsts.begin(), firsts.end());
      first_slots_.push_back(std::move(firsts));
      alias_.push_back(rep_.back()->cache_alias());
    } else {
      rep_.push_back(nullptr);
      cover_.push_back(nullptr);
      std::vector<uint32_t> inv(hidden);
      for (uint32_t s = 0; s < hidden; ++s) inv[order[s]] = s;
      slot_of_.push_back(std::move(inv));
      first_slots_.emplace_back();
      alias_.emplace_back();
    }
  }
  // The selections that keep gate rows in DRAM read every FFN region below: the pinned bundles come from those bytes.
  pinned_from_regions_ =
      o.select == SelectMode::kGate || o.select == SelectMode::kLowRank || o.select == SelectMode::kThreshold;
  make_caches();
  prev_needed_.resize(size_t(c.n_layers));
  pf_window_.assign(size_t(c.n_layers), 0.0);
  pf_precision_.assign(size_t(c.n_layers), 0.0);
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
    // One staging buffer for every layer's region (grown, never shrunk): a fresh one per layer took its page faults
    // again each time, ~6 ms per 1.9 MB layer of small-relu on the development host (a virtual machine).
    AlignedBuffer buf;
    // Every layer's DRAM copy (the dense FFN, or the gate rows) in one allocation: one matrix per layer is a few MB
    // on a small model, below the size that gets huge pages on its own, and on 4 KiB pages the 1,536 x 384 f16 gate
    // and up matrices of small-relu streamed 1.5x slower (1 thread, AMD EPYC Zen 4: 514-562 against 348-361 us per
    // token for the 8 gate products).
    const auto piece = [](size_t b) { return (b + 63) / 64 * 64; };
    const size_t layer_dram =
        piece(o.select == SelectMode::kDense ? kernels::DenseBundles::bytes_for(m_.dtype, c.dim, int(hidden))
                                             : size_t(hidden) * row_bytes_);
    ffn_dram_.resize_uninit(size_t(c.n_layers) * layer_dram);
    for (int l = 0; l < c.n_layers; ++l) {
      uint8_t* dram = ffn_dram_.data() + size_t(l) * layer_dram;
      const uint64_t bytes = img_.read_region(size_t(1 + l), &buf);  // checksummed here, once
      fill_pinned(l, buf.data(), bytes);
      if (o.select == SelectMode::kLowRank) {
        // The predictor is fitted on f32 gate rows, decoded for the fit only.
        std::vector<float> g(size_t(hidden) * dim);
        const WeightView gv{m_.dtype, buf.data(), int(hidden), c.dim, size_t(m_.bundle_bytes)};
        for (uint32_t s = 0; s < hidden; ++s) kernels::dequantize_row(gv, int(s), g.data() + s * dim);
        lowrank_.push_back(lowrank_fit(g.data(), int(hidden), int(dim), o.lowrank_rank, 1 + uint64_t(l)));
      }
      if (o.select == SelectMode::kDense) {
        dense_.emplace_back(m_.dtype, c.dim, int(hidden), buf.data(), size_t(m_.bundle_bytes), dram);
      } else {
        // Only the gate rows stay in DRAM, in the stored dtype; a replicated layer keeps its first copies' (row r is
        // the r-th first copy in slot order).
        const auto& firsts = first_slots_[size_t(l)];
        for (uint32_t s = 0; s < hidden; ++s)
          std::memcpy(dram + s * row_bytes_, buf.data() + (firsts.empty() ? s : firsts[s]) * m_.bundle_bytes,
                      row_bytes_);
        gate_view_.push_back({m_.dtype, dram, int(hidden), c.dim, row_bytes_});
        // Only matrix products read these rows: q8_0 takes the interleaved layout where the path has kernels for it
        // (the same numbers; the copy is ours).
        kernels::q8_interleave_if_pays(&gate_view_.back());
      }
    }
    threshold_.assign(size_t(c.n_layers), -std::numeric_limits<float>::infinity());
    calib_.resize(size_t(c.n_layers));
  }
  pinned_from_regions_ = false;  // from now on (make_caches again: a new run) pinned bundles are read
  for (const auto& w : pinned_wait_)
    if (!w.empty()) throw InternalError("pinned bundles listed for a region that was not read");
}

void FlashFfn::make_caches() {
  const ModelConfig& c = m_.config;
  const uint32_t hidden = uint32_t(c.hidden_dim);
  caches_.clear();
  store_.reset(c.n_layers, m_.bundle_bytes);
  pinned_bundles_ = pinned_reads_ = pinned_bytes_read_ = 0;
  for (int l = 0; l < c.n_layers; ++l) {
    CacheConfig cc = opt_.cache;
    cc.capacity = cache_capacity_for_ratio(opt_.cache_ratio, hidden);
    cc.alias = alias_[size_t(l)];  // both copies of a neuron share its first copy's entry, as in nl-layout eval
    cc.seed = cache_seed_for_layer(opt_.cache.seed, uint32_t(l));
    switch (opt_.cache_policy) {
      case CachePolicyMode::kManifest:
        if (!m_.cache_policy.empty()) {
          const ImageCachePolicy& p = m_.cache_policy[size_t(l)];
          cache_apply_policy(cc, p.admission, p.pinned, p.small_fraction, p.hot);
        }
        break;
      case CachePolicyMode::kLinkingAligned:
        cc.linking_aligned = true;
        break;
      case CachePolicyMode::kAll:
        cc.linking_aligned = false;
        break;
    }
    const uint32_t n_slots = m_.n_slots(l);
    // A cache that holds every neuron of the layer (a --memory-budget above the whole FFN, --cache-ratio 1) holds
    // them from the start: the layer is read once at load in long reads, as llama.cpp's mmap pages the whole model
    // in on its first token, instead of neuron by neuron in short reads while tokens wait (small-relu with its e2e
    // cap as --memory-budget, 2 threads: 5.8-7.3 ms for each of the first 16 decoded tokens, about 1.2 afterwards).
    if (cc.capacity >= hidden && cc.window_tokens == 0) {
      cc.pinned.clear();
      for (uint32_t s = 0; s < n_slots; ++s)
        if (cc.alias.empty() || cc.alias[s] == s) cc.pinned.push_back(s);
    }
    caches_.push_back(cc.capacity > 0 || cc.window_tokens > 0 ? std::make_unique<SlotCache>(n_slots, cc) : nullptr);
    if (caches_.back()) store_.enable(l, n_slots, cc.capacity);  // indexed by cache key (slab_key)
    load_pinned(l, cc.pinned);
  }
}

void FlashFfn::slab_keep(int layer, size_t p0, size_t p1) {
  const SlotCache* cache = caches_[size_t(layer)].get();
  if (!cache) return;
  // plan() has already recorded this token in the cache (hits, admissions, window): any slot the reads covered may
  // have been admitted, gap slots included.
  for (size_t p = p0; p < p1; ++p)
    for (uint32_t s = pieces_[p].slot_begin; s < pieces_[p].slot_end; ++s)
      if (cache->resident(s) && !slab_find(layer, s)) slab_put(layer, s, bundle(layer, s));
}

void FlashFfn::make_pieces(int layer, const std::vector<ReadOp>& reads, std::vector<Piece>* pieces,
                           std::vector<size_t>* batch_end) const {
  pieces->clear();
  for (const ReadOp& r : reads)
    planners_[size_t(layer)].for_each_piece(r, [&](uint32_t sb, uint32_t se, uint64_t offset, uint64_t length) {
      if (length > staging_cap_) throw InternalError("flash FFN: a read piece is longer than the staging");
      pieces->push_back({sb, se, offset, length, 0});
    });
  if (batch_end) batch_end->clear();
  uint64_t pos = 0;
  for (size_t p = 0; p < pieces->size(); ++p) {
    Piece& pc = (*pieces)[p];
    if (pos + pc.length > staging_cap_) {
      if (batch_end) batch_end->push_back(p);
      pos = 0;
    }
    pc.pos = pos;
    pos += pc.length;
  }
  if (batch_end && !pieces->empty()) batch_end->push_back(pieces->size());
}

void FlashFfn::load_pinned(int layer, const std::vector<uint32_t>& pinned) {
  SlotCache* cache = caches_[size_t(layer)].get();
  if (!cache || pinned.empty()) return;
  // The cache holds the listed slots that fit its capacity (hottest first); nothing else is resident yet.
  active_.clear();
  for (uint32_t s : pinned)
    if (cache->resident(s) && !slab_find(layer, s)) active_.push_back(s);
  if (active_.empty()) return;
  std::sort(active_.begin(), active_.end());
  active_.erase(std::unique(active_.begin(), active_.end()), active_.end());
  if (pinned_from_regions_) {
    pinned_wait_.resize(size_t(m_.config.n_layers));
    pinned_wait_[size_t(layer)] = active_;
    return;
  }
  planners_[size_t(layer)].plan(active_.data(), active_.size(), nullptr, plan_);  // no cache: not a token
  const uint64_t cap = staging_cap_;
  make_pieces(layer, plan_.reads, &pieces_, &batch_end_);
  staging_.resize(cap);
  size_t p0 = 0, k = 0;
  for (size_t b = 0; b < batch_end_.size(); ++b) {
    const size_t p1 = batch_end_[b];
    spans_.clear();
    for (size_t p = p0; p < p1; ++p)
      spans_.push_back({pieces_[p].offset, pieces_[p].length, staging_.data() + pieces_[p].pos});
    img_.io().read(spans_.data(), spans_.size());
    cur_batch_ = int(b), cur_p0_ = p0, cur_p1_ = p1;
    verify_pieces(layer, p0, p1);
    for (; k < active_.size() && active_[k] < pieces_[p1 - 1].slot_end; ++k)
      slab_put(layer, active_[k], bundle(layer, active_[k]));
    pinned_bytes_read_ += [&] {
      uint64_t t = 0;
      for (size_t p = p0; p < p1; ++p) t += pieces_[p].length;
      return t;
    }();
    p0 = p1;
  }
  cur_batch_ = -1;
  slab_settle(layer);
  pinned_bundles_ += active_.size();
  pinned_reads_ += pieces_.size();
  plan_.clear();
}
void FlashFfn::fill_pinned(int layer, const uint8_t* region, uint64_t region_bytes) {
  if (size_t(layer) >= pinned_wait_.size() || pinned_wait_[size_t(layer)].empty()) return;
  const std::vector<uint32_t>& slots = pinned_wait_[size_t(layer)];
  for (uint32_t s : slots) slab_put(layer, s, region + uint64_t(s) * m_.bundle_bytes);
  slab_settle(layer);
  pinned_bundles_ += slots.size();
  pinned_reads_ += 1;  // the region's one read, shared with the gate rows
  pinned_bytes_read_ += region_bytes;
  pinned_wait_[size_t(layer)].clear();
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
  pf_window_.assign(pf_window_.size(), 0.0);
  pf_precision_.assign(pf_precision_.size(), 0.0);
  pred_layer_ = -1;
}

void FlashFfn::set_trace_active(int layer, const std::vector<uint32_t>& neurons, int token) {
  if (opt_.select != SelectMode::kTrace) throw InternalError("set_trace_active outside --select trace");
  if (token < 0) throw InternalError("set_trace_active: negative token");
  auto& per_token = trace_active_[size_t(layer)];
  if (per_token.size() <= size_t(token)) per_token.resize(size_t(token) + 1);
  auto& a = per_token[size_t(token)];
  a.clear();
  for (uint32_t n : neurons) {
    if (n >= slot_of_[size_t(layer)].size()) throw InternalError("trace: neuron index out of range");
    // A replicated layer keeps the neurons: the copies are chosen when the layer runs, under the cache then.
    a.push_back(rep_[size_t(layer)] ? n : slot_of_[size_t(layer)][n]);
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
  pf_window_.assign(pf_window_.size(), 0.0);
  pf_precision_.assign(pf_precision_.size(), 0.0);
  pred_layer_ = -1;
}

const uint8_t* FlashFfn::bundle(int layer, uint32_t slot) const {
  // In the batch now in the staging?
  if (cur_batch_ >= 0) {
    auto it = std::upper_bound(pieces_.begin() + std::ptrdiff_t(cur_p0_), pieces_.begin() + std::ptrdiff_t(cur_p1_),
                               slot, [](uint32_t s, const Piece& p) { return s < p.slot_begin; });
    if (it != pieces_.begin() + std::ptrdiff_t(cur_p0_)) {
      const Piece& p = *(it - 1);
      if (slot < p.slot_end) {
        const uint64_t at = m_.ffn(layer).offset + uint64_t(slot) * m_.bundle_bytes - p.offset;
        if (p.ahead != kNotAhead) return pf_staging_.data() + p.ahead + at;
        return staging_.data() + cur_off_ + p.pos + at;
      }
    }
  }
  if (const uint8_t* b = slab_find(layer, slot)) return b;
  throw InternalError("slot " + std::to_string(slot) + " of layer " + std::to_string(layer) +
                      " neither read nor cached");
}

void FlashFfn::verify_pieces(int layer, size_t p0, size_t p1) {
  if (sums_.empty()) return;
  const auto t0 = Clock::now();
  const std::vector<uint64_t>& sums = sums_[size_t(layer)];
  for (size_t p = p0; p < p1; ++p)
    for (uint32_t s = pieces_[p].slot_begin; s < pieces_[p].slot_end; ++s) {
      const uint64_t got = xxh3_of(bundle(layer, s), m_.bundle_bytes);
      if (got != sums[s])
        throw InputError(img_.image_path(), "bundle slot " + std::to_string(s) + " of layer " + std::to_string(layer) +
                                                " read back as other bytes (xxh3 " + hex64(got) + ", " +
                                                hex64(sums[s]) +
                                                " at start-up): the storage returned corrupt data (--verify-reads)");
    }
  token_.verify_seconds += since(t0);
}

void FlashFfn::coefficients(size_t j0, size_t j1, const uint32_t* ids, GateFrom from) {
  // kernels::ffn_bundles's first phase, number for number: h_k = g_k * (up_k . x), zero when g_k is zero.
  const kernels::BundleGate gate = from == GateFrom::kGiven        ? kernels::BundleGate::kGiven
                                   : from == GateFrom::kBundleRelu ? kernels::BundleGate::kRelu
                                                                   : kernels::BundleGate::kSilu;
  const void* xr = xq_.row(xrow_);
  constexpr size_t kC = kernels::kBundleChunk;
  const uint8_t* b[kC];
  float g[kC], h[kC];
  size_t ks[kC];
  auto index = [&](size_t j) { return ids ? size_t(ids[j]) : j; };  // position j of the range -> active index
  for (size_t c = j0; c < j1; c += kC) {
    const size_t m = std::min(kC, j1 - c);
    for (size_t i = 0; i < m; ++i) {
      const size_t k = ks[i] = index(c + i);
      b[i] = bundles_[k];
      if (from == GateFrom::kGiven) g[i] = g_by_slot_[active_[k]];
    }
    if (c + kC < j1) {  // the next chunk's first bundles, requested while this one is computed
      const uint8_t* nb[kernels::kRowBlock];
      const size_t mn = std::min<size_t>(kernels::kRowBlock, j1 - c - kC);
      for (size_t i = 0; i < mn; ++i) nb[i] = bundles_[index(c + kC + i)];
      kernels::prefetch_bundles(m_.dtype, m_.config.dim, gate, nb, int(mn));
    }
    kernels::bundle_coefficients(m_.dtype, m_.config.dim, xr, gate, g, b, int(m), h);
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
    if (from != GateFrom::kBundleRelu || h_[k] != 0.0f) {
      hd_.push_back(h_[k]);
      downs_.push_back(bundles_[k] + 2 * row_bytes_);
    }
  kernels::down_project(m_.dtype, out, m_.config.dim, hd_.data(), downs_.data(), int(hd_.size()), accumulate);
}

void FlashFfn::load_batches(int layer, const std::function<void(uint32_t, bool)>& landed) {
  SlotCache* cache = caches_[size_t(layer)].get();
  auto t0 = Clock::now();
  planners_[size_t(layer)].plan(active_.data(), active_.size(), cache, plan_);
  // Bytes of slots the cache no longer holds go (not before this token's plan: the previous token's FFN used them),
  // except this token's hits, served from the slab below.
  if (cache) store_.drop_evicted(layer, cache, plan_.hits);
  const uint64_t cap = staging_cap_;
  make_pieces(layer, plan_.reads, &pieces_, &batch_end_);
  staging_.resize(cap);
  double io = 0;
  uint64_t bytes = 0;
  size_t p0 = 0;
  for (size_t b = 0; b < batch_end_.size(); ++b) {
    const size_t p1 = batch_end_[b];
    spans_.clear();
    for (size_t p = p0; p < p1; ++p) {
      spans_.push_back({pieces_[p].offset, pieces_[p].length, staging_.data() + pieces_[p].pos});
      bytes += pieces_[p].length;
    }
    auto ti = Clock::now();
    img_.io().read(spans_.data(), spans_.size());
    io += since(ti);
    cur_batch_ = int(b), cur_p0_ = p0, cur_p1_ = p1;
    verify_pieces(layer, p0, p1);
    slab_keep(layer, p0, p1);
    if (landed) landed(pieces_[p1 - 1].slot_end, false);
    p0 = p1;
  }
  cur_batch_ = -1;
  if (landed) landed(0, true);
  slab_settle(layer);
  token_.io_seconds += io;
  token_.io_busy_seconds += io;
  if (landed) token_.compute_seconds += since(t0) - io;  // planning included, as the overlapped path counts it
  token_.active += plan_.active;
  token_.reads += pieces_.size();
  token_.bytes_read += bytes;
  token_.bytes_needed += uint64_t(plan_.needed) * m_.bundle_bytes;
  token_.cache_hits += plan_.hits.size();
}

void FlashFfn::load_compute(int layer, float* out, GateFrom from) {
  if (!out) {
    load_batches(layer, nullptr);
    return;
  }
  const size_t n = active_.size();
  bundles_.resize(n);
  h_.resize(n);
  size_t k0 = 0;
  bool first = true;
  const bool ordered = begin_ordered(layer);
  load_batches(layer, [&](uint32_t slot_end, bool last) {
    if (!last) {
      // This batch's neurons and the hits before its last piece, then the next batch into the same buffer.
      const size_t k1 =
          size_t(std::lower_bound(active_.begin() + std::ptrdiff_t(k0), active_.end(), slot_end) - active_.begin());
      if (ordered)
        compute_ordered(layer, k0, k1, from, out, false);
      else
        compute_range(layer, k0, k1, from, out, !first);
      first = false;
      k0 = k1;
    } else if (ordered) {
      compute_ordered(layer, k0, n, from, out, true);
    } else if (k0 < n || first) {
      compute_range(layer, k0, n, from, out, !first);  // the hits after the last read
    }
  });
}

void FlashFfn::replay_layer(int layer, const std::vector<uint32_t>& neurons) {
  if (rep_[size_t(layer)]) {
    choose_copies(layer, neurons.data(), neurons.size());
    load_compute(layer, nullptr, GateFrom::kGiven);
    return;
  }
  active_.clear();
  for (uint32_t n : neurons) {
    if (n >= slot_of_[size_t(layer)].size()) throw InternalError("replay: neuron index out of range");
    active_.push_back(slot_of_[size_t(layer)][n]);
  }
  std::sort(active_.begin(), active_.end());
  load_compute(layer, nullptr, GateFrom::kGiven);
}

void FlashFfn::choose_copies(int layer, const uint32_t* neurons, size_t n) {
  for (size_t k = 0; k < n; ++k)
    if (neurons[k] >= slot_of_[size_t(layer)].size()) throw InternalError("active neuron index out of range");
  // The cover sees the cache as the planner will (before this token's update), as nl-layout eval's does.
  cover_[size_t(layer)]->choose(neurons, n, caches_[size_t(layer)].get(), active_);
  const ReplicaMap& rm = *rep_[size_t(layer)];
  seconds_ = 0;
  for (uint32_t s : active_) seconds_ += rm.first_of(s) != s;
  token_.replica_reads += seconds_;
}

bool FlashFfn::begin_ordered(int layer) {
  const ReplicaMap* rm = rep_[size_t(layer)].get();
  if (!rm) return false;
  const size_t n = active_.size();
  if (seconds_ == 0) return false;  // every chosen copy is a first copy: slot order is first-copy order
  ord_.resize(n);
  for (size_t k = 0; k < n; ++k) ord_[k] = k;
  std::sort(ord_.begin(), ord_.end(),
            [&](size_t a, size_t b) { return rm->first_of(active_[a]) < rm->first_of(active_[b]); });
  ord_pos_.resize(n);
  for (size_t q = 0; q < n; ++q) ord_pos_[ord_[q]] = q;
  down_of_.resize(n);
  ord_q_ = 0;
  ord_started_ = false;
  if (stash_cap_ < n * row_bytes_) {  // grows only; its pages are touched only by what waits
    stash_cap_ = n * row_bytes_;
    stash_.reset(new uint8_t[stash_cap_]);
  }
  return true;
}

void FlashFfn::compute_ordered(int layer, size_t k0, size_t k1, GateFrom from, float* out, bool last,
                               bool coefficients) {
  for (size_t k = k0; k < k1; ++k) {
    if (coefficients) bundles_[k] = bundle(layer, active_[k]);
    down_of_[k] = bundles_[k] + 2 * row_bytes_;
  }
  if (coefficients) coefficients_parallel(k0, k1, from);
  // Every index landed so far (< k1) whose turn came, in first-copy order, kept as compute_range keeps them.
  hd_.clear();
  downs_.clear();
  const size_t n = active_.size();
  for (; ord_q_ < n && ord_[ord_q_] < k1; ++ord_q_) {
    const size_t k = ord_[ord_q_];
    if (from != GateFrom::kBundleRelu || h_[k] != 0.0f) {
      hd_.push_back(h_[k]);
      downs_.push_back(down_of_[k]);
    }
  }
  if (!hd_.empty() || !ord_started_) {
    kernels::down_project(m_.dtype, out, m_.config.dim, hd_.data(), downs_.data(), int(hd_.size()), ord_started_);
    ord_started_ = true;
  }
  if (last) return;
  for (size_t k = k0; k < k1; ++k)
    if (ord_pos_[k] >= ord_q_) {
      uint8_t* dst = stash_.get() + k * row_bytes_;
      std::memcpy(dst, down_of_[k], row_bytes_);
      down_of_[k] = dst;
    }
}

void FlashFfn::reserve(int n_tokens) {
  if (!dense_.empty()) dense_.front().reserve(n_tokens);  // one scratch for every layer (dense_bundles.cpp)
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

namespace {
// Token t of a multi-token pass accounts into its own counters: they stand in for the current token's meanwhile.
struct CountersSwap {
  FlashCounters* cur;
  FlashCounters* other;  // null: a one-token pass, nothing to swap
  CountersSwap(FlashCounters* c, FlashCounters* o) : cur(c), other(o) {
    if (other) std::swap(*cur, *other);
  }
  ~CountersSwap() {
    if (other) std::swap(*cur, *other);
  }
  CountersSwap(const CountersSwap&) = delete;
  CountersSwap& operator=(const CountersSwap&) = delete;
};
}  // namespace

FlashFfn::GateFrom FlashFfn::select_token(int layer, int t, const float* xt, float* g) {
  const ModelConfig& c = m_.config;
  const int hidden = c.hidden_dim;
  g_by_slot_ = g;
  if (opt_.select == SelectMode::kLowRank && phase_ == LowRankPhase::kPredict) {
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
    // Measurement only (untimed): the exact gate `g`, to count which predicted neurons really fire.
    for (int s = 0; s < hidden; ++s) {
      const bool fires = g[s] > 0.0f, chosen = score_[size_t(s)] >= thr;
      pred_.truly_active += fires;
      pred_.true_positive += fires && chosen;
    }
    pred_.predicted += active_.size();
    prev_needed_[size_t(layer)] = active_;
    return GateFrom::kBundleRelu;
  }
  if (opt_.select == SelectMode::kTrace) {
    // The given neurons' bundles; each gate from the bundle's own row (no gate rows in DRAM), in the stored dtype.
    // ReLU: ffn_bundles applies the gate itself (zeros add nothing); SiLU: the gates first, then the same sum.
    const auto& per_token = trace_active_[size_t(layer)];
    if (size_t(t) >= per_token.size())
      throw InternalError("trace: no active set for token " + std::to_string(t) + " of layer " + std::to_string(layer));
    const auto& given = per_token[size_t(t)];
    if (rep_[size_t(layer)])
      choose_copies(layer, given.data(), given.size());
    else
      active_ = given;
    prev_needed_[size_t(layer)] = active_;
    return c.act == FfnAct::kRelu ? GateFrom::kBundleRelu : GateFrom::kBundleSilu;
  }
  auto t0 = Clock::now();
  active_.clear();
  for (int s = 0; s < hidden; ++s) {
    if (c.act == FfnAct::kRelu) {
      if (g[s] > 0.0f) active_.push_back(uint32_t(s));
    } else {
      g[s] = g[s] / (1.0f + std::exp(-g[s]));
      active_.push_back(uint32_t(s));
    }
  }
  if (opt_.select == SelectMode::kThreshold) {
    // CATS: keep |act| > t (ReLU: act > max(0, t)); the mass kept is measured on the same activations.
    const float thr = opt_.act_threshold[size_t(layer)];
    size_t k = 0;
    for (int s = 0; s < hidden; ++s)
      thr_.mass_total += std::fabs(double(c.act == FfnAct::kRelu ? std::max(0.0f, g[s]) : g[s]));
    for (uint32_t s : active_) {
      const float a = std::fabs(g[s]);
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
  if (const ReplicaMap* rm = rep_[size_t(layer)].get()) {
    // active_ holds ranks of first copies (the gate rows' order): to neurons, the gates by slot, then the copies.
    const auto& firsts = first_slots_[size_t(layer)];
    neurons_.clear();
    g_slot_.resize(rm->n_slots());
    for (uint32_t r : active_) {
      const uint32_t v = rm->neuron_of[firsts[r]];
      neurons_.push_back(v);
      g_slot_[rm->first[v]] = g[r];
      if (rm->second[v] != kNoSlot) g_slot_[rm->second[v]] = g[r];
    }
    g_by_slot_ = g_slot_.data();
    choose_copies(layer, neurons_.data(), neurons_.size());
  }
  prev_needed_[size_t(layer)] = active_;
  return GateFrom::kGiven;
}

void FlashFfn::ffn(int layer, int pos0, int n_tokens, const float* x, float* out, FfnObserver* observer) {
  (void)pos0;
  (void)observer;
  if (opt_.select == SelectMode::kReplay)
    throw UsageError("the model forward needs --select gate, dense, lowrank, trace or threshold");
  const bool predict = opt_.select == SelectMode::kLowRank && phase_ == LowRankPhase::kPredict;
  const bool overlapped = opt_.overlap != OverlapMode::kNone && opt_.select != SelectMode::kDense;
  const bool gates = opt_.select != SelectMode::kTrace;  // gate rows in DRAM: the caller computes the gate
  const ModelConfig& c = m_.config;
  const int dim = c.dim, hidden = c.hidden_dim;
  if (n_tokens > 1 && batch_.size() < size_t(n_tokens)) batch_.resize(size_t(n_tokens));
  if (opt_.select == SelectMode::kDense) {
    // Every token of the pass at once over the re-laid-out bundles (gate's numbers); the time split evenly.
    const auto t0 = Clock::now();
    dense_[size_t(layer)].ffn(x, n_tokens, c.act, out);
    const double each = since(t0) / n_tokens;
    for (int t = 0; t < n_tokens; ++t) (n_tokens > 1 ? batch_[size_t(t)] : token_).compute_seconds += each;
    return;
  }
  if (n_tokens > 1 && !rep_[size_t(layer)]) {
    ffn_block(layer, n_tokens, x, out);
    return;
  }
  g_.resize(size_t(hidden));
  for (int t = 0; t < n_tokens; ++t) {
    CountersSwap swap(&token_, n_tokens > 1 ? &batch_[size_t(t)] : nullptr);
    const float* xt = x + size_t(t) * dim;
    float* ot = out + size_t(t) * dim;
    xq_.prepare(m_.dtype, xt, 1, dim);
    xrow_ = 0;
    if (gates) {
      auto t0 = Clock::now();
      kernels::matmul(g_.data(), xq_, gate_view_[size_t(layer)], 1);
      if (!predict) token_.compute_seconds += since(t0);  // predict: the exact gate is a measurement (untimed)
    }
    const GateFrom from = select_token(layer, t, xt, g_.data());
    if (overlapped)
      load_compute_overlapped(layer, ot, from);
    else
      load_compute(layer, ot, from);
  }
}

void FlashFfn::ffn_block(int layer, int n, const float* x, float* out) {
  const ModelConfig& c = m_.config;
  const int dim = c.dim, hidden = c.hidden_dim;
  const bool predict = opt_.select == SelectMode::kLowRank && phase_ == LowRankPhase::kPredict;
  const bool gates = opt_.select != SelectMode::kTrace;
  xq_.prepare(m_.dtype, x, n, dim);
  if (gates) {
    // Every token's gate in one matrix product (the same numbers as one token at a time).
    blk_g_.resize(size_t(n) * size_t(hidden));
    auto t0 = Clock::now();
    kernels::matmul(blk_g_.data(), xq_, gate_view_[size_t(layer)], n);
    const double each = since(t0) / n;
    if (!predict)
      for (int t = 0; t < n; ++t) batch_[size_t(t)].compute_seconds += each;
  }
  blk_active_.resize(size_t(n));
  GateFrom from = GateFrom::kGiven;
  for (int t = 0; t < n; ++t) {
    CountersSwap swap(&token_, &batch_[size_t(t)]);
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
  pred_layer_ = layer;  // its window is measured from the end of this call (see the return paths below)
  win_t0_ = Clock::now();
  ++ov_.prefetches;
  ov_.predicted += pf_pred_.size();
  pf_plan_.clear();
  if (pf_pred_.empty()) return;
  planners_[size_t(layer)].plan(pf_pred_.data(), pf_pred_.size(), nullptr, pf_plan_);  // no cache: not a token
  // The first read_ahead_bytes of the predicted reads, in slot order (split as the exact reads are).
  make_pieces(layer, pf_plan_.reads, &pf_pieces_, nullptr);
  // At most read_ahead_bytes, and (with a device model) no more than the device reads, by that model, within the
  // window this layer's attention gave on the previous token, unless the prediction was mostly right then: reads
  // beyond the window are not hidden, and those the exact selection does not use cost the token their device time
  // (a small model's attention hides almost nothing).
  const double window = opt_.cost.bandwidth_MBps > 0 && pf_precision_[size_t(layer)] < kReadAheadPrecision
                            ? pf_window_[size_t(layer)]
                            : 0.0;
  uint64_t total = 0;
  double secs = 0;
  size_t k = 0;
  for (; k < pf_pieces_.size() && total + pf_pieces_[k].length <= opt_.read_ahead_bytes; ++k) {
    const double t = opt_.cost.seconds(double(pf_pieces_[k].length));
    if (window > 0 && secs + t > window) break;
    secs += t;
    pf_pieces_[k].pos = total;
    total += pf_pieces_[k].length;
  }
  pf_pieces_.resize(k);
  if (pf_pieces_.empty()) return;
  pf_staging_.resize(total);  // grows to at most read_ahead_bytes
  std::vector<ReadSpan> spans(pf_pieces_.size());
  for (size_t i = 0; i < spans.size(); ++i)
    spans[i] = {pf_pieces_[i].offset, pf_pieces_[i].length, pf_staging_.data() + pf_pieces_[i].pos};
  pf_done_.assign(spans.size(), 0);
  pf_t0_ = Clock::now();
  pf_first_id_ = img_.io().submit(spans.data(), spans.size());
  pf_layer_ = layer;
  win_t0_ = Clock::now();
  ov_.prefetch_bytes += total;
  token_.reads += spans.size();
  token_.bytes_read += total;
}

void FlashFfn::bundle_coefficients(size_t k0, size_t k1, GateFrom from) { coefficients(k0, k1, idx_.data(), from); }

void FlashFfn::load_compute_overlapped(int layer, float* out, GateFrom from) {
  OverlapRun r;
  r.layer = layer;
  r.out = out;
  r.from = from;
  r.per_read = opt_.overlap == OverlapMode::kLayer || opt_.overlap == OverlapMode::kBoth;
  r.pf = pf_layer_ == layer;
  if (pf_layer_ >= 0 && !r.pf) throw InternalError("read-ahead of another layer still pending");
  r.tc = Clock::now();
  overlap_plan(r);
  // Batch by batch: its late reads submitted, its bundles computed as their pieces complete (cache hits at once),
  // then its down projection added in slot order; the staging is then free for the next batch.
  r.ordered = begin_ordered(layer);  // a replicated layer-token reading second copies: first-copy order
  batch_id_.assign(batch_end_.size(), 0);
  for (size_t bi = 0; bi < batch_end_.size(); ++bi) overlap_batch(r, bi);
  overlap_finish(r);
}

void FlashFfn::overlap_plan(OverlapRun& r) {
  const int layer = r.layer;
  SlotCache* cache = caches_[size_t(layer)].get();
  // The layer's window and its prediction's precision on this token (whether or not anything was read ahead), and,
  // when something was (pf: always a layer just predicted), the read-ahead figures.
  if (pred_layer_ == layer) {
    pf_window_[size_t(layer)] = std::chrono::duration<double>(r.tc - win_t0_).count();
    size_t hit = 0;
    for (uint32_t s : active_) {
      const bool predicted = std::binary_search(pf_pred_.begin(), pf_pred_.end(), s);
      hit += predicted;
      if (r.pf && !(cache && cache->resident(s))) {
        ++ov_.needed;
        ov_.predicted_needed += predicted;
      }
    }
    pf_precision_[size_t(layer)] = pf_pred_.empty() ? 0.0 : double(hit) / double(pf_pred_.size());
  }
  pred_layer_ = -1;
  planners_[size_t(layer)].plan(active_.data(), active_.size(), cache, plan_);
  // As load_compute(): bytes of slots the cache no longer holds go, except this token's hits.
  if (cache) store_.drop_evicted(layer, cache, plan_.hits);
  r.cap = staging_cap_;
  make_pieces(layer, plan_.reads, &pieces_, &batch_end_);
  // Two batch buffers when there is more than one batch: batch b + 1's reads land in one while batch b is computed
  // from the other, so the device does not idle through each batch's down projection and cache admissions.
  r.two = batch_end_.size() > 1;
  staging_.resize(r.two ? kFfnOverlapReadBuffers * r.cap : r.cap);
  const uint64_t late_bytes = overlap_spans(r);
  if (r.pf) ov_.late_bytes += late_bytes;
  token_.active += plan_.active;
  token_.bytes_needed += uint64_t(plan_.needed) * m_.bundle_bytes;
  token_.cache_hits += plan_.hits.size();
  token_.reads += spans_.size();
  token_.bytes_read += late_bytes;
  r.t_io0 = r.pf ? pf_t0_ : Clock::now();
  r.io_started = r.pf;
  // Active indices per piece (both ascending); the others are cache hits, in DRAM now.
  const size_t n = r.n = active_.size();
  h_.resize(n);
  bundles_.resize(n);
  idx_.resize(n);
  const size_t P = pieces_.size();
  read_active_.resize(P);
  size_t i = 0;
  for (size_t ri = 0; ri < P; ++ri) {
    while (i < n && active_[i] < pieces_[ri].slot_begin) ++i;
    const size_t lo = i;
    while (i < n && active_[i] < pieces_[ri].slot_end) ++i;
    read_active_[ri] = {lo, i};
  }
}

uint64_t FlashFfn::overlap_spans(const OverlapRun& r) {
  // Each piece: parts already read ahead (copied when their read-ahead piece lands) and late parts (read in its
  // batch). Late spans are listed in piece order, so each batch's are contiguous.
  const size_t P = pieces_.size();
  spans_.clear();
  span_read_.clear();
  copies_.clear();
  batch_span_.assign(1, 0);
  outstanding_.assign(P, 0);
  uint64_t late_bytes = 0;
  size_t pj = 0, b = 0;
  uint64_t used_hi = 0;
  const auto& pr = pf_pieces_;
  for (size_t ri = 0; ri < P; ++ri) {
    if (ri == batch_end_[b]) batch_span_.push_back(spans_.size()), ++b;
    const uint64_t a = pieces_[ri].offset, e = a + pieces_[ri].length, pos = pieces_[ri].pos;
    uint64_t cur = a;
    auto late = [&](uint64_t lo, uint64_t hi) {
      spans_.push_back({lo, hi - lo, batch_base(b, r.cap) + pos + (lo - a)});
      span_read_.push_back(uint32_t(ri));
      ++outstanding_[ri];
      late_bytes += hi - lo;
    };
    if (r.pf) {
      // Pieces of one read may share a block with the next: the read-ahead scan restarts where this piece starts.
      while (pj > 0 && pr[pj - 1].offset + pr[pj - 1].length > a) --pj;
      while (pj < pr.size() && pr[pj].offset + pr[pj].length <= a) ++pj;
      for (size_t k = pj; k < pr.size() && pr[k].offset < e; ++k) {
        const uint64_t lo = std::max(cur, pr[k].offset), hi = std::min(e, pr[k].offset + pr[k].length);
        if (hi <= lo) continue;
        if (lo > cur) late(cur, lo);
        // A piece one read-ahead span covers whole is used where it landed (Piece::ahead, bundle()): its copy moves no
        // bytes and only waits for that span.
        const bool whole = lo == a && hi == e;
        if (whole) pieces_[ri].ahead = pr[k].pos + (lo - pr[k].offset);
        copies_.push_back(
            {uint32_t(k), uint32_t(ri), pr[k].pos + (lo - pr[k].offset), pos + (lo - a), whole ? 0 : hi - lo});
        ++outstanding_[ri];
        // Pieces of a split read share at most a block: each byte counts once.
        if (hi > used_hi) ov_.prefetch_used_bytes += hi - std::max(lo, used_hi), used_hi = hi;
        ++(whole ? ov_.pieces_in_place : ov_.pieces_copied);
        cur = hi;
      }
    }
    if (cur < e) late(cur, e);
  }
  while (batch_span_.size() <= batch_end_.size()) batch_span_.push_back(spans_.size());
  // Copies grouped by read-ahead piece.
  std::stable_sort(copies_.begin(), copies_.end(), [](const Copy& x, const Copy& y) { return x.pf_read < y.pf_read; });
  return late_bytes;
}

std::pair<std::vector<FlashFfn::Copy>::iterator, std::vector<FlashFfn::Copy>::iterator> FlashFfn::copies_of(size_t k) {
  auto lo =
      std::lower_bound(copies_.begin(), copies_.end(), k, [](const Copy& c, size_t kk) { return c.pf_read < kk; });
  auto hi = lo;
  while (hi != copies_.end() && hi->pf_read == k) ++hi;
  return {lo, hi};
}

void FlashFfn::overlap_submit(OverlapRun& r, size_t b, bool ahead) {
  // Batch b's late spans out; `ahead`: while batch b - 1 is read and computed.
  const size_t s0 = batch_span_[b], s1 = batch_span_[b + 1];
  if (s1 > s0) {
    if (!r.io_started) r.t_io0 = Clock::now(), r.io_started = true;
    batch_id_[b] = img_.io().submit(spans_.data() + s0, s1 - s0);
    ov_.batches_ahead += ahead;
  }
  ++ov_.batches;
}

void FlashFfn::overlap_publish(OverlapBatch& b, size_t lo, size_t hi) {
  size_t q = b.pub.load(std::memory_order_relaxed);
  for (size_t i = lo; i < hi; ++i) {
    bundles_[i] = bundle(b.layer, active_[i]);
    idx_[q++] = uint32_t(i);
  }
  b.pub.store(q, std::memory_order_release);
  if (img_.io().in_flight() > 0) ov_.bundles_in_flight += hi - lo;
  ov_.bundles_computed += hi - lo;
}

void FlashFfn::overlap_ready(const OverlapRun& r, OverlapBatch& b, size_t ri) {
  verify_pieces(r.layer, ri, ri + 1);
  --b.left;
  if (r.per_read) overlap_publish(b, read_active_[ri].first, read_active_[ri].second);
}

void FlashFfn::overlap_work(const OverlapRun& r, OverlapBatch& b, bool all, double* idle) {
  // Coefficients of published bundles, claimed kClaimChunk at a time; `all`: until the batch's last one is done.
  bool idling = false;
  Clock::time_point t_idle;
  for (;;) {
    size_t c = b.claim.load(std::memory_order_relaxed);
    const size_t q = b.pub.load(std::memory_order_acquire);
    if (c >= q) {
      if (!all || c >= b.k1 || b.stop.load(std::memory_order_relaxed)) {
        if (idling) *idle += since(t_idle);
        return;
      }
      if (!idling) idling = true, t_idle = Clock::now();
      std::this_thread::yield();
      continue;
    }
    if (idling) *idle += since(t_idle), idling = false;
    const size_t e = std::min(q, c + kClaimChunk);
    if (b.claim.compare_exchange_weak(c, e, std::memory_order_relaxed)) bundle_coefficients(c, e, r.from);
  }
}

void FlashFfn::overlap_io_loop(const OverlapRun& r, OverlapBatch& b, int threads, double* idle, double* bwait) {
  IoEngine& io = img_.io();
  const size_t bi = b.bi;
  std::vector<uint64_t> done;
  while (b.left > 0) {
    done.clear();
    auto tw = Clock::now();
    io.wait_some(&done);
    if (threads == 1) *bwait += since(tw);
    for (uint64_t id : done) {
      if (r.pf && id >= pf_first_id_ && id < pf_first_id_ + pf_pieces_.size()) {
        const size_t k = size_t(id - pf_first_id_);
        pf_done_[k] = 1;
        auto [c0, c1] = copies_of(k);
        for (auto c = c0; c != c1; ++c) {
          if (c->read < b.p0 || c->read >= b.p1) continue;  // a later batch copies it when its turn comes
          std::memcpy(batch_base(bi, r.cap) + c->dst, pf_staging_.data() + c->src, c->bytes);
          if (--outstanding_[c->read] == 0) overlap_ready(r, b, c->read);
        }
      } else if (b.s1 > b.s0 && id >= batch_id_[bi] && id < batch_id_[bi] + (b.s1 - b.s0)) {
        const uint32_t ri = span_read_[b.s0 + size_t(id - batch_id_[bi])];
        if (--outstanding_[ri] == 0) overlap_ready(r, b, ri);
      } else if (b.n1 > b.n0 && id >= batch_id_[bi + 1] && id < batch_id_[bi + 1] + (b.n1 - b.n0)) {
        --outstanding_[span_read_[b.n0 + size_t(id - batch_id_[bi + 1])]];  // the next batch's: counted at its turn
      } else {
        throw InternalError("overlap: completion of a read this layer did not issue");
      }
    }
    if (threads == 1) overlap_work(r, b, false, idle);
  }
}

void FlashFfn::overlap_batch(OverlapRun& r, size_t bi) {
  const int layer = r.layer;
  const size_t p0 = r.p0, p1 = batch_end_[bi];
  OverlapBatch b;
  b.layer = layer;
  b.bi = bi, b.p0 = p0, b.p1 = p1;
  b.k1 = size_t(std::lower_bound(active_.begin() + std::ptrdiff_t(r.k0), active_.end(), pieces_[p1 - 1].slot_end) -
                active_.begin());
  b.pub.store(r.k0), b.claim.store(r.k0);
  cur_batch_ = int(bi), cur_p0_ = p0, cur_p1_ = p1, cur_off_ = uint64_t(batch_base(bi, r.cap) - staging_.data());
  // Parts already read ahead are copied now; the late spans go out.
  for (const Copy& c : copies_)
    if (c.read >= p0 && c.read < p1 && pf_done_[c.pf_read]) {
      std::memcpy(batch_base(bi, r.cap) + c.dst, pf_staging_.data() + c.src, c.bytes);
      --outstanding_[c.read];
    }
  // This batch's late spans (unless out already) and the next batch's, into the other buffer (free: the batch
  // before this one is done).
  if (bi == 0 || !r.two) overlap_submit(r, bi, false);
  const bool next = r.two && bi + 1 < batch_end_.size();  // the next batch's spans go out now too
  if (next) overlap_submit(r, bi + 1, true);
  b.s0 = batch_span_[bi], b.s1 = batch_span_[bi + 1];
  b.n0 = next ? batch_span_[bi + 1] : 0, b.n1 = next ? batch_span_[bi + 2] : 0;
  if (r.per_read) {
    // The batch's cache hits, then its pieces already in place.
    size_t i = r.k0;
    for (size_t ri = p0; ri < p1; ++ri) {
      if (read_active_[ri].first > i) overlap_publish(b, i, read_active_[ri].first);
      i = read_active_[ri].second;
    }
    if (b.k1 > i) overlap_publish(b, i, b.k1);
  }
  for (size_t ri = p0; ri < p1; ++ri)
    if (outstanding_[ri] > 0)
      ++b.left;
    else if (r.per_read)
      overlap_publish(b, read_active_[ri].first, read_active_[ri].second);
  overlap_wait_batch(r, b);
  overlap_compute_batch(r, b);
}

void FlashFfn::overlap_wait_batch(OverlapRun& r, OverlapBatch& b) {
  const int threads =
      r.per_read && long(b.k1 - r.k0) * m_.config.dim > kOverlapParallelWork ? omp_get_max_threads() : 1;
  std::vector<double> idle(size_t(threads), 0.0);
  double bwait = 0;
  if (threads > 1) {
    std::exception_ptr err;
#pragma omp parallel num_threads(threads)
    {
      if (omp_get_thread_num() == 0) {
        try {
          overlap_io_loop(r, b, threads, &idle[0], &bwait);
        } catch (...) {
          err = std::current_exception();
          b.stop.store(true);
        }
      }
      overlap_work(r, b, true, &idle[size_t(omp_get_thread_num())]);
    }
    if (err) std::rethrow_exception(err);
    bwait = *std::min_element(idle.begin() + 1, idle.end());
  } else {
    overlap_io_loop(r, b, threads, &idle[0], &bwait);
    if (r.per_read) overlap_work(r, b, true, &idle[0]);
  }
  r.wait += bwait;
  for (size_t ri = b.p0; ri < b.p1; ++ri)
    if (outstanding_[ri] != 0) throw InternalError("overlap: a read never completed");
}

void FlashFfn::overlap_compute_batch(OverlapRun& r, const OverlapBatch& b) {
  const int dim = m_.config.dim;
  if (r.per_read && r.ordered) {
    compute_ordered(r.layer, r.k0, b.k1, r.from, r.out, false, false);  // coefficients done as the reads completed
  } else if (r.per_read) {
    // The batch's down projection, in slot order, over the neurons ffn_bundles would keep: continuing the sums.
    hd_.clear();
    downs_.clear();
    for (size_t i = r.k0; i < b.k1; ++i)
      if (r.from != GateFrom::kBundleRelu || h_[i] != 0.0f) {
        hd_.push_back(h_[i]);
        downs_.push_back(bundles_[i] + 2 * row_bytes_);
      }
    kernels::down_project(m_.dtype, r.out, dim, hd_.data(), downs_.data(), int(hd_.size()), !r.first);
  } else {
    compute_range(r.layer, r.k0, b.k1, r.from, r.out, !r.first);
  }
  slab_keep(r.layer, b.p0, b.p1);
  r.first = false;
  r.k0 = b.k1;
  r.p0 = b.p1;
}

void FlashFfn::overlap_finish(OverlapRun& r) {
  const int layer = r.layer;
  const size_t n = r.n;
  IoEngine& io = img_.io();
  cur_batch_ = -1, cur_off_ = 0;
  if (r.ordered) {
    if (r.per_read) ov_.bundles_computed += n - r.k0;
    compute_ordered(layer, r.k0, n, r.from, r.out, true);
  } else if (r.k0 < n || r.first) {
    // The hits after the last read (or a layer with nothing to read).
    if (r.per_read) ov_.bundles_computed += n - r.k0;
    compute_range(layer, r.k0, n, r.from, r.out, !r.first);
  }
  slab_settle(layer);
  // Read-ahead that no exact read used is collected before the next layer's.
  {
    std::vector<uint64_t> done;
    auto tw = Clock::now();
    while (io.pending() > 0) {
      done.clear();
      io.wait_some(&done);
    }
    r.wait += since(tw);
  }
  const double busy =
      io.async() ? (r.io_started ? since(r.t_io0) : 0.0) : r.wait;  // a synchronous engine reads only while waited on
  pf_layer_ = -1;
  ++ov_.layer_tokens;
  ov_.io_busy_seconds += busy;
  ov_.io_wait_seconds += r.wait;
  token_.io_seconds += r.wait;
  token_.io_busy_seconds += busy;
  token_.compute_seconds += since(r.tc) - r.wait;  // planning included, as load_compute() counts it
}

}  // namespace nl
