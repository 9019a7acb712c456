#include "layout/pins.h"

#include <algorithm>

#include "formats/core/error.h"

namespace nl {

namespace {

// One pass over the tokens: the estimated cost of the pinned set, and per neuron what pinning it would save
// (unpinned) or what unpinning it would cost (pinned), each with the rest of the set as it is.
class PinPass {
 public:
  PinPass(const TokenMajorMask& tm, const Order& order, const CostModel& c, uint64_t max_tokens)
      : n_(tm.n_neurons), order_(order), c_(c) {
    if (order.size() != n_) throw InternalError("refine_pins: order length does not match the layer");
    const uint64_t end = max_tokens && max_tokens < tm.end - tm.begin ? tm.begin + max_tokens : tm.end;
    // Every token's active slots, ascending, listed once: only the pinned set changes between passes.
    std::vector<uint32_t> slot_of(n_);
    for (uint32_t s = 0; s < n_; ++s) slot_of[order[s]] = s;
    std::vector<uint64_t> slot_bits(words_for_tokens(n_), 0);
    tok_begin_.push_back(0);
    for (uint64_t t = tm.begin; t < end; ++t) {
      tm.append_slots(t, slot_of, slot_bits, slots_);
      tok_begin_.push_back(slots_.size());
    }
  }

  // Returns the summed cost; delta[v] gets the neuron's saving (unpinned) or loss (pinned), in microseconds.
  double run(const std::vector<uint8_t>& pinned, std::vector<double>& delta) {
    const uint32_t n = n_;
    // By slot while sweeping (the active slots come in ascending order), by neuron on return.
    pin_slot_.resize(n);
    for (uint32_t s = 0; s < n; ++s) pin_slot_[s] = pinned[order_[s]];
    dslot_.assign(n, 0.0);
    double total = 0;
    for (size_t t = 0; t + 1 < tok_begin_.size(); ++t) {
      const uint32_t* act = slots_.data() + tok_begin_[t];
      const size_t n_act = size_t(tok_begin_[t + 1] - tok_begin_[t]);
      need_.clear();
      for (size_t i = 0; i < n_act; ++i)
        if (!pin_slot_[act[i]]) need_.push_back(act[i]);
      if (!need_.empty()) {
        total += c_.read_us + double(need_.size()) * bundle_us_;
        for (size_t i = 1; i < need_.size(); ++i) total += link(need_[i - 1], need_[i]);
      }
      // j = needed slots before the current active slot.
      size_t j = 0;
      for (size_t i = 0; i < n_act; ++i) {
        const uint32_t s = act[i];
        const bool is_needed = j < need_.size() && need_[j] == s;
        const int64_t p = j > 0 ? int64_t(need_[j - 1]) : -1;
        const size_t qi = is_needed ? j + 1 : j;
        const int64_t q = qi < need_.size() ? int64_t(need_[qi]) : -1;
        dslot_[s] += bundle_us_ + link_or(p, s, true) + link_or(s, q, false) - link_pq(p, q);
        if (is_needed) ++j;
      }
    }
    delta.resize(n);
    for (uint32_t s = 0; s < n; ++s) delta[order_[s]] = dslot_[s];
    return total;
  }

 private:
  uint32_t n_;
  const Order& order_;
  CostModel c_;
  double bundle_us_ = c_.bundle_us();
  std::vector<uint32_t> slots_, need_;  // slots_: every token's active slots; need_: one token's unpinned ones
  std::vector<uint64_t> tok_begin_;     // token t's slots are slots_[tok_begin_[t], tok_begin_[t + 1])
  std::vector<uint8_t> pin_slot_;
  std::vector<double> dslot_;

