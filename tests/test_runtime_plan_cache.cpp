// SlotCache: S3-FIFO bounds and scan resistance, linking-aligned admission, pinned set, sliding window,
// determinism for a seed.
#include <doctest/doctest.h>

#include <algorithm>
#include <random>

#include "formats/core/error.h"
#include "runtime/plan/read_plan.h"
#include "runtime/plan/slot_cache.h"

using namespace nl;

namespace {

ReadPlanner planner(uint32_t n, const char* gap = "off") {
  PlannerConfig c;
  c.n_slots = n;
  c.bundle_bytes = 4096;
  c.gap = GapPolicy::parse(gap);
  c.cost.read_latency_us = 8.14;
  c.cost.bandwidth_MBps = 4267;
  return ReadPlanner(c);
}

// Feeds random tokens; returns the total hits, checking the capacity bound after each token.
uint64_t drive(SlotCache& cache, const ReadPlanner& pl, uint32_t n, uint64_t seed, int tokens) {
  std::mt19937_64 rng(seed);
  TokenPlan p;
  uint64_t hits = 0;
  for (int t = 0; t < tokens; ++t) {
    std::vector<uint32_t> act;
    for (uint32_t s = 0; s < n; ++s)
      if (rng() % 100 < (s < n / 10 ? 60u : 5u)) act.push_back(s);  // a hot tenth
    pl.plan(act, &cache, p);
    hits += p.hits.size();
    REQUIRE(cache.size() <= cache.capacity());
  }
  return hits;
}

}  // namespace

TEST_CASE("capacity from a ratio of FFN bytes") {
  CHECK(cache_capacity_for_ratio(0.05, 16384) == 819);
  CHECK(cache_capacity_for_ratio(0.0, 100) == 0);
  CHECK(cache_capacity_for_ratio(0.1, 10) == 1);
  CHECK_THROWS_AS(cache_capacity_for_ratio(1.5, 10), UsageError);
}

TEST_CASE("S3-FIFO never exceeds capacity, serves hits, and is deterministic for a seed") {
  const uint32_t n = 400;
  ReadPlanner pl = planner(n);
  CacheConfig cc;
  cc.capacity = 40;
  cc.seed = 3;
  SlotCache a(n, cc), b(n, cc);
  uint64_t ha = drive(a, pl, n, 11, 300), hb = drive(b, pl, n, 11, 300);
  CHECK(ha > 0);
  CHECK(ha == hb);
  CHECK(a.admissions() == b.admissions());
  cc.capacity = 0;
  SlotCache none(n, cc);
  CHECK(drive(none, pl, n, 11, 50) == 0);
  CHECK(none.size() == 0);
}

TEST_CASE("S3-FIFO keeps a reused slot through a scan of one-hit slots") {
  const uint32_t n = 1000;
  ReadPlanner pl = planner(n);
  CacheConfig cc;
  cc.capacity = 20;
  cc.linking_aligned = false;
  SlotCache c(n, cc);
  TokenPlan p;
  // Slot 0 is used by every token; slots 2, 4, 6, ... are each used once (a scan).
  for (uint32_t t = 0; t < 400; ++t) pl.plan({0, 2 + 2 * t}, &c, p);
  CHECK(c.resident(0));
  pl.plan({0}, &c, p);
  CHECK(p.hits == std::vector<uint32_t>{0});
}

TEST_CASE("a cache that holds every slot (or every key of a replicated layer) admits every miss") {
  const uint32_t n = 100;
  ReadPlanner pl = planner(n);
  CacheConfig cc;
  cc.run_admit_prob = 0.0;  // linking-aligned would hold back every miss inside a long read
  std::vector<uint32_t> run;
  for (uint32_t s = 20; s < 60; ++s) run.push_back(s);
  TokenPlan p;
  cc.capacity = n;
  SlotCache all(n, cc);
  pl.plan(run, &all, p);
  CHECK(all.admissions() == run.size());
  pl.plan(run, &all, p);
  CHECK(p.reads.empty());  // every neuron read once, then served from DRAM
  cc.capacity = n - 1;     // one slot short: linking-aligned as configured
  SlotCache short_one(n, cc);
  pl.plan(run, &short_one, p);
  CHECK(short_one.admissions() == 0);
  // Replicated: 100 slots, 90 keys (slots 90..99 are second copies of 0..9); 90 entries hold every key.
  cc.capacity = 90;
  cc.alias.resize(n);
  for (uint32_t s = 0; s < n; ++s) cc.alias[s] = s < 90 ? s : s - 90;
  SlotCache keys(n, cc);
  pl.plan(run, &keys, p);
  CHECK(keys.admissions() == run.size());
}

