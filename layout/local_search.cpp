#include "layout/local_search.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <numeric>
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#endif

#include "formats/core/error.h"

namespace nl {

namespace detail {
bool ls_portable_kernel = false;
}

namespace {

constexpr uint32_t kNone = UINT32_MAX;
constexpr uint32_t kMaxWindow = 15;  // g + 1 is capped: tiny bundles would otherwise make windows huge

struct Move {
  enum Kind : uint8_t { Reverse, Shift } kind;
  int64_t i, j;   // Reverse: positions [i, j]; Shift: segment [i, j]
  int64_t p = 0;  // Shift: insert after position p (-1 = front); p < i - 1 or p > j
  bool rev = false;
};

// cnt[d] += tokens at which the neuron in slot q is active and the nearest active slot before it is q - d (d <= g1),
// over the slots q0 <= q < L of rp[0..L) (q0 >= 1).
NL_POPCNT_CLONES void window_counts_scalar(const uint64_t* const* rp, size_t q0, size_t L, uint32_t g1, uint32_t W,
                                           uint64_t* cnt) {
  for (size_t q = q0; q < L; ++q) {
    uint32_t dmax = uint32_t(std::min<size_t>(g1, q));
    const uint64_t* rq = rp[q];
    for (uint32_t w = 0; w < W; ++w) {
      uint64_t x = rq[w];
      if (!x) continue;
      uint64_t msk = 0;
      for (uint32_t d = 1; d <= dmax; ++d) {
        uint64_t y = rp[q - d][w];
        cnt[d] += uint64_t(__builtin_popcountll(x & y & ~msk));
        msk |= y;
        if (!(x & ~msk)) break;
      }
    }
  }
}

#if defined(__x86_64__) && defined(__GNUC__)
// The same counts, 8 token words per step (AVX-512F + VPOPCNTDQ); words past W are masked off.
__attribute__((target("avx512f,avx512vpopcntdq"))) void window_counts_avx512(const uint64_t* const* rp, size_t q0,
                                                                             size_t L, uint32_t g1, uint32_t W,
                                                                             uint64_t* cnt) {
  __m512i acc[kMaxWindow + 1];
  for (uint32_t d = 0; d <= g1; ++d) acc[d] = _mm512_setzero_si512();
  for (size_t q = q0; q < L; ++q) {
    const uint32_t dmax = uint32_t(std::min<size_t>(g1, q));
    const uint64_t* rq = rp[q];
    for (uint32_t w = 0; w < W; w += 8) {
      const __mmask8 lanes = W - w >= 8 ? __mmask8(0xFF) : __mmask8((1u << (W - w)) - 1);
      const __m512i x = _mm512_maskz_loadu_epi64(lanes, rq + w);
      if (!_mm512_test_epi64_mask(x, x)) continue;
      __m512i msk = _mm512_setzero_si512();
      for (uint32_t d = 1; d <= dmax; ++d) {
        const __m512i y = _mm512_maskz_loadu_epi64(lanes, rp[q - d] + w);
        // Ternary logic for x & y & ~msk and x & ~msk (GCC 12's andnot warns about an uninitialised operand).
        acc[d] = _mm512_add_epi64(acc[d], _mm512_popcnt_epi64(_mm512_ternarylogic_epi64(x, y, msk, 0x40)));
        msk = _mm512_or_si512(msk, y);
        if (!_mm512_test_epi64_mask(x, _mm512_ternarylogic_epi64(x, msk, x, 0x30))) break;
      }
    }
  }
  alignas(64) uint64_t lane[8];
  for (uint32_t d = 1; d <= g1; ++d) {
    _mm512_store_si512(lane, acc[d]);
    for (uint64_t v : lane) cnt[d] += v;
  }
}
#endif

void window_counts(const uint64_t* const* rp, size_t q0, size_t L, uint32_t g1, uint32_t W, uint64_t* cnt) {
#if defined(__x86_64__) && defined(__GNUC__)
  static const bool wide = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vpopcntdq");
  if (wide && !detail::ls_portable_kernel) return window_counts_avx512(rp, q0, L, g1, W, cnt);
#endif
  window_counts_scalar(rp, q0, L, g1, W, cnt);
}

struct Search {
  const LayerMask& m;
  const LayerGraph& g;
  LsOptions opt;
  uint32_t n = 0, n_act = 0, g1 = 1, W = 0;
  double sd[kMaxWindow + 1] = {};
  std::vector<uint64_t> R;  // sampled rows, (n + 1) * W; row n is the all-zero sentinel
  std::vector<uint32_t> ord, pos;
  std::vector<uint8_t> hot;
  uint64_t w_cur = 0, w_floor = 0;
  double saving = 0;
  LsStats st;
  uint32_t k_cur = 0;  // candidates per neuron now (opt.neighbours, widened at local optima up to max_neighbours)
  // Lists longer than the graph's top-k, from its full matrix once the search widens past them (the same lists a
  // longer top-k would have held); wide.k = 0: the graph's own lists.
  LayerGraph wide;
  std::vector<uint32_t> zbuf[2];

