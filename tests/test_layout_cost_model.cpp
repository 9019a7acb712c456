// The one objective (layout/cost_model.h): the estimates every search uses come from the same device, planner rule,
// bundle size and cache as the exact measure (the runtime's planner), and agree with it where they claim to.
#include <doctest/doctest.h>

#include "layout/cost_model.h"
#include "runtime/plan/slot_cache.h"

using namespace nl;

TEST_CASE("the cost model's merge gap, capacity and exact measure are the runtime planner's") {
  for (const char* gap : {"auto", "auto-keep-runs", "off", "3"}) {
    for (uint64_t bundle : {0ull, 172ull, 4096ull, 16384ull, 24576ull}) {
      EvalConfig ec;
      ec.device = default_device();
      ec.gap = GapPolicy::parse(gap);
      ec.cache_ratio = 0.05;
      ec.bundle_bytes = bundle;
      const uint32_t n = 11008;
      const CostModel c = cost_model(ec, n);
      CAPTURE(gap);
      CAPTURE(bundle);
      const uint64_t want_bundle = bundle ? bundle : default_bundle_bytes(n);
      CHECK(c.bundle_bytes == want_bundle);
      CHECK(c.exact.bundle_bytes == want_bundle);
      CHECK(c.merge_gap == ReadPlanner(planner_config(c.exact, n)).merge_gap_bundles());
      if (std::string(gap) == "auto") CHECK(c.merge_gap == auto_gap_bundles(ec.device.cost, want_bundle));
      CHECK(c.cache_capacity == cache_capacity_for_ratio(0.05, n));
      CHECK(c.read_us == ec.device.cost.read_latency_us);
      CHECK(c.bundle_us() == doctest::Approx(double(want_bundle) / ec.device.cost.bandwidth_MBps));
    }
  }
}

TEST_CASE("two needed slots: the estimates equal the planner's I/O time when bundles fill blocks") {
  EvalConfig ec;
  ec.device = default_device();
  ec.gap = GapPolicy::parse("auto");
  ec.bundle_bytes = 4096;  // one block each: no alignment padding
  const uint32_t n = 4096;
  const CostModel c = cost_model(ec, n);
  REQUIRE(c.merge_gap >= 1);
  const ReadPlanner planner(planner_config(c.exact, n));
  TokenPlan p;
  for (uint32_t gap = 0; gap <= c.merge_gap + 3; ++gap) {
    planner.plan(std::vector<uint32_t>{10, 11 + gap}, nullptr, p);
    const double planner_us = p.io_seconds(ec.device.cost) * 1e6;
    CAPTURE(gap);
    // Pins' estimate: a read for the first, a bundle each, and the link between them.
    CHECK(planner_us == doctest::Approx(c.read_us + 2 * c.bundle_us() + c.link_us(gap)));
    // The search's saving against one read per needed slot, where the planner merges.
    if (gap <= c.merge_gap)
      CHECK(planner_us == doctest::Approx(2 * (c.read_us + c.bundle_us()) - c.merge_saving_us(gap + 1)));
    // The span estimate: one read from the first to the last slot.
    if (gap <= c.merge_gap) CHECK(planner_us == doctest::Approx(c.span_read_us(10, 11 + gap)));
  }
}
