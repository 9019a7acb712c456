// Flash replication: the per-token cover (runtime/plan/replica_cover.h), the cache keyed by a neuron's first copy,
// eval of replicated layouts, the layout format, and the solver's replica step (layout/replicate.h) choosing its
// level on validation tokens from candidates built on build tokens only.
#include <doctest/doctest.h>

#include <algorithm>
#include <numeric>
#include <random>

#include "formats/core/error.h"
#include "formats/layout.h"
#include "layout/cost_model.h"
#include "layout/evaluate.h"
#include "layout/replicate.h"
#include "layout/solve.h"
#include "layout/synthetic.h"
#include "mask_test_util.h"
#include "runtime/plan/replica_cover.h"
#include "runtime/plan/slot_cache.h"

using namespace nl;

namespace {

EvalConfig no_cache_16k() {
  EvalConfig e;
  e.device = default_device();  // UFS 4.0: a 16 KiB bundle costs less than a read, so the planner merges 2-slot gaps
  e.gap = GapPolicy::parse("auto");
  e.cache_ratio = 0;
  e.bundle_bytes = 16384;
  return e;
}

Order identity(uint32_t n) {
  Order o(n);
  std::iota(o.begin(), o.end(), 0u);
  return o;
}

}  // namespace

TEST_CASE("a replica beside a group saves the read its neuron needed alone, and the cover reads it once") {
  // 30 neurons in identity order; tokens alternate group A = {0, 1, 2} and group B = {20, 21, 22}, neuron 10 fires
  // with both. Without a copy neuron 10 is a read of its own every token; a copy after neuron 2 joins A's read.
  const uint32_t n = 30;
  LayerMask m(n, 64);
  for (uint64_t t = 0; t < 64; ++t) {
    const uint32_t base = t % 2 ? 20 : 0;
    for (uint32_t v = base; v < base + 3; ++v) m.set(v, t);
    m.set(10, t);
  }
  const EvalConfig e = no_cache_16k();
  const LayerEval plain = evaluate_layer(m, identity(n), e, 0);
  CHECK(plain.reads == 128);  // two reads every token
  Order rep = identity(n);
  rep.insert(rep.begin() + 3, 10u);  // copy of 10 right after neuron 2
  const LayerEval with = evaluate_layer(m, rep, e, 0);
  CHECK(with.reads == 96);  // A tokens: one read; B tokens: two
  CHECK(with.io_seconds < plain.io_seconds);
  CHECK(with.active == plain.active);  // each active neuron counted once
  CHECK(with.bytes_needed == plain.bytes_needed);

  // The solver finds that copy from the reads on these tokens: neuron 10 beside group A or B.
  const CostModel cost = cost_model(e, n);
  const TokenMajorMask tm(m, 0, 64);
  const std::vector<ReplicaCandidate> c = replica_candidates(m, tm, identity(n), cost, 0, nullptr, 3);
  REQUIRE(!c.empty());
  CHECK(c[0].neuron == 10);
  CHECK(c[0].tokens == 32);
  CHECK(((c[0].anchor == 2 && c[0].after) || (c[0].anchor == 0 && !c[0].after) || (c[0].anchor == 22 && c[0].after) ||
         (c[0].anchor == 20 && !c[0].after)));
  const Order best = insert_replicas(identity(n), c, 1);
  CHECK(best.size() == n + 1);
  CHECK(evaluate_layer(m, best, e, 0).reads == 96);
}

