#include "cli/layout_options.h"

#include <algorithm>
#include <filesystem>
#include <stdexcept>

#include "formats/core/error.h"
#include "formats/core/image_writer.h"
#include "formats/core/synthetic_models.h"
#include "formats/model_source.h"

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
    const size_t dash = item.find('-');
    const std::string what = "--layers '" + item + "' (use all, or e.g. 0,3,5-7)";
    const uint64_t a = parse_uint_arg(what, dash == std::string::npos ? item : item.substr(0, dash));
    const uint64_t b = dash == std::string::npos ? a : parse_uint_arg(what, item.substr(dash + 1));
    if (a > b) throw UsageError("--layers: empty range '" + item + "'");
    if (b >= n_layers)
      throw UsageError("--layers: layer " + std::to_string(b) + " out of range (trace has " + std::to_string(n_layers) +
                       " layers)");
    for (uint64_t l = a; l <= b; ++l) out.push_back(uint32_t(l));
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
  auto* bytes =
      c.add_option("--bundle-bytes", a.bundle_bytes,
                   "Bytes per neuron bundle (default: --bundle-for's, else from the layer width assuming f16)")
          ->check(CLI::Range(uint64_t(1), uint64_t(1) << 30))
          ->group(grp);
  auto* bfor =
      c.add_option("--bundle-for", a.bundle_for,
                   "Price bundles as nl-layout pack stores this model: a llama2.c / Hugging Face model path, a "
                   "--synthetic-shape name or DIMxHIDDEN[xplain|xgated] (with --dtype)")
          ->group(grp);
  c.add_option("--dtype", a.dtype, "With --bundle-for: the image dtype the layout is for (default f16)")
      ->needs(bfor)
      ->group(grp);
  bytes->excludes(bfor);
  c.add_option("--cache-window,--window", a.window,
               "Sliding window: neurons active in the last K tokens stay resident (nl-run's --cache-window; "
               "--window is the former name)")
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

namespace {

// --bundle-for / --dtype: the bundle bytes and FFN neurons per layer of that model in that dtype.
struct BundleFor {
  uint64_t bytes = 0;
  uint32_t hidden = 0;
};
BundleFor bundle_for_resolve(const DeviceObjectiveArgs& a) {
  ImageDtype dt = ImageDtype::kF16;
  if (!a.dtype.empty() && !image_dtype_parse(a.dtype, &dt)) throw UsageError("unknown --dtype " + a.dtype);
  ModelConfig c;
  BundleKind kind = BundleKind::kGated;
  SyntheticFfnShape s;
  if (synthetic_ffn_shape_parse(a.bundle_for, &s)) {
    c.dim = s.dim;
    c.hidden_dim = s.hidden;
    kind = s.kind;
  } else if (std::error_code ec; std::filesystem::exists(a.bundle_for, ec)) {
    c = open_model_source(a.bundle_for)->config();  // the header only
    kind = bundle_kind_of(c);                       // as pack writes it: OPT and Phi have two-vector bundles
  } else {
    throw UsageError("--bundle-for " + a.bundle_for + ": no such model file or folder, and not " +
                     synthetic_shape_names() + " or DIMxHIDDEN[xplain|xgated]");
  }
  if (!image_row_len_ok(dt, size_t(c.dim)))
    throw UsageError("--dtype " + std::string(image_dtype_name(dt)) + " cannot store " + a.bundle_for + ": dim " +
                     std::to_string(c.dim) + " is not a multiple of " + std::to_string(kImageQuantBlock));
  return {image_bundle_bytes(dt, kind, size_t(c.dim)), uint32_t(c.hidden_dim)};
}

}  // namespace

EvalConfig eval_config_from(const DeviceObjectiveArgs& a, const TraceInfo* trace) {
  EvalConfig e;
  e.device = a.device.empty() ? default_device() : device_load(a.device);
  e.gap = GapPolicy::parse(a.gap);
  e.cache_ratio = a.cache_ratio;
  e.bundle_bytes = a.bundle_bytes;
  if (!a.bundle_for.empty()) {
    const BundleFor b = bundle_for_resolve(a);
    e.bundle_bytes = b.bytes;
    for (size_t l = 0; trace && l < trace->n_neurons.size(); ++l)
      if (trace->n_neurons[l] != b.hidden)
        throw UsageError("--bundle-for " + a.bundle_for + " has " + std::to_string(b.hidden) +
                         " FFN neurons per layer, " + trace->path + " layer " + std::to_string(l) + " has " +
                         std::to_string(trace->n_neurons[l]));
  }
  e.cache.window_tokens = a.window;
  e.cache.run_admit_prob = a.run_admit_prob;
  e.cache.isolated_max_bundles = a.isolated_max;
  e.cache.linking_aligned = !a.plain_s3fifo;
  return e;
}

}  // namespace nl::cli
