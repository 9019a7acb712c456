// solve --graph: counts from a graph file instead of a trace; the per-layer solve is solve_layer's own.
#include "layout/solve_graph.h"

#include <omp.h>

#include <mutex>

#include "formats/core/error.h"
#include "formats/trace.h"
#include "graph/graph_file.h"

namespace nl {

LayerGraph graph_counts_for_solve(LayerGraph g, const CoactivationOptions& co, const std::string& path, uint32_t layer,
                                  std::vector<uint32_t>* unused_upper) {
  const std::string at = path + ": layer " + std::to_string(layer) + ": ";
  const bool has_upper = g.has_full();
  if (co.full_matrix && !has_upper)
    throw UsageError(at +
                     "stores top-k lists only, but greedy uses every pair of a layer this size (count it with "
                     "`graph --full`, or solve with --full-matrix-mib 0 for the top-k form)");
  if (has_upper && (co.top_k > g.k || !co.full_matrix)) {
    // Exact top-k lists of any length come from the full matrix (the lists solve's own count would give).
    coactivation_build_topk(g, co.top_k);
  } else if (co.top_k < g.k) {
    // Exact top-k lists are prefixes of longer ones (count desc, index asc): cut each row to co.top_k.
    const uint32_t k = co.top_k;
    std::vector<uint32_t> nbr(size_t(g.n_neurons) * k), cnt(size_t(g.n_neurons) * k);
    for (uint32_t v = 0; v < g.n_neurons; ++v) {
      std::copy_n(g.nbr.begin() + std::ptrdiff_t(size_t(v) * g.k), k, nbr.begin() + std::ptrdiff_t(size_t(v) * k));
      std::copy_n(g.nbr_cnt.begin() + std::ptrdiff_t(size_t(v) * g.k), k, cnt.begin() + std::ptrdiff_t(size_t(v) * k));
      g.nbr_len[v] = std::min(g.nbr_len[v], k);
    }
    g.nbr.swap(nbr);
    g.nbr_cnt.swap(cnt);
    g.k = k;
  } else if (co.top_k > g.k) {
    throw UsageError(at + "stores top-" + std::to_string(g.k) + " lists, fewer than solve's --top-k " +
                     std::to_string(co.top_k) + " (count with a larger --top-k or --full, or lower --top-k)");
  }
  if (!co.full_matrix) {
    if (unused_upper) unused_upper->swap(g.upper);
    g.upper.clear();
    g.upper.shrink_to_fit();
  }
  return g;
}

namespace {

// Path weight from what the graph knows: exact from the full matrix; else the adjacent pairs found in the top-k
// lists (a lower bound: a pair outside both neurons' lists counts 0).
uint64_t graph_path_weight(const LayerGraph& g, const std::vector<uint32_t>& upper, const Order& o) {
  uint64_t w = 0;
  const uint32_t n = g.n_neurons;
  for (size_t i = 0; i + 1 < o.size(); ++i) {
    const uint32_t a = o[i], b = o[i + 1];
    if (!upper.empty()) {
      w += upper[LayerGraph::upper_index(n, std::min(a, b), std::max(a, b))];
      continue;
    }
    uint64_t c = 0;
    for (uint32_t e = 0; e < (g.k ? g.nbr_len[a] : 0) && !c; ++e)
      if (g.nbr[size_t(a) * g.k + e] == b) c = g.nbr_cnt[size_t(a) * g.k + e];
    for (uint32_t e = 0; e < (g.k ? g.nbr_len[b] : 0) && !c; ++e)
      if (g.nbr[size_t(b) * g.k + e] == a) c = g.nbr_cnt[size_t(b) * g.k + e];
    w += c;
  }
  return w;
}

}  // namespace

Layout solve_graph(const std::vector<std::string>& graph_paths, const std::string& sample_trace,
                   const SolveOptions& options, const std::function<void(uint32_t, const LayerSolve&)>& progress) {
  if (graph_paths.empty()) throw UsageError("solve --graph needs a graph file");
  // The graph's counts hold every counted token: no validation split is made (solve_layer), and the layout records so.
  SolveOptions opt = options;
  opt.validation_share = 0;
  // Every layer from exactly one file (layer groups may be counted and merged separately); the files must
  // describe the same counted tokens.
  std::vector<std::unique_ptr<GraphFileReader>> grs;
  std::vector<std::pair<size_t, size_t>> where;  // layer -> (file, index in it)
  std::vector<uint32_t> widths;
  for (const auto& p : graph_paths) {
    grs.push_back(std::make_unique<GraphFileReader>(p));
    const GraphFileInfo& fi = grs.back()->info();
    const GraphFileInfo& f0 = grs.front()->info();
    if (fi.n_tokens != f0.n_tokens || fi.trace.sha256 != f0.trace.sha256 || fi.trace.model != f0.trace.model)
      throw InputError(p, "counts other tokens than " + f0.path + " (n_tokens, trace sha256 or model differ)");
    for (size_t i = 0; i < fi.layers.size(); ++i) {
      const uint32_t l = fi.layers[i];
      if (l >= where.size()) where.resize(size_t(l) + 1, {SIZE_MAX, 0}), widths.resize(size_t(l) + 1, 0);
      if (where[l].first != SIZE_MAX)
        throw InputError(p, "holds layer " + std::to_string(l) + ", as " + graph_paths[where[l].first] + " does");
      where[l] = {grs.size() - 1, i};
      widths[l] = fi.n_neurons[i];
    }
  }
  const std::string graph_path = graph_paths.front();
  const GraphFileInfo& gi = grs.front()->info();
  const uint32_t n_layers = uint32_t(where.size());
  for (uint32_t l = 0; l < n_layers; ++l)
    if (where[l].first == SIZE_MAX)
      throw InputError(graph_path, "no graph file holds layer " + std::to_string(l) +
                                       " (solve orders every layer: count them all, --layers all)");
  if (n_layers == 0) throw InputError(graph_path, "holds no layers");
  // The trace's own layer count, where the files record it: layers past the last one counted are missing too.
  for (const auto& gr : grs)
    if (const uint32_t tl = gr->info().trace.n_layers; tl > n_layers)
      throw InputError(gr->info().path, "counts layers 0-" + std::to_string(n_layers - 1) + " of a trace with " +
                                            std::to_string(tl) + " layers: no graph file holds layer " +
                                            std::to_string(n_layers) +
                                            " (solve orders every layer: count them all, --layers all)");
  if (opt.method == "greedy+ls" && sample_trace.empty())
    throw UsageError(
        "--method greedy+ls from --graph needs --trace SAMPLE.h5: its search, guard and cache variants "
        "measure the device objective on tokens (docs/solvers.md)");
  std::unique_ptr<TraceReader> tr;
  if (!sample_trace.empty()) {
    tr = std::make_unique<TraceReader>(sample_trace);
    const TraceInfo& ti = tr->info();
    if (ti.n_layers != n_layers)
      throw InputError(sample_trace, "has " + std::to_string(ti.n_layers) + " layers but graph " + graph_path +
                                         " has " + std::to_string(n_layers));
    for (uint32_t l = 0; l < n_layers; ++l)
      if (ti.n_neurons[l] != widths[l])
        throw InputError(sample_trace, "layer " + std::to_string(l) + " has " + std::to_string(ti.n_neurons[l]) +
                                           " neurons but graph " + graph_path + " has " + std::to_string(widths[l]));
    if (!gi.trace.model.empty() && ti.model != gi.trace.model)
      throw InputError(sample_trace, "is a trace of model '" + ti.model + "' but graph " + graph_path + " counts '" +
                                         gi.trace.model + "'");
  }
  Layout out;
  out.method = opt.method;
  out.trace_sha256 = gi.trace.sha256;
  out.trace_model = gi.trace.model;
  out.trace_tokens = gi.n_tokens;
  out.parameters = solve_parameters(opt);
  std::mutex io_mu;
  solve_layers(out, n_layers, progress, [&](uint32_t l) {
    LayerGraph file_g, g;
    std::vector<uint32_t> spare_upper;
    LayerMask m(widths[l], 0);  // no tokens unless a sample is given
    {
      std::lock_guard<std::mutex> lk(io_mu);  // HDF5 is serialised
      file_g = grs[where[l].first]->read_layer(where[l].second);
      if (tr) m = tr->read_layer(l);
    }
    auto counts = [&](uint32_t layer, const CoactivationOptions& co) -> const LayerGraph& {
      g = graph_counts_for_solve(std::move(file_g), co, graph_paths[where[layer].first], layer, &spare_upper);
      return g;
    };
    LayerSolve s = solve_layer(m, opt, l, nullptr, counts);
    // solve_layer measures the path weight on the sample where the graph's matrix does not cover it: record
    // the graph's own (exact with the full matrix, or when the sample is the counted trace itself).
    if (!(graph_covers(g, m) || (m.n_tokens == g.n_tokens && m.n_tokens > 0)))
      s.objective = graph_path_weight(g, g.upper.empty() ? spare_upper : g.upper, s.order);
    return s;
  });
  return out;
}

}  // namespace nl
