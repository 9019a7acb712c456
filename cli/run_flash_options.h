// Options shared by `nl-run generate` and `nl-run replay` (image, I/O engine, planner, cache, metrics), one
// option-group function per concern, and the metrics report both print.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "cli/common.h"
#include "runtime/flash_ffn.h"
#include "runtime/flash_image.h"
#include "runtime/generate.h"

namespace nl::cli {

struct FlashArgs {
  std::string image;
  bool verify = false;
  bool verify_reads = false;  // --verify-reads: every bundle read checked against start-up checksums
  std::string io = "auto";    // uring where this kernel and build have it (overlap is real there), else pread
  bool buffered = false;      // --no-direct
  uint32_t queue_depth = IoOptions{}.queue_depth;
  std::string gap = "off";
  std::string device;  // device profile for --gap auto
  double cache_ratio = 0;
  uint32_t cache_window = CacheConfig{}.window_tokens;  // runtime/plan/slot_cache.h's defaults, not copies
  double run_admit_prob = CacheConfig{}.run_admit_prob;
  std::string cache_policy = "manifest";  // manifest | linking-aligned | all
  uint64_t seed = 1;                      // cache admission draws (same default as nl-layout eval)
  std::string metrics;                    // metrics JSON path
  // Options the user passed (the rest follow the manifest's planner settings, when it records them).
  CLI::Option* gap_opt = nullptr;
  CLI::Option* cache_ratio_opt = nullptr;
  // The opened image's planner settings (set by flash_open; empty when the manifest records none).
  mutable ImagePlanner planner;
  // The cache ratio a run sized (generate: from --memory-budget, or 0 for --select dense); < 0 = none yet.
  double cache_ratio_ran = -1;

  // The options as runtime planner settings (options not given left unset: the manifest's, else the defaults).
  PlannerSettings settings() const;
  // What runs: the option when given, else the manifest's planner setting, else the option's default.
  std::string effective_gap() const;
  double effective_cache_ratio() const;
};

void add_flash_image_options(CLI::App* c, FlashArgs& a);
void add_flash_io_options(CLI::App* c, FlashArgs& a);
void add_flash_plan_options(CLI::App* c, FlashArgs& a);
void add_flash_metrics_options(CLI::App* c, FlashArgs& a);

// Opens the image with the chosen engine (notices on stderr unless --quiet) and verifies it when asked; takes the
// manifest's planner settings for the options not given (a.planner). Checks the paths first (check_paths: --metrics
// and `other_outputs` against the image, its manifest and tokenizer, --device and `other_inputs`).
std::unique_ptr<FlashImage> flash_open(const FlashArgs& a, const GlobalOptions& g,
                                       const std::vector<NamedPath>& other_inputs = {},
                                       const std::vector<NamedPath>& other_outputs = {});
FlashFfnOptions flash_ffn_options(const FlashArgs& a, SelectMode select);

// Prints the summary table (or JSON with --json) and writes --metrics. `extra` is merged into the JSON.
void flash_report(const FlashArgs& a, const GlobalOptions& g, const FlashImage& img, const FlashFfn* ffn,
                  double wall_seconds, uint64_t tokens, const std::string& extra_json);

}  // namespace nl::cli
