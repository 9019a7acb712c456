#include "cli/layout_options.h"

#include <algorithm>
#include <stdexcept>

#include "formats/core/error.h"

namespace nl::cli {

// "all" or a comma list of indices and ranges ("0,3,5-7").
std::vector<uint32_t> parse_layers(const std::string& spec, uint32_t n_layers) {
  std::vector<uint32_t> out;
  if (spec == "all") {
    for (uint32_t l = 0; l < n_layers; ++l) out.push_back(l);
    return out;
  }
  size_t pos = 0;
  while (pos <= spec.size()) {
    size_t comma = spec.find(',', pos);
    std::string item = spec.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    size_t dash = item.find('-');
    try {
      size_t used = 0;
      uint64_t a = std::stoull(dash == std::string::npos ? item : item.substr(0, dash), &used);
      uint64_t b = dash == std::string::npos ? a : std::stoull(item.substr(dash + 1));
      if (a > b) throw UsageError("--layers: empty range '" + item + "'");
      if (b >= n_layers)
        throw UsageError("--layers: layer " + std::to_string(b) + " out of range (trace has " +
                         std::to_string(n_layers) + " layers)");
      for (uint64_t l = a; l <= b; ++l) out.push_back(uint32_t(l));
    } catch (const std::logic_error&) {
      throw UsageError("--layers: cannot parse '" + item + "' (use all, or e.g. 0,3,5-7)");
    }
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

void add_device_objective_options(CLI::App& c, DeviceObjectiveArgs& a) {
  const char* grp = "Device objective";
  c.add_option("--device", a.device, "Device profile JSON (default: built-in UFS 4.0 = configs/devices/ufs40.json)")
      ->check(CLI::ExistingFile)
      ->group(grp);
  c.add_option("--gap", a.gap,
               "Gap merging: off, auto (device cost model; cached slots inside a run are a gap too), auto-keep-runs "
               "(the paper's rule: the cache never splits a run) or N bundles")
      ->group(grp);
  c.add_option("--cache-ratio", a.cache_ratio, "Cache size as a fraction of each layer's FFN bytes")
      ->check(CLI::Range(0.0, 1.0))
      ->group(grp);
  c.add_option("--bundle-bytes", a.bundle_bytes, "Bytes per neuron bundle (default: from the layer width)")
      ->check(CLI::Range(uint64_t(1), uint64_t(1) << 30))
      ->group(grp);
  c.add_option("--window", a.window, "Sliding window: neurons active in the last K tokens stay resident")
      ->check(CLI::Range(0u, 1000000u))
      ->group(grp);
  c.add_option("--run-admit-prob", a.run_admit_prob, "Linking-aligned admission probability inside longer reads")
      ->check(CLI::Range(0.0, 1.0))
      ->group(grp);
  c.add_option("--isolated-max", a.isolated_max, "Reads of at most this many bundles admit normally")
      ->check(CLI::Range(0u, 1u << 20))
      ->group(grp);
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
