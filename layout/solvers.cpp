#include "layout/solvers.h"

#include <algorithm>
#include <boost/graph/adjacency_list.hpp>
#include <boost/graph/cuthill_mckee_ordering.hpp>
#include <numeric>
#include <set>

#include "formats/core/error.h"

namespace nl {

Order solve_identity(uint32_t n) {
  Order o(n);
  std::iota(o.begin(), o.end(), 0u);
  return o;
}

Order solve_frequency(const LayerGraph& g) {
  Order o = solve_identity(g.n_neurons);
  std::stable_sort(o.begin(), o.end(), [&](uint32_t a, uint32_t b) { return g.freq[a] > g.freq[b]; });
  return o;
}

namespace {

struct Dsu {
  std::vector<uint32_t> p;
  explicit Dsu(uint32_t n) : p(n) { std::iota(p.begin(), p.end(), 0u); }
  uint32_t find(uint32_t x) {
    while (p[x] != x) x = p[x] = p[p[x]];
    return x;
  }
  void unite(uint32_t a, uint32_t b) { p[find(a)] = find(b); }
};

struct Edge {
  uint64_t count;
  uint32_t u, v;
};
bool edge_before(const Edge& a, const Edge& b) {
  if (a.count != b.count) return a.count > b.count;
  if (a.u != b.u) return a.u < b.u;
  return a.v < b.v;
}

struct PathBuilder {
  uint32_t n;
  std::vector<uint8_t> deg;
  std::vector<uint32_t> adj;  // 2 per node, UINT32_MAX = none
  Dsu dsu;
  Links* links;
  explicit PathBuilder(uint32_t n_, Links* l) : n(n_), deg(n_, 0), adj(2 * size_t(n_), UINT32_MAX), dsu(n_), links(l) {}
  bool try_link(uint32_t u, uint32_t v) {
    if (u == v || deg[u] >= 2 || deg[v] >= 2 || dsu.find(u) == dsu.find(v)) return false;
    adj[2 * size_t(u) + deg[u]++] = v;
    adj[2 * size_t(v) + deg[v]++] = u;
    dsu.unite(u, v);
    if (links) links->emplace_back(std::min(u, v), std::max(u, v));
    return true;
  }
};

}  // namespace

Order solve_greedy(const LayerGraph& g, const LayerMask* mask, GreedyStats* stats, Links* links) {
  const uint32_t n = g.n_neurons;
  GreedyStats st;
  if (links) links->clear();
  if (n == 0) return {};
  std::vector<Edge> edges;
  edges.reserve(size_t(n) * g.k);
  for (uint32_t v = 0; v < n; ++v)
    for (uint32_t e = 0; e < (g.k ? g.nbr_len[v] : 0); ++e) {
      uint32_t u = g.nbr[size_t(v) * g.k + e];
      uint64_t c = g.nbr_cnt[size_t(v) * g.k + e];
      if (u != v && c > 0) edges.push_back({c, std::min(u, v), std::max(u, v)});
    }
  std::sort(edges.begin(), edges.end(), edge_before);
  edges.erase(std::unique(edges.begin(), edges.end(),
                          [](const Edge& a, const Edge& b) { return a.u == b.u && a.v == b.v; }),
              edges.end());
  st.candidates = edges.size();
  PathBuilder pb(n, links);
  for (const Edge& e : edges)
    if (pb.try_link(e.u, e.v)) ++st.accepted;
  edges.clear();
  edges.shrink_to_fit();

  // Fragment endpoints (degree < 2). Continue Algorithm 1 over their exact pair counts.
  std::vector<uint32_t> ends;
  for (uint32_t v = 0; v < n; ++v)
    if (pb.deg[v] < 2) ends.push_back(v);
  st.fragments = 0;
  for (uint32_t v : ends) st.fragments += pb.deg[v] == 0 ? 2 : 1;
  st.fragments /= 2;
  if (mask && ends.size() > 1 && mask->words > 0) {
    // Keep the endpoint count cost bounded: at most ~1e9 word operations, on a token prefix if needed.
    double pairs = 0.5 * double(ends.size()) * double(ends.size() - 1);
    uint64_t words = std::min<uint64_t>(mask->words, std::max<uint64_t>(16, uint64_t(1e9 / std::max(1.0, pairs))));
    if (pairs <= 5e7) {
      std::vector<Edge> ee;
#pragma omp parallel
      {
        std::vector<Edge> local;
#pragma omp for schedule(dynamic, 8) nowait
        for (int64_t a = 0; a < int64_t(ends.size()); ++a) {
          const uint64_t* ra = mask->row(ends[size_t(a)]);
          for (size_t b = size_t(a) + 1; b < ends.size(); ++b) {
            const uint64_t* rb = mask->row(ends[b]);
            uint64_t c = 0;
            for (uint64_t w = 0; w < words; ++w) c += uint64_t(__builtin_popcountll(ra[w] & rb[w]));
            if (c) local.push_back({c, ends[size_t(a)], ends[b]});
          }
        }
#pragma omp critical
        ee.insert(ee.end(), local.begin(), local.end());
      }
      std::sort(ee.begin(), ee.end(), edge_before);
      for (const Edge& e : ee)
        if (pb.try_link(e.u, e.v)) ++st.endpoint_links;
    }
  }
  // Whatever is left has no (known) co-activation: join in (u, v) index order, as Algorithm 1 would order
  // its zero-count pairs.
  std::set<uint32_t> avail;
  for (uint32_t v = 0; v < n; ++v)
    if (pb.deg[v] < 2) avail.insert(v);
  for (auto it = avail.begin(); it != avail.end();) {
    uint32_t u = *it;
    bool linked = false;
    for (auto jt = std::next(it); jt != avail.end() && pb.deg[u] < 2; ++jt) {
      uint32_t v = *jt;
      if (pb.try_link(u, v)) {
        ++st.index_links;
        linked = true;
        if (pb.deg[v] == 2) avail.erase(jt);
        break;
      }
    }
    if (pb.deg[u] == 2) {
      it = avail.erase(it);
    } else if (!linked) {
      ++it;  // u cannot link to any later node any more
    }
  }
  // Walk the single path from its smaller-index end.
  uint32_t start = UINT32_MAX;
  for (uint32_t v = 0; v < n && start == UINT32_MAX; ++v)
    if (pb.deg[v] < 2) start = v;
  if (start == UINT32_MAX) throw InternalError("greedy: no path end (cycle)");
  Order o;
  o.reserve(n);
  uint32_t prev = UINT32_MAX, cur = start;
  while (cur != UINT32_MAX) {
    o.push_back(cur);
    uint32_t a = pb.adj[2 * size_t(cur)], b = pb.adj[2 * size_t(cur) + 1];
    uint32_t next = a != prev ? a : b;
    if (a == prev && b == prev) next = UINT32_MAX;
    if (next == prev) next = UINT32_MAX;
    prev = cur;
    cur = next;
  }
  if (o.size() != n) throw InternalError("greedy: path does not cover every neuron");
  if (stats) *stats = st;
  return o;
}

Order solve_rcm(const LayerGraph& g, uint32_t min_count) {
  using namespace boost;
  using Graph = adjacency_list<vecS, vecS, undirectedS,
                               property<vertex_color_t, default_color_type, property<vertex_degree_t, int>>>;
  const uint32_t n = g.n_neurons;
  std::vector<std::pair<uint32_t, uint32_t>> es;
  for (uint32_t v = 0; v < n; ++v)
    for (uint32_t e = 0; e < (g.k ? g.nbr_len[v] : 0); ++e) {
      uint32_t u = g.nbr[size_t(v) * g.k + e];
      if (u != v && g.nbr_cnt[size_t(v) * g.k + e] >= std::max<uint32_t>(1, min_count))
        es.emplace_back(std::min(u, v), std::max(u, v));
    }
  std::sort(es.begin(), es.end());
  es.erase(std::unique(es.begin(), es.end()), es.end());
  Graph G(n);
  for (auto [a, b] : es) add_edge(a, b, G);
  std::vector<Graph::vertex_descriptor> inv(n);
  cuthill_mckee_ordering(G, inv.rbegin(), get(vertex_color, G), make_degree_map(G));
  Order o(inv.begin(), inv.end());
  return o;
}

uint64_t path_weight(const LayerMask& m, const Order& o) {
  uint64_t w = 0;
  for (size_t i = 0; i + 1 < o.size(); ++i) w += coactivation_pair(m, o[i], o[i + 1]);
  return w;
}

double path_upper_bound(const LayerGraph& g) {
  double s = 0;
  for (uint32_t v = 0; v < g.n_neurons; ++v) {
    uint32_t len = g.k ? g.nbr_len[v] : 0;
    for (uint32_t e = 0; e < std::min<uint32_t>(2, len); ++e) s += double(g.nbr_cnt[size_t(v) * g.k + e]);
  }
  return 0.5 * s;
}

}  // namespace nl