  Search(const LayerMask& mask, const LayerGraph& graph, const LsOptions& o) : m(mask), g(graph), opt(o) {
    n = m.n_neurons;
    g1 = std::min<uint32_t>({opt.cost.merge_gap + 1, kMaxWindow, std::max<uint32_t>(1, opt.max_window)});
    for (uint32_t d = 1; d <= g1; ++d) sd[d] = opt.cost.merge_saving_us(d);
    uint64_t want = std::max<uint64_t>(1, (uint64_t(opt.sample_tokens) + 63) / 64);
    W = uint32_t(std::min<uint64_t>(m.words, want));
    R.assign(size_t(n + 1) * W, 0);
    for (uint32_t v = 0; v < n; ++v)
      for (uint32_t k = 0; k < W; ++k) R[size_t(v) * W + k] = m.row(v)[uint64_t(k) * m.words / W];
  }
  const uint64_t* row(uint32_t v) const { return R.data() + size_t(v == kNone ? n : v) * W; }

  // Saving (us) of every window term (p < q <= p + g + 1) inside the sequence.
  double zone(const std::vector<uint32_t>& seq) const { return zone_after(seq, 0, 0); }
  // The current order's window counts by the slot that ends them: C[q * (g1 + 1) + d] = cnt[d] of slot q's terms
  // (q < n_act). A zone of consecutive slots of the current order is then a sum of these (cur_zone), the same
  // integer counts as zone() of that sequence, so the same saving to the bit; apply() keeps them current.
  std::vector<uint64_t> C;
  void count_slot(int64_t q) {
    uint64_t* c = C.data() + size_t(q) * (g1 + 1);
    std::fill(c, c + g1 + 1, 0);
    if (q == 0) return;
    const int64_t a = std::max<int64_t>(0, q - g1);
    const uint64_t* rp[kMaxWindow + 1];
    for (int64_t k = a; k <= q; ++k) rp[k - a] = row(ord[size_t(k)]);
    window_counts(rp, size_t(q - a), size_t(q - a + 1), g1, W, c);
  }
  void count_slots(int64_t lo, int64_t hi) {
    lo = std::max<int64_t>(lo, 0);
    hi = std::min<int64_t>(hi, int64_t(n_act) - 1);
    for (int64_t q = lo; q <= hi; ++q) count_slot(q);
  }
  // Adds the counts of zone() of ord[a..b] (clamped to the searched slots, as app() clamps) to cnt.
  void cur_counts(int64_t a, int64_t b, uint64_t* cnt) const {
    a = std::max<int64_t>(a, 0);
    b = std::min<int64_t>(b, int64_t(n_act) - 1);
    for (int64_t q = a + 1; q <= b; ++q) {
      const uint64_t* c = C.data() + size_t(q) * (g1 + 1);
      const uint32_t dmax = uint32_t(std::min<int64_t>(g1, q - a));
      for (uint32_t d = 1; d <= dmax; ++d) cnt[d] += c[d];
    }
  }
  double saving_of(const uint64_t* cnt) const {
    double s = 0;
    for (uint32_t d = 1; d <= g1; ++d) s += sd[d] * double(cnt[d]);
    return s;
  }
  double cur_zone(int64_t a, int64_t b) const {
    uint64_t cnt[kMaxWindow + 1] = {};
    cur_counts(a, b, cnt);
    return saving_of(cnt);
  }
  // zone() of a sequence whose first `pre` slots are ord[a..a + pre - 1] (a contiguous run of the current order): the
  // terms ending inside that run from C, the others counted.
  double zone_after(const std::vector<uint32_t>& seq, size_t pre, int64_t a) const {
    const size_t len = seq.size();
    if (len < 2) return 0;
    if (len > 64) throw InternalError("local search: zone longer than 64 slots");
    uint64_t cnt[kMaxWindow + 1] = {};
    if (pre > 1) cur_counts(a, a + int64_t(pre) - 1, cnt);
    const uint64_t* rp[64];
    for (size_t q = 0; q < len; ++q) rp[q] = row(seq[q]);
    window_counts(rp, std::max<size_t>(1, pre), len, g1, W, cnt);
    return saving_of(cnt);
  }
  double total() const {
    double s = 0;
    std::vector<uint32_t> seq;
    for (uint32_t b = 0; b < n_act; b += 40) {  // overlapping chunks: each term counted once by its q
      int64_t lo = std::max<int64_t>(0, int64_t(b) - g1);
      seq.assign(ord.begin() + lo, ord.begin() + std::min<uint32_t>(n_act, b + 40));
      double full = zone(seq);
      seq.resize(size_t(int64_t(b) - lo));
      s += full - zone(seq);
    }
    return s;
  }

