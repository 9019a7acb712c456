#include "layout/solvers.h"

#include <algorithm>
#include <boost/graph/adjacency_list.hpp>
#include <boost/graph/cuthill_mckee_ordering.hpp>
#include <numeric>
#include <set>
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#endif

#include "formats/core/error.h"

namespace nl {

namespace detail {
uint64_t greedy_band_pairs = uint64_t(1) << 22;  // pairs per band (x 16 bytes)
}

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

Order hottest(const std::vector<uint64_t>& freq, uint32_t count) {
  Order o(freq.size());
  std::iota(o.begin(), o.end(), 0u);
  count = std::min<uint32_t>(count, uint32_t(o.size()));
  std::partial_sort(o.begin(), o.begin() + count, o.end(),
                    [&](uint32_t a, uint32_t b) { return freq[a] != freq[b] ? freq[a] > freq[b] : a < b; });
  o.resize(count);
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

using Edge = GreedyFirstBand::Edge;
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

// Positions k < len with r[k] >= lo, ascending, into hits: 16 counts per compare where AVX-512 is present.
uint32_t at_least_portable(const uint32_t* r, uint32_t len, uint32_t lo, uint32_t* hits) {
  uint32_t nh = 0;
  for (uint32_t k = 0; k < len; ++k)
    if (r[k] >= lo) hits[nh++] = k;
  return nh;
}
#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target("avx512f,bmi"))) uint32_t at_least_avx512(const uint32_t* r, uint32_t len, uint32_t lo,
                                                                uint32_t* hits) {
  const __m512i vlo = _mm512_set1_epi32(int(lo));
  uint32_t nh = 0, k = 0;
  for (; k + 16 <= len; k += 16)
    for (uint32_t m = _mm512_cmpge_epu32_mask(_mm512_loadu_si512(r + k), vlo); m; m &= m - 1)
      hits[nh++] = k + uint32_t(__builtin_ctz(m));
  for (; k < len; ++k)
    if (r[k] >= lo) hits[nh++] = k;
  return nh;
}
#endif
uint32_t at_least(const uint32_t* r, uint32_t len, uint32_t lo, uint32_t* hits) {
#if defined(__x86_64__) && defined(__GNUC__)
  static const bool wide = __builtin_cpu_supports("avx512f");
  if (wide) return at_least_avx512(r, len, lo, hits);
#endif
  return at_least_portable(r, len, lo, hits);
}

// Stable sort of a band collected in (u, v) order by decreasing count (counts in [lo, hi]): the order edge_before
// gives, in O(band + hi - lo).
void sort_band(std::vector<Edge>& band, uint64_t lo, uint64_t hi, std::vector<Edge>& tmp, std::vector<uint64_t>& off) {
  off.assign(size_t(hi - lo) + 2, 0);
  for (const Edge& e : band) ++off[size_t(hi - e.count) + 1];
  for (size_t k = 1; k < off.size(); ++k) off[k] += off[k - 1];
  tmp.resize(band.size());
  for (const Edge& e : band) tmp[off[size_t(hi - e.count)]++] = e;
  band.swap(tmp);
}

// Algorithm 1 over every pair with a non-zero count (the full matrix g.upper), without holding all pairs: bands of
// decreasing count, each collected by a scan that keeps only pairs whose both ends are still free, sorted as the
// global order would be (count, then (u, v)) and tried. A pair the scan leaves out has an end with two links
// already, which the global order would refuse too, so the accepted links are the same as one sort of all pairs.
// Band sizes change only the cost, never the links. The first band (counts >= a threshold estimated from every
// 8th pair) is one scan of the whole triangle; later bands are sized from an exact histogram of the pairs between
// still-free ends and scan only those pairs, which are few once the first band has linked most neurons.
template <class In>
void greedy_every_pair(const LayerGraph& g, const In& in, uint32_t n_in, PathBuilder& pb, GreedyStats& st,
                       GreedyFirstBand* fb) {
  const uint32_t n = g.n_neurons;
  const uint64_t kBandPairs = std::max<uint64_t>(1, detail::greedy_band_pairs);
  const uint32_t* up = g.upper.data();
  auto row = [&](uint32_t i) { return up + LayerGraph::upper_index(n, i, i + 1) - (i + 1); };  // row(i)[j], j > i
  std::vector<uint32_t> fr;  // free (degree < 2) included neurons, ascending
  auto collect_free = [&] {
    fr.clear();
    for (uint32_t v = 0; v < n; ++v)
      if (pb.deg[v] < 2 && in(v)) fr.push_back(v);
  };
  std::vector<Edge> band, tmp;
  std::vector<uint64_t> off;
  uint64_t links = 0;
  auto try_band = [&](uint64_t lo, uint64_t hi) {
    if (hi >= lo) sort_band(band, lo, hi, tmp, off);
    st.candidates += band.size();
    for (const Edge& e : band)
      if (pb.try_link(e.u, e.v)) ++st.accepted, ++links;
  };

  collect_free();
  if (fr.size() < 2) return;
  std::vector<uint64_t> hist;
  uint64_t lo1 = 0;
  if (fb && fb->graph == &g) {
    // The first band of an earlier run on g: its pairs with both ends included, already in order.
    lo1 = fb->lo;
    band.clear();
    band.reserve(fb->edges.size());  // at most the whole band: no growth copies
    for (const Edge& e : fb->edges)
      if (in(e.u) && in(e.v)) band.push_back(e);
    try_band(1, 0);
  } else {
    // First band: threshold from a sample of the pairs (every 8th of each row, offset by row).
    constexpr uint32_t kSample = 8;
    for (size_t p = 0; p + 1 < fr.size(); ++p) {
      const uint32_t* r = row(fr[p]);
      for (size_t q = p + 1 + (p * 5) % kSample; q < fr.size(); q += kSample) {
        const uint32_t c = r[fr[q]];
        if (c >= hist.size()) hist.resize(size_t(c) + 1, 0);
        ++hist[c];
      }
    }
    lo1 = hist.size();
    for (uint64_t acc = 0; lo1 > 1 && (acc + hist[lo1 - 1]) * kSample <= kBandPairs;) acc += hist[--lo1];
    if (lo1 == hist.size()) lo1 = std::max<uint64_t>(1, hist.size() - 1);  // at least the top sampled count
    // Room for the sampled estimate and a margin up front: growing by doubling copied and faulted the band again.
    uint64_t sampled = 0;
    for (uint64_t c = lo1; c < hist.size(); ++c) sampled += hist[c];
    band.clear();
    band.reserve(size_t(sampled * kSample + sampled * kSample / 4 + 1024));
    // Collected with no upper bound: the sample may have missed the largest counts.
    uint64_t hi1 = lo1;
    // Every included neuron is free here: whole rows are scanned (at_least), the included test made on the hits.
    std::vector<uint32_t> hits(n);
    for (size_t p = 0; p + 1 < fr.size(); ++p) {
      const uint32_t i = fr[p], *r = row(i);
      const uint32_t nh = at_least(r + i + 1, n - i - 1, uint32_t(std::min<uint64_t>(lo1, UINT32_MAX)), hits.data());
      for (uint32_t h = 0; h < nh; ++h) {
        const uint32_t j = i + 1 + hits[h];
        if (in(j)) band.push_back({r[j], i, j});
      }
    }
    for (const Edge& e : band) hi1 = std::max(hi1, e.count);
    try_band(lo1, hi1);
    if (fb && n_in == n) {  // only a band over every neuron serves every subset
      fb->graph = &g;
      fb->lo = lo1;
      fb->edges = std::move(band);  // the later bands start a vector of their own
      band = std::vector<Edge>();
    }
  }

  // Later bands: exact histogram of the counts below lo1 between free ends; those pairs only.
  if (links + 1 >= n_in || lo1 <= 1) return;
  collect_free();
  hist.assign(lo1, 0);
  for (size_t p = 0; p + 1 < fr.size(); ++p) {
    const uint32_t* r = row(fr[p]);
    for (size_t q = p + 1; q < fr.size(); ++q) {
      const uint32_t c = r[fr[q]];
      if (c < lo1) ++hist[c];
    }
  }
  for (uint64_t hi = lo1 - 1; hi >= 1 && links + 1 < n_in;) {
    uint64_t lo = hi, acc = hist[hi];
    while (lo > 1 && acc + hist[lo - 1] <= kBandPairs) acc += hist[--lo];
    collect_free();
    band.clear();
    band.reserve(size_t(acc));  // at most the histogram's count in [lo, hi]: ends only leave the free set
    for (size_t p = 0; p + 1 < fr.size(); ++p) {
      const uint32_t i = fr[p], *r = row(i);
      for (size_t q = p + 1; q < fr.size(); ++q) {
        const uint32_t c = r[fr[q]];
        if (c >= lo && c <= hi) band.push_back({c, i, fr[q]});
      }
    }
    try_band(lo, hi);
    hi = lo - 1;
  }
}

}  // namespace

