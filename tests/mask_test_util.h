// Random layer masks and orders for the layout tests (pins, span).
#pragma once
#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>

#include "formats/core/bitmask.h"
#include "layout/solvers.h"

namespace nl::test {

// Each neuron fires independently at a rate drawn uniformly in [0, hot) for half of the neurons and in [0, cold) for
// the other half (chosen per neuron by a coin).
inline LayerMask random_mask(uint32_t n, uint64_t tokens, std::mt19937_64& rng, double hot, double cold) {
  LayerMask m(n, tokens);
  std::vector<double> rate(n);
  for (auto& r : rate) r = double(rng() % 1000) / 1000.0 * (rng() % 2 ? hot : cold);
  for (uint32_t v = 0; v < n; ++v)
    for (uint64_t t = 0; t < tokens; ++t)
      if (double(rng() % 1000) / 1000.0 < rate[v]) m.set(v, t);
  return m;
}

inline Order shuffled(uint32_t n, std::mt19937_64& rng) {
  Order o(n);
  std::iota(o.begin(), o.end(), 0u);
  std::shuffle(o.begin(), o.end(), rng);
  return o;
}

}  // namespace nl::test
