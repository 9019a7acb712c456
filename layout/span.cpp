#include "layout/span.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "formats/core/error.h"
#include "layout/pins.h"

namespace nl {

Order EndsIn::order() const {
  Order out = left;
  out.insert(out.end(), right.rbegin(), right.rend());
  return out;
}

EndsIn solve_ends_in(const TokenMajorMask& tm, const std::vector<uint8_t>& include) {
  const uint32_t n = tm.n_neurons;
  if (include.size() != n) throw InternalError("solve_ends_in: include length does not match the layer");
  const uint64_t T = tm.end - tm.begin;
  // grow[side][v]: v's active tokens not yet in that end's union (what adding v there would add).
  std::vector<uint64_t> grow[2] = {std::vector<uint64_t>(n, 0), std::vector<uint64_t>(n, 0)};
  for (uint64_t t = tm.begin; t < tm.end; ++t) tm.for_each_active(t, [&](uint32_t v) { ++grow[0][v]; });
  grow[1] = grow[0];
  std::vector<uint8_t> in_union[2] = {std::vector<uint8_t>(T, 0), std::vector<uint8_t>(T, 0)};
  std::vector<uint8_t> alive = include;
  uint32_t left = 0;
  for (uint8_t a : alive) left += a != 0;
  // Neuron-major lists of active tokens, so adding v walks only v's tokens.
  std::vector<uint64_t> start(n + 1, 0);
  for (uint32_t v = 0; v < n; ++v) start[v + 1] = start[v] + grow[0][v];
  std::vector<uint32_t> toks(start[n]);
  {
    std::vector<uint64_t> fill(start.begin(), start.end() - 1);
    for (uint64_t t = tm.begin; t < tm.end; ++t)
      tm.for_each_active(t, [&](uint32_t v) { toks[fill[v]++] = uint32_t(t - tm.begin); });
  }
  EndsIn r;
  Order* ends[2] = {&r.left, &r.right};
  std::vector<uint64_t>* cover[2] = {&r.cover_left, &r.cover_right};
  uint64_t covered[2] = {0, 0};
  for (; left > 0; --left) {
    uint32_t best[2] = {n, n};
    for (int s = 0; s < 2; ++s) {
      uint64_t g = std::numeric_limits<uint64_t>::max();
      for (uint32_t v = 0; v < n; ++v)
        if (alive[v] && grow[s][v] < g) g = grow[s][v], best[s] = v;
    }
    // The end whose union would be the smaller after the step (ties: the smaller growth, then the left end).
    const uint64_t u0 = covered[0] + grow[0][best[0]], u1 = covered[1] + grow[1][best[1]];
    const int side = u0 < u1 || (u0 == u1 && grow[0][best[0]] <= grow[1][best[1]]) ? 0 : 1;
    const uint32_t v = best[side];
    alive[v] = 0;
    ends[side]->push_back(v);
    for (uint64_t i = start[v]; i < start[v + 1]; ++i) {
      const uint32_t t = toks[i];
      if (in_union[side][t]) continue;
      in_union[side][t] = 1;
      ++covered[side];
      tm.for_each_active(tm.begin + t, [&](uint32_t u) { --grow[side][u]; });
    }
    cover[side]->push_back(covered[side]);
  }
  return r;
}

uint64_t span_bundles(const TokenMajorMask& tm, const Order& order, const std::vector<uint32_t>& pinned) {
  const uint32_t n = tm.n_neurons;
  if (order.size() != n) throw InternalError("span_bundles: order length does not match the layer");
  std::vector<uint32_t> slot_of(n);
  for (uint32_t s = 0; s < n; ++s) slot_of[order[s]] = s;
  const std::vector<uint8_t> pin = pin_flags(n, pinned);
  uint64_t total = 0;
  for (uint64_t t = tm.begin; t < tm.end; ++t) {
    uint32_t lo = n, hi = 0;
    tm.for_each_active(t, [&](uint32_t v) {
      if (pin[v]) return;
      lo = std::min(lo, slot_of[v]);
      hi = std::max(hi, slot_of[v]);
    });
    if (lo <= hi) total += hi - lo + 1;
  }
  return total;
}

namespace {

struct TokenSpan {
  uint32_t count = 0;         // needed slots
  uint32_t lo1 = 0, lo2 = 0;  // the two smallest needed slots (lo2 valid when count >= 2)
  uint32_t hi1 = 0, hi2 = 0;  // the two largest (hi1 the largest)
};

}  // namespace

Order polish_span(const TokenMajorMask& tm, const Order& order, const std::vector<uint32_t>& pinned, const CostModel& c,
                  uint32_t passes, uint64_t max_tokens, uint64_t max_work, double* saved_us) {
  const uint32_t n = tm.n_neurons;
  if (order.size() != n) throw InternalError("polish_span: order length does not match the layer");
  if (c.block_bytes == 0 || c.bundle_bytes == 0) throw InternalError("polish_span: zero block or bundle bytes");
  const uint64_t end = max_tokens && max_tokens < tm.end - tm.begin ? tm.begin + max_tokens : tm.end;
  const uint64_t T = end - tm.begin;
  Order o = order;
  std::vector<uint32_t> slot_of(n);
  for (uint32_t s = 0; s < n; ++s) slot_of[o[s]] = s;
  const std::vector<uint8_t> pin = pin_flags(n, pinned);
  // Neuron-major token lists of the unpinned neurons (what a swap of two of them touches).
  std::vector<std::vector<uint32_t>> toks(n);
  for (uint64_t t = tm.begin; t < end; ++t)
    tm.for_each_active(t, [&](uint32_t v) {
      if (!pin[v]) toks[v].push_back(uint32_t(t - tm.begin));
    });
  // The bytes of one read from slot lo to slot hi are E[hi] - B[lo] (CostModel::span_read_us, precomputed).
  std::vector<uint64_t> B(n), E(n);
  for (uint32_t s = 0; s < n; ++s) B[s] = c.span_begin_byte(s), E[s] = c.span_end_byte(s);
  const double a = c.read_us, upb = c.us_per_byte();
  auto span_us = [&](uint32_t lo, uint32_t hi) { return a + double(E[hi] - B[lo]) * upb; };
  auto cost = [&](uint32_t count, uint32_t lo, uint32_t hi) { return count == 0 ? 0.0 : span_us(lo, hi); };
  std::vector<TokenSpan> sp(T);
  auto rebuild = [&](uint32_t t) {
    TokenSpan s;
    tm.for_each_active(tm.begin + t, [&](uint32_t v) {
      if (pin[v]) return;
      const uint32_t q = slot_of[v];
      if (s.count == 0) {
        s.lo1 = s.lo2 = s.hi1 = s.hi2 = q;
      } else {
        if (q < s.lo1)
          s.lo2 = s.lo1, s.lo1 = q;
        else if (s.count == 1 || q < s.lo2)
          s.lo2 = q;
        if (q > s.hi1)
          s.hi2 = s.hi1, s.hi1 = q;
        else if (s.count == 1 || q > s.hi2)
          s.hi2 = q;
      }
      ++s.count;
    });
    sp[t] = s;
  };
  for (uint32_t t = 0; t < T; ++t) rebuild(t);
  // The other needed slots' span of a token when its needed slot `from` leaves (count > 1).
  auto rest = [](const TokenSpan& s, uint32_t from) {
    return std::pair<uint32_t, uint32_t>(s.lo1 == from ? s.lo2 : s.lo1, s.hi1 == from ? s.hi2 : s.hi1);
  };
  // The cost change of one token when its needed slot `from` moves to `to` (its other needed slots stay).
  auto moved = [&](const TokenSpan& s, uint32_t from, uint32_t to) {
    uint32_t lo = to, hi = to;
    if (s.count > 1) {
      const auto [l, h] = rest(s, from);
      lo = std::min(to, l), hi = std::max(to, h);
    }
    return cost(s.count, lo, hi) - cost(s.count, s.lo1, s.hi1);
  };
  // The exact change of swapping the neurons at slots i and j.
  auto swap_delta = [&](uint32_t i, uint32_t j) {
    const auto& tu = toks[o[i]];
    const auto& tw = toks[o[j]];
    double d = 0;
    size_t x = 0, y = 0;
    while (x < tu.size() || y < tw.size()) {  // tokens of u only: i -> j; of w only: j -> i; of both: same
      if (y == tw.size() || (x < tu.size() && tu[x] < tw[y]))
        d += moved(sp[tu[x++]], i, j);
      else if (x == tu.size() || tw[y] < tu[x])
        d += moved(sp[tw[y++]], j, i);
      else
        ++x, ++y;
    }
    return d;
  };
  // For slot i, every swap (i, j) at once, in O(T + n + the tokens of u + the needed slots of the tokens whose change
  // depends on j) instead of visiting every neuron's tokens:
  // - M(j), the change if i's neuron u alone moved to slot j (the others staying), from difference arrays over u's
  //   tokens: per token a constant over j < lo', over [lo', hi'] and over j > hi' ([lo', hi'] spans its other needed
  //   slots), plus -B[j] / +E[j] bytes below / above it;
  // - acc[w], the change the other neuron w brings: on a token without u, w moving to slot i changes nothing unless w
  //   is at an end of the token's span or i lies outside it (then every needed neuron's move matters); on a token
  //   with u, the swap keeps the needed slots, so M's term is taken back from each w there, which is non-zero only
  //   where u is at an end of the span.
  // The best swap for slot i is checked exactly and kept when it lowers the cost.
  std::vector<double> dc(n + 1), dl(n + 1), dr(n + 1), acc(n);
  std::vector<uint8_t> mark(T, 0);
  double saved = 0;
  uint64_t work = 0;
  for (uint32_t pass = 0; pass < passes && !(max_work && work >= max_work); ++pass) {
    bool improved = false;
    for (uint32_t i = 0; i < n && !(max_work && work >= max_work); ++i) {
      const uint32_t u = o[i];
      if (pin[u]) continue;
      const auto& tu = toks[u];
      std::fill(dc.begin(), dc.end(), 0.0);
      std::fill(dl.begin(), dl.end(), 0.0);
      std::fill(dr.begin(), dr.end(), 0.0);
      std::fill(acc.begin(), acc.end(), 0.0);
      double single = 0;  // tokens needing only u: their read moves with it
      for (uint32_t t : tu) {
        const TokenSpan& s = sp[t];
        mark[t] = 1;
        const double cur = cost(s.count, s.lo1, s.hi1);
        if (s.count == 1) {
          dc[0] += a - cur, dc[n] -= a - cur, single += 1;
          continue;
        }
        const auto [l, h] = rest(s, i);
        const double below = a + double(E[h]) * upb - cur, inside = span_us(l, h) - cur,
                     above = a - double(B[l]) * upb - cur;
        dc[0] += below, dc[l] -= below, dl[0] += 1, dl[l] -= 1;
        dc[l] += inside, dc[h + 1] -= inside;
        dc[h + 1] += above, dc[n] -= above, dr[h + 1] += 1, dr[n] -= 1;
        if (i != s.lo1 && i != s.hi1) continue;
        work += s.count;
        tm.for_each_active(tm.begin + t, [&](uint32_t v) {
          if (v != u && !pin[v]) acc[v] -= inside;
        });
      }
      work += T + n + tu.size();
      for (uint32_t t = 0; t < T; ++t) {
        const TokenSpan& s = sp[t];
        if (s.count == 0 || mark[t]) continue;
        if (s.lo1 <= i && i <= s.hi1) {
          acc[o[s.lo1]] += moved(s, s.lo1, i);
          if (s.hi1 != s.lo1) acc[o[s.hi1]] += moved(s, s.hi1, i);
          continue;
        }
        const double outer = cost(s.count, std::min(i, s.lo1), std::max(i, s.hi1)) - cost(s.count, s.lo1, s.hi1);
        work += s.count;
        tm.for_each_active(tm.begin + t, [&](uint32_t v) {
          if (pin[v]) return;
          const uint32_t q = slot_of[v];
          acc[v] += q == s.lo1 || q == s.hi1 ? moved(s, q, i) : outer;
        });
      }
      for (uint32_t t : tu) mark[t] = 0;
      double best = -1e-9, cc = 0, cl = 0, cr = 0;
      uint32_t best_j = n;
      for (uint32_t j = 0; j < n; ++j) {
        cc += dc[j], cl += dl[j], cr += dr[j];
        if (j == i || pin[o[j]]) continue;
        const double d = cc + upb * (cr * double(E[j]) - cl * double(B[j]) + single * double(E[j] - B[j])) + acc[o[j]];
        if (d < best) best = d, best_j = j;
      }
      if (best_j == n) continue;
      work += tu.size() + toks[o[best_j]].size();
      const double d = swap_delta(i, best_j);
      if (d >= -1e-9) continue;
      const uint32_t w = o[best_j];
      std::swap(o[i], o[best_j]);
      slot_of[u] = best_j, slot_of[w] = i;
      for (uint32_t t : toks[u]) rebuild(t);
      for (uint32_t t : toks[w]) rebuild(t);
      saved -= d;
      improved = true;
    }
    if (!improved) break;
  }
  if (saved_us) *saved_us = saved;
  return o;
}

}  // namespace nl