TEST_CASE("linking-aligned admission: isolated misses admitted, misses inside long reads held back") {
  const uint32_t n = 100;
  ReadPlanner pl = planner(n);
  CacheConfig cc;
  cc.capacity = 50;
  cc.run_admit_prob = 0.0;
  SlotCache c(n, cc);
  TokenPlan p;
  pl.plan({10, 20, 21, 22, 23, 40}, &c, p);
  CHECK(c.resident(10));
  CHECK(c.resident(40));
  for (uint32_t s = 20; s < 24; ++s) CHECK_FALSE(c.resident(s));
  CHECK(c.admissions() == 2);
  CHECK(c.rejections() == 4);

  cc.isolated_max_bundles = 4;  // reads of up to 4 bundles count as isolated
  SlotCache d(n, cc);
  pl.plan({20, 21, 22, 23}, &d, p);
  CHECK(d.resident(21));

  cc.isolated_max_bundles = 1;
  cc.run_admit_prob = 0.5;  // probabilistic: some but not all, same answer for the same seed
  int admitted[2] = {0, 0};
  for (int rep = 0; rep < 2; ++rep) {
    SlotCache e(n, cc);
    std::vector<uint32_t> run;
    for (uint32_t s = 0; s < 40; ++s) run.push_back(s);
    pl.plan(run, &e, p);
    admitted[rep] = int(e.admissions());
  }
  CHECK(admitted[0] > 5);
  CHECK(admitted[0] < 35);
  CHECK(admitted[0] == admitted[1]);
}

TEST_CASE("pinned slots stay resident and count against capacity") {
  const uint32_t n = 100;
  ReadPlanner pl = planner(n);
  CacheConfig cc;
  cc.capacity = 5;
  cc.pinned = {1, 3, 5};
  SlotCache c(n, cc);
  CHECK(c.size() == 3);
  TokenPlan p;
  for (uint32_t t = 0; t < 200; ++t) pl.plan({1, 10 + (t % 80)}, &c, p);
  CHECK(c.resident(1));
  CHECK(c.resident(3));
  CHECK(c.resident(5));
  CHECK(c.size() <= 5);
  CHECK_THROWS_AS(SlotCache(n, CacheConfig{.capacity = 2, .pinned = {200}}), UsageError);
  CHECK_FALSE(c.all_pinned());
}

TEST_CASE("all_pinned: only a cache whose every key is pinned says its residency never changes") {
  const uint32_t n = 10;
  CacheConfig cc;
  cc.capacity = n;
  for (uint32_t s = 0; s + 1 < n; ++s) cc.pinned.push_back(s);
  CHECK_FALSE(SlotCache(n, cc).all_pinned());  // one slot left to S3-FIFO
  cc.pinned.push_back(n - 1);
  CHECK(SlotCache(n, cc).all_pinned());
  cc.capacity = n - 1;  // pinned beyond capacity are not held
  CHECK_FALSE(SlotCache(n, cc).all_pinned());
  // Replicated: slots 8, 9 are second copies of 0, 1; pinning the 8 keys pins the layer.
  cc.capacity = 8;
  cc.alias = {0, 1, 2, 3, 4, 5, 6, 7, 0, 1};
  cc.pinned = {0, 1, 2, 3, 4, 5, 6, 7};
  CHECK(SlotCache(n, cc).all_pinned());
  cc.pinned.pop_back();
  CHECK_FALSE(SlotCache(n, cc).all_pinned());
}

