// nl-layout graph-merge: sum graph files counted from token shards of one trace (exact; needs --full inputs).
#include <cstdio>
#include <nlohmann/json.hpp>
#include <optional>

#include "cli/commands.h"
#include "formats/core/progress.h"
#include "graph/graph_file.h"

namespace nl::cli {
namespace {

struct MergeArgs {
  std::vector<std::string> inputs;
  std::string out;
  int64_t top_k = -1;
};

void merge_main(const MergeArgs& a, const GlobalOptions& g) {
  apply_global_options(g);
  check_paths(named_paths("input", a.inputs), {{"--out", a.out}});
  std::optional<uint32_t> k;
  if (a.top_k >= 0) k = static_cast<uint32_t>(a.top_k);
  info(g, "graph-merge: " + std::to_string(a.inputs.size()) + " inputs -> " + a.out);
  uint32_t n_layers = 0;
  {
    GraphFileReader first(a.inputs.front());
    n_layers = uint32_t(first.info().layers.size());
  }
  Progress prog("graph-merge", n_layers, !g.quiet, "layers");
  graph_file_merge(a.inputs, a.out, k, [&prog] { prog.add(1); });
  prog.finish();
  GraphFileReader r(a.out);
  const GraphFileInfo& gi = r.info();
  if (g.json) {
    nlohmann::json j = {
        {"out", a.out}, {"inputs", a.inputs}, {"n_tokens", gi.n_tokens}, {"top_k", gi.top_k}, {"layers", gi.layers}};
    std::printf("%s\n", json_dump(j, 2).c_str());
    return;
  }
  std::printf("%s: %zu inputs merged, %zu layers, %llu tokens, top-%u + full matrix\n", a.out.c_str(), a.inputs.size(),
              gi.layers.size(), static_cast<unsigned long long>(gi.n_tokens), gi.top_k);
}

}  // namespace

void add_layout_graph_merge(CLI::App& app, GlobalOptions& g) {
  static MergeArgs a;
  CLI::App* c = app.add_subcommand(
      "graph-merge", "Sum graph files counted from token shards of one trace (inputs must be counted with --full)");
  c->add_option("inputs", a.inputs, "Graph files to merge")->required()->check(CLI::ExistingFile);
  c->add_option("--out", a.out, "Merged graph file (stores the full matrix, so it can be merged again)")->required();
  c->add_option("--top-k", a.top_k, "Neighbours per neuron in the output (default: the inputs' k)")
      ->check(CLI::Range(0, 65536));
  c->callback([&g] { merge_main(a, g); });
}

}  // namespace nl::cli
