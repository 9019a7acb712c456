// Held-out evaluation of a layout on a trace, through the runtime's read planner and cache (runtime/plan):
// the figures nl-layout eval prints and the local search's guard compares. Same code as nl-run's reads.
#pragma once
#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "formats/core/bitmask.h"
#include "runtime/device.h"
#include "runtime/plan/read_plan.h"
#include "runtime/plan/replica_cover.h"
#include "runtime/plan/slot_cache.h"

namespace nl {

class TraceReader;
struct Layout;
class Progress;

struct EvalConfig {
  GapPolicy gap;             // default auto
  double cache_ratio = 0.0;  // fraction of the layer's FFN bytes held by the cache
  CacheConfig cache;         // admission parameters, window, seed (capacity is set from cache_ratio)
  DeviceModel device;
  uint64_t bundle_bytes = 16384;
  uint64_t token_begin = 0, token_end = UINT64_MAX;  // evaluate tokens [begin, end)
};

// Sums over the evaluated tokens of one layer.
struct LayerEval {
  uint64_t tokens = 0;
  uint64_t active = 0;  // active neurons
  uint64_t reads = 0;
  uint64_t bundles_read = 0;  // slots spanned by reads
  uint64_t max_read_bundles = 0;
  uint64_t bytes_read = 0;    // aligned
  uint64_t bytes_needed = 0;  // active neurons read from flash (cache misses) x bundle bytes
  uint64_t hits = 0;          // active neurons served from the cache
  double io_seconds = 0;      // sum over tokens of reads * a + bytes / B

  void add(const LayerEval& o);
  double reads_per_token() const { return tokens ? double(reads) / double(tokens) : 0; }
  double avg_read_bundles() const { return reads ? double(bundles_read) / double(reads) : 0; }
  double hit_rate() const { return active ? double(hits) / double(active) : 0; }
  double io_ms_per_token() const { return tokens ? 1e3 * io_seconds / double(tokens) : 0; }
};

// A layout layer's own cache policy (formats/layout.h): admission (kUnset: cfg's) and pinned neurons (hottest first;
// they count against the capacity, the rest of it runs S3-FIFO).
struct LayerCachePolicy {
  CacheAdmission admission = CacheAdmission::kUnset;
  std::vector<uint32_t> pinned;
  double small_fraction = 0;       // S3-FIFO's small-queue share; 0 = cfg's
  std::vector<uint32_t> hot = {};  // admission kValue: neurons hottest first
};

// Tokens [begin, end) of a layer, token-major: bit v of row t - begin is neuron v at token t. Built once (one
// pass over the neuron-major rows in their natural order) and shared by every evaluation of that range: the
// solve guard evaluates several orders and cache policies of a layer, eval several layouts.
struct TokenMajorMask {
  uint32_t n_neurons = 0;
  uint64_t begin = 0, end = 0;
  uint64_t words = 0;          // words per token row = words_for_tokens(n_neurons)
  std::vector<uint64_t> bits;  // (end - begin) * words