TEST_CASE("a recorded small_fraction sizes S3-FIFO's small queue: neurons back one token later are hits") {
  // Each set of 5 neurons is active at two consecutive tokens, then never again. A small queue of 1 slot (10 % of
  // 10) keeps only the newest miss, so most second accesses miss; one of 5 slots keeps the whole set.
  ReadPlanner pl = planner(100);
  uint64_t hits[2] = {0, 0};
  for (int k = 0; k < 2; ++k) {
    const double sf = k == 0 ? 0.0 : 0.5;
    CacheConfig cc;
    cc.capacity = 10;
    cache_apply_policy(cc, CacheAdmission::kAll, {}, sf);
    CHECK(cc.small_fraction == (sf == 0 ? 0.10 : 0.5));  // 0 = nothing recorded: S3-FIFO's 10 % stays
    SlotCache c(100, cc);
    TokenPlan p;
    for (uint32_t t = 0; t < 200; ++t) {
      std::vector<uint32_t> act;
      for (uint32_t i = 0; i < 5; ++i) act.push_back((t / 2 * 5 + i) % 100);
      std::sort(act.begin(), act.end());
      for (uint32_t s : act) hits[k] += c.resident(s);
      pl.plan(act, &c, p);
    }
  }
  MESSAGE("hits over 200 tokens: small FIFO 10 % " << hits[0] << ", 50 % " << hits[1]);
  CHECK(hits[1] == 500);  // every second access
  CHECK(hits[0] < hits[1]);
  CacheConfig bad;
  CHECK_THROWS_AS(cache_apply_policy(bad, CacheAdmission::kUnset, {}, 1.0), UsageError);
  CHECK_THROWS_AS(cache_apply_policy(bad, CacheAdmission::kUnset, {}, -0.1), UsageError);
}

TEST_CASE("a recorded cache policy: admission overrides the setting, pinned slots hottest first up to capacity") {
  CacheConfig cc;
  cache_apply_policy(cc, CacheAdmission::kAll, {9, 4, 7});
  CHECK_FALSE(cc.linking_aligned);
  CHECK(cc.pinned == std::vector<uint32_t>{9, 4, 7});
  cache_apply_policy(cc, CacheAdmission::kLinkingAligned, {});
  CHECK(cc.linking_aligned);
  CHECK(cc.run_admit_prob == 0.125);
  CacheConfig iso;
  cache_apply_policy(iso, CacheAdmission::kIsolated, {});  // linking-aligned with no admission inside longer reads
  CHECK(iso.linking_aligned);
  CHECK(iso.run_admit_prob == 0.0);
  {
    ReadPlanner pl = planner(100);
    iso.capacity = 50;
    SlotCache c(100, iso);
    TokenPlan p;
    std::vector<uint32_t> run;
    for (uint32_t s = 0; s < 40; ++s) run.push_back(s);
    run.push_back(60);
    pl.plan(run, &c, p);
    CHECK(c.admissions() == 1);  // only slot 60, read alone
    CHECK(c.resident(60));
  }
  CacheConfig keep;
  keep.linking_aligned = false;
  cache_apply_policy(keep, CacheAdmission::kUnset, {1});
  CHECK_FALSE(keep.linking_aligned);             // kUnset = nothing recorded: the caller's setting stays
  CacheAdmission parsed = CacheAdmission::kAll;  // names are parsed where files and options are read
  CHECK_FALSE(cache_admission_parse("lru", &parsed));
  CHECK_FALSE(cache_admission_parse("", &parsed));
  CHECK(parsed == CacheAdmission::kAll);
  for (CacheAdmission r : kCacheAdmissionRules)
    CHECK((cache_admission_parse(cache_admission_name(r), &parsed) && parsed == r));
  cc.capacity = 2;  // more pinned than capacity: the first (hottest) ones are held
  SlotCache c(20, cc);
  CHECK(c.resident(9));
  CHECK(c.resident(4));
  CHECK_FALSE(c.resident(7));
  CHECK(c.size() == 2);
}

