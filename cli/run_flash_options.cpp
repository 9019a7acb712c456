// Shared nl-run options and the metrics report (cli/run_flash_options.h).
#include "cli/run_flash_options.h"

#include <cstdio>
#include <nlohmann/json.hpp>

#include "formats/core/atomic_file.h"
#include "formats/core/error.h"
#include "runtime/device.h"
#include "runtime/session.h"

namespace nl::cli {

void add_flash_image_options(CLI::App* c, FlashArgs& a) {
  c->add_option("--image", a.image, "Flash image (model.nlw; its manifest is model.nlw.json) or the manifest")
      ->required()
      ->check(CLI::ExistingFile)
      ->group("Image");
  c->add_flag("--verify", a.verify, "Check every region's xxh64 at start-up (reads the whole image once)")
      ->group("Image");
  c->add_flag("--verify-reads", a.verify_reads,
              "Check every bundle read after start-up (xxh3-64) against a table built at start-up from the "
              "checksummed regions (reads the FFN once more at start-up; cost in docs/robustness.md)")
      ->group("Image");
}

void add_flash_io_options(CLI::App* c, FlashArgs& a) {
  c->add_option("--io", a.io, "I/O engine; auto (default): uring where the kernel and this build have it, else pread")
      ->check(CLI::IsMember({"auto", "pread", "preadv", "uring", "mmap"}))
      ->group("I/O");
  c->add_flag("--no-direct", a.buffered, "Buffered reads instead of O_DIRECT")->group("I/O");
  c->add_option("--queue-depth", a.queue_depth, "uring: reads in flight at most")
      ->check(CLI::Range(1, 4096))
      ->group("I/O");
}

void add_flash_plan_options(CLI::App* c, FlashArgs& a) {
  a.gap_opt = c->add_option("--gap", a.gap,
                            "Merge reads across gaps: off | N bundles | auto (needs --device or the manifest's device; "
                            "cached slots inside a run are a gap too) | auto-keep-runs (the cache never splits a run). "
                            "Default: the manifest's planner setting (the layout's), else off")
                  ->group("Reads");
  c->add_option("--device", a.device,
                "Device profile (configs/devices/*.json) for --gap auto (default: the manifest's device fit)")
      ->check(CLI::ExistingFile)
      ->group("Reads");
  a.cache_ratio_opt =
      c->add_option("--cache-ratio", a.cache_ratio,
                    "DRAM cache, fraction of each layer's FFN bytes. Default: the manifest's planner setting, else 0")
          ->check(CLI::Range(0.0, 1.0))
          ->group("Cache");
  c->add_option("--cache-window", a.cache_window, "Keep the neurons of the last K tokens resident (LLM in a flash)")
      ->group("Cache");
  c->add_option("--cache-policy", a.cache_policy,
                "Per-layer cache policy: manifest (the layout's admission and pinned hot set, recorded by pack; "
                "linking-aligned where none), or linking-aligned / all (S3-FIFO admitting every miss) for every "
                "layer, nothing pinned")
      ->check(CLI::IsMember({"manifest", "linking-aligned", "all"}))
      ->group("Cache");
  c->add_option("--run-admit-prob", a.run_admit_prob, "Admission probability for neurons read inside longer reads")
      ->check(CLI::Range(0.0, 1.0))
      ->group("Cache");
  c->add_option("--seed", a.seed, "Seed of the cache's admission draws (as nl-layout eval --seed)")->group("Cache");
}

void add_flash_metrics_options(CLI::App* c, FlashArgs& a) {
  c->add_option("--metrics", a.metrics, "Write per-token and total metrics here (JSON)")->group("Output");
}

std::unique_ptr<FlashImage> flash_open(const FlashArgs& a, const GlobalOptions& g,
                                       const std::vector<NamedPath>& other_inputs,
                                       const std::vector<NamedPath>& other_outputs) {
  // The image, its manifest and tokenizer (whichever of image / manifest --image names), the device profile and the
  // command's other inputs may not be overwritten by --metrics.
  std::vector<NamedPath> inputs = other_inputs;
  const std::string suffix = ".json";
  const bool is_manifest =
      a.image.size() > suffix.size() && a.image.compare(a.image.size() - suffix.size(), suffix.size(), suffix) == 0;
  const std::string image = is_manifest ? a.image.substr(0, a.image.size() - suffix.size()) : a.image;
  for (const std::string& p : {image, manifest_path_for(image), image + ".tokenizer"}) inputs.push_back({"--image", p});
  inputs.push_back({"--device", a.device});
  std::vector<NamedPath> outputs = other_outputs;
  outputs.push_back({"--metrics", a.metrics});
  check_paths(inputs, outputs);
  IoOptions io;
  if (!io_kind_choose(a.io, &io.kind)) throw UsageError("unknown --io " + a.io);
  io.direct = !a.buffered;
  io.queue_depth = a.queue_depth;
  io.warn = [&g](const std::string& s) { info(g, s); };
  auto img = open_flash_image(a.image, io, a.verify);
  a.planner = img->manifest().planner;
  // Where the planner settings came from is said with the summary (flash_report), not here: an error after the
  // image opened would otherwise follow this note, two lines instead of one.
  if (img->manifest().source.find(kSyntheticWeightsNote) != std::string::npos)
    info(g, img->image_path() + ": " + kSyntheticWeightsNote);
  return img;
}

PlannerSettings FlashArgs::settings() const {
  PlannerSettings s;
  if (gap_opt && gap_opt->count() > 0) s.gap = gap;
  if (cache_ratio_opt && cache_ratio_opt->count() > 0) s.cache_ratio = cache_ratio;
  s.device = device;
  s.cache_window = cache_window;
  s.run_admit_prob = run_admit_prob;
  if (!cache_policy_mode_parse(cache_policy, &s.cache_policy))
    throw UsageError("unknown --cache-policy " + cache_policy);
  s.seed = seed;
  return s;
}

std::string FlashArgs::effective_gap() const { return settings().effective_gap(planner); }
double FlashArgs::effective_cache_ratio() const {
  return cache_ratio_ran >= 0 ? cache_ratio_ran : settings().effective_cache_ratio(planner);
}

FlashFfnOptions flash_ffn_options(const FlashArgs& a, SelectMode select) {
  FlashFfnOptions o = nl::flash_ffn_options(a.settings(), a.planner, select);
  o.verify_reads = a.verify_reads;
  return o;
}

namespace {
nlohmann::json counters_json(const FlashCounters& c) {
  return {{"active", c.active},
          {"reads", c.reads},
          {"bytes_read", c.bytes_read},
          {"bytes_needed", c.bytes_needed},
          {"cache_hits", c.cache_hits},
          {"io_seconds", c.io_seconds},
          {"compute_seconds", c.compute_seconds}};
}
}  // namespace

void flash_report(const FlashArgs& a, const GlobalOptions& g, const FlashImage& img, const FlashFfn* ffn,
                  double wall_seconds, uint64_t tokens, const std::string& extra_json) {
  nlohmann::json j = extra_json.empty() ? nlohmann::json::object() : nlohmann::json::parse(extra_json);
  const FlashCounters t = ffn ? ffn->totals() : FlashCounters{};
  j["image"] = img.image_path();
  j["engine"] = img.io().name();
  j["direct"] = img.io().direct();
  j["dtype"] = image_dtype_name(img.manifest().dtype);
  j["gap"] = a.effective_gap();
  j["cache_ratio"] = a.effective_cache_ratio();
  if (!a.planner.empty())
    j["planner"] = {{"from", "manifest (" + a.planner.from + ")"},
                    {"gap", a.planner.gap},
                    {"cache_ratio", a.planner.cache_ratio},
                    {"device", a.planner.device}};
  j["cache_policy"] = a.cache_policy;
  // The pinned hot set is loaded at start-up, outside the per-token figures.
  j["pinned"] = {{"bundles", ffn ? ffn->pinned_bundles() : 0},
                 {"reads", ffn ? ffn->pinned_reads() : 0},
                 {"bytes_read", ffn ? ffn->pinned_bytes_read() : 0}};
  j["tokens"] = tokens;
  j["wall_seconds"] = wall_seconds;
  j["tokens_per_second"] = wall_seconds > 0 ? double(tokens) / wall_seconds : 0.0;
  j["totals"] = counters_json(t);
  if (img.manifest().replicated())  // flash replication (format 1.2): copies in the image, tokens served by one
    j["replication"] = {{"replicas", img.manifest().total_replicas()}, {"second_copy_reads", t.replica_reads}};
  const double per = tokens ? 1.0 / double(tokens) : 0.0;
  j["per_token_mean"] = {{"reads", double(t.reads) * per},
                         {"bytes_read", double(t.bytes_read) * per},
                         {"bytes_needed", double(t.bytes_needed) * per},
                         {"cache_hits", double(t.cache_hits) * per},
                         {"io_ms", t.io_seconds * 1e3 * per},
                         {"compute_ms", t.compute_seconds * 1e3 * per}};
  j["effective_bandwidth_MBps"] = t.io_seconds > 0 ? double(t.bytes_needed) / t.io_seconds / 1e6 : 0.0;
  if (!a.metrics.empty()) {
    nlohmann::json m = j;
    nlohmann::json per_token = nlohmann::json::array();
    if (ffn)
      for (const auto& c : ffn->per_token()) per_token.push_back(counters_json(c));
    m["per_token"] = std::move(per_token);
    write_file_atomic(a.metrics, json_dump(m, 1) + "\n");
  }
  const bool gap_given = a.gap_opt && a.gap_opt->count() > 0,
             ratio_given = a.cache_ratio_opt && a.cache_ratio_opt->count() > 0;
  if (!a.planner.empty() && (!gap_given || !ratio_given))
    info(g, "planner settings from the manifest (" + a.planner.from +
                "):" + (gap_given ? "" : " gap " + a.planner.gap) +
                (ratio_given ? "" : " cache ratio " + std::to_string(a.planner.cache_ratio)) +
                (a.device.empty() ? ", device " + a.planner.device : ""));
  if (g.json) {
    std::printf("%s\n", json_dump(j, 1).c_str());
    return;
  }
  std::printf("engine %s (%s), dtype %s, gap %s, cache %.3f (policy %s, %llu bundles pinned)\n",
              j["engine"].get<std::string>().c_str(), j["direct"].get<bool>() ? "O_DIRECT" : "buffered",
              j["dtype"].get<std::string>().c_str(), a.effective_gap().c_str(), a.effective_cache_ratio(),
              a.cache_policy.c_str(), static_cast<unsigned long long>(ffn ? ffn->pinned_bundles() : 0));
  std::printf("%-24s %14s %14s\n", "", "total", "per token");
  auto row = [&](const char* name, double total, double per_tok) {
    std::printf("%-24s %14.0f %14.1f\n", name, total, per_tok);
  };
  row("reads", double(t.reads), double(t.reads) * per);
  row("bytes read", double(t.bytes_read), double(t.bytes_read) * per);
  row("bytes needed", double(t.bytes_needed), double(t.bytes_needed) * per);
  row("cache hits", double(t.cache_hits), double(t.cache_hits) * per);
  std::printf("%-24s %14.3f %14.4f\n", "I/O time ms", t.io_seconds * 1e3, t.io_seconds * 1e3 * per);
  std::printf("%-24s %14.3f %14.4f\n", "compute time ms", t.compute_seconds * 1e3, t.compute_seconds * 1e3 * per);
  if (img.manifest().replicated()) row("second-copy reads", double(t.replica_reads), double(t.replica_reads) * per);
  std::printf("%-24s %14.1f\n", "effective MB/s", j["effective_bandwidth_MBps"].get<double>());
  std::printf("%-24s %14.2f\n", "tokens/s", j["tokens_per_second"].get<double>());
}

}  // namespace nl::cli
