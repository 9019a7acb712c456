// Read planner: runs, gap merging (off / fixed / auto), cache trimming that never fragments a run under off / N /
// auto-keep-runs, cost-based splitting around cached slots under auto, alignment.
#include <doctest/doctest.h>

#include <algorithm>
#include <random>
#include <set>

#include "formats/core/error.h"
#include "runtime/plan/read_plan.h"
#include "runtime/plan/slot_cache.h"

using namespace nl;

namespace {

CostFit ufs40() {
  CostFit c;
  c.read_latency_us = 8.14;
  c.bandwidth_MBps = 4267;
  return c;
}

PlannerConfig cfg(uint32_t n, uint64_t bundle, GapPolicy gap, uint32_t block = 4096) {
  PlannerConfig c;
  c.n_slots = n;
  c.bundle_bytes = bundle;
  c.block_bytes = block;
  c.gap = gap;
  c.cost = ufs40();
  return c;
}

std::vector<std::pair<uint32_t, uint32_t>> spans(const TokenPlan& p) {
  std::vector<std::pair<uint32_t, uint32_t>> v;
  for (const auto& r : p.reads) v.emplace_back(r.slot_begin, r.slot_end);
  return v;
}

using Spans = std::vector<std::pair<uint32_t, uint32_t>>;

// Ascending slots < n, each drawn with one random probability for the whole set.
std::vector<uint32_t> random_slots(uint32_t n, std::mt19937_64& rng) {
  std::vector<uint32_t> out;
  const double p_on = double(rng() % 100) / 100.0;
  for (uint32_t s = 0; s < n; ++s)
    if (double(rng() % 1000) / 1000.0 < p_on) out.push_back(s);
  return out;
}

}  // namespace

TEST_CASE("gap policy parsing") {
  CHECK(GapPolicy::parse("off").mode == GapMode::Off);
  CHECK(GapPolicy::parse("auto").mode == GapMode::Auto);
  CHECK(GapPolicy::parse("auto").resident_gaps);
  CHECK(GapPolicy::parse("auto-keep-runs").mode == GapMode::Auto);
  CHECK_FALSE(GapPolicy::parse("auto-keep-runs").resident_gaps);
  CHECK(GapPolicy::parse("auto-keep-runs").to_string() == "auto-keep-runs");
  CHECK(GapPolicy::parse("auto").to_string() == "auto");
  CHECK_THROWS_AS(GapPolicy::parse("auto-keep"), UsageError);
  CHECK(GapPolicy::parse("0").mode == GapMode::Off);
  GapPolicy g = GapPolicy::parse("3");
  CHECK(g.mode == GapMode::Fixed);
  CHECK(g.bundles == 3);
  CHECK(g.to_string() == "3");
  CHECK_THROWS_AS(GapPolicy::parse("-1"), UsageError);
  CHECK_THROWS_AS(GapPolicy::parse("two"), UsageError);
  CHECK_THROWS_AS(GapPolicy::parse(""), UsageError);
}

TEST_CASE("maximal runs without merging, and fixed gaps") {
  std::vector<uint32_t> act = {1, 2, 3, 7, 9, 10};
  TokenPlan p;
  ReadPlanner(cfg(16, 4096, GapPolicy::parse("off"))).plan(act, nullptr, p);
  CHECK(spans(p) == Spans{{1, 4}, {7, 8}, {9, 11}});
  CHECK(p.needed == 6);
  CHECK(p.bytes_read == 6 * 4096);
  CHECK(p.reads[0].offset == 4096);
  CHECK(p.reads[0].length == 3 * 4096);

  ReadPlanner(cfg(16, 4096, GapPolicy::parse("1"))).plan(act, nullptr, p);
  CHECK(spans(p) == Spans{{1, 4}, {7, 11}});
  CHECK(p.bundles_read == 3 + 4);
  CHECK(p.reads[1].needed == 3);
  ReadPlanner(cfg(16, 4096, GapPolicy::parse("3"))).plan(act, nullptr, p);
  CHECK(spans(p) == Spans{{1, 11}});
  CHECK(p.needed == 6);
}