TEST_CASE("sliding window keeps the last k tokens' neurons resident") {
  const uint32_t n = 50;
  ReadPlanner pl = planner(n);
  CacheConfig cc;
  cc.window_tokens = 2;
  SlotCache c(n, cc);
  TokenPlan p;
  pl.plan({7}, &c, p);  // token 0: miss
  CHECK(p.needed == 1);
  pl.plan({7}, &c, p);  // token 1: in the window
  CHECK(p.hits == std::vector<uint32_t>{7});
  pl.plan({8}, &c, p);  // token 2: 7 still within the last 2 tokens
  CHECK(c.resident(7));
  CHECK(c.window_resident() == 2);
  pl.plan({9}, &c, p);  // token 3: 7 last active at token 1 -> out
  CHECK_FALSE(c.resident(7));
  CHECK(c.resident(8));
}

TEST_CASE("value cache: read alone before a read's end before inside a read before idle, hotter first, in capacity") {
  // Gap off: two active slots are one read exactly when adjacent. Token 1: 5, 50 and 70 are read alone, 20 and 22
  // end a read, 21 is inside it. Hotness order 50, 20, 21, 22, 5; 70 is not listed (after every listed slot).
  const uint32_t n = 100;
  ReadPlanner pl = planner(n);
  CacheConfig cc;
  cache_apply_policy(cc, CacheAdmission::kValue, {}, 0, {50, 20, 21, 22, 5});
  CHECK(cc.value);
  auto held = [](const SlotCache& c, uint32_t n_slots) {
    std::vector<uint32_t> r;
    for (uint32_t s = 0; s < n_slots; ++s)
      if (c.resident(s)) r.push_back(s);
    return r;
  };
  const std::vector<uint32_t> t1 = {5, 20, 21, 22, 50, 70};
  TokenPlan p;
  cc.capacity = 3;
  SlotCache c3(n, cc);
  pl.plan(t1, &c3, p);
  CHECK(held(c3, n) == std::vector<uint32_t>{5, 50, 70});  // the three read alone
  CHECK(c3.admissions() == 3);
  CHECK(c3.rejections() == 3);
  cc.capacity = 4;
  SlotCache c4(n, cc);
  pl.plan(t1, &c4, p);
  CHECK(held(c4, n) == std::vector<uint32_t>{5, 20, 50, 70});  // then the hotter read end
  // Token 2: 20 and 21 form a read (20 resident at its end: a hit); 5, 50, 70 are held but idle. Kept: 20 and 21
  // (both at a read's end now), then the hotter idle ones, 50 and 5; 70 goes.
  pl.plan({20, 21}, &c4, p);
  CHECK(p.hits == std::vector<uint32_t>{20});
  CHECK(held(c4, n) == std::vector<uint32_t>{5, 20, 21, 50});
  CHECK(c4.size() == 4);
  // Token 3: a hit that falls to the bottom class is dropped after the token (its bytes serve this token only).
  pl.plan({19, 20, 21, 22, 60, 61, 62, 63}, &c4, p);
  CHECK(c4.size() == 4);
  CHECK_FALSE(c4.resident(20));  // inside the read 19-22 now; 50 and 5 (idle) rank below the read ends 19, 22, 60, 63
  CHECK(held(c4, n) == std::vector<uint32_t>{19, 22, 60, 63});
  // Pinned slots stay and count against the capacity; the value part gets the rest.
  SlotCache cp(n, [&] {
    CacheConfig x = cc;
    x.pinned = {99};
    return x;
  }());
  pl.plan(t1, &cp, p);
  CHECK(held(cp, n) == std::vector<uint32_t>{5, 50, 70, 99});
  pl.plan({1, 3, 7, 9, 11}, &cp, p);  // five read alone, none listed: the lowest slots win the tie
  CHECK(held(cp, n) == std::vector<uint32_t>{1, 3, 7, 99});
  // Random tokens: never above capacity, deterministic, and it serves hits.
  cc.capacity = 40;
  SlotCache a(400, cc), b(400, cc);
  ReadPlanner p400 = planner(400, "auto");
  const uint64_t ha = drive(a, p400, 400, 5, 300), hb = drive(b, p400, 400, 5, 300);
  CHECK(ha == hb);
  CHECK(ha > 0);
  CacheConfig bad_hot;
  bad_hot.capacity = 2;
  bad_hot.value = true;
  bad_hot.hot = {200};
  CHECK_THROWS_AS(SlotCache(n, bad_hot), UsageError);
}
