// The CSR candidate view: symmetric, weights equal the counts, matches the top-k lists / thresholded matrix,
// and runs Boost's reverse Cuthill-McKee.
#include <doctest/doctest.h>

#include <algorithm>
#include <boost/graph/cuthill_mckee_ordering.hpp>
#include <random>
#include <set>

#include "graph/coactivation.h"
#include "graph/csr_view.h"

using namespace nl;

namespace {
LayerMask random_mask(uint32_t n, uint64_t tokens, double p, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::bernoulli_distribution on(p);
  LayerMask m(n, tokens);
  for (uint32_t i = 0; i < n; ++i)
    for (uint64_t t = 0; t < tokens; ++t)
      if (on(rng)) m.set(i, t);
  return m;
}
}  // namespace

TEST_CASE("CSR view of the top-k candidate graph") {
  LayerMask m = random_mask(60, 400, 0.05, 3);
  CoactivationOptions o;
  o.top_k = 4;
  o.full_matrix = true;
  LayerGraph g = coactivation_count(m, o);
  CandidateGraph csr = candidate_graph_csr(g);
  CHECK(num_vertices(csr) == 60);
  std::set<std::pair<uint32_t, uint32_t>> want;
  for (uint32_t v = 0; v < 60; ++v)
    for (uint32_t e = 0; e < g.nbr_len[v]; ++e) {
      uint32_t u = g.nbr[v * 4 + e];
      want.insert({std::min(u, v), std::max(u, v)});
    }
  CHECK(num_edges(csr) == 2 * want.size());
  for (auto e : boost::make_iterator_range(edges(csr))) {
    uint32_t s = source(e, csr), t = target(e, csr);
    CHECK(want.count({std::min(s, t), std::max(s, t)}) == 1);
    CHECK(csr[e].count == g.pair(s, t));
    CHECK(boost::edge(t, s, csr).second);  // symmetric
  }
  // Thresholds drop light edges.
  CandidateGraph heavy = candidate_graph_csr(g, 3);
  for (auto e : boost::make_iterator_range(edges(heavy))) CHECK(heavy[e].count >= 3);
  CHECK(num_edges(heavy) <= num_edges(csr));
  // From the full matrix: every pair with count >= 2.
  CandidateGraph full = candidate_graph_csr(g, 2, CandidateSource::Full);
  uint64_t pairs = 0;
  for (uint32_t i = 0; i < 60; ++i)
    for (uint32_t j = i + 1; j < 60; ++j) pairs += g.pair(i, j) >= 2;
  CHECK(num_edges(full) == 2 * pairs);
  o.full_matrix = false;
  CHECK_THROWS(candidate_graph_csr(coactivation_count(m, o), 1, CandidateSource::Full));

  // Reverse Cuthill-McKee runs on the view and returns a permutation.
  std::vector<uint32_t> order(num_vertices(csr));
  std::vector<boost::default_color_type> color(num_vertices(csr));
  boost::cuthill_mckee_ordering(csr, order.rbegin(),
                                boost::make_iterator_property_map(color.begin(), get(boost::vertex_index, csr)),
                                boost::make_out_degree_map(csr));
  std::vector<uint32_t> sorted = order;
  std::sort(sorted.begin(), sorted.end());
  for (uint32_t i = 0; i < 60; ++i) CHECK(sorted[i] == i);
}

TEST_CASE("CSR view of empty and edgeless layers") {
  LayerGraph g = coactivation_count(LayerMask(0, 10), CoactivationOptions{});
  CHECK(num_vertices(candidate_graph_csr(g)) == 0);
  LayerGraph h = coactivation_count(LayerMask(5, 10), CoactivationOptions{});
  CandidateGraph c = candidate_graph_csr(h);
  CHECK(num_vertices(c) == 5);
  CHECK(num_edges(c) == 0);
}