TEST_CASE("auto gap merges while the gap costs less than one read (a*B bytes)") {
  // UFS 4.0: a*B = 8.14 us * 4267 MB/s = 34,733 bytes: with 16 KiB bundles gaps of up to 2 bundles merge.
  CHECK(auto_gap_bundles(ufs40(), 16384) == 2);
  CHECK(auto_gap_bundles(ufs40(), 24576) == 1);
  CHECK(auto_gap_bundles(ufs40(), 40000) == 0);
  ReadPlanner pl(cfg(64, 16384, GapPolicy::parse("auto")));
  CHECK(pl.merge_gap_bundles() == 2);
  TokenPlan p;
  pl.plan({0, 3}, nullptr, p);  // gap of 2 bundles = 32 KiB < 34.7 KB
  CHECK(spans(p) == Spans{{0, 4}});
  pl.plan({0, 4}, nullptr, p);  // gap of 3 bundles = 48 KiB
  CHECK(spans(p) == Spans{{0, 1}, {4, 5}});
  CHECK(p.io_seconds(ufs40()) == doctest::Approx(2 * 8.14e-6 + 2 * 16384 / 4267e6));
}

TEST_CASE("reads are block aligned; small bundles sharing a block merge under auto") {
  PlannerConfig c = cfg(100, 1000, GapPolicy::parse("off"));
  c.region_offset = 8192;
  TokenPlan p;
  ReadPlanner(c).plan({0, 1, 5}, nullptr, p);
  REQUIRE(p.reads.size() == 2);
  CHECK(p.reads[0].offset == 8192);
  CHECK(p.reads[0].length == 4096);         // bytes 8192..10192 -> one block
  CHECK(p.reads[1].offset == 8192 + 4096);  // slot 5 = bytes 13192..14192
  CHECK(p.reads[1].length == 4096);
  c.gap = GapPolicy::parse("auto");
  ReadPlanner(c).plan({0, 1, 5}, nullptr, p);
  CHECK(spans(p) == Spans{{0, 6}});  // aligned gap is zero bytes: merging is free
  CHECK(p.bytes_read == 8192);
}

TEST_CASE("planner rejects unsorted or out-of-range input") {
  ReadPlanner pl(cfg(8, 4096, GapPolicy::parse("off")));
  TokenPlan p;
  CHECK_THROWS_AS(pl.plan({3, 2}, nullptr, p), InternalError);
  CHECK_THROWS_AS(pl.plan({2, 2}, nullptr, p), InternalError);
  CHECK_THROWS_AS(pl.plan({8}, nullptr, p), InternalError);
  CHECK_THROWS_AS(ReadPlanner(cfg(8, 0, GapPolicy::parse("off"))), UsageError);
}

TEST_CASE("cache hits trim run ends but never split a run") {
  CacheConfig cc;
  cc.capacity = 8;
  cc.pinned = {2, 4, 10, 11, 20};
  SlotCache cache(32, cc);
  ReadPlanner pl(cfg(32, 4096, GapPolicy::parse("off")));
  TokenPlan p;
  // Runs: [2..5) -> 2 trimmed (hit), 4 inside (read anyway); [10..12) all cached -> no read; [20] hit; [25] miss.
  pl.plan({2, 3, 4, 5, 10, 11, 20, 25}, &cache, p);
  CHECK(spans(p) == Spans{{3, 6}, {25, 26}});
  CHECK(p.hits == std::vector<uint32_t>{2, 10, 11, 20});
  CHECK(p.cached_in_reads == 1);
  CHECK(p.needed == 3);
  CHECK(p.active == 8);
}

