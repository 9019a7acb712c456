// greedy+ls for layers the planner reads in few long pieces: when the cost-based merge gap is wide (small bundles,
// e.g. the tiny real models, where a gap of hundreds of bundles costs less than one more read), a token's read
// runs from its first to its last needed slot and the order only decides how much lies between. The expected span
// is the sum over the cuts between slots of P(something needed on both sides), so the ends should hold neurons
// that are rarely needed, and needed together. solve_ends_in builds the order from both ends inwards: each step
// adds, at the end whose union of tokens would be the smaller after it, the neuron that grows that union least (the
// "peel"); what is left meets in the middle. The local search's windows (a few slots) cannot see this objective.
#pragma once
#include <cstdint>
#include <vector>

#include "layout/cost_model.h"
#include "layout/evaluate.h"
#include "layout/solvers.h"

namespace nl {

// The peel of the neurons with include[v] != 0 on tm's tokens (ties: the smaller growth, the left end, the smaller
// neuron index): `left` from the left end inwards, `right` from the right end inwards, and after each step the tokens
// that end's union covers. The order is left followed by right reversed. Deterministic. O(n^2 + nnz) for n neurons and
// nnz active (neuron, token) pairs.
struct EndsIn {
  Order left, right;
  std::vector<uint64_t> cover_left, cover_right;
  Order order() const;
};
EndsIn solve_ends_in(const TokenMajorMask& tm, const std::vector<uint8_t>& include);

// Sum over tm's tokens of (last - first + 1) needed slots of `order` (0 for a token with none), where needed means
// active and not in `pinned`: the bundles one read per token transfers, before block alignment.
uint64_t span_bundles(const TokenMajorMask& tm, const Order& order, const std::vector<uint32_t>& pinned);

// Swaps of two unpinned neurons' slots, kept while they lower the cost of one read per token from its first to its
// last needed slot (CostModel::span_read_us) summed over the first `max_tokens` of tm's tokens (0 = all), in at most
// `passes` passes over the slots in ascending order: for each slot, the best swap with any other slot (best
// improvement; every swap's change is found at once from per-token span ends, docs/solvers.md "greedy+ls"),
// kept when its exact change is negative. Stops once the work (tokens and slots visited) reaches `max_work` (0 = no
// limit; the budget keeps it deterministic). Pinned neurons keep their slots. `saved_us` (optional) gets the cost
// saved on those tokens.
Order polish_span(const TokenMajorMask& tm, const Order& order, const std::vector<uint32_t>& pinned, const CostModel& c,
                  uint32_t passes, uint64_t max_tokens = 0, uint64_t max_work = 0, double* saved_us = nullptr);

}  // namespace nl
