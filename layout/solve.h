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
#include "layout/solvers.h"

namespace nl {

struct SolveOptions {
  std::string method = "greedy+ls";
  uint64_t seed = 1;
  uint32_t top_k = 32;
  uint32_t rcm_min_count = 1;
  // The device objective greedy+ls optimises and its guard measures (same settings as nl-layout eval).
  EvalConfig eval;               // gap, cache ratio, device, bundle bytes (0 = default for the layer width)
  LsOptions ls;                  // merge gap / costs are filled in from `eval` by solve_layer
  double hot_share = 1.0;        // hot block size as a share of the cache capacity (0 = no hot block)
};

struct LayerSolve {
  Order order;
  uint64_t objective = 0;        // path weight
  double upper_bound = 0;
  GreedyStats greedy;
  LsStats ls;
  bool guard_kept_seed = false;  // greedy+ls: the search result was not better on the profile trace
  double seconds = 0;
};

LayerSolve solve_layer(const LayerMask& m, const SolveOptions& opt, uint32_t layer_index);

// Solves every layer of a trace file. `progress` (optional) is called after each layer (from any thread,
// serialised).
Layout solve_trace(const std::string& trace_path, const SolveOptions& opt,
                   const std::function<void(uint32_t layer, const LayerSolve&)>& progress = {});

}  // namespace nl
