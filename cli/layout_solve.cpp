// nl-layout solve: learn one neuron order per FFN layer from a profile trace and write the layout JSON.
#include <cstdio>

#include "cli/commands.h"
#include "cli/layout_options.h"
#include "formats/layout.h"
#include "layout/solve.h"

namespace nl::cli {
namespace {

struct SolveArgs {
  std::string trace, out, method = "greedy+ls";
  uint64_t seed = 1;
  uint32_t top_k = 32, rcm_min_count = 1, sample_tokens = 8192, neighbours = 6, kicks = 0;
  double time_budget = 0, hot_share = 1.0;
  DeviceObjectiveArgs dev;
};

void add_io_options(CLI::App& c, SolveArgs& a) {
  c.add_option("--trace", a.trace, "Profile trace (HDF5, trace v1)")->required()->check(CLI::ExistingFile)->group("Input/output");
  c.add_option("--out", a.out, "Layout JSON to write (atomically)")->required()->group("Input/output");
}

void add_method_options(CLI::App& c, SolveArgs& a) {
  c.add_option("--method", a.method, "identity, frequency, greedy, greedy+ls (default), rcm")
      ->check(CLI::IsMember(layout_methods()))->group("Method");
  c.add_option("--seed", a.seed, "Seed (same inputs and seed -> byte-identical layout)")->group("Method");
  c.add_option("--top-k", a.top_k, "Co-activation candidates kept per neuron")->check(CLI::Range(2u, 4096u))->group("Method");
  c.add_option("--rcm-min-count", a.rcm_min_count, "rcm: keep candidate pairs co-active at least this often")
      ->check(CLI::Range(1u, 1u << 30))->group("Method");
}

void add_search_options(CLI::App& c, SolveArgs& a) {
  const char* grp = "Local search (greedy+ls)";
  c.add_option("--sample-tokens", a.sample_tokens, "Profile tokens the search objective is measured on")
      ->check(CLI::Range(64u, 1u << 30))->group(grp);
  c.add_option("--neighbours", a.neighbours, "Candidate neighbours tried per neuron")->check(CLI::Range(1u, 4096u))->group(grp);
  c.add_option("--hot-share", a.hot_share, "Hot block (neurons the cache will hold, moved to the end) as a share of the cache capacity")
      ->check(CLI::Range(0.0, 1.0))->group(grp);
  c.add_option("--kicks", a.kicks, "Random kicks followed by local search, kept when better")->group(grp);
  c.add_option("--time-budget", a.time_budget, "Stop kicking after this many seconds per layer (timing-dependent!)")
      ->check(CLI::Range(0.0, 1e6))->group(grp);
}

void solve_main(const SolveArgs& a, const GlobalOptions& g) {
  apply_global_options(g);
  SolveOptions o;
  o.method = a.method;
  o.seed = a.seed;
  o.top_k = a.top_k;
  o.rcm_min_count = a.rcm_min_count;
  o.eval = eval_config_from(a.dev);
  o.hot_share = a.hot_share;
  o.ls.sample_tokens = a.sample_tokens;
  o.ls.neighbours = a.neighbours;
  o.ls.kicks = a.kicks;
  o.ls.time_budget_s = a.time_budget;
  Layout l = solve_trace(a.trace, o, [&](uint32_t layer, const LayerSolve& s) {
    char buf[256];
    std::snprintf(buf, sizeof buf, "layer %u: %s path weight %llu, bound %.0f, %.2f s%s", layer, a.method.c_str(),
                  static_cast<unsigned long long>(s.objective), s.upper_bound, s.seconds,
                  s.guard_kept_seed ? " (guard kept the greedy seed)" : "");
    info(g, buf);
  });
  layout_write(a.out, l);
  if (g.json) {
    nlohmann::json j = {{"out", a.out}, {"method", a.method}, {"layers", l.layers.size()}};
    nlohmann::json ls = nlohmann::json::array();
    for (const auto& L : l.layers) ls.push_back({{"objective", L.objective}, {"upper_bound", L.upper_bound}, {"gap", L.gap()}});
    j["per_layer"] = ls;
    std::printf("%s\n", j.dump(2).c_str());
  } else {
    std::printf("wrote %s (%s, %zu layers)\n", a.out.c_str(), a.method.c_str(), l.layers.size());
  }
}

}  // namespace

void add_layout_solve(CLI::App& app, GlobalOptions& g) {
  static SolveArgs a;
  CLI::App* c = app.add_subcommand("solve", "Learn a neuron order per FFN layer from a profile trace");
  add_io_options(*c, a);
  add_method_options(*c, a);
  add_search_options(*c, a);
  add_device_objective_options(*c, a.dev);
  c->callback([&g] { solve_main(a, g); });
}

}  // namespace nl::cli
