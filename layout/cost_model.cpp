#include "layout/cost_model.h"

#include "runtime/memory.h"
#include "runtime/plan/slot_cache.h"

namespace nl {

PlannerConfig planner_config(const EvalConfig& cfg, uint32_t n_neurons) {
  PlannerConfig pc;
  pc.n_slots = n_neurons;
  pc.bundle_bytes = cfg.bundle_bytes ? cfg.bundle_bytes : default_bundle_bytes(n_neurons);
  pc.block_bytes = cfg.device.block_bytes;
  pc.gap = cfg.gap;
  pc.cost = cfg.device.cost;
  pc.max_read_bytes = ffn_batch_staging_bytes(pc.bundle_bytes);  // nl-run's default staging: its pieces are reads
  return pc;
}

CostModel cost_model(const EvalConfig& cfg, uint32_t n_neurons) {
  CostModel c;
  c.exact = cfg;
  if (c.exact.bundle_bytes == 0) c.exact.bundle_bytes = default_bundle_bytes(n_neurons);
  c.read_us = cfg.device.cost.read_latency_us;
  c.bandwidth_MBps = cfg.device.cost.bandwidth_MBps;
  c.bundle_bytes = c.exact.bundle_bytes;
  c.block_bytes = cfg.device.block_bytes;
  c.merge_gap = ReadPlanner(planner_config(c.exact, n_neurons)).merge_gap_bundles();
  c.cache_capacity = cache_capacity_for_ratio(cfg.cache_ratio, n_neurons);
  return c;
}

}  // namespace nl
