// greedy+ls: local search from the greedy path on what the device pays per token — reads and bytes under gap
// merging (a pair of active slots d apart with nothing active between is read as one when d-1 <= g, saving
// a - (d-1)*b/B of a separate read), with the neurons the cache will hold treated as not needing reads.
// Moves: 2-opt (segment reversal, including prefix/suffix), Or-opt (segments of 1-3, both orientations),
// driven by top-k neighbour lists and don't-look bits; at a local optimum with budget left the lists widen. The window
// saving comes from the layer's cost model (layout/cost_model.h). With keep_weight (solve sets it under --weight-guard)
// the path weight (gap-0 reads on the full profile trace) never drops below the seed's: a move that would push it below
// is refused.
#pragma once
#include <cstdint>
#include <vector>

#include "formats/core/bitmask.h"
#include "graph/coactivation.h"
#include "layout/cost_model.h"
#include "layout/solvers.h"
#include "runtime/device.h"

namespace nl {

struct LsOptions {
  CostModel cost;                 // merge gap g, read cost a, bundle cost (solve fills it in: cost_model())
  uint32_t sample_tokens = 8192;  // tokens of the profile trace the objective is measured on (evenly spread)
  uint32_t neighbours = 24;       // candidates per neuron from its top-k list (docs/benchmarks.md "Layout solver")
  // At a local optimum with budget left, the candidate lists double (neighbours, 2x, 4x, ...) up to this many and the
  // search goes on from there (a layer that converges well inside max_evaluations uses the rest); 0 or <= neighbours
  // = off (solve: with --weight-guard). Past the graph's top-k lists only where it holds the full count matrix.
  uint32_t max_neighbours = 256;
  uint32_t max_window = 4;       // window terms span at most this many slots (caps g + 1; cost grows with it)
  uint32_t hot_count = 0;        // most frequent neurons moved to a block at the end (for the cache); 0 = off
  bool keep_weight = true;       // refuse moves that push the path weight below the seed's (solve: --weight-guard)
  uint64_t max_evaluations = 0;  // move evaluations before the search stops (0 = until a local optimum);
                                 // the deterministic budget (the result depends only on the inputs)
};

struct LsStats {
  double saving_seed = 0, saving_final = 0;  // objective (us saved on the sample) before / after
  double saving_tracked = 0;  // the search's own running figure (seed's + every applied move's delta) = saving_final
  uint64_t weight_seed = 0, weight_final = 0;
  uint64_t moves = 0, evaluations = 0, refused_by_weight = 0;
  uint32_t neighbours_final = 0;  // candidate list length when the search stopped (see max_neighbours)
  bool fell_back = false;         // the hot block could not keep the seed's path weight: seed order kept
};

Order local_search(const LayerMask& m, const LayerGraph& g, const Order& seed, const LsOptions& opt,
                   LsStats* stats = nullptr);

namespace detail {
// Tests: force the portable window-count loop instead of the AVX-512 one picked at run time (same counts).
extern bool ls_portable_kernel;
}  // namespace detail

// The objective local_search maximises, for reports and tests: microseconds saved on the sampled tokens
// relative to one read per active neuron.
double ls_objective(const LayerMask& m, const Order& order, const LsOptions& opt);

}  // namespace nl