TEST_CASE("the cover lists every active neuron exactly once, ascending, for random replicas, tokens and caches") {
  std::mt19937_64 rng(7);
  for (int trial = 0; trial < 30; ++trial) {
    const uint32_t n = 40 + uint32_t(rng() % 200);
    Order o = test::shuffled(n, rng);
    const Order perm = o;
    const uint32_t r = uint32_t(rng() % (n / 2));
    for (uint32_t k = 0; k < r; ++k) {  // copies of distinct neurons at random places
      const uint32_t v = perm[k];
      o.insert(o.begin() + std::ptrdiff_t(rng() % (o.size() + 1)), v);
    }
    const ReplicaMap map = ReplicaMap::from_order(o, n);
    REQUIRE(map.replicas() == r);
    EvalConfig e = no_cache_16k();
    e.bundle_bytes = 1024 << (rng() % 6);  // merge gaps from 1 to 33 bundles
    PlannerConfig pc = planner_config(e, n);
    pc.n_slots = map.n_slots();
    ReplicaCover cover(map, pc);
    CacheConfig cc;
    cc.capacity = n / 10;
    cc.linking_aligned = false;
    cc.alias = map.cache_alias();
    SlotCache cache(map.n_slots(), cc);
    ReadPlanner planner(pc);
    TokenPlan plan;
    std::vector<uint32_t> slots;
    for (int t = 0; t < 50; ++t) {
      std::vector<uint32_t> act;
      for (uint32_t v = 0; v < n; ++v)
        if (rng() % 4 == 0) act.push_back(v);
      std::shuffle(act.begin(), act.end(), rng);
      cover.choose(act.data(), act.size(), &cache, slots);
      REQUIRE(slots.size() == act.size());
      CHECK(std::is_sorted(slots.begin(), slots.end()));
      CHECK(std::adjacent_find(slots.begin(), slots.end()) == slots.end());
      std::vector<uint32_t> got;
      for (uint32_t s : slots) got.push_back(map.neuron_of[s]);
      std::sort(got.begin(), got.end());
      std::sort(act.begin(), act.end());
      CHECK(got == act);  // every active neuron once: never two copies of one
      planner.plan(slots, &cache, plan);
      CHECK(plan.active == act.size());
    }
  }
}

TEST_CASE("both copies of a neuron share one cache entry") {
  const Order o = {0, 1, 2, 0, 3};  // neuron 0 at slots 0 and 3
  const ReplicaMap map = ReplicaMap::from_order(o, 4);
  CacheConfig cc;
  cc.capacity = 2;
  cc.linking_aligned = false;
  cc.alias = map.cache_alias();
  SlotCache cache(map.n_slots(), cc);
  PlannerConfig pc;
  pc.n_slots = map.n_slots();
  pc.bundle_bytes = 4096;
  pc.gap = GapPolicy::parse("off");
  ReadPlanner planner(pc);
  TokenPlan plan;
  planner.plan(std::vector<uint32_t>{3}, &cache, plan);  // read through the second copy: admitted under the first
  CHECK(cache.resident(0));
  CHECK(cache.resident(3));
  planner.plan(std::vector<uint32_t>{0}, &cache, plan);
  CHECK(plan.reads.empty());
  CHECK(plan.hits.size() == 1);
  CHECK(cache.size() == 1);
  CHECK_THROWS_AS(ReplicaMap::from_order({0, 0, 0, 1}, 2), InternalError);  // three copies
  CHECK_THROWS_AS(ReplicaMap::from_order({0, 0, 1}, 3), InternalError);     // neuron 2 missing
  CHECK(primary_order(o, 4) == Order{0, 1, 2, 3});
}

TEST_CASE("layout files carry replicas: written, read back, and malformed ones refused") {
  Layout l;
  l.method = "greedy+ls";
  LayoutLayer L;
  L.order = {2, 0, 1, 0, 3};
  L.replicas = 1;
  L.pinned = {0};
  l.layers.push_back(L);
  const std::string text = layout_to_json(l);
  CHECK(text.find("\"n_neurons\": 4, \"replicas\": 1") != std::string::npos);
  const Layout back = layout_parse(text, "x.json");
  CHECK(back.layers[0].order == L.order);
  CHECK(back.layers[0].replicas == 1);
  CHECK(layout_cache_policy_slots(back)[0].pinned == std::vector<uint32_t>{1});  // the first copy's slot
  auto with = [&](const std::string& order, const std::string& reps) {
    return "{\"format\": \"neuralink-layout\", \"version\": 1, \"method\": \"greedy+ls\", \"layers\": [{\"order\": " +
           order + reps + "}]}";
  };
  CHECK_THROWS_AS(layout_parse(with("[0, 1, 0]", ""), "x.json"), InputError);  // no replicas field: a permutation
  CHECK(layout_parse(with("[0, 1, 0]", ", \"replicas\": 1"), "x.json").layers[0].order.size() == 3);
  CHECK_THROWS_AS(layout_parse(with("[0, 0, 0, 1]", ", \"replicas\": 2"), "x.json"), InputError);  // thrice
  CHECK_THROWS_AS(layout_parse(with("[0, 0, 1, 1]", ", \"replicas\": 1"), "x.json"), InputError);  // 2 missing
  CHECK_THROWS_AS(layout_parse(with("[0, 1]", ", \"replicas\": -1"), "x.json"), InputError);
}