  TokenMajorMask() = default;
  TokenMajorMask(const LayerMask& m, uint64_t begin, uint64_t end);
  const uint64_t* row(uint64_t t) const { return bits.data() + size_t(t - begin) * words; }
  // Calls f(v) for each neuron v active at token t, ascending.
  template <class F>
  void for_each_active(uint64_t t, F&& f) const {
    const uint64_t* r = row(t);
    for (uint64_t w = 0; w < words; ++w)
      for (uint64_t x = r[w]; x; x &= x - 1) f(uint32_t(w * 64 + uint64_t(__builtin_ctzll(x))));
  }
  // Appends token t's active neurons as slots of an order, ascending (what the planner takes): slot_of[v] is
  // neuron v's slot; slot_bits is scratch of words_for_tokens(n_neurons) zero words, left zero.
  void append_slots(uint64_t t, const std::vector<uint32_t>& slot_of, std::vector<uint64_t>& slot_bits,
                    std::vector<uint32_t>& out) const;
};

// order: slot -> neuron; longer than the layer when it holds replicas (a neuron at most twice: each token reads one
// copy, chosen by runtime/plan/replica_cover.h, and the cache is keyed by the first). policy (optional): the layout
// layer's cache policy, applied on top of cfg.cache. tm (optional): m's tokens in token-major form, shared by several
// calls; built for this call when absent or not covering the evaluated range.
LayerEval evaluate_layer(const LayerMask& m, const std::vector<uint32_t>& order, const EvalConfig& cfg,
                         uint32_t layer_index, const LayerCachePolicy* policy = nullptr, LayerMask* misses = nullptr,
                         std::vector<uint64_t>* read_lengths = nullptr, const TokenMajorMask* tm = nullptr);
// misses (optional): set to the miss stream, a mask of the neurons that were active and not resident in the cache
// when their token came (what the device had to read), over the evaluated tokens.
// read_lengths (optional): counts of reads by length in bundles (index = length), grown as needed.

// The same for one order under several cache policies (nullptr = cfg.cache as is), in one pass over the tokens:
// result k equals evaluate_layer(m, order, cfg, layer_index, policies[k], nullptr, nullptr, tm).
std::vector<LayerEval> evaluate_layer_policies(const LayerMask& m, const std::vector<uint32_t>& order,
                                               const EvalConfig& cfg, uint32_t layer_index,
                                               const std::vector<const LayerCachePolicy*>& policies,
                                               const TokenMajorMask* tm = nullptr);

// The same for one policy, calling on_plan(t, slots, plan) after each token's plan: the slots the planner was given
// (ascending; with replicas, the copies the cover chose) and its plan (the cache already updated). For searches that
// look at the reads (layout/replicate.h).
using TokenPlanFn = std::function<void(uint64_t t, const std::vector<uint32_t>& slots, const TokenPlan& plan)>;
LayerEval evaluate_layer_plans(const LayerMask& m, const std::vector<uint32_t>& order, const EvalConfig& cfg,
                               uint32_t layer_index, const LayerCachePolicy* policy, const TokenMajorMask* tm,
                               const TokenPlanFn& on_plan);

// One order (without replicas) over cfg's token range, its tokens' slot lists listed once and kept, so that several
// cache policies can be measured one after another (the selection, layout/solve.cpp), each able to stop early.
// run(policy) equals evaluate_layer(m, order, cfg, layer_index, policy, nullptr, nullptr, tm) figure for figure.
// Keeps no reference to m or order; memory: 4 bytes per active neuron of every token in the range, and the order's
// slot map.
class OrderPass {
 public:
  OrderPass(const LayerMask& m, const std::vector<uint32_t>& order, const EvalConfig& cfg, uint32_t layer_index,
            const TokenMajorMask* tm = nullptr);
  uint64_t tokens() const { return ends_.size(); }
  // Stops after the first token, short of the last, at which io_seconds reaches stop_at: *stopped (optional) is then
  // true and the figures are those of the tokens so far (io_seconds a lower bound on the whole pass's).
  LayerEval run(const LayerCachePolicy* policy, double stop_at = std::numeric_limits<double>::infinity(),
                bool* stopped = nullptr) const;

 private:
  uint32_t n_ = 0;  // the layer's neurons
  EvalConfig cfg_;
  uint32_t layer_ = 0;
  ReplicaMap rmap_;              // the order's slots, built once for every run
  std::vector<uint32_t> slots_;  // every token's active slots, ascending per token, token after token
  std::vector<size_t> ends_;     // where each token's slots end in slots_
};

// A lower bound on the estimated I/O seconds of ANY order, cache policy and read planner with cfg's cache capacity
// K on tm's tokens: a token with |A_t| active neurons has at least |A_t| - K of
// them to read, which costs at least one read and their bundles: sum over tokens with |A_t| > K of
// a + (|A_t| - K) * bundle_bytes / B. It credits the cache with a hit on every slot at every token and the reads
// with no gap bytes and no second read, so no real pipeline reaches it; the ratio of a layout's time to it bounds
// what any better layout or cache could still gain. Negative with a sliding window (its residency is extra to K).
double io_lower_bound_seconds(const TokenMajorMask& tm, const EvalConfig& cfg);

// layout_cache: apply each layout layer's own cache policy (LayerCachePolicy). Every layer of a trace under several
// layouts (checked against the trace by layout_load), layers in parallel: the figures nl-layout eval prints and
// nl-layout report tabulates. A bundle_bytes of 0 in cfg means default_bundle_bytes of each layer. Read-length
// histograms are collected for the layers in hist_layers.
struct TraceEval {
  std::vector<std::vector<LayerEval>> layers;                    // [layout][layer]
  std::vector<LayerEval> total;                                  // [layout], summed over layers
  std::vector<std::vector<std::vector<uint64_t>>> read_lengths;  // [layout][index in hist_layers][length]
  std::vector<double> bound_seconds;  // [layer] io_lower_bound_seconds (negative: not defined)
  double bound_total = 0;             // summed over layers (negative: not defined)
};
TraceEval evaluate_trace(const TraceReader& trace, const std::vector<Layout>& layouts, const EvalConfig& cfg,
                         const std::vector<uint32_t>& hist_layers = {}, Progress* progress = nullptr,
                         bool layout_cache = true);

// Bundle bytes guessed from a layer's FFN width: OPT-style ReLU FFN with d_model = width / 4 in f16 (so 16,384
// neurons -> 16 KiB, the paper's OPT-6.7B bundles), and the paper's 24 KiB for Llama-2-7B's 11,008.
uint64_t default_bundle_bytes(uint32_t n_neurons);

}  // namespace nl

namespace nl {}  // namespace nl
