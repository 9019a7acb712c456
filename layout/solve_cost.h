// What `nl-layout solve` will cost before it starts (issue 58): wall seconds and peak memory of count + solve, from a
// model fitted on the cost curve of synthetic OPT-6.7B-preset layers (bench/solve_cost_curve.sh measures it,
// bench/solve_cost_fit.py fits it; docs/benchmarks.md "Offline: count + solve"). The figures are for the machine the
// curve was measured on (a 2-core AMD EPYC, Zen 4); scale them for a slower or faster core.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "layout/solve.h"

namespace nl {

struct SolveCostEstimate {
  double layer_seconds = 0;  // one layer of the widest width alone on one thread
  double wall_seconds = 0;   // every layer on `threads` threads (layers handed out in order, each to the first free)
  uint64_t peak_bytes = 0;   // resident memory at the peak: `threads` layers in flight
  bool full_matrix = false;  // the widest layer keeps its full pair-count matrix (greedy over every pair)
};

// One layer's seconds on one thread in a many-layer run (its buffers reused) for `neurons` neurons, `tokens` profile
// tokens and an active fraction `density` under `opt` (greedy and greedy+ls; 0 for the other methods, which cost a
// fraction of a count).
double solve_layer_seconds(uint32_t neurons, uint64_t tokens, double density, const SolveOptions& opt);
// Resident bytes of one layer in flight (the mask, the build and validation parts, the count matrix and its spare,
// the token lists) under `opt`.
uint64_t solve_layer_bytes(uint32_t neurons, uint64_t tokens, const SolveOptions& opt);

// The whole solve: `neurons` per layer, `tokens` profile tokens, `density` the active fraction (a sample of the
// trace), on `threads` threads.
SolveCostEstimate estimate_solve_cost(const std::vector<uint32_t>& neurons, uint64_t tokens, double density,
                                      uint32_t threads, const SolveOptions& opt);

// A one-line summary for the solve's progress output.
std::string describe(const SolveCostEstimate& e, uint32_t layers, uint32_t threads);

}  // namespace nl
