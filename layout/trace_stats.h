// Layout-free statistics of an activation trace that predict how much a co-activation order can gain over the
// identity order (issue 20 item 6), and the predictor fitted on the synthetic structure sweep
// (bench/structure_sweep.py, docs/benchmarks.md "When does the order matter").
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace nl {

class TraceReader;

// Tokens at the start of each layer that the co-activation statistic is measured on: its sampling bias depends
// on the token count, so it is fixed (the structure sweep's held-out splits have exactly this many).
inline constexpr uint64_t kCofireTokens = 2048;
// Neurons sampled per layer (activation-weighted) for the co-activation statistic.
inline constexpr uint32_t kCofireSamples = 256;
// κ = 1 would promise unbounded runs: κ is capped where a run would span 1 / (1 − 0.999) = 1,000 neurons.
inline constexpr double kCofireCap = 0.999;

// Sums over tokens and layers; the figures are ratios of them, so layers and traces pool by adding.
struct TraceStructureSums {
  uint64_t slots = 0;          // Σ tokens × neurons
  uint64_t active = 0;         // Σ_t |S_t|
  uint64_t runs = 0;           // runs of consecutive active indices (identity order, gap 0, no cache)
  uint64_t persist_pairs = 0;  // Σ |S_t ∩ S_{t+1}| over consecutive tokens of one sequence
  uint64_t persist_base = 0;   // Σ |S_t| over tokens with a successor in their sequence
  double cofire_sum = 0;       // Σ over sampled neurons v of the mean of v's top-2 P(u active | v active)
  double excess_sum = 0;       // the same with P(u | v) − P(u): co-firing beyond what u's own rate explains
  uint64_t cofire_samples = 0;
  uint64_t cofire_tokens = 0;  // tokens the co-activation statistic used (per layer, the last layer's)
  void add(const TraceStructureSums& o);
};

struct TraceStructureStats {
  double active_share = 0;  // mean |S_t| / n
  double persistence = 0;   // Σ|S_t ∩ S_{t+1}| / Σ|S_t|, consecutive tokens of one sequence
  double identity_run = 0;  // active neurons per run of consecutive indices: identity's read length, gap 0
  // κ: for a neuron drawn in proportion to how often it fires, the mean of its two highest conditional
  // co-firing probabilities P(u | v) over the other neurons (measured on the first kCofireTokens tokens). In a
  // linear order a neuron has two neighbours; 1 / (1 − κ) is the read length an order that put every neuron
  // between its two best partners could reach if runs continued independently.
  double cofire = 0;
  // (1 / (1 − κ)) / identity_run: the read-length headroom an order has over identity; the predictor's input.
  double headroom = 0;
  // The same as κ with each P(u | v) less P(u): always-on partners (cached anyway) add nothing.
  double excess = 0;
  uint64_t cofire_tokens = 0;
};

TraceStructureStats trace_structure_stats(const TraceStructureSums& s);

// One layer's sums from its neuron-major rows (`words` 64-bit words per neuron covering `n_tokens` tokens, bit t
// of a row = active at token t); `sequences` = start tokens of the independent sequences (first 0).
TraceStructureSums layer_structure_sums(const uint64_t* rows, uint32_t n_neurons, uint64_t n_tokens, uint64_t words,
                                        const std::vector<int64_t>& sequences);

// All layers of a trace, pooled. Streams over tokens in chunks: memory is a few MiB per layer whatever the length.
TraceStructureStats trace_structure_stats(const TraceReader& tr);

// M, the order's modelled gain: I/O time per uncached active neuron when identity's reads hold `identity_run`
// neurons and the order's 1 / (1 − κ), a read of k bundles costing a + k·bundle_bytes / B:
// M = (r / identity_run + 1) / (r (1 − κ) + 1) with r = a·B / bundle_bytes. Ignores the cache and gap merging; the
// fit below maps it to what the planner and cache make of it.
double modelled_gain(const TraceStructureStats& s, double read_latency_us, double bandwidth_MBps,
                     uint64_t bundle_bytes);
// r = a·B / bundle_bytes: how many bundles' transfer one read's fixed cost is worth (0 for no bundle).
double read_cost_bundles(double read_latency_us, double bandwidth_MBps, uint64_t bundle_bytes);
// The sweep's range of r (UFS 4.0 with 24 KiB, 16 KiB and 4 KiB bundles): outside it the planner's gap merging,
// which M ignores, changes identity's reads and the prediction is an extrapolation (eval says so).
inline constexpr double kFitReadCostMin = 1.4, kFitReadCostMax = 8.5;

// Predicted held-out I/O-time gain of `method` ("greedy" = the paper's pipeline, "greedy+ls" = ours) over identity
// with a good cache, from M: log(gain) = c0 + c1·log(M), fitted on the synthetic structure sweep for the runtime's
// planner (gap auto) and a 5 % cache (bench/structure_sweep.py); `low` and `high` add the fit's extreme
// leave-one-out residuals to `mid`.
struct GainPrediction {
  double low = 0, mid = 0, high = 0;
};
GainPrediction predict_order_gain(double modelled_gain, const std::string& method);

}  // namespace nl