TEST_CASE("auto splits a run around cached slots exactly when skipping them costs less than one more read") {
  // 24 KiB bundles on UFS 4.0: one bundle (24,576 B) is cheaper to read through than a read (a*B = 34,733 B);
  // two (49,152 B) are not.
  CacheConfig cc;
  cc.capacity = 6;  // the pinned slots only: planning admits nothing, so both rules see the same contents
  cc.pinned = {3, 10, 11, 20, 21, 22};
  SlotCache cache(40, cc);
  TokenPlan p;
  const std::vector<uint32_t> act = {1, 2, 3, 4, 5, 8, 9, 10, 11, 12, 13, 19, 20, 21, 22};
  ReadPlanner(cfg(40, 24576, GapPolicy::parse("auto"))).plan(act, &cache, p);
  // [1..6): slot 3 read through; [8..14): 10, 11 skipped -> two reads; [19..23): 20-22 trimmed off the end.
  CHECK(spans(p) == Spans{{1, 6}, {8, 10}, {12, 14}, {19, 20}});
  CHECK(p.hits == std::vector<uint32_t>{10, 11, 20, 21, 22});
  CHECK(p.cached_in_reads == 1);
  CHECK(p.needed == 9);
  CHECK(p.bytes_read == 10 * 24576);
  const double split_cost = p.io_seconds(ufs40());
  // The paper's rule keeps every run whole: 10 and 11 are read with their run, the cache only trims run ends.
  ReadPlanner(cfg(40, 24576, GapPolicy::parse("auto-keep-runs"))).plan(act, &cache, p);
  CHECK(spans(p) == Spans{{1, 6}, {8, 14}, {19, 20}});
  CHECK(p.hits == std::vector<uint32_t>{20, 21, 22});
  CHECK(p.cached_in_reads == 3);
  CHECK(p.io_seconds(ufs40()) - split_cost == doctest::Approx(2 * 24576 / 4267e6 - 8.14e-6));
  // Without a cache both rules are the same planner.
  TokenPlan q;
  ReadPlanner(cfg(40, 24576, GapPolicy::parse("auto"))).plan(act, nullptr, p);
  ReadPlanner(cfg(40, 24576, GapPolicy::parse("auto-keep-runs"))).plan(act, nullptr, q);
  CHECK(spans(p) == spans(q));
}

TEST_CASE("auto never costs more than auto-keep-runs for the same cache contents") {
  std::mt19937_64 rng(11);
  for (int iter = 0; iter < 300; ++iter) {
    uint32_t n = 1 + rng() % 400;
    const std::vector<uint32_t> act = random_slots(n, rng);
    CacheConfig cc;
    cc.capacity = n;
    cc.pinned = random_slots(n, rng);
    uint64_t bundle = 1 + rng() % 40000;
    PlannerConfig c = cfg(n, bundle, GapPolicy::parse("auto"));
    c.region_offset = 4096 * (rng() % 3) + (rng() % 2) * 512;
    TokenPlan split, keep;
    SlotCache c1(n, cc), c2(n, cc);  // one plan each, from the same contents
    ReadPlanner(c).plan(act, &c1, split);
    c.gap = GapPolicy::parse("auto-keep-runs");
    ReadPlanner(c).plan(act, &c2, keep);
    CHECK(split.io_seconds(ufs40()) <= keep.io_seconds(ufs40()) + 1e-15);
    CHECK(split.needed == keep.needed);
    CHECK(split.needed + split.hits.size() + split.cached_in_reads == act.size());
    CHECK(split.hits.size() >= keep.hits.size());
  }
}

