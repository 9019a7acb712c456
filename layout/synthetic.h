// Structured synthetic activation masks for tests and benchmarks until real / paper-shaped traces exist:
// neurons belong to hidden clusters (randomly scattered over the original index order, so `identity` is a
// poor layout), a cluster fires as a contiguous window of its members (so good orders exist), plus a hot set
// that fires most of the time and background noise. Deterministic for a seed.
#pragma once
#include <cstdint>
#include <vector>

#include "formats/core/bitmask.h"

namespace nl {

struct ClusteredTraceSpec {
  uint32_t n_neurons = 1024;
  uint64_t n_tokens = 4096;
  uint32_t cluster_size = 24;    // members per hidden cluster
  double cluster_rate = 0.03;    // mean probability a cluster fires at a token (varies per cluster, power law)
  double window_fraction = 0.5;  // a firing cluster activates a contiguous window of this share of its members
  double member_dropout = 0.15;  // members of the window that still stay silent
  double stickiness = 0.5;       // probability a firing cluster fires again at the next token
  double hot_fraction = 0.01;    // neurons that fire at most tokens
  double hot_rate = 0.7;
  double noise = 0.002;  // background firing probability
  uint64_t seed = 1;
};

LayerMask clustered_mask(const ClusteredTraceSpec& spec);

}  // namespace nl
