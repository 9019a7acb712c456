// greedy+ls: choosing which neurons a layer's cache pins for a given order. The hottest neurons are the
// natural set (most hits), but a pin only saves what the read plan no longer pays: under cost-based gap merging
// (`--gap auto`, runtime/plan/read_plan.h) a pinned neuron alone inside a run is still read through (its bytes
// cost less than one more read), while an isolated active neuron that is pinned saves a whole read. So the set is
// refined by swaps on the estimated I/O time of the profile tokens: the pinned neuron whose loss is smallest goes
// out for the unpinned neuron whose gain is largest, while the gain exceeds the loss, in rounds, keeping the best
// set seen. Deterministic (no randomness; ties by neuron index).
#pragma once
#include <cstdint>
#include <vector>

#include "layout/cost_model.h"
#include "layout/evaluate.h"
#include "layout/solvers.h"

namespace nl {

struct PinRefineStats {
  double cost_seed_us = 0, cost_final_us = 0;  // estimated I/O us summed over the tokens, for the seed / the result
  uint32_t rounds = 0, swaps = 0;              // rounds run, swaps in the kept set
};

// Estimated I/O microseconds of `order` with `pinned` (neuron ids) resident, summed over tm's tokens: per token a
// read for the first needed slot, a bundle per needed slot, and between two consecutive needed slots x < y
// CostModel::link_us of the y - x - 1 slots between. Block alignment is ignored (the selection measures the planner).
// `pinned` (neuron ids) as one flag per neuron of n; throws InternalError unless they are distinct and < n.
std::vector<uint8_t> pin_flags(uint32_t n, const std::vector<uint32_t>& pinned);

double pinned_cost_us(const TokenMajorMask& tm, const Order& order, const std::vector<uint32_t>& pinned,
                      const CostModel& c);

// Per neuron, the first-order change of pinned_cost_us from flipping that neuron alone: for an unpinned neuron
// what pinning it saves, for a pinned one what unpinning it costs (exact for a single flip). What refine_pins ranks.
std::vector<double> pin_deltas(const TokenMajorMask& tm, const Order& order, const std::vector<uint32_t>& pinned,
                               const CostModel& c);

// Refines `seed` (neuron ids; the result has the same size, ordered hottest first by `freq`, ties by index) for
// `order` on the first `max_tokens` of tm's tokens (0 = all), in at most `rounds` rounds of swaps. Returns the
// seed itself when no swap lowers the cost.
std::vector<uint32_t> refine_pins(const TokenMajorMask& tm, const Order& order, const std::vector<uint32_t>& seed,
                                  const std::vector<uint64_t>& freq, const CostModel& c, uint32_t rounds = 8,
                                  uint64_t max_tokens = 0, PinRefineStats* stats = nullptr);

}  // namespace nl
