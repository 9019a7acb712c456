// Builds the CSR candidate graph from top-k lists or the full matrix (see csr_view.h).
#include "graph/csr_view.h"

#include <algorithm>
#include <tuple>
#include <vector>

#include "formats/core/error.h"

namespace nl {

CandidateGraph candidate_graph_csr(const LayerGraph& g, uint32_t min_count, CandidateSource source) {
  const uint32_t n = g.n_neurons;
  min_count = std::max<uint32_t>(min_count, 1);
  std::vector<std::tuple<uint32_t, uint32_t, uint32_t>> arcs;  // (source, target, count), both directions
  if (source == CandidateSource::TopK) {
    for (uint32_t v = 0; v < n && g.k > 0; ++v)
      for (uint32_t e = 0; e < g.nbr_len[v]; ++e) {
        const uint32_t u = g.nbr[size_t(v) * g.k + e], c = g.nbr_cnt[size_t(v) * g.k + e];
        if (c < min_count) continue;
        arcs.emplace_back(v, u, c);
        arcs.emplace_back(u, v, c);
      }
  } else {
    if (!g.has_full()) throw UsageError("candidate graph from the full matrix: the layer has no full matrix");
    for (uint32_t i = 0; i + 1 < n; ++i)
      for (uint32_t j = i + 1; j < n; ++j) {
        const uint32_t c = g.upper[LayerGraph::upper_index(n, i, j)];
        if (c < min_count) continue;
        arcs.emplace_back(i, j, c);
        arcs.emplace_back(j, i, c);
      }
  }
  std::sort(arcs.begin(), arcs.end());
  arcs.erase(std::unique(arcs.begin(), arcs.end()), arcs.end());  // a pair listed from both ends
  std::vector<std::pair<uint32_t, uint32_t>> edges;
  std::vector<CandidateEdge> props;
  edges.reserve(arcs.size());
  props.reserve(arcs.size());
  for (const auto& [s, t, c] : arcs) {
    edges.emplace_back(s, t);
    props.push_back({c});
  }
  return CandidateGraph(boost::edges_are_sorted, edges.begin(), edges.end(), props.begin(), n);
}

}  // namespace nl
