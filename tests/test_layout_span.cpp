// Orders for layers read in one piece (layout/span.h): the peel follows its rule (checked against a direct
// re-implementation), span counts and the polish's cost are exact, the polish never raises the cost and keeps the
// pinned slots, and greedy+ls with small bundles (where the peel is tried) keeps its guarantees.
#include <doctest/doctest.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <set>

#include "layout/evaluate.h"
#include "layout/solve.h"
#include "layout/span.h"
#include "mask_test_util.h"

using namespace nl;

namespace {

constexpr double kHot = 0.6;  // the firing-rate ceiling of the hot half of random_mask's neurons

LayerMask random_mask(uint32_t n, uint64_t tokens, std::mt19937_64& rng, double hot = kHot) {
  return test::random_mask(n, tokens, rng, hot, 0.05);
}

using test::shuffled;

// The peel's rule written out directly: each step, for each end, the neuron whose addition leaves that end's union
// smallest; the end whose union would be the smaller (ties: smaller growth, the left end); ties by index.
EndsIn brute_peel(const LayerMask& m, const std::vector<uint8_t>& include) {
  const uint32_t n = m.n_neurons;
  std::vector<std::vector<uint8_t>> u(2, std::vector<uint8_t>(m.n_tokens, 0));
  std::vector<uint8_t> alive = include;
  EndsIn r;
  auto after = [&](int s, uint32_t v) {
    uint64_t k = 0;
    for (uint64_t t = 0; t < m.n_tokens; ++t) k += u[s][t] || m.test(v, t);
    return k;
  };
  auto size = [&](int s) { return uint64_t(std::count(u[s].begin(), u[s].end(), 1)); };
  for (;;) {
    int bs = -1;
    uint32_t bv = 0;
    uint64_t bu = 0, bg = 0;
    for (int s = 0; s < 2; ++s)
      for (uint32_t v = 0; v < n; ++v) {
        if (!alive[v]) continue;
        const uint64_t k = after(s, v), gr = k - size(s);
        if (bs < 0 || k < bu || (k == bu && (gr < bg || (gr == bg && s == bs && v < bv))))
          bs = s, bv = v, bu = k, bg = gr;
      }
    if (bs < 0) break;
    alive[bv] = 0;
    for (uint64_t t = 0; t < m.n_tokens; ++t)
      if (m.test(bv, t)) u[bs][t] = 1;
    (bs == 0 ? r.left : r.right).push_back(bv);
    (bs == 0 ? r.cover_left : r.cover_right).push_back(size(bs));
  }
  return r;
}

// The first and last slot of `order` holding a neuron active at t and not pinned (-1, -1: none).
std::pair<int64_t, int64_t> needed_range(const LayerMask& m, const Order& order, const std::set<uint32_t>& pin,
                                         uint64_t t) {
  int64_t lo = -1, hi = -1;
  for (uint32_t s = 0; s < order.size(); ++s)
    if (m.test(order[s], t) && !pin.count(order[s])) {
      if (lo < 0) lo = s;
      hi = s;
    }
  return {lo, hi};
}

uint64_t brute_span(const LayerMask& m, const Order& order, const std::vector<uint32_t>& pinned) {
  const std::set<uint32_t> pin(pinned.begin(), pinned.end());
  uint64_t total = 0;
  for (uint64_t t = 0; t < m.n_tokens; ++t) {
    const auto [lo, hi] = needed_range(m, order, pin, t);
    if (lo >= 0) total += uint64_t(hi - lo + 1);
  }
  return total;
}

// One read per token from its first to its last needed slot, block-aligned (slot 0 at a block start).
double brute_cost(const LayerMask& m, const Order& order, const std::vector<uint32_t>& pinned, const CostModel& c) {
  const std::set<uint32_t> pin(pinned.begin(), pinned.end());
  double us = 0;
  for (uint64_t t = 0; t < m.n_tokens; ++t) {
    const auto [lo, hi] = needed_range(m, order, pin, t);
    if (lo < 0) continue;
    const uint64_t b = uint64_t(lo) * c.bundle_bytes / c.block_bytes * c.block_bytes;
    const uint64_t e = (uint64_t(hi + 1) * c.bundle_bytes + c.block_bytes - 1) / c.block_bytes * c.block_bytes;
    us += c.read_us + double(e - b) * c.us_per_byte();
  }
  return us;
}

// A random layer for the polish tests: n_min + [0, n_span) neurons, tok_min + [0, tok_span) tokens, about one neuron in
// `pin_one_in` pinned, and the bundle size by `iter` (whole, many and straddling blocks).
struct PolishCase {
  uint32_t n;
  LayerMask m;
  std::vector<uint32_t> pinned;
  CostModel c;
};
PolishCase polish_case(std::mt19937_64& rng, int iter, uint32_t n_min, uint32_t n_span, uint64_t tok_min,
                       uint64_t tok_span, uint32_t pin_one_in, double hot = kHot) {
  const uint32_t n = n_min + uint32_t(rng() % n_span);
  const uint64_t tokens = tok_min + rng() % tok_span;
  PolishCase p{n, random_mask(n, tokens, rng, hot), {}, CostModel{}};
  for (uint32_t v = 0; v < n; ++v)
    if (rng() % pin_one_in == 0) p.pinned.push_back(v);
  p.c.bundle_bytes = (iter % 3 == 0) ? 4096 : (iter % 3 == 1) ? 172 : 1000;
  return p;
}

}  // namespace

