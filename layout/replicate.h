// Flash replication (beyond the paper): after the order is chosen, a second copy of some neurons is inserted next to
// a group they fire with far from their own slot, within a budget of extra flash (a share of the layer's FFN bytes).
// Candidates come from the runtime's own reads on the build tokens: a neuron read alone (a read for it only) at a
// token where another read starts or ends at slot q would, with a copy beside q, join that read: one read less. Each
// such neuron's best place (tokens saved x a, less the bundles a copy puts between two slots read together) is ranked;
// the budget level (the top 1/4, 1/2 or all of the budget, or none) is chosen on validation tokens by the exact
// measure (layout/evaluate.h with the cover of runtime/plan/replica_cover.h). docs/solvers.md "Flash replication".
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "layout/cost_model.h"
#include "layout/evaluate.h"
#include "layout/solvers.h"

namespace nl {

struct ReplicaCandidate {
  uint32_t neuron = 0;
  uint32_t anchor = 0;   // the slot (in the order without replicas) the copy goes beside
  bool after = false;    // beside: after the anchor (true) or before it
  uint32_t tokens = 0;   // build tokens where the copy would have joined a read
  double saving_us = 0;  // estimated: tokens x a - bundles put between slots read together x bundle time
};

// The candidates for `order` (a permutation) under `policy` on tm's tokens (at most max_tokens of them, from its
// start), best first, at most max_count, one per neuron; only those with a positive estimated saving.
std::vector<ReplicaCandidate> replica_candidates(const LayerMask& m, const TokenMajorMask& tm, const Order& order,
                                                 const CostModel& cost, uint32_t layer_index,
                                                 const LayerCachePolicy* policy, uint32_t max_count,
                                                 uint64_t max_tokens = 4096);

// The order with the first `count` candidates' copies inserted beside their anchors (slot -> neuron, the neuron then
// appearing twice).
Order insert_replicas(const Order& order, const std::vector<ReplicaCandidate>& candidates, size_t count);

// Replicas a budget of `share` of a layer of n neurons allows: floor(share x n).
uint32_t replica_budget(double share, uint32_t n_neurons);

struct ReplicateResult {
  Order order;            // the chosen order (replicas included; `order` unchanged when none pays)
  uint32_t replicas = 0;  // copies kept
  double base_ms = 0;     // I/O ms/token on the validation tokens without replicas
  double chosen_ms = 0;   // with the chosen level
  std::string summary;    // "replicas ms/tok: 0 a, 40 b, 80 c, 160 d; kept 80"
};

// The replication step of one layer: candidates on the build tokens (tm_build, drawn from m_build), each budget level
// measured on the validation tokens (tm_val, from m_val, eval's token range = tm_val's) with the layer's chosen cache
// policy; the lowest I/O time wins, ties keep fewer copies.
ReplicateResult replicate_layer(const LayerMask& m_build, const TokenMajorMask& tm_build, const LayerMask& m_val,
                                const TokenMajorMask& tm_val, const Order& order, const LayerCachePolicy& policy,
                                const CostModel& cost, uint32_t layer_index, double share);

}  // namespace nl
