// nl-layout solve --graph: solve from the co-activation counts of a graph file (nl-layout graph / graph-merge,
// e.g. counted in slices on many machines) instead of recounting a trace, with an optional token sample (a trace)
// for the parts that need tokens. docs/solvers.md "What needs tokens" says which parts those are.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "layout/solve.h"

namespace nl {

// What the graph gives solve for one layer, prepared as solve_layer would have counted it (`co`): the top-k lists
// cut (or rebuilt from the full matrix) to co.top_k, the full matrix kept only when co.full_matrix. Throws
// UsageError naming the file when the graph lacks what solve needs (the full matrix, or lists of >= co.top_k).
// A full matrix solve does not use is moved to *unused_upper (when given; the exact path weight needs it).
LayerGraph graph_counts_for_solve(LayerGraph g, const CoactivationOptions& co, const std::string& path, uint32_t layer,
                                  std::vector<uint32_t>* unused_upper = nullptr);

// Solves every layer of the graph files (together they hold layers 0..L-1, each once, counted over the same tokens:
// e.g. one merged file per layer group). `sample_trace` ("" = none): a trace of the
// same model whose tokens greedy+ls's search, guard and cache variants run on (required for greedy+ls), and
// which greedy over top-k lists joins its fragments on. The layout records the graph's trace (sha256, model,
// tokens), so `graph` + `solve --graph` over a whole trace writes the layout `solve --trace` writes.
Layout solve_graph(const std::vector<std::string>& graph_paths, const std::string& sample_trace,
                   const SolveOptions& opt,
                   const std::function<void(uint32_t layer, const LayerSolve&)>& progress = {});

}  // namespace nl
