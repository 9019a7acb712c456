// Sparse FFN from the flash image (runtime/flash_ffn.h): the facade. Here: the options' names, the constructor (the
// planners, replica maps, gate rows or dense copies in DRAM), the FfnProvider entry (ffn), replay and the per-token
// accounting. The parts, each a file of runtime/ffn/: select.cpp (which neurons), batches.cpp (reads in staging-sized
// batches), pinned.cpp (the caches and their pinned bundles), bundle_store (the cached bytes), compute.cpp (the
// arithmetic, prompt blocks), replica_order.cpp (flash replication), overlap.cpp (--overlap and the read-ahead).
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
#include "runtime/ffn/internal.h"
#include "runtime/memory.h"
#include "runtime/parallel.h"

namespace nl {
using namespace ffn_detail;

namespace {
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
  if (c.has_biases() && o.select != SelectMode::kReplay) {
    if (o.neuron_bias.size() != size_t(c.n_layers))
      throw InternalError("FlashFfn: an " + std::string(model_arch_name(c.arch)) + " image needs fc1's biases");
    for (int l = 0; l < c.n_layers; ++l) {
      const float* b = o.neuron_bias[size_t(l)];
      const auto& order = m_.order[size_t(l)];
      const auto& firsts = first_slots_[size_t(l)];
      std::vector<float> by_slot(order.size()), by_row(hidden);
      for (size_t s = 0; s < order.size(); ++s) by_slot[s] = b[order[s]];
      for (uint32_t r = 0; r < hidden; ++r) by_row[r] = b[order[firsts.empty() ? r : firsts[r]]];
      slot_bias_.push_back(std::move(by_slot));
      gate_bias_.push_back(std::move(by_row));
    }
  }
  // The selections that keep gate rows in DRAM read every FFN region below: the pinned bundles come from those bytes.
  pinned_from_regions_ = selection_keeps_gate_rows(o.select, o.predictor_only);
  make_caches();
  prev_needed_.resize(size_t(c.n_layers));
  pf_window_.assign(size_t(c.n_layers), 0.0);
  pf_precision_.assign(size_t(c.n_layers), 0.0);
  if (o.select == SelectMode::kLowRank) {
    if (!ffn_act_sparse(c.act))
      throw UsageError(std::string(o.stored_predictor ? "--select predictor" : "--select lowrank") +
                       " predicts ReLU-family sparsity; this model's FFN activation is " +
                       (c.act == FfnAct::kGelu ? "GeLU (gelu" : "SiLU (silu") +
                       "; every neuron fires: use --select threshold)");
    if (o.lowrank_rank < 1) throw UsageError("--select lowrank:R needs R >= 1");
    if (o.stored_predictor) load_stored_predictor();
  }
  row_bytes_ = image_row_bytes(m_.dtype, size_t(c.dim));
  down_off_ = size_t(bundle_parts(m_.bundle_kind) - 1) * row_bytes_;
  // Plain bundles under a gated model's config are synthetic I/O-only images: nothing to compute.
  const bool computable = m_.bundle_kind == bundle_kind_of(c);
  if (image_dtype_quantized(m_.dtype) && c.dim % kQuantBlock != 0)
    throw InputError(img_.manifest_path(), "dim " + std::to_string(c.dim) + " is not a multiple of 32 (" +
                                               image_dtype_name(m_.dtype) + " bundles)");
  if (o.select == SelectMode::kThreshold && o.act_threshold.size() != size_t(c.n_layers))
    throw UsageError("--select threshold needs one threshold per layer (" + std::to_string(c.n_layers) + ")");
  if (o.select == SelectMode::kTrace) {
    if (o.trace_pays_predictor) load_stored_predictor();
    if (!computable)
      throw UsageError("--select trace needs a model's FFN (this image has plain bundles of a gated model: I/O only)");
    trace_active_.resize(size_t(c.n_layers));
  }
  if (o.predictor_only) {  // --select predictor:T: the stored predictor decides from the first token
    if (!computable) throw UsageError("--select predictor:T needs a model's FFN (this image is I/O only)");
    // score > T (the calibrated phases keep score >= their threshold, a recorded score).
    threshold_.assign(size_t(c.n_layers),
                      std::nextafter(o.predictor_threshold, std::numeric_limits<float>::infinity()));
    phase_ = LowRankPhase::kPredict;
  }
  if (selection_keeps_gate_rows(o.select, o.predictor_only) || o.select == SelectMode::kDense) {
    if (!computable)
      throw UsageError(
          "--select gate|dense|lowrank|threshold needs a model's FFN (this image has plain bundles of a "
          "gated model: I/O only)");
    const size_t dim = size_t(c.dim);
    // One staging buffer for every layer's region (grown, never shrunk): a fresh one per layer took its page faults
    // again each time, ~6 ms per 1.9 MB layer of small-relu on the development host (a virtual machine).
    AlignedBuffer buf;
    // Every layer's DRAM copy (the dense FFN, or the gate rows) in one allocation: one matrix per layer is a few MB
    // on a small model, below the size that gets huge pages on its own, and on 4 KiB pages the 1,536 x 384 f16 gate
    // and up matrices of small-relu streamed 1.5x slower (1 thread, AMD EPYC Zen 4: 514-562 against 348-361 us per
    // token for the 8 gate products).
    const auto piece = [](size_t b) { return (b + 63) / 64 * 64; };
    const bool up_rows = selection_keeps_up_rows(o.select, c.act);
    const size_t layer_dram = piece(o.select == SelectMode::kDense
                                        ? kernels::DenseBundles::bytes_for(m_.dtype, c.dim, int(hidden), m_.bundle_kind)
                                        : size_t(hidden) * row_bytes_ * (up_rows ? 2 : 1));
    ffn_dram_.resize_uninit(size_t(c.n_layers) * layer_dram);
    for (int l = 0; l < c.n_layers; ++l) {
      uint8_t* dram = ffn_dram_.data() + size_t(l) * layer_dram;
      const uint64_t bytes = img_.read_region(size_t(1 + l), &buf);  // checksummed here, once
      fill_pinned(l, buf.data(), bytes);
      if (o.select == SelectMode::kLowRank && !o.stored_predictor) {
        // The predictor is fitted on f32 gate rows, decoded for the fit only.
        std::vector<float> g(size_t(hidden) * dim);
        const WeightView gv{m_.dtype, buf.data(), int(hidden), c.dim, size_t(m_.bundle_bytes)};
        for (uint32_t s = 0; s < hidden; ++s) kernels::dequantize_row(gv, int(s), g.data() + s * dim);
        lowrank_.push_back(lowrank_fit(g.data(), int(hidden), int(dim), o.lowrank_rank, 1 + uint64_t(l)));
      }
      if (o.select == SelectMode::kDense) {
        dense_.emplace_back(m_.dtype, c.dim, int(hidden), buf.data(), size_t(m_.bundle_bytes), dram, m_.bundle_kind,
                            slot_bias_.empty() ? nullptr : slot_bias_[size_t(l)].data());
      } else {
        // Only the gate rows stay in DRAM, in the stored dtype; a replicated layer keeps its first copies' (row r is
        // the r-th first copy in slot order).
        // dReLU's gate / threshold: the up rows too, after the gate rows.
        const auto& firsts = first_slots_[size_t(l)];
        for (int part = 0; part < (up_rows ? 2 : 1); ++part) {
          uint8_t* rows = dram + size_t(part) * hidden * row_bytes_;
          for (uint32_t s = 0; s < hidden; ++s)
            std::memcpy(rows + s * row_bytes_,
                        buf.data() + (firsts.empty() ? s : firsts[s]) * m_.bundle_bytes + size_t(part) * row_bytes_,
                        row_bytes_);
          auto& views = part == 0 ? gate_view_ : up_view_;
          views.push_back({m_.dtype, rows, int(hidden), c.dim, row_bytes_});
          // Only matrix products read these rows: q8_0 takes the interleaved layout where the path has kernels for
          // it (the same numbers; the copy is ours).
          kernels::q8_interleave_if_pays(&views.back());
        }
      }
    }
    threshold_.assign(size_t(c.n_layers), -std::numeric_limits<float>::infinity());
    calib_.resize(size_t(c.n_layers));
  }
  pinned_from_regions_ = false;  // from now on (make_caches again: a new run) pinned bundles are read
  for (const auto& w : pinned_wait_)
    if (!w.empty()) throw InternalError("pinned bundles listed for a region that was not read");
}

void FlashFfn::add_gate_bias(int layer, float* g, int n) const {
  if (gate_bias_.empty()) return;
  const std::vector<float>& b = gate_bias_[size_t(layer)];
  for (int t = 0; t < n; ++t)
    for (size_t r = 0; r < b.size(); ++r) g[size_t(t) * b.size() + r] += b[r];
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

void FlashFfn::ffn(int layer, int pos0, int n_tokens, const float* x, float* out, FfnObserver* observer) {
  (void)pos0;
  (void)observer;
  if (opt_.select == SelectMode::kReplay)
    throw UsageError("the model forward needs --select gate, dense, lowrank, trace or threshold");
  const bool predict = opt_.select == SelectMode::kLowRank && phase_ == LowRankPhase::kPredict;
  const bool overlapped = opt_.overlap != OverlapMode::kNone && opt_.select != SelectMode::kDense;
  const bool gates = !gate_view_.empty();  // gate rows in DRAM: the caller computes the gate
  const ModelConfig& c = m_.config;
  const int dim = c.dim, hidden = c.hidden_dim;
  if (n_tokens > 1 && batch_.size() < size_t(n_tokens)) batch_.resize(size_t(n_tokens));
  cur_slot_bias_ = slot_bias_.empty() ? nullptr : slot_bias_[size_t(layer)].data();
  if (opt_.select == SelectMode::kDense) {
    // Every token of the pass at once over the re-laid-out bundles (gate's numbers); the time split evenly.
    const auto t0 = Clock::now();
    dense_[size_t(layer)].ffn(x, n_tokens, c, out);
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
      add_gate_bias(layer, g_.data(), 1);
      if (!up_view_.empty()) {
        u_.resize(size_t(hidden));
        kernels::matmul(u_.data(), xq_, up_view_[size_t(layer)], 1);
      }
      if (!predict) token_.compute_seconds += since(t0);  // predict: the exact gate is a measurement (untimed)
    }
    u_by_slot_ = up_view_.empty() ? nullptr : u_.data();
    const GateFrom from = select_token(layer, t, xt, g_.data());
    if (overlapped)
      load_compute_overlapped(layer, ot, from);
    else
      load_compute(layer, ot, from);
  }
}

}  // namespace nl