  void app(std::vector<uint32_t>& v, int64_t a, int64_t b) const {
    a = std::max<int64_t>(a, 0);
    b = std::min<int64_t>(b, int64_t(n_act) - 1);
    for (int64_t k = a; k <= b; ++k) v.push_back(ord[size_t(k)]);
  }
  void app_rev(std::vector<uint32_t>& v, int64_t a, int64_t b) const {
    a = std::max<int64_t>(a, 0);
    b = std::min<int64_t>(b, int64_t(n_act) - 1);
    for (int64_t k = b; k >= a; --k) v.push_back(ord[size_t(k)]);
  }
  void app_seg(std::vector<uint32_t>& v, const Move& mv) const {
    if (mv.rev)
      app_rev(v, mv.i, mv.j);
    else
      app(v, mv.i, mv.j);
  }

  // The change of the saving: the zones the move rewrites, new (n1, n2) less old (o1, o2, read from C). Where a new
  // zone starts with a run of the current order (pre1 / pre2 slots from a1 / a2), that run's own terms come from C.
  double delta(const Move& mv) {
    for (auto& z : zbuf) z.clear();
    auto &n1 = zbuf[0], &n2 = zbuf[1];
    const int64_t G = g1, i = mv.i, j = mv.j;
    double o1 = 0, o2 = 0;
    size_t pre1 = 0, pre2 = 0;
    int64_t a1 = 0, a2 = 0;
    // Starts a new zone with ord[a..b] and records that run (its length and first slot, clamped as app() clamps).
    auto lead = [&](std::vector<uint32_t>& z, int64_t a, int64_t b, size_t& pre, int64_t& at) {
      app(z, a, b);
      pre = z.size(), at = std::max<int64_t>(0, a);
    };
    if (mv.kind == Move::Reverse) {
      if (j - i + 1 >= 2 * G) {
        o1 = cur_zone(i - G, i + G - 1);
        o2 = cur_zone(j - G + 1, j + G);
        lead(n1, i - G, i - 1, pre1, a1);
        app_rev(n1, j - G + 1, j);
        app_rev(n2, i, i + G - 1);
        app(n2, j + 1, j + G);
      } else {
        o1 = cur_zone(i - G, j + G);
        lead(n1, i - G, i - 1, pre1, a1);
        app_rev(n1, i, j);
        app(n1, j + 1, j + G);
      }
    } else {
      const int64_t p = mv.p;
      bool far = p < i ? (i - p > 2 * G) : (p - j >= 2 * G);
      if (far) {
        o1 = cur_zone(i - G, j + G);
        o2 = cur_zone(p - G + 1, p + G);
        lead(n1, i - G, i - 1, pre1, a1);
        app(n1, j + 1, j + G);
        lead(n2, p - G + 1, p, pre2, a2);
        app_seg(n2, mv);
        app(n2, p + 1, p + G);
      } else if (p < i) {
        o1 = cur_zone(p - G + 1, j + G);
        lead(n1, p - G + 1, p, pre1, a1);
        app_seg(n1, mv);
        app(n1, p + 1, i - 1);
        app(n1, j + 1, j + G);
      } else {
        o1 = cur_zone(i - G, p + G);
        lead(n1, i - G, i - 1, pre1, a1);
        app(n1, j + 1, p);
        app_seg(n1, mv);
        app(n1, p + 1, p + G);
      }
    }
    ++st.evaluations;
    return zone_after(n1, pre1, a1) + zone_after(n2, pre2, a2) - o1 - o2;
  }

