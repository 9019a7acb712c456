// Option groups shared by nl-layout solve and eval: the device objective (device, gap, cache, bundle size).
#pragma once
#include <string>

#include "cli/common.h"
#include "layout/evaluate.h"

namespace nl::cli {

struct DeviceObjectiveArgs {
  std::string device;            // path; empty = built-in UFS 4.0
  std::string gap = "auto";
  double cache_ratio = 0.05;
  uint64_t bundle_bytes = 0;     // 0 = from the layer width
  uint32_t window = 0;
  double run_admit_prob = 0.125;
  uint32_t isolated_max = 1;
  bool plain_s3fifo = false;
};

void add_device_objective_options(CLI::App& c, DeviceObjectiveArgs& a);
// Fills eval config from the options (loads the device profile).
EvalConfig eval_config_from(const DeviceObjectiveArgs& a);

}  // namespace nl::cli
