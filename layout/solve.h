// Solving a whole trace: per layer, count co-activations (graph/), run the chosen method, and record the
// objective and upper bound; layers in parallel (OpenMP). greedy+ls keeps the greedy seed when the search
// result is not better on the profile trace (guard), so it is never worse than greedy there.
#pragma once
#include <cstdint>
#include <functional>
#include <string>

#include "formats/layout.h"
#include "layout/evaluate.h"
#include "layout/local_search.h"
#include "layout/pins.h"
#include "layout/solvers.h"

namespace nl {

struct SolveOptions {
  std::string method = "greedy+ls";
  uint64_t seed = 1;
  uint32_t top_k =
      256;  // candidates per neuron: greedy matches an every-pair Algorithm 1 on the presets (docs/workloads.md)
  uint32_t rcm_min_count = 1;
  // greedy / greedy+ls count the full pair matrix and run Algorithm 1 over every pair when it fits in this many
  // bytes per layer (n(n-1)/2 x 4: 512 MiB at 16,384 neurons); else over the top-k lists. On the dense presets
  // top-k truncation costs greedy a lot (Llama-2: 4.94 with k = 256 vs 6.65 with k = 4,096; docs/solvers.md).
  uint64_t full_matrix_bytes = uint64_t(1) << 30;
  // The device objective greedy+ls optimises and its guard measures (same settings as nl-layout eval).
  EvalConfig eval;         // gap, cache ratio, device, bundle bytes (0 = default for the layer width)
  LsOptions ls;            // merge gap / costs are filled in from `eval` by solve_layer
  double hot_share = 0.0;  // variant 1: hot block kept at the end for the S3-FIFO cache (rejected experiment)
  // greedy+ls co-designs the layout with the cache at the same capacity: admission "all" (plain S3-FIFO, which
  // keeps the neurons of persistent runs; linking-aligned admission rejects them) and, when pin_share > 0, a
  // variant that pins the hottest pin_share x capacity neurons (they leave the path). The variant that is best on
  // the profile trace is kept, and the paper's pipeline (greedy + linking-aligned) when neither beats it.
  CacheAdmission admission = CacheAdmission::kAll;
  double pin_share = 1.0;
  // Rounds of swaps refining the pinned set for the searched order (layout/pins.h); 0 = the hottest set only.
  uint32_t pin_rounds = 8;
  // Each cache candidate with an S3-FIFO part is also tried with this small-FIFO share (recorded per layer as
  // `small_fraction`); 0 = only S3-FIFO's 10 %.
  double small_fraction = 0.5;
  bool miss_stream = false;       // also try greedy + search on the miss stream's co-activation
  uint64_t guard_tokens = 16384;  // profile tokens (a prefix) the guard compares pipelines on
  bool guard_weight = true;       // a variant must keep the greedy path weight (gap-0 reads without a cache)
  // Deterministic search budget when ls.max_evaluations is 0: this many move evaluations per neuron.
  uint32_t evaluations_per_neuron = 4;
};

struct LayerSolve {
  Order order;
  LayerCachePolicy cache;  // the cache policy the order was designed for (greedy+ls); empty = evaluator's
  uint64_t objective = 0;  // path weight
  double upper_bound = 0;
  GreedyStats greedy;
  LsStats ls;
  PinRefineStats pins;        // greedy+ls: the pinned set refined for the searched order
  bool pins_refined = false;  // the kept policy pins the refined set (not the hottest)
  bool guard_kept_seed = false;
  // greedy+ls: profile-trace I/O ms/token of the paper's pipeline and of each variant: the search, pinned-hot,
  // miss-stream and ends-in (layout/span.h) ones (0 = not tried, or refused by the weight guard)
  double io_ms_greedy = 0, io_ms_ls = 0, io_ms_pinned = 0, io_ms_miss = 0, io_ms_span = 0;
  uint64_t weight_miss_greedy = 0, weight_miss = 0;  // miss-stream variant: full-trace path weights
  double seconds_count = 0, seconds_greedy = 0,
         seconds_ls = 0;  // time split  // greedy+ls: the search result was not better on the profile trace
  double seconds = 0;
};

// Where a layer's co-activation counts come from when they are not counted from its mask (nl-layout solve --graph,
// layout/solve_graph.h): given the counting options solve would use, the layer's graph (kept alive by the caller).
using LayerCountsFn = std::function<const LayerGraph&(uint32_t layer, const CoactivationOptions& co)>;

// `counts` (optional): the layer's counts instead of counting `m` (which is then the token sample, maybe empty).
LayerSolve solve_layer(const LayerMask& m, const SolveOptions& opt, uint32_t layer_index,
                       const LayerCountsFn& counts = {});

// The layout's "parameters" object for these options, and one layer's entry from its result (one definition
// for solve_trace and solve_graph).
nlohmann::json solve_parameters(const SolveOptions& opt);
LayoutLayer layout_layer_of(const LayerSolve& s);

// Solves every layer of a trace file. `progress` (optional) is called after each layer (from any thread,
// serialised).
Layout solve_trace(const std::string& trace_path, const SolveOptions& opt,
                   const std::function<void(uint32_t layer, const LayerSolve&)>& progress = {});

}  // namespace nl
