// Random layer masks and orders for the layout tests (pins, span).
#pragma once
#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>

#include "formats/core/bitmask.h"
#include "layout/solvers.h"
#include "layout/synthetic.h"

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

// A small clustered layer (clusters of 12 firing at 5 %): the co-activation structure the solvers exist for.
inline LayerMask clustered_layer(uint32_t n, uint64_t tokens, uint64_t seed) {
  ClusteredTraceSpec s;
  s.n_neurons = n;
  s.n_tokens = tokens;
  s.cluster_size = 12;
  s.cluster_rate = 0.05;
  s.seed = seed;
  return clustered_mask(s);
}

inline Order shuffled(uint32_t n, std::mt19937_64& rng) {
  Order o(n);
  std::iota(o.begin(), o.end(), 0u);
  std::shuffle(o.begin(), o.end(), rng);
  return o;
}

}  // namespace nl::test
