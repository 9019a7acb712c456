// Ordering solvers for one FFN layer: slot -> neuron permutations from a layer's co-activation graph.
// identity, frequency (Neuralink-S), greedy (the paper's Algorithm 1 over top-k candidate pairs), rcm
// (reverse Cuthill-McKee, Boost.Graph). The local search (greedy+ls) lives in layout/local_search.h.
#pragma once
#include <cstdint>
#include <utility>
#include <vector>

#include "formats/core/bitmask.h"
#include "graph/coactivation.h"

namespace nl {

using Order = std::vector<uint32_t>;  // slot -> neuron

Order solve_identity(uint32_t n);
// By decreasing activation count, ties by index.
Order solve_frequency(const LayerGraph& g);
// The `count` most frequent neurons, hottest first (ties by index): the pinned hot set.
Order hottest(const std::vector<uint64_t>& freq, uint32_t count);

struct GreedyStats {
  uint64_t candidates = 0;      // distinct candidate pairs from the top-k lists
  uint64_t accepted = 0;        // links accepted from candidates
  uint64_t endpoint_links = 0;  // links accepted when joining fragments by exact endpoint counts
  uint64_t index_links = 0;     // links accepted by the deterministic index-order join (count 0 or unknown)
  uint32_t fragments = 0;       // paths left after the candidate pass
};

namespace detail {
// Every-pair greedy: pairs collected per band of counts (64 MiB of candidates by default; tests make bands tiny).
extern uint64_t greedy_band_pairs;
}  // namespace detail

// The links Algorithm 1 accepts, in acceptance order, as (u, v) with u < v.
using Links = std::vector<std::pair<uint32_t, uint32_t>>;

// Paper's Algorithm 1: candidate pairs (every pair with a non-zero count when g holds the full matrix, exactly as the
// paper; else the top-k lists) by decreasing count, ties by (u, v); accept when
// both ends have fewer than two links and union-find finds no cycle. Fragments left when neurons exhaust
// their candidates are joined by the same rule over co-activation counts between fragment endpoints (each
// endpoint's 8 heaviest endpoint partners, counted from `mask` when given on at most 8,192 evenly spread
// tokens with the fast counting kernel, in up to 3 rounds), and finally in index order (O(F log F)). Returns the path
// walked from its smaller-index end. first_band (optional, full-matrix greedy only): the first band of pairs (count >=
// lo, in Algorithm 1's order) is stored there by the first run on g and reused by later runs on g, on subsets too (the
// subset's pairs are the band's pairs with both ends included), instead of scanning the matrix again. Same links either
// way.
struct GreedyFirstBand {
  struct Edge {
    uint64_t count;
    uint32_t u, v;
  };
  const LayerGraph* graph = nullptr;  // the graph the band belongs to (nullptr: not filled yet)
  uint64_t lo = 0;
  std::vector<Edge> edges;
};
Order solve_greedy(const LayerGraph& g, const LayerMask* mask, GreedyStats* stats = nullptr, Links* links = nullptr,
                   GreedyFirstBand* first_band = nullptr);

// The same on the neurons with include[v] != 0 only (the others are left out of the path and of every
// candidate pair): returns a path over that subset.
Order solve_greedy_subset(const LayerGraph& g, const LayerMask* mask, const std::vector<uint8_t>* include,
                          GreedyStats* stats = nullptr, Links* links = nullptr, GreedyFirstBand* first_band = nullptr);

// Reverse Cuthill-McKee on the candidate graph thresholded at min_count (pairs from the top-k lists).
Order solve_rcm(const LayerGraph& g, uint32_t min_count = 1);

// Sum of co-activation counts of adjacent slots (exact, from the mask). With gap 0 and no cache the reads over
// the trace are sum_v f(v) - path_weight.
uint64_t path_weight(const LayerMask& m, const Order& order);
// The same from g's full count matrix when g holds one for m (graph_covers), else from the mask. g must be m's graph.
uint64_t path_weight(const LayerGraph& g, const LayerMask& m, const Order& order);
// g has the full upper triangle over m's neurons and tokens (pair counts are then O(1) look-ups).
inline bool graph_covers(const LayerGraph& g, const LayerMask& m) {
  return !g.upper.empty() && g.n_neurons == m.n_neurons && g.n_tokens == m.n_tokens;
}
// C[a][b] of m: from g's matrix when it covers m, else counted from the mask. g must be m's graph.
inline uint64_t pair_count(const LayerGraph& g, const LayerMask& m, uint32_t a, uint32_t b) {
  return graph_covers(g, m) ? g.pair(a, b) : coactivation_pair(m, a, b);
}
// 1/2 sum over neurons of their two heaviest co-activation counts (from the top-k lists; needs k >= 2).
double path_upper_bound(const LayerGraph& g);

}  // namespace nl
