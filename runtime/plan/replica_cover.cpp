#include "runtime/plan/replica_cover.h"

#include <algorithm>

#include "formats/core/error.h"
#include "runtime/plan/slot_cache.h"

namespace nl {

ReplicaMap ReplicaMap::from_order(const std::vector<uint32_t>& order, uint32_t n_neurons) {
  ReplicaMap m;
  m.n_neurons = n_neurons;
  m.neuron_of = order;
  m.first.assign(n_neurons, kNoSlot);
  m.second.assign(n_neurons, kNoSlot);
  if (order.size() < n_neurons || order.size() > 2 * size_t(n_neurons))
    throw InternalError("replicas: an order of " + std::to_string(order.size()) + " slots for " +
                        std::to_string(n_neurons) + " neurons");
  for (uint32_t s = 0; s < order.size(); ++s) {
    const uint32_t v = order[s];
    if (v >= n_neurons) throw InternalError("replicas: neuron out of range in the order");
    if (m.first[v] == kNoSlot)
      m.first[v] = s;
    else if (m.second[v] == kNoSlot)
      m.second[v] = s;
    else
      throw InternalError("replicas: neuron " + std::to_string(v) + " has more than two copies");
  }
  for (uint32_t v = 0; v < n_neurons; ++v)
    if (m.first[v] == kNoSlot) throw InternalError("replicas: neuron " + std::to_string(v) + " has no slot");
  return m;
}

std::vector<uint32_t> ReplicaMap::cache_alias() const {
  if (replicas() == 0) return {};
  std::vector<uint32_t> a(neuron_of.size());
  for (uint32_t s = 0; s < a.size(); ++s) a[s] = first_of(s);
  return a;
}

std::vector<uint32_t> primary_order(const std::vector<uint32_t>& order, uint32_t n_neurons) {
  std::vector<uint32_t> out;
  out.reserve(n_neurons);
  std::vector<uint8_t> seen(n_neurons, 0);
  for (uint32_t v : order)
    if (v < n_neurons && !seen[v]) seen[v] = 1, out.push_back(v);
  return out;
}

ReplicaCover::ReplicaCover(const ReplicaMap& map, const PlannerConfig& cfg)
    : map_(map),
      read_us_(cfg.cost.read_latency_us),
      bundle_us_(double(cfg.bundle_bytes) / cfg.cost.bandwidth_MBps),
      merge_gap_(ReadPlanner(cfg).merge_gap_bundles()),
      needed_((map.n_slots() + 63) / 64, 0),
      listed_((map.n_slots() + 63) / 64, 0) {}

double ReplicaCover::link_us(uint32_t gap) const {
  if (gap == 0) return 0;
  return gap <= merge_gap_ ? std::min(double(gap) * bundle_us_, read_us_) : read_us_;
}

uint32_t ReplicaCover::nearest_left(uint32_t s) const {
  if (s == 0) return kNoSlot;
  const uint32_t i = s - 1, lo = i >= merge_gap_ ? i - merge_gap_ : 0;
  uint64_t w = i >> 6;
  uint64_t x = needed_[w] & ((i & 63) == 63 ? ~uint64_t(0) : (uint64_t(1) << ((i & 63) + 1)) - 1);
  for (;;) {
    if (x) {
      const uint32_t p = uint32_t(w * 64 + 63 - uint64_t(__builtin_clzll(x)));
      return p >= lo ? p : kNoSlot;
    }
    if (w * 64 <= lo) return kNoSlot;
    x = needed_[--w];
  }
}

uint32_t ReplicaCover::nearest_right(uint32_t s) const {
  const uint32_t i = s + 1;
  if (i >= map_.n_slots()) return kNoSlot;
  const uint32_t hi = uint32_t(std::min<uint64_t>(uint64_t(i) + merge_gap_, map_.n_slots() - 1));
  uint64_t w = i >> 6;
  uint64_t x = needed_[w] & (~uint64_t(0) << (i & 63));
  for (;;) {
    if (x) {
      const uint32_t p = uint32_t(w * 64 + uint64_t(__builtin_ctzll(x)));
      return p <= hi ? p : kNoSlot;
    }
    if ((w + 1) * 64 > hi) return kNoSlot;
    x = needed_[++w];
  }
}

// left + right - both, an absent neighbour costing one read: alone a read, next to a run nothing, within the merge
// gap the gap's bytes, and between two needed slots the change of what lies between them.
double ReplicaCover::added_cost_us(uint32_t s) const {
  const uint32_t l = nearest_left(s), r = nearest_right(s);
  const double left = l == kNoSlot ? read_us_ : link_us(s - l - 1);
  const double right = r == kNoSlot ? read_us_ : link_us(r - s - 1);
  const double both = (l == kNoSlot || r == kNoSlot) ? read_us_ : link_us(r - l - 1);
  return left + right - both;
}

void ReplicaCover::choose(const uint32_t* neurons, size_t n, const SlotCache* cache, std::vector<uint32_t>& out) {
  out.clear();
  pending_.clear();
  auto set = [](std::vector<uint64_t>& b, uint32_t s) { b[s >> 6] |= uint64_t(1) << (s & 63); };
  for (size_t k = 0; k < n; ++k) {
    const uint32_t v = neurons[k];
    if (v >= map_.n_neurons) throw InternalError("replica cover: active neuron out of range");
    const uint32_t s = map_.first[v];
    const bool resident = cache && cache->resident(s);
    if (map_.second[v] == kNoSlot || resident) {
      set(listed_, s);
      if (!resident) set(needed_, s);
    } else {
      pending_.push_back(v);
    }
  }
  // Each replicated neuron takes its cheaper copy given every other needed slot; a second pass revisits the first
  // choices with all of them made. Ties keep the first copy.
  chosen_.assign(pending_.size(), kNoSlot);
  for (int pass = 0; pass < 2 && !pending_.empty(); ++pass) {
    for (size_t i = 0; i < pending_.size(); ++i) {
      const uint32_t v = pending_[i];
      if (chosen_[i] != kNoSlot) needed_[chosen_[i] >> 6] &= ~(uint64_t(1) << (chosen_[i] & 63));
      const uint32_t a = map_.first[v], b = map_.second[v];
      const uint32_t s = added_cost_us(b) < added_cost_us(a) ? b : a;
      set(needed_, s);
      chosen_[i] = s;
    }
  }
  for (uint32_t s : chosen_) set(listed_, s);
  for (size_t w = 0; w < listed_.size(); ++w) {
    for (uint64_t x = listed_[w]; x; x &= x - 1) out.push_back(uint32_t(w * 64 + uint64_t(__builtin_ctzll(x))));
    listed_[w] = needed_[w] = 0;
  }
}

}  // namespace nl