  uint32_t at(int64_t k) const { return k >= 0 && k < int64_t(n) ? ord[size_t(k)] : kNone; }
  // From the layer's full count matrix when the graph holds one (an O(1) look-up), else from the mask.
  int64_t pw(uint32_t a, uint32_t b) const { return (a == kNone || b == kNone) ? 0 : int64_t(pair_count(g, m, a, b)); }
  // Change of the exact (full-trace) path weight.
  int64_t weight_delta(const Move& mv) const {
    const int64_t i = mv.i, j = mv.j;
    if (mv.kind == Move::Reverse)
      return pw(at(i - 1), at(j)) + pw(at(i), at(j + 1)) - pw(at(i - 1), at(i)) - pw(at(j), at(j + 1));
    uint32_t first = mv.rev ? at(j) : at(i), last = mv.rev ? at(i) : at(j);
    const int64_t p = mv.p;
    return pw(at(p), first) + pw(last, at(p + 1)) + pw(at(i - 1), at(j + 1)) - pw(at(p), at(p + 1)) -
           pw(at(i - 1), at(i)) - pw(at(j), at(j + 1));
  }

  void apply(const Move& mv) {
    int64_t lo, hi;
    const size_t cw = g1 + 1;
    auto rotate_counts = [&](int64_t first, int64_t middle, int64_t last) {  // as ord, slots [first, last)
      std::rotate(C.begin() + first * cw, C.begin() + middle * cw, C.begin() + last * cw);
    };
    if (mv.kind == Move::Reverse) {
      lo = mv.i;
      hi = mv.j;
      std::reverse(ord.begin() + lo, ord.begin() + hi + 1);
      count_slots(lo, hi + g1);  // every slot inside now has other slots before it
    } else {
      const int64_t L = mv.j - mv.i + 1;
      if (mv.rev) std::reverse(ord.begin() + mv.i, ord.begin() + mv.j + 1);
      if (mv.p < mv.i) {
        lo = mv.p + 1;
        hi = mv.j;
        std::rotate(ord.begin() + lo, ord.begin() + mv.i, ord.begin() + mv.j + 1);
        rotate_counts(lo, mv.i, mv.j + 1);
        // Slots keep their counts unless what comes before them within g1 changed: the segment and g1 after it,
        // and g1 after where it was.
        count_slots(lo, lo + L - 1 + g1);
        count_slots(mv.j + 1, mv.j + g1);
      } else {
        lo = mv.i;
        hi = mv.p;
        std::rotate(ord.begin() + mv.i, ord.begin() + mv.j + 1, ord.begin() + mv.p + 1);
        rotate_counts(mv.i, mv.j + 1, mv.p + 1);
        count_slots(mv.i, mv.i + g1 - 1);
        count_slots(mv.p - L + 1, mv.p + g1);
      }
    }
    for (int64_t k = lo; k <= hi; ++k) pos[ord[size_t(k)]] = uint32_t(k);
  }

