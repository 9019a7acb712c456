// nl-run replay: a trace names the neurons each token needs; the runtime plans and issues exactly the reads generate
// would, and reports them. Full builds read HDF5 traces (trace v1); the phone build (-DNL_RUNTIME_ONLY=ON) has no
// HDF5 and does not offer this subcommand yet.
#ifdef NL_FULL_BUILD
#include <chrono>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/run_flash_options.h"
#include "cli/run_trace.h"
#include "formats/core/error.h"
#include "formats/core/progress.h"
#include "formats/trace.h"

namespace nl::cli {
namespace {

struct ReplayArgs {
  FlashArgs flash;
  std::string trace;
  uint64_t max_tokens = 0;
};

void add_replay_trace_options(CLI::App* c, ReplayArgs& a) {
  c->add_option("--trace", a.trace, "Activation trace (HDF5, trace v1)")
      ->required()
      ->check(CLI::ExistingFile)
      ->group("Trace");
  c->add_option("--max-tokens", a.max_tokens, "Replay at most this many tokens (0 = all)")
      ->check(CLI::NonNegativeNumber)  // "-1" would wrap to "all" in an unsigned option
      ->group("Trace");
}

void replay_main(const ReplayArgs& a, const GlobalOptions& g) {
  apply_global_options(g);
  auto img = flash_open(a.flash, g, {{"--trace", a.trace}});
  const ImageManifest& m = img->manifest();
  TraceInfo ti;
  std::vector<LayerMask> masks = read_trace_masks(a.trace, m, &ti);
  const uint64_t n = a.max_tokens ? std::min(a.max_tokens, ti.n_tokens) : ti.n_tokens;
  FlashFfn ffn(*img, flash_ffn_options(a.flash, SelectMode::kReplay));
  std::vector<uint32_t> active;
  auto t0 = std::chrono::steady_clock::now();
  Progress prog("replay", n, !g.quiet, "tokens");
  for (uint64_t t = 0; t < n; ++t) {
    for (uint32_t l = 0; l < ti.n_layers; ++l) {
      active.clear();
      const LayerMask& mk = masks[l];
      for (uint32_t k = 0; k < mk.n_neurons; ++k)
        if (mk.test(k, t)) active.push_back(k);
      ffn.replay_layer(int(l), active);
    }
    ffn.end_token();
    prog.add(1);
  }
  prog.finish();
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  nlohmann::json extra = {{"mode", "replay"}, {"trace", a.trace}};
  flash_report(a.flash, g, *img, &ffn, wall, n, json_dump(extra));
}

}  // namespace

void add_run_replay(CLI::App& app, GlobalOptions& g) {
  static ReplayArgs a;
  CLI::App* c = app.add_subcommand("replay", "Issue the reads a trace's tokens need and report them");
  add_flash_image_options(c, a.flash);
  add_replay_trace_options(c, a);
  add_flash_io_options(c, a.flash);
  add_flash_plan_options(c, a.flash);
  add_flash_metrics_options(c, a.flash);
  c->callback([&g] { replay_main(a, g); });
}

}  // namespace nl::cli
#endif
