// nl-layout solve: learn one neuron order per FFN layer from a profile trace (or from a graph file's counts plus
// an optional token sample, --graph) and write the layout JSON.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>

#include "cli/commands.h"
#include "cli/layout_options.h"
#include "formats/core/error.h"
#include "formats/core/progress.h"
#include "formats/layout.h"
#include "formats/trace.h"
#include "graph/graph_file.h"
#include "layout/solve.h"
#include "layout/solve_cost.h"
#include "layout/solve_graph.h"

namespace nl::cli {
namespace {

// The defaults are SolveOptions' own (layout/solve.h): the options bind to its fields; only the CLI's own inputs
// and the two options stated differently on the command line (MiB, a negated flag) are kept here.
struct SolveArgs {
  std::string trace, out;
  std::vector<std::string> graph;
  SolveOptions o;
  uint64_t full_matrix_mib = o.full_matrix_bytes >> 20;  // o is default-constructed above
  DeviceObjectiveArgs dev;
};

void add_io_options(CLI::App& c, SolveArgs& a) {
  c.add_option("--trace", a.trace,
               "Profile trace (HDF5, trace v1); with --graph, the token sample greedy+ls searches on (optional for "
               "the other methods)")
      ->check(CLI::ExistingFile)
      ->group("Input/output");
  c.add_option("--graph", a.graph,
               "Co-activation counts from graph files (nl-layout graph / graph-merge; several: one per layer group) "
               "instead of counting --trace")
      ->check(CLI::ExistingFile)
      ->group("Input/output");
  c.add_option("--out", a.out, "Layout JSON to write (atomically)")->required()->group("Input/output");
}

void add_method_options(CLI::App& c, SolveArgs& a) {
  c.add_option("--method", a.o.method, "identity, frequency, greedy, greedy+ls (default), rcm")
      ->check(CLI::IsMember(layout_methods()))
      ->group("Method");
  c.add_option("--seed", a.o.seed, "Seed (same inputs and seed -> byte-identical layout)")->group("Method");
  c.add_option("--top-k", a.o.top_k, "Co-activation candidates kept per neuron")
      ->check(CLI::Range(2u, 4096u))
      ->group("Method");
  c.add_option("--full-matrix-mib", a.full_matrix_mib,
               "greedy: every pair (the paper's Algorithm 1) when a layer's pair counts fit in this many MiB, else "
               "top-k (0 = top-k)")
      ->check(CLI::Range(uint64_t(0), uint64_t(1) << 30))
      ->group("Method");
  c.add_option("--rcm-min-count", a.o.rcm_min_count, "rcm: keep candidate pairs co-active at least this often")
      ->check(CLI::Range(1u, 1u << 30))
      ->group("Method");
}

void add_search_options(CLI::App& c, SolveArgs& a) {
  const char* grp = "Local search (greedy+ls)";
  c.add_option("--sample-tokens", a.o.ls.sample_tokens, "Profile tokens the search objective is measured on")
      ->check(CLI::Range(64u, 1u << 30))
      ->group(grp);
  c.add_option("--neighbours", a.o.ls.neighbours, "Candidate neighbours tried per neuron")
      ->check(CLI::Range(1u, 4096u))
      ->group(grp);
  c.add_option("--max-neighbours", a.o.ls.max_neighbours,
               "At a local optimum with evaluations left, the candidate lists double up to this many (past --top-k "
               "where the layer's full count matrix is kept; 0 = fixed at --neighbours)")
      ->check(CLI::Range(0u, 4096u))
      ->group(grp);
  c.add_option("--pin-share", a.o.pin_share,
               "Share of the cache capacity pinned with the hottest neurons, which leave the path (0 = S3-FIFO only)")
      ->check(CLI::Range(0.0, 1.0))
      ->group(grp);
  c.add_option("--pin-rounds", a.o.pin_rounds,
               "Rounds of swaps refining the pinned set for the searched order by its estimated read savings (0 = "
               "hottest only)")
      ->check(CLI::Range(0u, 64u))
      ->group(grp);
  c.add_option("--small-fraction", a.o.small_fraction,
               "--candidates full: also try the two best cache candidates with this share of their S3-FIFO part in "
               "the small FIFO (0 = 10 % only)")
      ->check(CLI::Range(0.0, 0.99))
      ->group(grp);
  c.add_option_function<std::string>(
       "--candidates", [&a](const std::string& s) { a.o.full_candidates = s == "full"; },
       "Cache policies each searched order is measured under: lean (the value cache, the hottest and the refined "
       "pinned sets) or full (also the paper's cache, partial pinned sets, isolated admission and small-FIFO "
       "retries: about 4x the validation passes)")
      ->check(CLI::IsMember({"lean", "full"}))
      ->default_str("lean")
      ->group(grp);
  // Parsed here, once, into the enum (formats/core/cache_admission.h); the names are the ones files record.
  // The S3-FIFO rules only: the value cache is a candidate of its own in every family (docs/solvers.md).
  std::vector<std::string> admissions;
  for (CacheAdmission r : kCacheAdmissionRules)
    if (r != CacheAdmission::kValue) admissions.push_back(cache_admission_name(r));
  c.add_option_function<std::string>(
       "--admission", [&a](const std::string& s) { cache_admission_parse(s, &a.o.admission); },
       "S3-FIFO admission rule of the cache candidates (recorded in the layout; eval uses it); the value cache is "
       "always a candidate too")
      ->check(CLI::IsMember(admissions))
      ->default_str(cache_admission_name(a.o.admission))  // still the default: options are parsed later
      ->group(grp);
  c.add_option("--validation-share", a.o.validation_share,
               "Share of the profile trace's sequences (the last ones) held out to choose between candidates; the "
               "rest builds them (0 = build and choose on the same tokens)")
      ->check(CLI::Range(0.0, 0.9))
      ->group(grp);
  c.add_flag("--rebuild", a.o.rebuild,
             "Rebuild the chosen candidate's recipe on every profile token (default: keep it as built on the build "
             "tokens)")
      ->group(grp);
  c.add_option_function<std::string>(
       "--replicate-budget",
       [&a](const std::string& s) {  // "10%" or "10": percent of the layer's FFN bytes
         const std::string num = !s.empty() && s.back() == '%' ? s.substr(0, s.size() - 1) : s;
         size_t used = 0;
         double p = -1;
         try {
           p = std::stod(num, &used);
         } catch (...) {
         }
         if (num.empty() || used != num.size() || !(p >= 0 && p <= 100))
           throw UsageError("--replicate-budget must be a percentage in [0, 100], got '" + s + "'");
         a.o.replicate_share = p / 100;
       },
       "Flash replication: up to this share of the FFN bytes (e.g. 10%) holds second copies of neurons beside groups "
       "they fire with; the amount is chosen on validation tokens (default 0 = off; pack writes the copies, nl-run "
       "reads one)")
      ->default_str("0%")
      ->group(grp);
  c.add_flag("--weight-guard", a.o.guard_weight,
             "Refuse candidates whose gap-0 path weight is below greedy's (the paper's proxy; gap-0 reads never rise, "
             "the I/O time may)")
      ->group(grp);
  c.add_option("--max-evaluations", a.o.ls.max_evaluations,
               "Move evaluations per layer before the search stops (deterministic budget; 0 = default)")
      ->group(grp);
  c.add_option("--guard-tokens", a.o.guard_tokens,
               "Validation tokens (a prefix of the held-out sequences) the candidates are compared on")
      ->check(CLI::Range(uint64_t(64), uint64_t(1) << 40))
      ->group(grp);
}

// The solve's estimated time and memory (layout/solve_cost.h) from the trace's shape and a sample of its first
// layer's activity: printed, and a run that cannot fit in memory refused before it starts.
void estimate_cost(const TraceReader& tr, const SolveOptions& o, const GlobalOptions& g) {
  const TraceInfo& ti = tr.info();
  if (ti.n_layers == 0 || ti.n_tokens == 0) return;
  const uint64_t words = std::min<uint64_t>(64, (ti.n_tokens + 63) / 64);  // the first 4,096 tokens
  const std::vector<uint64_t> w = tr.read_layer_words(0, 0, words);
  uint64_t ones = 0;
  for (uint64_t x : w) ones += uint64_t(__builtin_popcountll(x));
  const double density = double(ones) / (double(ti.n_neurons[0]) * double(std::min<uint64_t>(ti.n_tokens, words * 64)));
  const uint32_t threads = uint32_t(std::max(1, omp_get_max_threads()));
  const SolveCostEstimate e = estimate_solve_cost(ti.n_neurons, ti.n_tokens, density, threads, o);
  if (e.layer_seconds > 0) info(g, describe(e, ti.n_layers, std::min<uint32_t>(threads, ti.n_layers)));
  require_memory("nl-layout solve " + ti.path + " (" + std::to_string(ti.n_layers) + " layers of up to " +
                     std::to_string(*std::max_element(ti.n_neurons.begin(), ti.n_neurons.end())) + " neurons, " +
                     std::to_string(ti.n_tokens) + " tokens, " + std::to_string(threads) +
                     " layers at a time; --threads 1 or a smaller --full-matrix-mib needs less)",
                 e.peak_bytes);
}

void solve_main(const SolveArgs& a, const GlobalOptions& g) {
  apply_global_options(g);
  if (a.trace.empty() && a.graph.empty()) throw UsageError("solve needs --trace or --graph (or both)");
  std::vector<NamedPath> ins = named_paths("--graph", a.graph);
  ins.push_back({"--trace", a.trace});
  ins.push_back({"--device", a.dev.device});
  check_paths(ins, {{"--out", a.out}});
  SolveOptions o = a.o;
  o.full_matrix_bytes = a.full_matrix_mib << 20;
  uint32_t n_layers = 0;
  if (a.trace.empty()) {
    o.eval = eval_config_from(a.dev, nullptr);
  } else {
    TraceReader tr(a.trace);
    n_layers = tr.info().n_layers;
    o.eval = eval_config_from(a.dev, &tr.info());
    if (a.graph.empty()) estimate_cost(tr, o, g);
  }
  o.family_build_figures = !g.quiet;  // only the progress line below shows them
  if (!a.graph.empty()) {
    n_layers = 0;
    bool full = true;
    for (const auto& p : a.graph) {
      GraphFileReader gr(p);
      n_layers += uint32_t(gr.info().layers.size());
      full = full && gr.info().full;
    }
    if (!full && a.trace.empty())
      info(g, "solve: --graph " + a.graph.front() + (a.graph.size() > 1 ? " ..." : "") +
                  " stores top-k lists only and no --trace is given: greedy joins its fragments in index order and "
                  "the recorded path weights count only the pairs in the lists (lower bounds)");
  }
  Progress prog("solve " + o.method, n_layers, !g.quiet, "layers");
  PhaseTimes phases;  // every layer's, summed
  auto on_layer = [&](uint32_t layer, const LayerSolve& s) {
    for (const auto& [name, sec] : s.phases.list) phases.add(name, sec);
    std::string line;
    char buf[512];
    std::snprintf(buf, sizeof buf,
                  "layer %u: %s path weight %llu, bound %.0f, %.2f s (count %.2f, greedy %.2f, search %.2f)", layer,
                  o.method.c_str(), static_cast<unsigned long long>(s.objective), s.upper_bound, s.seconds,
                  s.seconds_count(), s.seconds_greedy(), s.seconds_ls());
    line = buf;
    if (o.method == "greedy+ls") {
      std::snprintf(buf, sizeof buf, "; built on %llu tokens, chosen on %llu%s; io ms/tok build / validation:",
                    (unsigned long long)s.split.build_end, (unsigned long long)(s.split.n_tokens - s.split.build_end),
                    s.split.split() ? "" : " (the same tokens)");
      line += buf;
      for (const FamilyFigure& f : s.families) {
        std::snprintf(buf, sizeof buf, " %s %.4f / %.4f", f.family.c_str(), f.build_ms, f.validation_ms);
        line += buf;
        if (f.refused) line += " (" + std::to_string(f.refused) + " of " + std::to_string(f.candidates) + " refused)";
        line += ",";
      }
      line += " kept " + s.chosen_family + " (" + s.chosen + ")" + (s.rebuilt ? ", rebuilt on all tokens" : "");
      if (!s.cache.pinned.empty()) line += ", " + std::to_string(s.cache.pinned.size()) + " pinned";
      if (!s.replicate_summary.empty()) line += "; replicas, validation io ms/tok: " + s.replicate_summary;
    }
    prog.note(line);
    prog.add(1);
  };
  Layout l = a.graph.empty() ? solve_trace(a.trace, o, on_layer) : solve_graph(a.graph, a.trace, o, on_layer);
  prog.finish();
  const auto t_write = std::chrono::steady_clock::now();
  layout_write(a.out, l);
  phases.add("write", std::chrono::duration<double>(std::chrono::steady_clock::now() - t_write).count());
  if (g.json) {
    nlohmann::json j = {{"out", a.out}, {"method", o.method}, {"layers", l.layers.size()}};
    nlohmann::json ph = nlohmann::json::object();
    for (const auto& [name, sec] : phases.list) ph[name] = sec;
    j["phase_seconds"] = ph;
    nlohmann::json ls = nlohmann::json::array();
    for (const auto& L : l.layers)
      ls.push_back({{"objective", L.objective}, {"upper_bound", L.upper_bound}, {"gap", L.gap()}});
    j["per_layer"] = ls;
    std::printf("%s\n", json_dump(j, 2).c_str());
  } else {
    if (!g.quiet) {
      std::string line = "solve phases, thread-seconds summed over layers:";
      char buf[96];
      for (const auto& [name, sec] : phases.list) {
        std::snprintf(buf, sizeof buf, " %s %.2f,", name.c_str(), sec);
        line += buf;
      }
      line.pop_back();
      info(g, line);
    }
    std::printf("wrote %s (%s, %zu layers)\n", a.out.c_str(), o.method.c_str(), l.layers.size());
  }
}

}  // namespace

void add_layout_solve(CLI::App& app, GlobalOptions& g) {
  static SolveArgs a;
  CLI::App* c = app.add_subcommand(
      "solve", "Learn a neuron order per FFN layer from a profile trace or a graph file's co-activation counts");
  add_io_options(*c, a);
  add_method_options(*c, a);
  add_search_options(*c, a);
  add_device_objective_options(*c, a.dev);
  c->callback([&g] { solve_main(a, g); });
}

}  // namespace nl::cli
