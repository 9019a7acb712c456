// Option groups shared by nl-layout solve and eval: the device objective (device, gap, cache, bundle size).
#pragma once
#include <string>
#include <vector>

#include "cli/common.h"
#include "formats/trace.h"
#include "layout/evaluate.h"

namespace nl::cli {

struct DeviceObjectiveArgs {
  std::string device;                             // path; empty = built-in UFS 4.0
  std::string gap = GapPolicy{}.to_string();      // auto
  double cache_ratio = 0.05;                      // the CLI's default cache (EvalConfig's own is none)
  uint64_t bundle_bytes = 0;                      // 0 = from the layer width
  std::string bundle_for;                         // a shape or model: bundle bytes as pack stores them
  std::string dtype;                              // with bundle_for: the image dtype (empty = f16)
  uint32_t window = CacheConfig{}.window_tokens;  // cache defaults: runtime/plan/slot_cache.h, not copies
  double run_admit_prob = CacheConfig{}.run_admit_prob;
  uint32_t isolated_max = CacheConfig{}.isolated_max_bundles;
  bool plain_s3fifo = !CacheConfig{}.linking_aligned;
};

void add_device_objective_options(CLI::App& c, DeviceObjectiveArgs& a);
// Fills eval config from the options (loads the device profile). --bundle-for / --dtype give the bundle bytes pack
// stores for that model in that dtype (the one formula, image_bundle_bytes); UsageError for an unknown shape or dtype,
// a dtype the model's width cannot store, or (when `trace` is given) a model whose FFN width differs from the trace's.
EvalConfig eval_config_from(const DeviceObjectiveArgs& a, const TraceInfo* trace);

// --layers: "all" or a comma list of indices and ranges ("0,3,5-7"), sorted, unique; UsageError when out of range.
std::vector<uint32_t> parse_layers(const std::string& spec, uint32_t n_layers);

}  // namespace nl::cli
