// nl-layout eval: held-out figures for one or more layouts on a trace, through the runtime's read planner and
// cache; one table with ratios against identity and greedy; optional quality gates (--require).
#include <cmath>
#include <cstdio>
#include <map>

#include "cli/commands.h"
#include "cli/layout_options.h"
#include "formats/core/error.h"
#include "formats/core/progress.h"
#include "formats/layout.h"
#include "formats/trace.h"
#include "layout/evaluate.h"
#include "layout/gate.h"
#include "layout/trace_stats.h"

namespace nl::cli {
namespace {

struct EvalArgs {
  std::string trace;
  std::vector<std::string> layouts, require;
  bool per_layer = false, layout_cache = true;
  uint64_t seed = 1;
  DeviceObjectiveArgs dev;
};

void add_input_options(CLI::App& c, EvalArgs& a) {
  c.add_option("--trace", a.trace, "Held-out trace (HDF5, trace v1)")
      ->required()
      ->check(CLI::ExistingFile)
      ->group("Input");
  c.add_option("--layout", a.layouts, "Layout JSON (repeat for several)")
      ->required()
      ->check(CLI::ExistingFile)
      ->group("Input");
}

void add_report_options(CLI::App& c, EvalArgs& a) {
  c.add_flag("--per-layer", a.per_layer, "Also print per-layer figures")->group("Report");
  c.add_option("--require", a.require,
               "Quality gate, e.g. \"greedy+ls.io_ms <= 0.95 * greedy.io_ms\" (metrics: reads, io_ms, avg_len, "
               "max_len, bytes_read, bytes_needed, hit_rate); exit 5 when violated")
      ->group("Report");
  c.add_option("--seed", a.seed, "Seed of the cache's admission draws")->group("Report");
  auto* same = c.add_flag("!--same-cache", a.layout_cache,
                          "Ignore the layouts' own cache policies (admission, pinned set): every layout gets the cache "
                          "set by the device options (ablation); = --cache-policy linking-aligned, or all with "
                          "--plain-s3fifo")
                   ->group("Report");
  // nl-run's name for the same choice (nl-run generate/replay --cache-policy manifest|linking-aligned|all; a layout's
  // own policy is what pack records in the manifest).
  c.add_option_function<std::string>(
       "--cache-policy",
       [&a](const std::string& v) {
         a.layout_cache = v == "layout" || v == "manifest";
         a.dev.plain_s3fifo = v == "all";
       },
       "Per-layer cache policy, named as nl-run names it: layout (default; each layout's own admission and pinned set, "
       "what nl-run's manifest policy runs), linking-aligned or all (S3-FIFO admitting every miss) for every layout, "
       "nothing pinned")
      ->check(CLI::IsMember({"layout", "manifest", "linking-aligned", "all"}))
      ->excludes(same)
      ->excludes(c.get_option("--plain-s3fifo"))  // added with the device options, before these
      ->group("Report");
}

struct Row {
  std::string name, file;
  LayerEval total;
  std::vector<LayerEval> layers;
  double metric(const std::string& m, bool& ok) const {
    ok = true;
    const LayerEval& t = total;
    double tok = t.tokens ? double(t.tokens) : 1.0;
    if (m == "reads") return t.reads_per_token();
    if (m == "io_ms") return t.io_ms_per_token();
    if (m == "avg_len") return t.avg_read_bundles();
    if (m == "max_len") return double(t.max_read_bundles);
    if (m == "bytes_read") return double(t.bytes_read) / tok;
    if (m == "bytes_needed") return double(t.bytes_needed) / tok;
    if (m == "hit_rate") return t.hit_rate();
    ok = false;
    return 0;
  }
};

void eval_main(const EvalArgs& a, const GlobalOptions& g) {
  apply_global_options(g);
  std::vector<NamedPath> inputs = named_paths("--layout", a.layouts);
  inputs.push_back({"--trace", a.trace});
  inputs.push_back({"--device", a.dev.device});
  check_paths(inputs, {});
  TraceReader tr(a.trace);
  const TraceInfo& ti = tr.info();
  EvalConfig ec = eval_config_from(a.dev, &ti);
  ec.cache.seed = a.seed;
  std::vector<Layout> lays;
  std::vector<Row> rows;
  std::map<std::string, int> seen;
  for (const auto& f : a.layouts) {
    lays.push_back(layout_load(f, &ti));
    std::string name = lays.back().method;
    if (seen[name]++) name += "#" + std::to_string(seen[name]);
    rows.push_back(Row{name, f, {}, std::vector<LayerEval>(ti.n_layers)});
  }
  // --require's layout and metric names are checked now, before the evaluation (exit 2 at once, not after it).
  for (const auto& expr : a.require)
    gate_check(expr, [&](const std::string& lay, const std::string& met, double& v) {
      std::string names;
      bool known = false;
      for (const auto& r : rows) {
        known |= r.name == lay;
        names += (names.empty() ? "" : ", ") + r.name;
      }
      if (!known)
        throw UsageError("--require \"" + expr + "\": no layout named '" + lay + "' (the layouts: " + names + ")");
      bool ok;
      Row{}.metric(met, ok);
      v = 1;
      return ok;
    });
  Progress prog("eval", ti.n_layers, !g.quiet, "layers");
  TraceEval te = evaluate_trace(tr, lays, ec, {}, &prog, a.layout_cache);
  // Layout-free statistics of the trace and the order gain they predict (layout/trace_stats.h).
  const TraceStructureStats st = trace_structure_stats(tr);
  // The fit holds for the runtime's planner and cache defaults; the device and bundle size enter through M.
  const bool fit_conditions =
      ec.gap.to_string() == "auto" && ec.cache_ratio == DeviceObjectiveArgs{}.cache_ratio && !ec.cache.window_tokens;
  for (size_t k = 0; k < rows.size(); ++k) {
    rows[k].layers = te.layers[k];
    rows[k].total = te.total[k];
  }

  auto find = [&](const std::string& n) -> const Row* {
    for (const auto& r : rows)
      if (r.name == n) return &r;
    return nullptr;
  };
  const Row* ident = find("identity");
  const Row* greedy = find("greedy");
  uint64_t bb = ec.bundle_bytes ? ec.bundle_bytes : default_bundle_bytes(ti.n_neurons.empty() ? 0 : ti.n_neurons[0]);
  // The layout-independent lower bound (io_lower_bound_seconds) per evaluated token, when defined.
  const uint64_t n_tok = rows.empty() ? 0 : rows[0].total.tokens;
  const double model_gain = modelled_gain(st, ec.device.cost.read_latency_us, ec.device.cost.bandwidth_MBps, bb);
  const double read_cost = read_cost_bundles(ec.device.cost.read_latency_us, ec.device.cost.bandwidth_MBps, bb);
  const bool fit_range = read_cost >= kFitReadCostMin && read_cost <= kFitReadCostMax;
  const GainPrediction pred_greedy = predict_order_gain(model_gain, "greedy"),
                       pred_ours = predict_order_gain(model_gain, "greedy+ls");
  const double bound_ms = te.bound_total >= 0 && n_tok ? 1e3 * te.bound_total / double(n_tok) : -1.0;

  std::vector<GateResult> gates;
  for (const auto& expr : a.require)
    gates.push_back(gate_check(expr, [&](const std::string& lay, const std::string& met, double& v) {
      const Row* r = find(lay);
      if (!r) return false;
      bool ok;
      v = r->metric(met, ok);
      return ok;
    }));

  if (g.json) {
    nlohmann::json j = {{"trace", a.trace},
                        {"tokens", ti.n_tokens},
                        {"gap", ec.gap.to_string()},
                        {"cache_ratio", ec.cache_ratio},
                        {"device", ec.device.name},
                        {"bundle_bytes", bb},
                        {"window", ec.cache.window_tokens}};
    nlohmann::json arr = nlohmann::json::array();
    for (const auto& r : rows) {
      bool ok;
      nlohmann::json x = {{"name", r.name}, {"file", r.file}};
      for (const char* m : {"reads", "io_ms", "avg_len", "max_len", "bytes_read", "bytes_needed", "hit_rate"})
        x[m] = r.metric(m, ok);
      if (ident) x["io_vs_identity"] = r.total.io_seconds / ident->total.io_seconds;
      if (greedy) x["io_vs_greedy"] = r.total.io_seconds / greedy->total.io_seconds;
      if (ident) x["reads_vs_identity"] = double(r.total.reads) / double(ident->total.reads);
      if (greedy) x["reads_vs_greedy"] = double(r.total.reads) / double(greedy->total.reads);
      if (bound_ms > 0) x["io_vs_bound"] = r.total.io_ms_per_token() / bound_ms;
      if (a.per_layer) {
        nlohmann::json pl = nlohmann::json::array();
        for (const auto& le : r.layers)
          pl.push_back({{"reads", le.reads_per_token()},
                        {"io_ms", le.io_ms_per_token()},
                        {"avg_len", le.avg_read_bundles()},
                        {"max_len", le.max_read_bundles},
                        {"hit_rate", le.hit_rate()}});
        x["per_layer"] = pl;
      }
      arr.push_back(x);
    }
    j["layouts"] = arr;
    j["trace_structure"] = {{"active_share", st.active_share},
                            {"persistence", st.persistence},
                            {"identity_run", st.identity_run},
                            {"cofire", st.cofire},
                            {"cofire_excess", st.excess},
                            {"cofire_tokens", st.cofire_tokens},
                            {"headroom", st.headroom},
                            {"modelled_gain", model_gain},
                            {"predicted_gain_over_identity",
                             {{"synthetic_fit", true},
                              {"fit_conditions", fit_conditions},
                              {"read_cost_bundles", read_cost},
                              {"in_fit_range", fit_range},
                              {"greedy", {pred_greedy.low, pred_greedy.mid, pred_greedy.high}},
                              {"greedy+ls", {pred_ours.low, pred_ours.mid, pred_ours.high}}}}};
    if (bound_ms >= 0) j["io_ms_lower_bound"] = bound_ms;
    nlohmann::json gj = nlohmann::json::array();
    for (const auto& gr : gates) gj.push_back({{"require", gr.text}, {"ok", gr.ok}});
    j["gates"] = gj;
    std::printf("%s\n", json_dump(j, 2).c_str());
  } else {
    std::printf("%s: %llu tokens, %u layers; gap %s, cache %.3g of FFN bytes%s, device %s, bundle %llu B\n",
                a.trace.c_str(), static_cast<unsigned long long>(ti.n_tokens), ti.n_layers, ec.gap.to_string().c_str(),
                ec.cache_ratio,
                ec.cache.window_tokens ? (", window " + std::to_string(ec.cache.window_tokens)).c_str() : "",
                ec.device.name.c_str(), static_cast<unsigned long long>(bb));
    std::printf("%-14s %10s %8s %8s %11s %9s %6s %10s %8s %8s %8s %8s\n", "layout", "reads/tok", "avg_len", "max_len",
                "KiB_rd/tok", "rd/need", "hit%", "io_ms/tok", "rd/idn", "io/idn", "rd/grd", "io/grd");
    for (const auto& r : rows) {
      const LayerEval& t = r.total;
      auto ratio = [](double x, double y) { return y > 0 ? x / y : 0.0; };
      std::printf("%-14s %10.2f %8.2f %8llu %11.1f %9.3f %6.2f %10.4f", r.name.c_str(), t.reads_per_token(),
                  t.avg_read_bundles(), static_cast<unsigned long long>(t.max_read_bundles),
                  double(t.bytes_read) / 1024.0 / double(std::max<uint64_t>(1, t.tokens)),
                  ratio(double(t.bytes_read), double(t.bytes_needed)), 100.0 * t.hit_rate(), t.io_ms_per_token());
      if (ident)
        std::printf(" %8.3f %8.3f", ratio(double(t.reads), double(ident->total.reads)),
                    ratio(t.io_seconds, ident->total.io_seconds));
      else
        std::printf(" %8s %8s", "-", "-");
      if (greedy)
        std::printf(" %8.3f %8.3f\n", ratio(double(t.reads), double(greedy->total.reads)),
                    ratio(t.io_seconds, greedy->total.io_seconds));
      else
        std::printf(" %8s %8s\n", "-", "-");
    }
    if (bound_ms > 0) {
      std::printf(
          "lower bound for any order and cache of this capacity: %.4f io_ms/tok (each token: one read of its active\n"
          "neurons beyond the capacity, every cache slot a hit, no gap bytes); io / bound:",
          bound_ms);
      for (const auto& r : rows) std::printf(" %s %.3f", r.name.c_str(), r.total.io_ms_per_token() / bound_ms);
      std::printf("\n");
    }
    auto cut2 = [](double x) { return std::floor(x * 100) / 100; };  // cut, never rounded up
    std::printf(
        "trace structure: active %.2f %%, persistence %.1f %%, identity run %.3f, top-2 co-firing %.3f (first %llu "
        "tokens), headroom %.3f, modelled gain M %.3f\n",
        100 * st.active_share, 100 * st.persistence, st.identity_run, st.cofire,
        static_cast<unsigned long long>(st.cofire_tokens), st.headroom, model_gain);
    std::printf(
        "predicted I/O gain over identity with a good cache (fit on a synthetic structure sweep, docs/benchmarks.md): "
        "greedy %.2f-%.2fx (mid %.2f), greedy+ls %.2f-%.2fx (mid %.2f)%s\n",
        cut2(pred_greedy.low), cut2(pred_greedy.high), cut2(pred_greedy.mid), cut2(pred_ours.low), cut2(pred_ours.high),
        cut2(pred_ours.mid), fit_conditions ? "" : " [fit is for gap auto, cache 0.05, no window: not these settings]");
    if (!fit_range)
      std::printf(
          "  (extrapolated: a read's fixed cost is worth %.2f bundles here, the sweep covered %.1f-%.1f; the "
          "planner's gap merging, which M ignores, changes identity's reads)\n",
          read_cost, kFitReadCostMin, kFitReadCostMax);
    if (a.per_layer)
      for (const auto& r : rows)
        for (size_t l = 0; l < r.layers.size(); ++l)
          std::printf("  %-14s layer %3zu: reads/tok %.2f, io_ms/tok %.4f, avg_len %.2f, hit%% %.2f\n", r.name.c_str(),
                      l, r.layers[l].reads_per_token(), r.layers[l].io_ms_per_token(), r.layers[l].avg_read_bundles(),
                      100.0 * r.layers[l].hit_rate());
    for (const auto& gr : gates) std::printf("gate %s: %s\n", gr.ok ? "ok" : "VIOLATED", gr.text.c_str());
  }
  std::fflush(stdout);
  for (const auto& gr : gates)
    if (!gr.ok) throw GateError("quality gate violated: " + gr.text);
}

}  // namespace

void add_layout_eval(CLI::App& app, GlobalOptions& g) {
  static EvalArgs a;
  CLI::App* c = app.add_subcommand("eval", "Held-out reads, bytes, cache hits and estimated I/O time of layouts");
  add_input_options(*c, a);
  add_device_objective_options(*c, a.dev);
  add_report_options(*c, a);
  c->callback([&g] { eval_main(a, g); });
}

}  // namespace nl::cli
