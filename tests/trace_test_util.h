// Test fixture: a small trace v1 file of clustered synthetic layers (layout/synthetic.h), one seed per layer.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "formats/trace.h"
#include "layout/synthetic.h"

namespace nl::test {

inline void write_clustered_trace(const std::string& path, uint32_t layers, uint32_t neurons, uint64_t tokens,
                                  uint64_t first_seed, const std::string& model) {
  std::vector<LayerMask> masks;
  for (uint32_t l = 0; l < layers; ++l) {
    ClusteredTraceSpec s;
    s.n_neurons = neurons;
    s.n_tokens = tokens;
    s.cluster_size = 8;
    s.seed = first_seed + l;
    masks.push_back(clustered_mask(s));
  }
  TraceWriterOptions o;
  o.model = model;
  o.activation = "synthetic:clustered";
  o.n_neurons.assign(layers, neurons);
  trace_write(path, o, masks, {0});
}

}  // namespace nl::test
