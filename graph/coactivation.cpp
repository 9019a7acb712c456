// Co-activation counting driver: tiles of neuron pairs over OpenMP, each tile counted by a run-time-dispatched
// AND+popcount kernel (graph/popcount_kernels.cpp) and reduced either into the packed upper triangle or
// straight into per-thread top-k lists (merged exactly at the end). Traces are streamed in token chunks.
#include "graph/coactivation.h"

#include <omp.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <numeric>

#include "formats/core/enum_names.h"
#include "formats/core/error.h"
#include "formats/core/huge_pages.h"
#include "formats/trace.h"
#include "graph/popcount_kernels.h"

namespace nl {
namespace {

using detail::kParallelMin;

constexpr uint32_t kTile = 128;      // neurons per tile side: 2 x 128 rows x kSegWords words stay in L2
constexpr uint64_t kSegWords = 512;  // words (32768 tokens) per kernel call within a tile

// Per-neuron bounded heaps keeping the k best (count desc, index asc) neighbours. One per thread; merged exactly.
struct TopKHeaps {
  uint32_t n = 0, k = 0;
  std::vector<uint32_t> cnt, idx, len;
  // floor[v]: the least count that can still enter v's heap (1 until it is full, then its root's count), kept
  // contiguous so a tile's columns are screened with sequential loads instead of one cache line per neuron.
  std::vector<uint32_t> floor;
  bool wide = false;  // screen tiles with AVX-512 (chosen with the popcount kernel, so tests cover both screens)

  TopKHeaps(uint32_t n_, uint32_t k_)
      : n(n_), k(k_), cnt(size_t(n_) * k_), idx(size_t(n_) * k_), len(n_, 0), floor(n_, k_ ? 1u : UINT32_MAX) {}

  // a is worse than b (the root holds the worst kept entry).
  static bool worse(uint32_t ca, uint32_t ia, uint32_t cb, uint32_t ib) { return ca < cb || (ca == cb && ia > ib); }