TEST_CASE("the peel puts the rare neurons at the ends: a hand case") {
  // 8 tokens. Neuron 0 at every token, 1 at tokens 0-3, 2 at token 4 only, 3 at token 5 only.
  LayerMask m(4, 8);
  for (uint64_t t = 0; t < 8; ++t) m.set(0, t);
  for (uint64_t t = 0; t < 4; ++t) m.set(1, t);
  m.set(2, 4);
  m.set(3, 5);
  const TokenMajorMask tm(m, 0, m.n_tokens);
  const EndsIn e = solve_ends_in(tm, std::vector<uint8_t>(4, 1));
  // 2 (left, union 1); 3 (right: union 1 < 2); 1 (tie at union 5, same growth: left); 0 (tie at 8, growth 3 < 7).
  CHECK(e.left == Order{2, 1, 0});
  CHECK(e.right == Order{3});
  CHECK(e.cover_left == std::vector<uint64_t>{1, 5, 8});
  CHECK(e.cover_right == std::vector<uint64_t>{1});
  CHECK(e.order() == Order{2, 1, 0, 3});
  // Spans: tokens 0-3 two slots each, token 4 three, token 5 two, tokens 6-7 one: 15. The identity order: 17.
  CHECK(span_bundles(tm, e.order(), {}) == 15);
  CHECK(span_bundles(tm, Order{0, 1, 2, 3}, {}) == 17);
  // Neuron 0 pinned: tokens 0-3 one slot, 4 and 5 one each, 6-7 none.
  CHECK(span_bundles(tm, e.order(), {0}) == 6);
}

TEST_CASE("the peel equals its rule written out, on random layers and subsets") {
  std::mt19937_64 rng(17);
  for (int iter = 0; iter < 20; ++iter) {
    const uint32_t n = 5 + uint32_t(rng() % 36);
    const LayerMask m = random_mask(n, 30 + rng() % 90, rng);
    std::vector<uint8_t> inc(n, 1);
    for (auto& x : inc) x = rng() % 5 != 0;
    const TokenMajorMask tm(m, 0, m.n_tokens);
    const EndsIn got = solve_ends_in(tm, inc);
    const EndsIn want = brute_peel(m, inc);
    CAPTURE(iter);
    CHECK(got.left == want.left);
    CHECK(got.right == want.right);
    CHECK(got.cover_left == want.cover_left);
    CHECK(got.cover_right == want.cover_right);
    // Exactly the included neurons, once each.
    Order o = got.order();
    std::sort(o.begin(), o.end());
    Order inc_ids;
    for (uint32_t v = 0; v < n; ++v)
      if (inc[v]) inc_ids.push_back(v);
    CHECK(o == inc_ids);
  }
}