  std::deque<uint32_t> queue;
  std::vector<uint8_t> inq;
  void push(int64_t k) {
    if (k < 0 || k >= int64_t(n_act)) return;
    uint32_t v = ord[size_t(k)];
    if (!inq[v]) {
      inq[v] = 1;
      queue.push_back(v);
    }
  }
  void push_around(int64_t k) {
    for (int64_t d = -1; d <= 1; ++d) push(k + d);
  }

  bool try_move(const Move& mv) {
    double d = delta(mv);
    if (!(d > 1e-6)) return false;
    int64_t dw = weight_delta(mv);
    bool ok = int64_t(w_cur) + dw >= int64_t(w_floor) || dw >= 0;
    if (!ok) {
      ++st.refused_by_weight;
      return false;
    }
    // Junction positions before the move (the neurons there get their don't-look bits cleared).
    int64_t js[4] = {mv.i, mv.j, mv.kind == Move::Shift ? mv.p : mv.i, mv.kind == Move::Shift ? mv.p + 1 : mv.j};
    uint32_t vs[4];
    for (int q = 0; q < 4; ++q) vs[q] = at(js[q]);
    apply(mv);
    w_cur = uint64_t(int64_t(w_cur) + dw);
    saving += d;
    ++st.moves;
    for (uint32_t v : vs)
      if (v != kNone && pos[v] < n_act) push_around(pos[v]);
    return true;
  }

  bool improve(uint32_t v) {
    int64_t i = pos[v];
    if (i >= int64_t(n_act)) return false;
    const LayerGraph& lists = wide.k ? wide : g;
    const uint32_t* list = lists.nbr.data() + size_t(v) * lists.k;
    const uint32_t K = lists.k ? std::min(lists.nbr_len[v], k_cur) : 0;
    for (uint32_t e = 0; e < K; ++e) {
      uint32_t u = list[e];
      if (hot[u]) continue;
      int64_t j = pos[u];
      if (j > i) {
        if (j > i + 1 && try_move({Move::Reverse, i + 1, j})) return true;
        if (j - 1 > i && try_move({Move::Reverse, i, j - 1})) return true;
      } else {
        if (i > j + 1 && try_move({Move::Reverse, j + 1, i})) return true;
        if (i - 1 > j && try_move({Move::Reverse, j, i - 1})) return true;
      }
      for (int64_t L = 1; L <= 3; ++L) {
        for (int anchor = 0; anchor < (L == 1 ? 1 : 2); ++anchor) {
          int64_t a = anchor == 0 ? j : j - L + 1, b = a + L - 1;  // anchor 0: u first; 1: u last
          if (a < 0 || b >= int64_t(n_act) || (i >= a && i <= b)) continue;
          bool u_first = anchor == 0;
          // After v: u must come first; before v: u must come last.
          Move after{Move::Shift, a, b, i, !u_first};
          Move before{Move::Shift, a, b, i - 1, u_first};
          for (const Move& mv : {after, before}) {
            if (mv.p >= mv.i - 1 && mv.p <= mv.j) continue;
            if (try_move(mv)) return true;
          }
        }
      }
    }
    if (i >= 2 && try_move({Move::Reverse, 0, i - 1})) return true;
    if (i + 2 < int64_t(n_act) && try_move({Move::Reverse, i + 1, int64_t(n_act) - 1})) return true;
    return false;
  }