  void insert(uint32_t v, uint32_t u, uint32_t c) {
    if (c == 0) return;
    uint32_t* hc = cnt.data() + size_t(v) * k;
    uint32_t* hi = idx.data() + size_t(v) * k;
    uint32_t& l = len[v];
    if (l < k) {  // sift up
      uint32_t p = l++;
      while (p > 0) {
        uint32_t q = (p - 1) / 2;
        if (!worse(c, u, hc[q], hi[q])) break;
        hc[p] = hc[q];
        hi[p] = hi[q];
        p = q;
      }
      hc[p] = c;
      hi[p] = u;
      if (l == k) floor[v] = hc[0];
      return;
    }
    if (!worse(hc[0], hi[0], c, u)) return;  // not better than the worst kept
    uint32_t p = 0;
    for (;;) {  // sift down from the root
      uint32_t a = 2 * p + 1, b = a + 1, m = p;
      uint32_t mc = c, mi = u;
      if (a < k && worse(hc[a], hi[a], mc, mi)) m = a, mc = hc[a], mi = hi[a];
      if (b < k && worse(hc[b], hi[b], mc, mi)) m = b;
      if (m == p) break;
      hc[p] = hc[m];
      hi[p] = hi[m];
      p = m;
    }
    hc[p] = c;
    hi[p] = u;
    floor[v] = hc[0];
  }
  // Threshold below which a candidate for v cannot enter (fast reject for a whole row of counts).
  uint32_t floor_count(uint32_t v) const { return floor[v]; }
};

// Writes the exact top-k of the union of the per-thread heaps into g.
void merge_topk(LayerGraph& g, std::vector<TopKHeaps>& heaps) {
  const uint32_t n = g.n_neurons, k = g.k;
  g.nbr.assign(size_t(n) * k, 0);
  g.nbr_cnt.assign(size_t(n) * k, 0);
  g.nbr_len.assign(n, 0);
#pragma omp parallel if (n >= kParallelMin)
  {
    std::vector<std::pair<uint32_t, uint32_t>> cand;  // (count, index)
#pragma omp for schedule(dynamic, 256)
    for (int64_t vi = 0; vi < int64_t(n); ++vi) {
      const uint32_t v = uint32_t(vi);
      cand.clear();
      for (const auto& h : heaps)
        for (uint32_t e = 0; e < h.len[v]; ++e) cand.emplace_back(h.cnt[size_t(v) * k + e], h.idx[size_t(v) * k + e]);
      std::sort(cand.begin(), cand.end(), [](const auto& a, const auto& b) {
        return a.first != b.first ? a.first > b.first : a.second < b.second;
      });
      const size_t len = std::min<size_t>(cand.size(), k);
      for (size_t e = 0; e < len; ++e) {
        g.nbr_cnt[size_t(v) * k + e] = cand[e].first;
        g.nbr[size_t(v) * k + e] = cand[e].second;
      }
      g.nbr_len[v] = static_cast<uint32_t>(len);
    }
  }
}

// One candidate count of row i, column c (j = j0 + c > i): offered to both heaps it can enter.
inline void offer_pair(TopKHeaps& h, uint32_t i, uint32_t j, uint32_t v, uint32_t& fi) {
  if (v >= fi) h.insert(i, j, v), fi = h.floor[i];
  if (v >= h.floor[j]) h.insert(j, i, v);
}

// Offers the counts of a tile (rows i0.., columns j0.., only j > i) to the thread's heaps in both directions.
// Almost every count is below both floors once the heaps are full; the screen is the whole cost.
void offer_tile_scalar(TopKHeaps& h, uint32_t i0, uint32_t ni, uint32_t j0, uint32_t nj, const uint32_t* cnt,
                       uint64_t ld) {
  for (uint32_t r = 0; r < ni; ++r) {
    const uint32_t i = i0 + r;
    const uint32_t cstart = j0 > i ? 0 : i - j0 + 1;
    const uint32_t* row = cnt + r * ld;
    const uint32_t* fj = h.floor.data() + j0;
    uint32_t fi = h.floor[i];
    for (uint32_t c = cstart; c < nj; ++c) {
      const uint32_t v = row[c];
      if (v < fi && v < fj[c]) continue;  // floors are >= 1, so zero counts stop here too
      offer_pair(h, i, j0 + c, v, fi);
    }
  }
}

#if defined(__x86_64__)
// Same result as the scalar screen (same pairs offered in the same order): 16 counts are compared with both
// floors at once and only the candidates are visited; floors only rise, so the mask is a superset and each
// candidate is checked again against the current floors.
__attribute__((target("avx512f"))) void offer_tile_avx512(TopKHeaps& h, uint32_t i0, uint32_t ni, uint32_t j0,
                                                          uint32_t nj, const uint32_t* cnt, uint64_t ld) {
  for (uint32_t r = 0; r < ni; ++r) {
    const uint32_t i = i0 + r;
    const uint32_t cstart = j0 > i ? 0 : i - j0 + 1;
    const uint32_t* row = cnt + r * ld;
    const uint32_t* fj = h.floor.data() + j0;
    uint32_t fi = h.floor[i];
    uint32_t c = cstart;
    for (; c + 16 <= nj; c += 16) {
      const __m512i v = _mm512_loadu_si512(row + c);
      __mmask16 k = _mm512_cmpge_epu32_mask(v, _mm512_set1_epi32(int(fi))) |
                    _mm512_cmpge_epu32_mask(v, _mm512_loadu_si512(fj + c));
      while (k) {
        const uint32_t cc = c + uint32_t(__builtin_ctz(k));
        k &= static_cast<__mmask16>(k - 1);
        offer_pair(h, i, j0 + cc, row[cc], fi);
      }
    }
    for (; c < nj; ++c) {
      const uint32_t v = row[c];
      if (v < fi && v < fj[c]) continue;
      offer_pair(h, i, j0 + c, v, fi);
    }
  }
}
#endif

void offer_tile(TopKHeaps& h, uint32_t i0, uint32_t ni, uint32_t j0, uint32_t nj, const uint32_t* cnt, uint64_t ld) {
#if defined(__x86_64__)
  if (h.wide) return offer_tile_avx512(h, i0, ni, j0, nj, cnt, ld);
#endif
  offer_tile_scalar(h, i0, ni, j0, nj, cnt, ld);
}

std::vector<std::pair<uint32_t, uint32_t>> tile_list(uint32_t n) {
  std::vector<std::pair<uint32_t, uint32_t>> tiles;
  const uint32_t nb = (n + kTile - 1) / kTile;
  for (uint32_t I = 0; I < nb; ++I)
    for (uint32_t J = I; J < nb; ++J) tiles.emplace_back(I, J);
  return tiles;
}

// Counts one chunk of tokens (rows of `stride` words, the first `nw` used) for all pairs, block by block.
void dense_chunk(const uint64_t* bits, uint32_t n, uint64_t stride, uint64_t nw, detail::DenseTileFn fn,
                 const detail::TileSink& sink) {
  if (n < 2 || nw == 0) return;
  const auto tiles = tile_list(n);
#pragma omp parallel if (n >= kParallelMin)
  {
    std::vector<uint32_t> cnt(size_t(kTile) * kTile);
    const int tid = omp_get_thread_num();
#pragma omp for schedule(dynamic, 1)
    for (int64_t t = 0; t < int64_t(tiles.size()); ++t) {
      const uint32_t i0 = tiles[t].first * kTile, j0 = tiles[t].second * kTile;
      const uint32_t ni = std::min(kTile, n - i0), nj = std::min(kTile, n - j0);
      std::fill(cnt.begin(), cnt.end(), 0u);
      for (uint64_t w0 = 0; w0 < nw; w0 += kSegWords)
        fn(bits + size_t(i0) * stride + w0, ni, bits + size_t(j0) * stride + w0, nj, stride,
           std::min(kSegWords, nw - w0), cnt.data(), kTile, i0 == j0);
      sink(tid, i0, ni, j0, nj, cnt.data(), kTile);
    }
  }
}

// A sink that adds blocks into the packed upper triangle (or stores them: `store`, for a single chunk, whose blocks
// cover every pair exactly once, so the triangle needs no zeroing first) and/or offers them to per-thread heaps.
detail::TileSink make_sink(uint32_t n, uint32_t* upper, std::vector<TopKHeaps>* heaps, bool store) {
  return [=](int tid, uint32_t i0, uint32_t ni, uint32_t j0, uint32_t nj, const uint32_t* cnt, uint64_t ld) {
    if (upper)
      for (uint32_t r = 0; r < ni; ++r) {
        const uint32_t i = i0 + r;
        const uint32_t cstart = j0 > i ? 0 : i - j0 + 1;
        if (cstart >= nj) continue;
        uint32_t* dst = upper + LayerGraph::upper_index(n, i, j0 + cstart);
        const uint32_t* src = cnt + size_t(r) * ld + cstart;
        if (store)
          std::copy(src, src + (nj - cstart), dst);
        else
          for (uint32_t c = 0; c < nj - cstart; ++c) dst[c] += src[c];
      }
    if (heaps) offer_tile((*heaps)[size_t(tid)], i0, ni, j0, nj, cnt, ld);
  };
}

// Counts one chunk with the resolved method.
void count_chunk(const uint64_t* bits, uint32_t n, uint64_t stride, uint64_t nw, CountMethod method,
                 detail::DenseTileFn fn, uint32_t* upper, std::vector<TopKHeaps>* heaps, bool store = false) {
  if (!upper && !heaps) return;
  const auto sink = make_sink(n, upper, heaps, store);
  if (method == CountMethod::Sparse)
    detail::sparse_vertical_chunk(bits, n, stride, nw, sink);
  else
    dense_chunk(bits, n, stride, nw, fn, sink);
}

// Offers every pair of a complete upper triangle to per-thread heaps (row blocks in parallel).
void offer_upper(const std::vector<uint32_t>& upper, uint32_t n, std::vector<TopKHeaps>& heaps) {
#pragma omp parallel if (n >= kParallelMin)
  {
    const int tid = omp_get_thread_num();
#pragma omp for schedule(dynamic, 64)
    for (int64_t ii = 0; ii < int64_t(n) - 1; ++ii) {
      const uint32_t i = uint32_t(ii);
      const uint32_t* row = upper.data() + LayerGraph::upper_index(n, i, i + 1);
      offer_tile(heaps[size_t(tid)], i, 1, i + 1, n - i - 1, row, 0);
    }
  }
}

// `kernel` (resolved) picks the tile screen: AVX-512 with the AVX-512 kernel, scalar otherwise.
std::vector<TopKHeaps> make_heaps(uint32_t n, uint32_t k, PopcountKernel kernel) {
  TopKHeaps h(n, k);
  (void)kernel;
#if defined(__x86_64__)
  h.wide = kernel == PopcountKernel::Avx512;
#endif
  return std::vector<TopKHeaps>(size_t(omp_get_max_threads()), h);
}

void check_tokens(uint64_t n_tokens) {
  if (n_tokens > UINT32_MAX)
    throw UsageError("co-activation counts are uint32: split traces of more than 2^32-1 tokens into shards");
}

double active_fraction(const std::vector<uint64_t>& freq, uint32_t n, uint64_t tokens) {
  uint64_t s = 0;
  for (uint64_t f : freq) s += f;
  return n && tokens ? double(s) / (double(n) * double(tokens)) : 0.0;
}

// Hardware popcnt where the CPU has it (the portable build would call libgcc's bit-twiddling popcount).
__attribute__((target("popcnt"))) void row_freq_popcnt(const uint64_t* bits, uint32_t n, uint64_t stride, uint64_t nw,
                                                       std::vector<uint64_t>& freq) {
#pragma omp parallel for schedule(static) if (n >= kParallelMin)
  for (int64_t v = 0; v < int64_t(n); ++v) {
    const uint64_t* r = bits + size_t(v) * stride;
    uint64_t c = 0;
    for (uint64_t w = 0; w < nw; ++w) c += static_cast<uint64_t>(__builtin_popcountll(r[w]));
    freq[size_t(v)] += c;
  }
}

void row_freq(const uint64_t* bits, uint32_t n, uint64_t stride, uint64_t nw, std::vector<uint64_t>& freq) {
  if (__builtin_cpu_supports("popcnt")) return row_freq_popcnt(bits, n, stride, nw, freq);
#pragma omp parallel for schedule(static) if (n >= kParallelMin)
  for (int64_t v = 0; v < int64_t(n); ++v) {
    const uint64_t* r = bits + size_t(v) * stride;
    uint64_t c = 0;
    for (uint64_t w = 0; w < nw; ++w) c += static_cast<uint64_t>(__builtin_popcountll(r[w]));
    freq[size_t(v)] += c;
  }
}

}  // namespace

namespace {
constexpr EnumName<PopcountKernel> kPopcountKernelNames[] = {{PopcountKernel::Auto, "auto"},
                                                             {PopcountKernel::Scalar, "scalar"},
                                                             {PopcountKernel::Avx2, "avx2"},
                                                             {PopcountKernel::Avx512, "avx512"}};
constexpr EnumName<CountMethod> kCountMethodNames[] = {
    {CountMethod::Auto, "auto"}, {CountMethod::Dense, "dense"}, {CountMethod::Sparse, "sparse"}};
}  // namespace

bool popcount_kernel_supported(PopcountKernel k) {
  switch (k) {
    case PopcountKernel::Auto:
    case PopcountKernel::Scalar:
      return true;
    case PopcountKernel::Avx2:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("popcnt");
    case PopcountKernel::Avx512:
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vpopcntdq");
  }
  return false;
}

PopcountKernel popcount_kernel_resolve(PopcountKernel k) {
  if (k == PopcountKernel::Auto) {
    if (popcount_kernel_supported(PopcountKernel::Avx512)) return PopcountKernel::Avx512;
    if (popcount_kernel_supported(PopcountKernel::Avx2)) return PopcountKernel::Avx2;
    return PopcountKernel::Scalar;
  }
  if (!popcount_kernel_supported(k))
    throw UsageError(std::string("popcount kernel '") + popcount_kernel_name(k) + "' is not supported by this CPU");
  return k;
}

const char* popcount_kernel_name(PopcountKernel k) { return enum_name(kPopcountKernelNames, k); }

bool count_method_supported(CountMethod m) { return m != CountMethod::Sparse || detail::sparse_vertical_supported(); }

CountMethod count_method_resolve(CountMethod m, double density) {
  if (m == CountMethod::Auto)
    return detail::sparse_vertical_supported() && density < kSparseMaxDensity ? CountMethod::Sparse
                                                                              : CountMethod::Dense;
  if (!count_method_supported(m))
    throw UsageError(std::string("count method '") + count_method_name(m) + "' is not supported by this CPU");
  return m;
}

const char* count_method_name(CountMethod m) { return enum_name(kCountMethodNames, m); }

CountMethod count_method_parse(const std::string& s) {
  CountMethod m{};
  if (!enum_parse(kCountMethodNames, s, &m)) throw UsageError("unknown count method '" + s + "' (auto, dense, sparse)");
  return m;
}

PopcountKernel popcount_kernel_parse(const std::string& s) {
  PopcountKernel k{};
  if (!enum_parse(kPopcountKernelNames, s, &k))
    throw UsageError("unknown popcount kernel '" + s + "' (auto, scalar, avx2, avx512)");
  return k;
}

NL_POPCNT_CLONES uint32_t coactivation_pair(const LayerMask& m, uint32_t i, uint32_t j) {
  uint64_t c = 0;
  const uint64_t *a = m.row(i), *b = m.row(j);
  for (uint64_t w = 0; w < m.words; ++w) c += static_cast<uint64_t>(__builtin_popcountll(a[w] & b[w]));
  return static_cast<uint32_t>(c);
}

LayerGraph coactivation_topk_lists(const LayerGraph& g, uint32_t k) {
  if (!g.has_full()) throw InternalError("coactivation_topk_lists: the full matrix is not present");
  LayerGraph out;
  out.n_neurons = g.n_neurons;
  out.k = k;
  if (k == 0) return out;
  auto heaps = make_heaps(g.n_neurons, k, popcount_kernel_resolve(PopcountKernel::Auto));
  offer_upper(g.upper, g.n_neurons, heaps);
  merge_topk(out, heaps);
  return out;
}

void coactivation_build_topk(LayerGraph& g, uint32_t k) {
  LayerGraph t = coactivation_topk_lists(g, k);
  g.k = k;
  g.nbr = std::move(t.nbr);
  g.nbr_cnt = std::move(t.nbr_cnt);
  g.nbr_len = std::move(t.nbr_len);
}

LayerGraph coactivation_count(const LayerMask& m, const CoactivationOptions& opt, std::vector<uint32_t>* reuse) {
  check_tokens(m.n_tokens);
  const auto fn = detail::dense_tile_kernel(popcount_kernel_resolve(opt.kernel));
  const uint32_t n = m.n_neurons;
  LayerGraph g;
  g.n_neurons = n;
  g.n_tokens = m.n_tokens;
  g.k = opt.top_k;
  g.freq.assign(n, 0);
  row_freq(m.bits.data(), n, m.words, m.words, g.freq);
  const CountMethod method = count_method_resolve(opt.method, active_fraction(g.freq, n, m.n_tokens));
  // One chunk writes every pair once: a triangle of the right size from `reuse` is overwritten as it stands (no
  // zeroing, no fresh pages to fault in); a fresh one is zeroed and added to.
  bool store = false;
  if (opt.full_matrix && n >= 2) {
    const size_t pairs = size_t(uint64_t(n) * (n - 1) / 2);
    if (reuse && reuse->size() == pairs && m.words > 0) {
      g.upper.swap(*reuse);
      store = true;
    } else {
      assign_huge(g.upper, pairs, 0u);
    }
  }
  std::vector<TopKHeaps> heaps;
  if (g.k > 0) heaps = make_heaps(n, g.k, popcount_kernel_resolve(opt.kernel));
  count_chunk(m.bits.data(), n, m.words, m.words, method, fn, g.upper.empty() ? nullptr : g.upper.data(),
              g.k > 0 ? &heaps : nullptr, store);
  if (g.k > 0) merge_topk(g, heaps);
  return g;
}

LayerGraph coactivation_count_trace(const TraceReader& trace, uint32_t layer, const CoactivationOptions& opt) {
  const TraceInfo& ti = trace.info();
  if (layer >= ti.n_layers) throw UsageError("layer " + std::to_string(layer) + " out of range");
  const uint64_t t_end = std::min(opt.token_end, ti.n_tokens), t_begin = opt.token_begin;
  if (t_begin > t_end)
    throw UsageError("token range " + std::to_string(t_begin) + ":" + std::to_string(opt.token_end) +
                     " is outside the trace's " + std::to_string(ti.n_tokens) + " tokens");
  check_tokens(t_end - t_begin);
  const auto fn = detail::dense_tile_kernel(popcount_kernel_resolve(opt.kernel));
  const uint32_t n = ti.n_neurons[layer];
  // Words covering the slice; bits outside [t_begin, t_end) in its first and last word are cleared after reading.
  const uint64_t word_lo = t_begin / 64, word_hi = words_for_tokens(t_end);
  const uint64_t words = t_end > t_begin ? word_hi - word_lo : 0;
  // Chunk width in words: a multiple of 8 (one 512-bit vector) within the byte budget, at least 8.
  uint64_t cw = n == 0 ? words : std::max<uint64_t>(8, opt.chunk_bytes / (uint64_t(n) * 8) / 8 * 8);
  cw = std::min(cw, std::max<uint64_t>(words, 1));
  const bool one_chunk = cw >= words;
  LayerGraph g;
  g.n_neurons = n;
  g.n_tokens = t_end - t_begin;
  g.k = opt.top_k;
  g.freq.assign(n, 0);
  const bool need_upper = opt.full_matrix || (g.k > 0 && !one_chunk);
  if (need_upper && n >= 2) assign_huge(g.upper, size_t(uint64_t(n) * (n - 1) / 2), 0u);
  std::vector<TopKHeaps> heaps;
  const bool direct_topk = g.k > 0 && one_chunk;
  if (direct_topk) heaps = make_heaps(n, g.k, popcount_kernel_resolve(opt.kernel));
  for (uint64_t w0 = 0; w0 < words; w0 += cw) {
    const uint64_t nw = std::min(cw, words - w0);
    std::vector<uint64_t> chunk = trace.read_layer_words(layer, word_lo + w0, nw);
    const uint64_t first_tok = (word_lo + w0) * 64, last_tok = std::min((word_lo + w0 + nw) * 64, t_end);
    if (first_tok < t_begin || last_tok % 64 != 0) {
      const uint64_t lo_mask = first_tok < t_begin ? ~uint64_t(0) << (t_begin - first_tok) : ~uint64_t(0);
      const uint64_t hi_mask = last_tok % 64 ? ~uint64_t(0) >> (64 - last_tok % 64) : ~uint64_t(0);
      for (uint32_t v = 0; v < n; ++v) {
        chunk[size_t(v) * nw] &= lo_mask;
        chunk[size_t(v) * nw + nw - 1] &= hi_mask;
      }
    }
    std::vector<uint64_t> cf(n, 0);
    row_freq(chunk.data(), n, nw, nw, cf);
    for (uint32_t v = 0; v < n; ++v) g.freq[v] += cf[v];
    // The method is chosen per chunk from that chunk's density (both are exact).
    const CountMethod method =
        count_method_resolve(opt.method, active_fraction(cf, n, last_tok - std::max(first_tok, t_begin)));
    count_chunk(chunk.data(), n, nw, nw, method, fn, g.upper.empty() ? nullptr : g.upper.data(),
                direct_topk ? &heaps : nullptr);
  }
  if (direct_topk) merge_topk(g, heaps);
  if (g.k > 0 && !one_chunk) {
    heaps = make_heaps(n, g.k, popcount_kernel_resolve(opt.kernel));
    offer_upper(g.upper, n, heaps);
    merge_topk(g, heaps);
  }
  if (!opt.full_matrix) {
    g.upper.clear();
    g.upper.shrink_to_fit();
  }
  return g;
}

}  // namespace nl