Order solve_greedy(const LayerGraph& g, const LayerMask* mask, GreedyStats* stats, Links* links,
                   GreedyFirstBand* first_band) {
  return solve_greedy_subset(g, mask, nullptr, stats, links, first_band);
}

Order solve_greedy_subset(const LayerGraph& g, const LayerMask* mask, const std::vector<uint8_t>* include,
                          GreedyStats* stats, Links* links, GreedyFirstBand* first_band) {
  const uint32_t n = g.n_neurons;
  GreedyStats st;
  if (links) links->clear();
  if (include && include->size() != n) throw InternalError("greedy: subset mask length does not match the layer");
  auto in = [&](uint32_t v) { return !include || (*include)[v] != 0; };
  uint32_t n_in = 0;
  for (uint32_t v = 0; v < n; ++v) n_in += in(v);
  if (n_in == 0) return {};
  PathBuilder pb(n, links);
  if (!g.upper.empty()) {
    greedy_every_pair(g, in, n_in, pb, st, first_band);
  } else {
    std::vector<Edge> edges;
    edges.reserve(size_t(n) * g.k);
    for (uint32_t v = 0; v < n; ++v)
      for (uint32_t e = 0; e < (g.k && in(v) ? g.nbr_len[v] : 0); ++e) {
        uint32_t u = g.nbr[size_t(v) * g.k + e];
        uint64_t c = g.nbr_cnt[size_t(v) * g.k + e];
        if (u != v && c > 0 && in(u)) edges.push_back({c, std::min(u, v), std::max(u, v)});
      }
    std::sort(edges.begin(), edges.end(), edge_before);
    edges.erase(
        std::unique(edges.begin(), edges.end(), [](const Edge& a, const Edge& b) { return a.u == b.u && a.v == b.v; }),
        edges.end());
    st.candidates = edges.size();
    for (const Edge& e : edges)
      if (pb.try_link(e.u, e.v)) ++st.accepted;
  }

  // Fragment endpoints (degree < 2). Continue Algorithm 1 over their exact pair counts.
  std::vector<uint32_t> ends;
  for (uint32_t v = 0; v < n; ++v)
    if (pb.deg[v] < 2 && in(v)) ends.push_back(v);
  st.fragments = 0;
  for (uint32_t v : ends) st.fragments += pb.deg[v] == 0 ? 2 : 1;
  st.fragments /= 2;
  // Fragment joining continues Algorithm 1 over the endpoints' own co-activation counts: the endpoints' rows
  // (on at most kJoinWords evenly spread words, so the cost stays a fraction of the count at paper scale) go through
  // the same fast counting kernel with top-kJoinK lists, their pairs are tried by decreasing count; rounds repeat on
  // the endpoints still free (each round's lists are exact on the sample, so pairs that failed stay failed).
  if (mask && mask->words > 0) {
    constexpr uint64_t kJoinWords = 128;
    constexpr uint32_t kJoinK = 8;
    const uint64_t W = std::min<uint64_t>(mask->words, kJoinWords);
    for (int round = 0; round < 3; ++round) {
      std::vector<uint32_t> ends;
      for (uint32_t v = 0; v < n; ++v)
        if (pb.deg[v] < 2 && in(v)) ends.push_back(v);
      if (ends.size() < 3) break;
      LayerMask sub(uint32_t(ends.size()), W * 64);
      for (size_t e = 0; e < ends.size(); ++e) {
        const uint64_t* r = mask->row(ends[e]);
        uint64_t* d = sub.row(uint32_t(e));
        for (uint64_t w = 0; w < W; ++w) d[w] = r[w * mask->words / W];
      }
      CoactivationOptions co;
      co.top_k = kJoinK;
      LayerGraph sg = coactivation_count(sub, co);
      std::vector<Edge> ee;
      for (uint32_t a = 0; a < sg.n_neurons; ++a)
        for (uint32_t e = 0; e < sg.nbr_len[a]; ++e) {
          uint32_t u = ends[a], v = ends[sg.nbr[size_t(a) * sg.k + e]];
          if (u != v) ee.push_back({sg.nbr_cnt[size_t(a) * sg.k + e], std::min(u, v), std::max(u, v)});
        }
      std::sort(ee.begin(), ee.end(), edge_before);
      ee.erase(std::unique(ee.begin(), ee.end(), [](const Edge& x, const Edge& y) { return x.u == y.u && x.v == y.v; }),
               ee.end());
      uint64_t got = 0;
      for (const Edge& e : ee)
        if (pb.try_link(e.u, e.v)) ++got;
      st.endpoint_links += got;
      if (got == 0) break;
    }
  }
  // Whatever is left has no (known) co-activation: join in (u, v) index order, as Algorithm 1 orders its
  // zero-count pairs. For each free u, the first later free v of another fragment is taken (at most one free
  // node, u's own fragment's other end, is skipped), so this is O(F log F).
  std::set<uint32_t> avail;
  for (uint32_t v = 0; v < n; ++v)
    if (pb.deg[v] < 2 && in(v)) avail.insert(v);
  for (auto it = avail.begin(); it != avail.end();) {
    uint32_t u = *it;
    auto jt = std::next(it);
    while (jt != avail.end() && pb.deg[u] < 2) {
      uint32_t v = *jt;
      if (pb.try_link(u, v)) {
        ++st.index_links;
        jt = pb.deg[v] == 2 ? avail.erase(jt) : std::next(jt);
      } else {
        ++jt;
      }
    }
    it = avail.erase(it);  // u is linked twice or cannot link to any later node any more
  }
  // Walk the single path from its smaller-index end.
  uint32_t start = UINT32_MAX;
  for (uint32_t v = 0; v < n && start == UINT32_MAX; ++v)
    if (pb.deg[v] < 2 && in(v)) start = v;
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
  if (o.size() != n_in) throw InternalError("greedy: path does not cover every neuron");
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

uint64_t path_weight(const LayerGraph& g, const LayerMask& m, const Order& o) {
  uint64_t w = 0;
  for (size_t i = 0; i + 1 < o.size(); ++i) w += pair_count(g, m, o[i], o[i + 1]);
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
