#include "layout/synthetic.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "formats/core/rng.h"

namespace nl {

namespace {
using Rng = SplitMix64;  // identical on every platform (formats/core/rng.h)
}  // namespace

LayerMask clustered_mask(const ClusteredTraceSpec& sp) {
  Rng rng{sp.seed * 0x2545F4914F6CDD1Dull + 17};
  const uint32_t n = sp.n_neurons;
  LayerMask m(n, sp.n_tokens);
  if (n == 0) return m;
  // Scatter: latent position -> neuron index.
  std::vector<uint32_t> perm(n);
  std::iota(perm.begin(), perm.end(), 0u);
  for (uint32_t i = n; i > 1; --i) std::swap(perm[i - 1], perm[rng.below(i)]);
  uint32_t n_hot = uint32_t(std::floor(sp.hot_fraction * n));
  uint32_t cs = std::max<uint32_t>(1, sp.cluster_size);
  uint32_t n_clusters = (n - n_hot + cs - 1) / cs;
  std::vector<double> rate(n_clusters);
  for (uint32_t c = 0; c < n_clusters; ++c) {
    // Power-law spread around the mean rate (mean of u^-0.5 over (0,1] is 2).
    double u = std::max(1e-3, rng.uniform());
    rate[c] = std::min(0.9, sp.cluster_rate * 0.5 / std::sqrt(u));
  }
  std::vector<uint8_t> on(n_clusters, 0);
  for (uint64_t t = 0; t < sp.n_tokens; ++t) {
    for (uint32_t i = 0; i < n_hot; ++i)
      if (rng.uniform() < sp.hot_rate) m.set(perm[i], t);
    for (uint32_t c = 0; c < n_clusters; ++c) {
      bool fire = (on[c] && rng.uniform() < sp.stickiness) || rng.uniform() < rate[c];
      on[c] = fire;
      if (!fire) continue;
      uint32_t first = n_hot + c * cs, size = std::min(cs, n - first);
      uint32_t win = std::max<uint32_t>(1, uint32_t(std::lround(sp.window_fraction * size)));
      uint32_t start = uint32_t(rng.below(size - win + 1));
      for (uint32_t k = start; k < start + win; ++k)
        if (rng.uniform() >= sp.member_dropout) m.set(perm[first + k], t);
    }
    if (sp.noise > 0) {
      // Geometric skips: about noise * n draws per token instead of n.
      double lq = std::log1p(-std::min(sp.noise, 0.999));
      double pos = std::floor(std::log(std::max(1e-300, rng.uniform())) / lq);
      while (pos < n) {
        m.set(uint32_t(pos), t);
        pos += 1 + std::floor(std::log(std::max(1e-300, rng.uniform())) / lq);
      }
    }
  }
  return m;
}

}  // namespace nl
