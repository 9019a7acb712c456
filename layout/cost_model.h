// The one objective of every layout search: the I/O time the runtime pays for a layer's reads, from (device profile,
// planner rule, bundle bytes, cache). Exact: the runtime's own read planner and cache over tokens (`exact`, what
// layout/evaluate.h runs and what greedy+ls chooses candidates by). Fast estimates for the searches, all derived
// here from the same a, B, block size and merge gap: the local search's window saving (layout/local_search.h), the
// pinned-set cost (layout/pins.h) and the one-read span cost (layout/span.h). To change the objective, change this
// file (docs/solvers.md, "How to change the objective").
#pragma once
#include <algorithm>
#include <cstdint>

#include "layout/evaluate.h"
#include "runtime/device.h"
#include "runtime/plan/read_plan.h"

namespace nl {

struct CostModel {
  // The exact measure: the device, the planner rule (gap), the bundle size and the cache the runtime runs with.
  EvalConfig exact;
  // The estimates' parameters, from `exact` by cost_model() (tests may set them directly).
  double read_us = default_device().cost.read_latency_us;        // a: one more read
  double bandwidth_MBps = default_device().cost.bandwidth_MBps;  // B
  uint64_t bundle_bytes = 16384;                                 // one neuron's bundle on flash
  uint64_t block_bytes = 4096;                                   // reads start and end on these
  uint32_t merge_gap = 2;       // the widest gap (bundles) the planner reads through, block alignment ignored
  uint32_t cache_capacity = 0;  // bundles the cache holds at exact.cache_ratio

  double bundle_us() const { return double(bundle_bytes) / bandwidth_MBps; }  // bytes / (MB/s) = us
  double us_per_byte() const { return 1.0 / bandwidth_MBps; }
  // Two needed slots d apart (d - 1 slots between, none needed): what reading them in one read saves against two
  // reads when the planner merges them (d - 1 <= merge_gap): a read, less the gap's bundles. The search's window terms.
  double merge_saving_us(uint32_t d) const { return read_us - double(d - 1) * bundle_us(); }
  // The cost between consecutive needed slots with `gap` slots between: nothing when adjacent, the cheaper of reading
  // the gap and one more read when the planner merges across it, else one more read. The pinned-set estimate.
  double link_us(uint32_t gap) const {
    if (gap == 0) return 0;
    return gap <= merge_gap ? std::min(double(gap) * bundle_us(), read_us) : read_us;
  }
  // One read from slot lo to slot hi (inclusive), block-aligned with slot 0 at a block start. The span estimate.
  double span_read_us(uint32_t lo, uint32_t hi) const {
    return read_us + double(span_end_byte(hi) - span_begin_byte(lo)) * us_per_byte();
  }
  // Where such a read starts when its first slot is lo, and ends when its last slot is hi.
  uint64_t span_begin_byte(uint32_t lo) const { return uint64_t(lo) * bundle_bytes / block_bytes * block_bytes; }
  uint64_t span_end_byte(uint32_t hi) const {
    return ((uint64_t(hi) + 1) * bundle_bytes + block_bytes - 1) / block_bytes * block_bytes;
  }
};

// The read planner of the runtime for a layer of n_neurons under cfg (the evaluator's and nl-run's).
PlannerConfig planner_config(const EvalConfig& cfg, uint32_t n_neurons);

// The cost model of a layer of n_neurons under cfg (a bundle_bytes of 0: default_bundle_bytes of the layer).
CostModel cost_model(const EvalConfig& cfg, uint32_t n_neurons);

}  // namespace nl