TEST_CASE("random plans: every needed slot in exactly one read; gap off gives one read per maximal run") {
  std::mt19937_64 rng(7);
  for (int iter = 0; iter < 200; ++iter) {
    uint32_t n = 1 + rng() % 300;
    const std::vector<uint32_t> act = random_slots(n, rng);
    for (const char* gap : {"off", "1", "4", "auto", "auto-keep-runs"}) {
      CacheConfig cc;
      cc.capacity = n / 4;
      for (uint32_t s = 0; s < n; s += 7) cc.pinned.push_back(s);
      SlotCache cache(n, cc);
      uint64_t bundle = 1 + rng() % 20000;
      ReadPlanner pl(cfg(n, bundle, GapPolicy::parse(gap)));
      for (bool with_cache : {false, true}) {
        std::vector<bool> res_before(n);
        for (uint32_t s = 0; s < n; ++s) res_before[s] = cache.resident(s);
        TokenPlan p;
        pl.plan(act, with_cache ? &cache : nullptr, p);
        uint32_t covered = 0;
        for (size_t r = 0; r < p.reads.size(); ++r) {
          CHECK(p.reads[r].slot_begin < p.reads[r].slot_end);
          if (r) CHECK(p.reads[r - 1].slot_end < p.reads[r].slot_begin);
          CHECK(p.reads[r].offset % 4096 == 0);
          CHECK(p.reads[r].length % 4096 == 0);
          CHECK(p.reads[r].offset <= uint64_t(p.reads[r].slot_begin) * bundle);
          CHECK(p.reads[r].offset + p.reads[r].length >= uint64_t(p.reads[r].slot_end) * bundle);
          covered += p.reads[r].needed;
        }
        CHECK(covered == p.needed);
        CHECK(p.needed + p.hits.size() + p.cached_in_reads == act.size());
        for (uint32_t h : p.hits) CHECK((with_cache && res_before[h]));
        if (std::string(gap) == "off" && !with_cache) {
          size_t runs = 0;
          for (size_t i = 0; i < act.size(); ++i)
            if (i == 0 || act[i] != act[i - 1] + 1) ++runs;
          CHECK(p.reads.size() == runs);
          CHECK(p.needed == act.size());
        }
      }
    }
  }
}

TEST_CASE("a read longer than max_read_bytes is issued as block-aligned pieces of whole bundles that each fit") {
  for (uint64_t bundle : {uint64_t(12000), uint64_t(8192), uint64_t(1000)}) {
    CAPTURE(bundle);
    PlannerConfig c = cfg(4000, bundle, GapPolicy::parse("off"));
    c.max_read_bytes = 64 * 1024;
    ReadPlanner p(c);
    std::vector<uint32_t> active;
    for (uint32_t s = 3; s < 3000; ++s) active.push_back(s);  // one run: one planned read
    active.push_back(3500);
    TokenPlan t;
    p.plan(active, nullptr, t);
    REQUIRE(t.reads.size() == 2);
    uint32_t ops = 0;
    uint64_t bytes = 0;
    for (const ReadOp& r : t.reads) {
      uint32_t next = r.slot_begin;
      p.for_each_piece(r, [&](uint32_t sb, uint32_t se, uint64_t off, uint64_t len) {
        CHECK(sb == next);  // consecutive, whole bundles, covering the read
        CHECK(se > sb);
        next = se;
        CHECK(len <= c.max_read_bytes);
        CHECK(off % 4096 == 0);
        CHECK(len % 4096 == 0);
        CHECK(off <= sb * bundle);
        CHECK(off + len >= se * bundle);
        CHECK(off >= r.offset);
        CHECK(off + len <= r.offset + r.length);
        ++ops;
        bytes += len;
      });
      CHECK(next == r.slot_end);
    }
    CHECK(t.ops == ops);
    CHECK(t.bytes_read == bytes);
    const uint64_t per = (c.max_read_bytes - 2 * 4096) / bundle;
    CHECK(ops == 1 + (2997 + per - 1) / per);
    CHECK(t.io_seconds(c.cost) == doctest::Approx(ops * 8.14e-6 + double(bytes) / 4267e6));
  }
  PlannerConfig small = cfg(10, 12000, GapPolicy::parse("off"));
  small.max_read_bytes = 12000 + 4096;  // cannot hold one bundle and its partial blocks
  CHECK_THROWS_AS(ReadPlanner{small}, UsageError);
}
