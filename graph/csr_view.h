// Boost.Graph view of a layer's candidate graph: a compressed_sparse_row_graph with every undirected edge
// {u, v} stored in both directions and its co-activation count as the edge weight, for Boost algorithms such
// as reverse Cuthill-McKee (use make_out_degree_map(g) as the degree map).
#pragma once
#include <boost/graph/compressed_sparse_row_graph.hpp>
#include <cstdint>

#include "graph/coactivation.h"

namespace nl {

struct CandidateEdge {
  uint32_t count = 0;  // C[u][v]
};

using CandidateGraph = boost::compressed_sparse_row_graph<boost::directedS, boost::no_property, CandidateEdge,
                                                          boost::no_property, uint32_t, uint64_t>;

enum class CandidateSource {
  TopK,  // {u, v} when v is in u's top-k list or u in v's
  Full,  // every pair of the full matrix (requires has_full())
};

// Edges with count >= min_count (at least 1). Out-edges of each vertex are sorted by target; deterministic.
CandidateGraph candidate_graph_csr(const LayerGraph& g, uint32_t min_count = 1,
                                   CandidateSource source = CandidateSource::TopK);

}  // namespace nl
