// nl-layout graph: count co-activations of a trace's layers into a graph file (per-neuron counts, top-k
// neighbour lists, optionally the full upper triangle), of the whole trace or of a slice of its tokens (one
// machine's share; graph-merge sums the slices exactly).
#include <omp.h>

#include <cctype>
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/layout_options.h"
#include "formats/core/error.h"
#include "formats/core/progress.h"
#include "formats/sha256.h"
#include "formats/trace.h"
#include "graph/coactivation.h"
#include "graph/graph_file.h"

namespace nl::cli {
namespace {

struct GraphArgs {
  std::string trace, out, layers = "all", kernel = "auto", method = "auto", tokens, sequences, slice, trace_sha256;
  uint32_t top_k = 32;
  bool full = false;
  uint64_t chunk_mib = 512;
};

void add_input_options(CLI::App* c, GraphArgs& a) {
  c->add_option("--trace", a.trace, "Trace file (HDF5, trace format v1)")->required()->check(CLI::ExistingFile);
  c->add_option("--layers", a.layers, "Layers to count: all, or e.g. 0,3,5-7")->capture_default_str();
  auto* t = c->add_option("--tokens", a.tokens, "Count only tokens A:B of the trace (A inclusive, B exclusive)");
  auto* q = c->add_option("--sequences", a.sequences, "Count only sequences A:B of the trace (their tokens)");
  auto* s = c->add_option("--slice", a.slice,
                          "Count only slice I/N: tokens [floor(I*T/N), floor((I+1)*T/N)) of T (e.g. "
                          "$SLURM_ARRAY_TASK_ID/N)");
  t->excludes(q)->excludes(s);
  q->excludes(s);
  c->add_option("--trace-sha256", a.trace_sha256,
                "The trace's sha256 when known (64 hex digits): skips hashing the whole trace, e.g. in every slice "
                "task of a cluster job (`sha256sum` it once)");
}

// "A:B" -> [A, B); either end may be omitted (0, `end`).
std::pair<uint64_t, uint64_t> parse_range(const std::string& opt, const std::string& v, uint64_t end) {
  const size_t c = v.find(':');
  auto num = [&](const std::string& x, uint64_t dflt) -> uint64_t {
    if (x.empty()) return dflt;
    if (x.find_first_not_of("0123456789") != std::string::npos)
      throw UsageError(opt + " '" + v + "': expected A:B with non-negative integers");
    return parse_uint_arg(opt + " '" + v + "'", x, 0, end);
  };
  if (c == std::string::npos) throw UsageError(opt + " '" + v + "': expected A:B");
  const uint64_t a = num(v.substr(0, c), 0), b = num(v.substr(c + 1), end);
  if (a > b || b > end) throw UsageError(opt + " " + v + " is not within 0:" + std::to_string(end) + " with A <= B");
  return {a, b};
}

// The token range the options select ([0, n_tokens) when none).
std::pair<uint64_t, uint64_t> token_range(const GraphArgs& a, const TraceInfo& ti) {
  if (!a.tokens.empty()) return parse_range("--tokens", a.tokens, ti.n_tokens);
  if (!a.sequences.empty()) {
    const auto [s0, s1] = parse_range("--sequences", a.sequences, ti.sequences.size());
    auto start = [&](uint64_t s) { return s < ti.sequences.size() ? uint64_t(ti.sequences[s]) : ti.n_tokens; };
    return {start(s0), start(s1)};
  }
  if (!a.slice.empty()) {
    const size_t c = a.slice.find('/');
    if (c == std::string::npos) throw UsageError("--slice '" + a.slice + "': expected I/N with 0 <= I < N");
    const std::string what = "--slice '" + a.slice + "' (I/N with 0 <= I < N)";
    const uint64_t n = parse_uint_arg(what, a.slice.substr(c + 1), 1);
    const uint64_t i = parse_uint_arg(what, a.slice.substr(0, c), 0, n - 1);
    const auto at = [&](uint64_t j) {  // floor(j*T/N) without overflow
      return uint64_t((unsigned __int128)j * ti.n_tokens / n);
    };
    return {at(i), at(i + 1)};
  }
  return {0, ti.n_tokens};
}

void add_output_options(CLI::App* c, GraphArgs& a) {
  c->add_option("--out", a.out, "Graph file to write (HDF5, graph format v1)")->required();
  c->add_option("--top-k", a.top_k, "Neighbours kept per neuron (0 = none)")
      ->check(CLI::Range(0, 65536))
      ->capture_default_str();
  c->add_flag("--full", a.full, "Also store the full upper-triangle counts (needed for graph-merge; 2n^2 bytes/layer)");
}

void add_compute_options(CLI::App* c, GraphArgs& a) {
  c->add_option("--kernel", a.kernel, "Popcount kernel")
      ->check(CLI::IsMember({"auto", "scalar", "avx2", "avx512"}))
      ->capture_default_str();
  c->add_option("--method", a.method,
                "Counting method: dense (AND+popcount per pair), sparse (per active token; "
                "AVX-512), auto (sparse below 20 % active)")
      ->check(CLI::IsMember({"auto", "dense", "sparse"}))
      ->capture_default_str();
  c->add_option("--chunk-mib", a.chunk_mib, "Mask words held per token chunk, MiB")
      ->check(CLI::Range(uint64_t(1), uint64_t(1) << 20))
      ->capture_default_str();
}

void graph_main(const GraphArgs& a, const GlobalOptions& g) {
  apply_global_options(g);
  check_paths({{"--trace", a.trace}}, {{"--out", a.out}});
  TraceReader tr(a.trace);
  const TraceInfo& ti = tr.info();
  const std::vector<uint32_t> layers = parse_layers(a.layers, ti.n_layers);
  CoactivationOptions o;
  o.top_k = a.top_k;
  o.full_matrix = a.full;
  o.kernel = popcount_kernel_resolve(popcount_kernel_parse(a.kernel));
  o.chunk_bytes = a.chunk_mib << 20;
  o.method = count_method_parse(a.method);
  if (!count_method_supported(o.method))
    throw UsageError("--method sparse needs AVX-512 F/BW/VBMI2, which this CPU lacks");
  const auto [t0, t1] = token_range(a, ti);
  o.token_begin = t0;
  o.token_end = t1;
  const uint64_t n_tok = t1 - t0;
  info(g, "graph: " + a.trace + ": " + std::to_string(layers.size()) + " layers, tokens " + std::to_string(t0) + ":" +
              std::to_string(t1) + " of " + std::to_string(ti.n_tokens) + ", kernel " + popcount_kernel_name(o.kernel) +
              ", " + std::to_string(omp_get_max_threads()) + " threads");
  GraphFileWriter w(a.out, a.trace);
  // What solve --graph records in the layout, as solve --trace does (sha256 of the trace file, its model).
  std::string sha = a.trace_sha256;
  if (sha.empty()) {
    sha = sha256_file(a.trace);
  } else {
    for (char& ch : sha) ch = char(std::tolower(static_cast<unsigned char>(ch)));
    if (sha.size() != 64 || sha.find_first_not_of("0123456789abcdef") != std::string::npos)
      throw UsageError("--trace-sha256 '" + a.trace_sha256 + "': expected 64 hexadecimal digits");
  }
  w.set_trace(GraphTraceRef{sha, ti.model, true, t0, t1, ti.n_layers});
  nlohmann::json jl = nlohmann::json::array();
  Progress prog("graph", layers.size(), !g.quiet, "layers");
  double total_s = 0;
  for (uint32_t l : layers) {
    auto t0 = std::chrono::steady_clock::now();
    LayerGraph lg = coactivation_count_trace(tr, l, o);
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    total_s += s;
    uint64_t active = 0, edges = 0;
    for (uint64_t f : lg.freq) active += f;
    for (uint32_t len : lg.nbr_len) edges += len;
    const double frac = lg.n_neurons && lg.n_tokens ? double(active) / (double(lg.n_neurons) * double(lg.n_tokens)) : 0;
    w.add_layer(l, lg);
    jl.push_back({{"layer", l},
                  {"n_neurons", lg.n_neurons},
                  {"active_fraction", frac},
                  {"seconds", s},
                  {"neighbour_entries", edges}});
    prog.add();
  }
  w.close();
  prog.finish();
  nlohmann::json j = {{"trace", a.trace},
                      {"out", a.out},
                      {"n_tokens", n_tok},
                      {"token_begin", t0},
                      {"token_end", t1},
                      {"top_k", a.top_k},
                      {"full", a.full},
                      {"kernel", popcount_kernel_name(o.kernel)},
                      {"threads", omp_get_max_threads()},
                      {"seconds", total_s},
                      {"layers", jl}};
  if (g.json) {
    std::printf("%s\n", json_dump(j, 2).c_str());
    return;
  }
  std::printf("%s: %zu layers, %llu tokens (%llu:%llu), top-%u%s, kernel %s: %.3f s counting\n", a.out.c_str(),
              layers.size(), static_cast<unsigned long long>(n_tok), static_cast<unsigned long long>(t0),
              static_cast<unsigned long long>(t1), a.top_k, a.full ? " + full matrix" : "",
              popcount_kernel_name(o.kernel), total_s);
  std::printf("%6s %8s %9s %9s\n", "layer", "neurons", "active %", "seconds");
  for (const auto& l : jl)
    std::printf("%6u %8u %9.3f %9.3f\n", l["layer"].get<uint32_t>(), l["n_neurons"].get<uint32_t>(),
                100 * l["active_fraction"].get<double>(), l["seconds"].get<double>());
}

}  // namespace

void add_layout_graph(CLI::App& app, GlobalOptions& g) {
  static GraphArgs a;
  CLI::App* c = app.add_subcommand("graph", "Count neuron co-activations of a trace into a graph file");
  add_input_options(c, a);
  add_output_options(c, a);
  add_compute_options(c, a);
  c->callback([&g] { graph_main(a, g); });
}

}  // namespace nl::cli