  bool budget_left() const { return !opt.max_evaluations || st.evaluations < opt.max_evaluations; }
  void descend() {
    while (!queue.empty() && budget_left()) {
      uint32_t v = queue.front();
      queue.pop_front();
      inq[v] = 0;
      if (improve(v)) push(pos[v]);
    }
  }

  void run(const Order& seed_order, uint32_t hot_count) {
    ord.clear();
    hot.assign(n, 0);
    if (hot_count)
      for (uint32_t v : hottest(g.freq, hot_count)) hot[v] = 1;
    for (uint32_t v : seed_order)
      if (!hot[v]) ord.push_back(v);
    n_act = uint32_t(ord.size());
    for (uint32_t v : seed_order)
      if (hot[v]) ord.push_back(v);
    pos.assign(n, 0);
    for (uint32_t k = 0; k < n; ++k) pos[ord[k]] = k;
    // Hot neurons' sampled rows are zero: the cache serves them, so they need no reads.
    for (uint32_t v = 0; v < n; ++v)
      if (hot[v]) std::fill(R.begin() + size_t(v) * W, R.begin() + size_t(v + 1) * W, 0);
    w_floor = opt.keep_weight ? path_weight(g, m, seed_order) : 0;
    w_cur = path_weight(g, m, ord);
    saving = total();
    C.assign(size_t(n_act) * (g1 + 1), 0);
    count_slots(0, int64_t(n_act) - 1);
    inq.assign(n, 0);
    k_cur = opt.neighbours;
    for (uint32_t k = 0; k < n_act; ++k) push(k);
    descend();
    // A local optimum of these lists with budget left: widen them and go on from every neuron (past the graph's top-k
    // lists only where it holds the full matrix).
    const uint32_t k_top = std::min(opt.max_neighbours, g.has_full() && n > 1 ? n - 1 : g.k);
    while (queue.empty() && budget_left() && k_cur < k_top) {
      k_cur = std::min(k_top, std::max(k_cur + 1, 2 * k_cur));
      if (k_cur > g.k && wide.k == 0) wide = coactivation_topk_lists(g, k_top);
      for (uint32_t k = 0; k < n_act; ++k) push(k);
      descend();
    }
    st.neighbours_final = k_cur;
  }
};

}  // namespace

double ls_objective(const LayerMask& m, const Order& order, const LsOptions& opt) {
  LayerGraph empty;
  empty.n_neurons = m.n_neurons;
  Search s(m, empty, opt);
  s.ord = order;
  s.n_act = m.n_neurons;
  return s.total();
}

Order local_search(const LayerMask& m, const LayerGraph& g, const Order& seed, const LsOptions& opt, LsStats* stats) {
  if (seed.size() != m.n_neurons) throw InternalError("local search: seed order length does not match the layer");
  if (m.n_neurons < 3) return seed;
  Search s(m, g, opt);
  s.run(seed, opt.hot_count);
  bool fell_back = false;
  if (opt.keep_weight && s.w_cur < s.w_floor) {  // the hot block cost more path weight than the search won back
    Search plain(m, g, opt);
    plain.run(seed, 0);
    plain.st.fell_back = true;
    std::swap(s.ord, plain.ord);
    s.w_cur = plain.w_cur;
    s.st = plain.st;
    fell_back = true;
  }
  if (stats) {
    *stats = s.st;
    stats->fell_back = fell_back;
    stats->saving_seed = ls_objective(m, seed, opt);
    stats->saving_final = ls_objective(m, s.ord, opt);
    stats->saving_tracked = s.saving;
    stats->weight_seed = path_weight(g, m, seed);
    stats->weight_final = s.w_cur;
  }
  return s.ord;
}

}  // namespace nl