  double link(uint32_t x, uint32_t y) const { return c_.link_us(y - x - 1); }  // consecutive needed slots x < y
  // A missing neighbour before s: s starts the first read (a); a missing one after: nothing more.
  double link_or(int64_t p, int64_t q, bool before) const {
    if (before) return p < 0 ? c_.read_us : link(uint32_t(p), uint32_t(q));
    return q < 0 ? 0.0 : link(uint32_t(p), uint32_t(q));
  }
  double link_pq(int64_t p, int64_t q) const {
    if (p < 0) return q < 0 ? 0.0 : c_.read_us;
    return q < 0 ? 0.0 : link(uint32_t(p), uint32_t(q));
  }
};

std::vector<uint32_t> hottest_first(std::vector<uint32_t> set, const std::vector<uint64_t>& freq) {
  std::sort(set.begin(), set.end(),
            [&](uint32_t a, uint32_t b) { return freq[a] != freq[b] ? freq[a] > freq[b] : a < b; });
  return set;
}

}  // namespace

std::vector<uint8_t> pin_flags(uint32_t n, const std::vector<uint32_t>& pinned) {
  std::vector<uint8_t> pin(n, 0);
  for (uint32_t v : pinned) {
    if (v >= n || pin[v]) throw InternalError("pins: pinned neurons must be distinct and in range");
    pin[v] = 1;
  }
  return pin;
}

double pinned_cost_us(const TokenMajorMask& tm, const Order& order, const std::vector<uint32_t>& pinned,
                      const CostModel& c) {
  PinPass pass(tm, order, c, 0);
  std::vector<double> delta;
  return pass.run(pin_flags(tm.n_neurons, pinned), delta);
}

std::vector<double> pin_deltas(const TokenMajorMask& tm, const Order& order, const std::vector<uint32_t>& pinned,
                               const CostModel& c) {
  PinPass pass(tm, order, c, 0);
  std::vector<double> delta;
  pass.run(pin_flags(tm.n_neurons, pinned), delta);
  return delta;
}

std::vector<uint32_t> refine_pins(const TokenMajorMask& tm, const Order& order, const std::vector<uint32_t>& seed,
                                  const std::vector<uint64_t>& freq, const CostModel& c, uint32_t rounds,
                                  uint64_t max_tokens, PinRefineStats* stats) {
  const uint32_t n = tm.n_neurons;
  if (freq.size() != n) throw InternalError("refine_pins: frequencies do not match the layer");
  std::vector<uint8_t> pin = pin_flags(n, seed);
  PinRefineStats st;
  const uint32_t k = uint32_t(seed.size());
  if (k == 0 || k >= n || rounds == 0) {
    if (stats) *stats = st;
    return seed;
  }
  PinPass pass(tm, order, c, max_tokens);
  std::vector<double> delta;
  std::vector<uint8_t> best = pin;
  double best_cost = 0;
  uint32_t swaps = 0, best_swaps = 0;
  std::vector<uint32_t> in, out;
  for (uint32_t r = 0;; ++r) {
    const double cost = pass.run(pin, delta);
    if (r == 0) st.cost_seed_us = best_cost = cost;
    if (cost < best_cost) best_cost = cost, best = pin, best_swaps = swaps, st.rounds = r;
    if (r == rounds) break;
    in.clear();
    out.clear();
    for (uint32_t v = 0; v < n; ++v) (pin[v] ? out : in).push_back(v);
    // Candidates to pin by saving (largest first), pinned ones by loss (smallest first); ties by index.
    std::sort(in.begin(), in.end(),
              [&](uint32_t a, uint32_t b) { return delta[a] != delta[b] ? delta[a] > delta[b] : a < b; });
    std::sort(out.begin(), out.end(),
              [&](uint32_t a, uint32_t b) { return delta[a] != delta[b] ? delta[a] < delta[b] : a < b; });
    // Savings are first-order (each with the rest of the set fixed), so the batch shrinks every round.
    const uint32_t limit = std::max<uint32_t>(1, k / (4u << std::min<uint32_t>(r, 20)));
    uint32_t done = 0;
    for (uint32_t i = 0; i < limit && i < in.size() && i < out.size(); ++i) {
      if (!(delta[in[i]] > delta[out[i]] + 1e-9)) break;
      pin[in[i]] = 1;
      pin[out[i]] = 0;
      ++done;
    }
    swaps += done;
    if (done == 0) break;
  }
  st.cost_final_us = best_cost;
  st.swaps = best_swaps;
  if (stats) *stats = st;
  if (best_swaps == 0) return seed;
  std::vector<uint32_t> res;
  for (uint32_t v = 0; v < n; ++v)
    if (best[v]) res.push_back(v);
  return hottest_first(std::move(res), freq);
}

}  // namespace nl