TEST_CASE("span counts and the polish's cost are exact; the polish never raises it and keeps pinned slots") {
  std::mt19937_64 rng(23);
  for (int iter = 0; iter < 12; ++iter) {
    const auto [n, m, pinned, c] = polish_case(rng, iter, 6, 60, 40, 80, 6);
    const TokenMajorMask tm(m, 0, m.n_tokens);
    const Order order = shuffled(n, rng);
    CAPTURE(iter);
    CHECK(span_bundles(tm, order, pinned) == brute_span(m, order, pinned));
    double saved = -1;
    const Order got = polish_span(tm, order, pinned, c, 4, 0, 0, &saved);
    Order sorted = got;
    std::sort(sorted.begin(), sorted.end());
    Order ids(n);
    std::iota(ids.begin(), ids.end(), 0u);
    REQUIRE(sorted == ids);
    const double before = brute_cost(m, order, pinned, c), after = brute_cost(m, got, pinned, c);
    CHECK(after <= before + 1e-9);
    CHECK(before - after == doctest::Approx(saved).epsilon(1e-9));
    for (uint32_t s = 0; s < n; ++s)
      if (std::find(pinned.begin(), pinned.end(), order[s]) != pinned.end()) CHECK(got[s] == order[s]);
    CHECK(polish_span(tm, order, pinned, c, 4) == got);  // deterministic
    // A token limit uses only the first tokens.
    const TokenMajorMask head(m, 0, 20);
    CHECK(polish_span(tm, order, pinned, c, 4, 20) == polish_span(head, order, pinned, c, 4));
  }
}

TEST_CASE("the polish stops only where no swap of two unpinned slots lowers the cost (checked by brute force)") {
  // Every swap's change is computed at once from span ends (not by visiting the pair's tokens); a wrong change would
  // miss an improving swap here or keep one that does not improve (the first test case).
  std::mt19937_64 rng(41);
  for (int iter = 0; iter < 10; ++iter) {
    const auto [n, m, pinned, c] = polish_case(rng, iter, 5, 30, 30, 60, 5);
    const TokenMajorMask tm(m, 0, m.n_tokens);
    const Order got = polish_span(tm, shuffled(n, rng), pinned, c, 1000);
    const double cost = brute_cost(m, got, pinned, c);
    const std::set<uint32_t> pin(pinned.begin(), pinned.end());
    CAPTURE(iter);
    for (uint32_t i = 0; i < n; ++i)
      for (uint32_t j = i + 1; j < n; ++j) {
        if (pin.count(got[i]) || pin.count(got[j])) continue;
        Order o = got;
        std::swap(o[i], o[j]);
        CAPTURE(i);
        CAPTURE(j);
        CHECK(brute_cost(m, o, pinned, c) >= cost - 1e-9);
      }
  }
}

