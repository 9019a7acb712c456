// Pinned-set refinement (layout/pins.h): its cost model equals the runtime's planner with the pinned set resident
// (auto gap, bundles filling whole blocks), its per-neuron deltas are exact single flips, and refinement never
// raises the cost, keeps the size, and finds the pin that saves a read.
#include <doctest/doctest.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <set>

#include "layout/evaluate.h"
#include "layout/pins.h"
#include "mask_test_util.h"
#include "runtime/plan/read_plan.h"
#include "runtime/plan/slot_cache.h"

using namespace nl;

namespace {

CostFit ufs40() { return default_device().cost; }  // the built-in UFS 4.0 profile

LayerMask random_mask(uint32_t n, uint64_t tokens, std::mt19937_64& rng) {
  return test::random_mask(n, tokens, rng, 1.0, 0.1);
}

using test::shuffled;

std::vector<uint64_t> freqs(const LayerMask& m) {
  std::vector<uint64_t> f(m.n_neurons);
  for (uint32_t v = 0; v < m.n_neurons; ++v) f[v] = m.count(v);
  return f;
}

// The runtime's planner over every token with exactly `pinned` resident (capacity = the pinned set: nothing else
// is admitted), summed I/O microseconds.
double planner_cost_us(const LayerMask& m, const Order& order, const std::vector<uint32_t>& pinned, uint64_t bundle) {
  const uint32_t n = m.n_neurons;
  std::vector<uint32_t> slot_of(n);
  for (uint32_t s = 0; s < n; ++s) slot_of[order[s]] = s;
  CacheConfig cc;
  cc.capacity = uint32_t(pinned.size());
  for (uint32_t v : pinned) cc.pinned.push_back(slot_of[v]);
  SlotCache cache(n, cc);
  PlannerConfig pc;
  pc.n_slots = n;
  pc.bundle_bytes = bundle;
  pc.gap = GapPolicy::parse("auto");
  pc.cost = ufs40();
  ReadPlanner pl(pc);
  TokenPlan p;
  double us = 0;
  for (uint64_t t = 0; t < m.n_tokens; ++t) {
    std::vector<uint32_t> act;
    for (uint32_t s = 0; s < n; ++s)
      if (m.test(order[s], t)) act.push_back(s);
    pl.plan(act, pinned.empty() ? nullptr : &cache, p);
    us += p.io_seconds(ufs40()) * 1e6;
  }
  return us;
}

CostModel cost_for(uint64_t bundle) {
  CostModel c;
  c.read_us = 8.14;
  c.bandwidth_MBps = 4267.0;
  c.bundle_bytes = bundle;
  c.merge_gap = auto_gap_bundles(ufs40(), bundle);
  return c;
}

}  // namespace

TEST_CASE("the pin cost model is the runtime planner's I/O time with the pinned set resident") {
  std::mt19937_64 rng(3);
  for (int iter = 0; iter < 12; ++iter) {
    const uint32_t n = 8 + uint32_t(rng() % 120);
    const LayerMask m = random_mask(n, 40 + rng() % 60, rng);
    const Order order = shuffled(n, rng);
    std::vector<uint32_t> pinned;
    for (uint32_t v = 0; v < n; ++v)
      if (rng() % 4 == 0) pinned.push_back(v);
    const TokenMajorMask tm(m, 0, m.n_tokens);
    for (uint64_t bundle : {4096u, 16384u, 24576u, 40960u}) {  // merge gaps 8, 2, 1 and 0 bundles
      CAPTURE(bundle);
      CHECK(pinned_cost_us(tm, order, pinned, cost_for(bundle)) ==
            doctest::Approx(planner_cost_us(m, order, pinned, bundle)).epsilon(1e-9));
    }
  }
}

