#include "cli/layout_options.h"

namespace nl::cli {

void add_device_objective_options(CLI::App& c, DeviceObjectiveArgs& a) {
  const char* grp = "Device objective";
  c.add_option("--device", a.device, "Device profile JSON (default: built-in UFS 4.0 = configs/devices/ufs40.json)")
      ->check(CLI::ExistingFile)->group(grp);
  c.add_option("--gap", a.gap, "Gap merging: off, auto (device cost model) or N bundles")->group(grp);
  c.add_option("--cache-ratio", a.cache_ratio, "Cache size as a fraction of each layer's FFN bytes")
      ->check(CLI::Range(0.0, 1.0))->group(grp);
  c.add_option("--bundle-bytes", a.bundle_bytes, "Bytes per neuron bundle (default: from the layer width)")
      ->check(CLI::Range(uint64_t(1), uint64_t(1) << 30))->group(grp);
  c.add_option("--window", a.window, "Sliding window: neurons active in the last K tokens stay resident")
      ->check(CLI::Range(0u, 1000000u))->group(grp);
  c.add_option("--run-admit-prob", a.run_admit_prob, "Linking-aligned admission probability inside longer reads")
      ->check(CLI::Range(0.0, 1.0))->group(grp);
  c.add_option("--isolated-max", a.isolated_max, "Reads of at most this many bundles admit normally")
      ->check(CLI::Range(0u, 1u << 20))->group(grp);
  c.add_flag("--plain-s3fifo", a.plain_s3fifo, "Admit every miss (no linking-aligned admission)")->group(grp);
}

EvalConfig eval_config_from(const DeviceObjectiveArgs& a) {
  EvalConfig e;
  e.device = a.device.empty() ? default_device() : device_load(a.device);
  e.gap = GapPolicy::parse(a.gap);
  e.cache_ratio = a.cache_ratio;
  e.bundle_bytes = a.bundle_bytes;
  e.cache.window_tokens = a.window;
  e.cache.run_admit_prob = a.run_admit_prob;
  e.cache.isolated_max_bundles = a.isolated_max;
  e.cache.linking_aligned = !a.plain_s3fifo;
  return e;
}

}  // namespace nl::cli