TEST_CASE("solve's replicas come from build tokens only; the level kept is the best on validation tokens") {
  ClusteredTraceSpec s;
  s.n_neurons = 512;
  s.n_tokens = 4096;
  s.cluster_size = 12;
  s.cluster_rate = 0.05;
  s.seed = 3;
  const LayerMask m = clustered_mask(s);
  SolveOptions o;
  o.method = "greedy+ls";
  o.eval = no_cache_16k();
  o.eval.cache_ratio = 0.05;
  o.replicate_share = 0.2;
  // On this clustered trace plain S3-FIFO with the larger small FIFO wins (0.0957 ms/token on validation, against
  // the value cache's 0.0959 in the lean set), and copies pay only with it: the full candidate set.
  o.full_candidates = true;
  std::vector<int64_t> seq;
  for (int64_t t = 0; t < 4096; t += 128) seq.push_back(t);
  const LayerSolve r = solve_layer(m, o, 0, &seq);
  REQUIRE(r.split.split());
  const uint64_t b = r.split.build_end;
  SolveOptions o0 = o;  // the same solve without replicas: the order the copies were added to
  o0.replicate_share = 0;
  const Order primary = solve_layer(m, o0, 0, &seq).order;
  REQUIRE(primary.size() == m.n_neurons);
  CHECK(r.order.size() == m.n_neurons + r.replicas);
  // The candidates, recomputed from the build tokens alone, give the order: only the level was chosen.
  const CostModel cost = cost_model(o.eval, m.n_neurons);
  const TokenMajorMask tm_build(m, 0, std::min<uint64_t>(b, o.guard_tokens));
  const uint32_t budget = replica_budget(o.replicate_share, m.n_neurons);
  const std::vector<ReplicaCandidate> c = replica_candidates(m, tm_build, primary, cost, 0, &r.cache, budget);
  CHECK(r.order == insert_replicas(primary, c, r.replicas));
  // Changing the validation tokens leaves the candidates alone (they never read them).
  LayerMask m2 = m;
  for (uint64_t t = b; t < m.n_tokens; ++t)
    for (uint32_t v = 0; v < 40; ++v) m2.set(v, t);
  CHECK(replica_candidates(m2, TokenMajorMask(m2, 0, std::min<uint64_t>(b, o.guard_tokens)), primary, cost, 0, &r.cache,
                           budget)
            .size() == c.size());
  // Independently measured on the validation tokens, the kept level is no worse than none and than every other.
  EvalConfig ev = cost.exact;
  ev.token_begin = b;
  ev.token_end = m.n_tokens;
  const double kept = evaluate_layer(m, r.order, ev, 0, &r.cache).io_seconds;
  CHECK(kept <= evaluate_layer(m, primary, ev, 0, &r.cache).io_seconds);
  for (uint32_t div : {4u, 2u, 1u})
    CHECK(kept <= evaluate_layer(m, insert_replicas(primary, c, budget / div), ev, 0, &r.cache).io_seconds);
  CHECK(r.replicate_summary.find("kept") != std::string::npos);
  CHECK(r.replicas > 0);  // on this trace a level with copies wins (deterministic: 51 of 102)
}