TEST_CASE("the polish's first step is the best swap for the first unpinned slot (checked by brute force)") {
  // A budget of one unit of work stops the polish after its first slot, so its one swap can be compared with every
  // swap of that slot priced by brute force; sparse and dense layers, so that tokens' spans both contain the slot and
  // miss it.
  std::mt19937_64 rng(43);
  int checked = 0;
  for (int iter = 0; iter < 60; ++iter) {
    const auto [n, m, pinned, c] = polish_case(rng, iter, 5, 40, 20, 60, 5, iter % 2 ? kHot : 0.15);
    const TokenMajorMask tm(m, 0, m.n_tokens);
    const std::set<uint32_t> pin(pinned.begin(), pinned.end());
    const Order order = shuffled(n, rng);
    uint32_t i = 0;
    while (i < n && pin.count(order[i])) ++i;
    if (i == n) continue;
    const double base = brute_cost(m, order, pinned, c);
    double best = -1e-9, second = 0;
    uint32_t best_j = n;
    for (uint32_t j = 0; j < n; ++j) {
      if (j == i || pin.count(order[j])) continue;
      Order o = order;
      std::swap(o[i], o[j]);
      const double d = brute_cost(m, o, pinned, c) - base;
      if (d < best)
        second = best, best = d, best_j = j;
      else if (d < second)
        second = d;
    }
    if (best_j != n && second - best < 1e-6) continue;  // a near tie: either swap is right
    Order want = order;
    if (best_j != n) std::swap(want[i], want[best_j]);
    CAPTURE(iter);
    CHECK(polish_span(tm, order, pinned, c, 1, 0, 1) == want);
    ++checked;
  }
  CHECK(checked >= 40);
}

TEST_CASE("the polish moves a rare neuron out of the middle") {
  // Neuron 0 active at token 0 only, 1 and 2 at every token; order 1, 0, 2 reads three slots at every token.
  LayerMask m(3, 10);
  m.set(0, 0);
  for (uint64_t t = 0; t < 10; ++t) m.set(1, t), m.set(2, t);
  const TokenMajorMask tm(m, 0, m.n_tokens);
  CostModel c;
  c.bundle_bytes = 4096;  // one block each
  double saved = 0;
  const Order got = polish_span(tm, Order{1, 0, 2}, {}, c, 4, 0, 0, &saved);
  // The best swap for slot 0 is with slot 1, giving 0, 1, 2 (with slot 2 the two neurons every token needs would
  // only trade places); nine tokens then read two blocks.
  CHECK(got == Order{0, 1, 2});
  CHECK(saved == doctest::Approx(9 * 4096 * c.us_per_byte()));
  CHECK(brute_cost(m, got, {}, c) == doctest::Approx(10 * c.read_us + (9 * 2 + 3) * 4096 * c.us_per_byte()));
}

TEST_CASE(
    "greedy+ls with small bundles (the peel tried) keeps the greedy path weight; without the guard it is no "
    "worse on the guard's objective") {
  std::mt19937_64 rng(31);
  for (int iter = 0; iter < 3; ++iter) {
    const LayerMask m = random_mask(120 + uint32_t(rng() % 80), 600, rng);
    SolveOptions o;
    o.eval.device = default_device();
    o.eval.gap = GapPolicy::parse("auto");
    o.eval.cache_ratio = 0.05;
    o.eval.bundle_bytes = 256;  // merge gap of about 135 bundles: every layer is read in one piece
    o.method = "greedy";
    const LayerSolve gr = solve_layer(m, o, 0);
    o.method = "greedy+ls";
    o.validation_share = 0;  // built and chosen on the same tokens
    o.guard_weight = true;
    const LayerSolve ls = solve_layer(m, o, 0);
    o.guard_weight = false;
    const LayerSolve unguarded = solve_layer(m, o, 0), unguarded2 = solve_layer(m, o, 0);
    CAPTURE(iter);
    CHECK(ls.objective >= gr.objective);
    CHECK(unguarded.order == unguarded2.order);
    // The guard's objective (the profile tokens, each layout with its cache policy): the unguarded search keeps the
    // best of a superset of the guarded candidates.
    const LayerEval e_ls = evaluate_layer(m, ls.order, o.eval, 0, &ls.cache);
    const LayerEval e_free = evaluate_layer(m, unguarded.order, o.eval, 0, &unguarded.cache);
    const LayerEval e_gr = evaluate_layer(m, gr.order, o.eval, 0);
    CHECK(e_ls.io_seconds <= e_gr.io_seconds);
    CHECK(e_free.io_seconds <= e_ls.io_seconds + 1e-12);
  }
}
