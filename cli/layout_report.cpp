// nl-layout report: one self-contained HTML page with co-activation heatmaps, read-length histograms and the
// eval table for one or more layouts on a held-out trace (layout/report.h).
#include <cstdio>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/layout_options.h"
#include "formats/core/atomic_file.h"
#include "formats/core/progress.h"
#include "formats/trace.h"
#include "layout/report.h"

namespace nl::cli {
namespace {

struct ReportArgs {
  std::string trace, out, layers = "0";
  std::vector<std::string> layouts;
  uint32_t pixels = 512;
  uint64_t seed = 1;
  DeviceObjectiveArgs dev;
};

void add_io_options(CLI::App& c, ReportArgs& a) {
  c.add_option("--trace", a.trace, "Held-out trace (HDF5, trace v1)")
      ->required()
      ->check(CLI::ExistingFile)
      ->group("Input/output");
  c.add_option("--layout", a.layouts, "Layout JSON (repeat for several)")
      ->required()
      ->check(CLI::ExistingFile)
      ->group("Input/output");
  c.add_option("--out", a.out, "HTML page to write (atomically)")->required()->group("Input/output");
}

void add_page_options(CLI::App& c, ReportArgs& a) {
  c.add_option("--layers", a.layers, "Layers drawn: all, or e.g. 0,3,5-7 (the eval table covers every layer)")
      ->capture_default_str()
      ->group("Page");
  c.add_option("--pixels", a.pixels, "Heatmap side in pixels (capped at the layer width)")
      ->check(CLI::Range(16u, 4096u))
      ->capture_default_str()
      ->group("Page");
  c.add_option("--seed", a.seed, "Seed of the cache's admission draws (as nl-layout eval)")->group("Page");
}

void report_main(const ReportArgs& a, const GlobalOptions& g) {
  apply_global_options(g);
  std::vector<NamedPath> inputs = named_paths("--layout", a.layouts);
  inputs.push_back({"--trace", a.trace});
  check_paths(inputs, {{"--out", a.out}});
  ReportOptions o;
  o.trace = a.trace;
  o.layouts = a.layouts;
  o.pixels = a.pixels;
  {
    TraceReader tr(a.trace);
    o.layers = parse_layers(a.layers, tr.info().n_layers);
    o.eval = eval_config_from(a.dev, &tr.info());
  }
  o.eval.cache.seed = a.seed;
  Progress prog("report", 1 + o.layers.size(), !g.quiet, "steps");
  std::string html = report_html(o, &prog);
  write_file_atomic(a.out, html);
  if (g.json) {
    nlohmann::json j = {{"out", a.out}, {"bytes", html.size()}, {"layers", o.layers}, {"layouts", a.layouts}};
    std::printf("%s\n", json_dump(j, 2).c_str());
  } else {
    std::printf("wrote %s (%zu bytes, %zu layers drawn, %zu layouts)\n", a.out.c_str(), html.size(), o.layers.size(),
                a.layouts.size());
  }
}

}  // namespace

void add_layout_report(CLI::App& app, GlobalOptions& g) {
  static ReportArgs a;
  CLI::App* c =
      app.add_subcommand("report", "Self-contained HTML page: co-activation heatmaps, read lengths, eval table");
  add_io_options(*c, a);
  add_device_objective_options(*c, a.dev);
  add_page_options(*c, a);
  c->callback([&g] { report_main(a, g); });
}

}  // namespace nl::cli
