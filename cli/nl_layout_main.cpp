// nl-layout: offline layout work. Subcommands are registered here; each lives in cli/layout_<name>.cpp.
#include "cli/commands.h"
#include "cli/common.h"

int main(int argc, char** argv) {
  return nl::cli::run_main("nl-layout", "Neuralink layout: co-activation graphs, neuron orders, evaluation, packing",
                           argc, argv, [](CLI::App& app) {
                             static nl::cli::GlobalOptions g;
                             nl::cli::add_global_options(app, g);
                             nl::cli::add_layout_graph(app, g);
                             nl::cli::add_layout_graph_merge(app, g);
                             nl::cli::add_layout_solve(app, g);
                             nl::cli::add_layout_eval(app, g);
                           });
}