TEST_CASE("pin deltas are exact single flips") {
  std::mt19937_64 rng(5);
  const uint32_t n = 60;
  const LayerMask m = random_mask(n, 80, rng);
  const Order order = shuffled(n, rng);
  std::vector<uint32_t> pinned = {3, 4, 5, 17, 40};
  const TokenMajorMask tm(m, 0, m.n_tokens);
  const CostModel c = cost_for(16384);
  const double base = pinned_cost_us(tm, order, pinned, c);
  const std::vector<double> d = pin_deltas(tm, order, pinned, c);
  REQUIRE(d.size() == n);
  for (uint32_t v = 0; v < n; ++v) {
    std::vector<uint32_t> flipped;
    const bool was = std::find(pinned.begin(), pinned.end(), v) != pinned.end();
    for (uint32_t u : pinned)
      if (u != v) flipped.push_back(u);
    if (!was) flipped.push_back(v);
    const double after = pinned_cost_us(tm, order, flipped, c);
    CAPTURE(v);
    CHECK((was ? after - base : base - after) == doctest::Approx(d[v]).epsilon(1e-9));
  }
}

TEST_CASE("refinement swaps a pin inside a run for the isolated neuron whose pin saves a read") {
  // Identity order; neurons 0..5 always active (one run), neuron 10 always active alone, 12 active every other
  // token. One pin: the hottest by count ties to neuron 0, which only trims the run's end (one bundle); pinning 10
  // saves its read and its bundle.
  const uint32_t n = 16;
  LayerMask m(n, 64);
  for (uint64_t t = 0; t < 64; ++t) {
    for (uint32_t v = 0; v <= 5; ++v) m.set(v, t);
    m.set(10, t);
    if (t % 2) m.set(12, t);
  }
  Order order(n);
  std::iota(order.begin(), order.end(), 0u);
  const TokenMajorMask tm(m, 0, m.n_tokens);
  const CostModel c = cost_for(16384);
  const std::vector<uint64_t> f = freqs(m);
  const std::vector<uint32_t> seed = hottest(f, 1);
  REQUIRE(seed == std::vector<uint32_t>{0});
  PinRefineStats st;
  const std::vector<uint32_t> got = refine_pins(tm, order, seed, f, c, 8, 0, &st);
  CHECK(got == std::vector<uint32_t>{10});
  CHECK(st.swaps == 1);
  CHECK(st.cost_final_us < st.cost_seed_us);
  CHECK(st.cost_final_us == doctest::Approx(pinned_cost_us(tm, order, got, c)));
  // The planner agrees. Even tokens: one read fewer (10's read and bundle saved, 0's bundle read again). Odd
  // tokens: 12 was merged with 10 across one bundle and now needs its own read: one bundle fewer.
  CHECK(planner_cost_us(m, order, seed, 16384) - planner_cost_us(m, order, got, 16384) ==
        doctest::Approx(32 * 8.14 + 32 * 16384 / 4267.0).epsilon(1e-9));
}

TEST_CASE("refinement never raises the estimated cost, keeps the size, orders hottest first, and is deterministic") {
  std::mt19937_64 rng(9);
  for (int iter = 0; iter < 10; ++iter) {
    const uint32_t n = 20 + uint32_t(rng() % 200);
    const LayerMask m = random_mask(n, 100 + rng() % 100, rng);
    const Order order = shuffled(n, rng);
    const TokenMajorMask tm(m, 0, m.n_tokens);
    const std::vector<uint64_t> f = freqs(m);
    const uint32_t k = 1 + uint32_t(rng() % (n / 4));
    const std::vector<uint32_t> seed = hottest(f, k);
    const CostModel c = cost_for(rng() % 2 ? 16384 : 24576);
    PinRefineStats st;
    const std::vector<uint32_t> got = refine_pins(tm, order, seed, f, c, 8, 0, &st);
    REQUIRE(got.size() == seed.size());
    CHECK(std::set<uint32_t>(got.begin(), got.end()).size() == got.size());
    CHECK(pinned_cost_us(tm, order, got, c) <= pinned_cost_us(tm, order, seed, c) + 1e-9);
    for (size_t i = 1; i < got.size(); ++i)
      CHECK((f[got[i - 1]] > f[got[i]] || (f[got[i - 1]] == f[got[i]] && got[i - 1] < got[i])));
    if (st.swaps == 0) CHECK(got == seed);
    CHECK(refine_pins(tm, order, seed, f, c, 8) == got);
    // A token budget smaller than the range uses only the first tokens.
    const TokenMajorMask head(m, 0, 50);
    CHECK(refine_pins(tm, order, seed, f, c, 8, 50) == refine_pins(head, order, seed, f, c, 8));
  }
}
