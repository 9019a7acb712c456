// Flash replication: a layer whose slots hold some neurons twice (slot -> neuron, a neuron at most twice), and the
// per-token choice of which copy to read. The cover turns a token's active neurons into one slot per neuron (never
// two copies of one neuron), choosing each replicated neuron's copy by the read planner's cost: the copy whose
// nearest needed neighbours make it cheapest to read (adjacent to a run: its bundle only; within the merge gap: the
// gap's bytes; else one more read). The cache is keyed by a neuron's first copy (SlotCache's alias), so both copies
// of a resident neuron hit. Without replicas the cover is the identity map. docs/solvers.md "Flash replication".
#pragma once
#include <cstdint>
#include <vector>

#include "runtime/plan/read_plan.h"

namespace nl {

class SlotCache;

inline constexpr uint32_t kNoSlot = UINT32_MAX;

struct ReplicaMap {
  uint32_t n_neurons = 0;
  std::vector<uint32_t> neuron_of;  // slot -> neuron (n_neurons + replicas slots)
  std::vector<uint32_t> first;      // neuron -> its first slot (the cache key)
  std::vector<uint32_t> second;     // neuron -> its second slot, kNoSlot when it has one copy

  // From a slot -> neuron order where every neuron < n_neurons appears once or twice. InternalError otherwise.
  static ReplicaMap from_order(const std::vector<uint32_t>& order, uint32_t n_neurons);
  uint32_t n_slots() const { return uint32_t(neuron_of.size()); }
  uint32_t replicas() const { return n_slots() - n_neurons; }
  uint32_t first_of(uint32_t slot) const { return first[neuron_of[slot]]; }  // its neuron's first slot
  // slot -> the first slot of its neuron: CacheConfig::alias (empty without replicas).
  std::vector<uint32_t> cache_alias() const;
};

// The neurons of an order in first-copy order (a permutation of 0..n_neurons-1): the order without its replicas.
std::vector<uint32_t> primary_order(const std::vector<uint32_t>& order, uint32_t n_neurons);

// Chooses copies for one layer. Holds scratch: one per thread.
class ReplicaCover {
 public:
  ReplicaCover(const ReplicaMap& map, const PlannerConfig& cfg);

  // neurons: a token's active neurons (unique, any order, < n_neurons). cache (may be null): a resident neuron is
  // served whichever copy is listed; its first copy is. out: ascending slots, exactly one per active neuron.
  void choose(const uint32_t* neurons, size_t n, const SlotCache* cache, std::vector<uint32_t>& out);

  // What adding slot s to the needed slots costs under the planner's rule, in microseconds (tests, diagnostics).
  double added_cost_us(uint32_t s) const;

 private:
  const ReplicaMap& map_;
  double read_us_, bundle_us_;
  uint32_t merge_gap_;
  std::vector<uint64_t> needed_, listed_;  // bitmaps over slots: needed (not resident) and every listed slot
  std::vector<uint32_t> pending_;          // replicated, not resident neurons of the token
  std::vector<uint32_t> chosen_;           // their chosen slots

  double link_us(uint32_t gap) const;
  uint32_t nearest_left(uint32_t s) const;   // nearest needed slot < s within merge_gap + 1, else kNoSlot
  uint32_t nearest_right(uint32_t s) const;  // nearest needed slot > s within merge_gap + 1, else kNoSlot
  bool test(const std::vector<uint64_t>& b, uint32_t s) const { return (b[s >> 6] >> (s & 63)) & 1; }
};

}  // namespace nl
