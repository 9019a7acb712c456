// Reference implementation (scalar popcount over the full upper triangle). The graph work (issue 4) replaces
// the inside with blocked, run-time-dispatched SIMD kernels and token streaming; results must stay identical.
#include "graph/coactivation.h"

#include <algorithm>
#include <numeric>

#include "formats/trace.h"

namespace nl {

uint32_t coactivation_pair(const LayerMask& m, uint32_t i, uint32_t j) {
  uint64_t c = 0;
  const uint64_t *a = m.row(i), *b = m.row(j);
  for (uint64_t w = 0; w < m.words; ++w) c += static_cast<uint64_t>(__builtin_popcountll(a[w] & b[w]));
  return static_cast<uint32_t>(c);
}

LayerGraph coactivation_count(const LayerMask& m, const CoactivationOptions& opt) {
  LayerGraph g;
  const uint32_t n = m.n_neurons;
  g.n_neurons = n;
  g.n_tokens = m.n_tokens;
  g.freq.resize(n);
  for (uint32_t v = 0; v < n; ++v) g.freq[v] = m.count(v);
  std::vector<uint32_t> upper(n >= 2 ? uint64_t(n) * (n - 1) / 2 : 0);
#pragma omp parallel for schedule(dynamic, 16)
  for (int64_t i = 0; i < int64_t(n); ++i)
    for (uint32_t j = uint32_t(i) + 1; j < n; ++j)
      upper[LayerGraph::upper_index(n, uint32_t(i), j)] = coactivation_pair(m, uint32_t(i), j);
  g.upper = std::move(upper);
  g.k = opt.top_k;
  if (g.k > 0) {
    g.nbr.assign(size_t(n) * g.k, 0);
    g.nbr_cnt.assign(size_t(n) * g.k, 0);
    g.nbr_len.assign(n, 0);
#pragma omp parallel
    {
      std::vector<uint32_t> idx;
#pragma omp for schedule(dynamic, 16)
      for (int64_t vi = 0; vi < int64_t(n); ++vi) {
        uint32_t v = uint32_t(vi);
        idx.clear();
        for (uint32_t u = 0; u < n; ++u)
          if (u != v && g.pair(u, v) > 0) idx.push_back(u);
        auto better = [&](uint32_t a, uint32_t b) {
          uint32_t ca = g.pair(a, v), cb = g.pair(b, v);
          return ca != cb ? ca > cb : a < b;
        };
        size_t len = std::min<size_t>(idx.size(), g.k);
        std::partial_sort(idx.begin(), idx.begin() + len, idx.end(), better);
        for (size_t e = 0; e < len; ++e) {
          g.nbr[size_t(v) * g.k + e] = idx[e];
          g.nbr_cnt[size_t(v) * g.k + e] = g.pair(idx[e], v);
        }
        g.nbr_len[v] = static_cast<uint32_t>(len);
      }
    }
  }
  if (!opt.full_matrix) {
    g.upper.clear();
    g.upper.shrink_to_fit();
  }
  return g;
}

LayerGraph coactivation_count_trace(const TraceReader& trace, uint32_t layer, const CoactivationOptions& opt) {
  return coactivation_count(trace.read_layer(layer), opt);
}

}  // namespace nl
