// Registration functions, one per subcommand (one option-group function per concern inside each file).
#pragma once
#include "cli/common.h"

namespace nl::cli {
// nl-run
void add_run_probe(CLI::App& app, GlobalOptions& g);
void add_run_generate(CLI::App& app, GlobalOptions& g);
#ifdef NL_FULL_BUILD
void add_run_replay(CLI::App& app, GlobalOptions& g);  // HDF5 traces: full builds only
#endif
// nl-layout
void add_layout_graph(CLI::App& app, GlobalOptions& g);
void add_layout_graph_merge(CLI::App& app, GlobalOptions& g);
// (subcommands arrive with their modules: graph, solve, eval, pack)
void add_layout_solve(CLI::App& app, GlobalOptions& g);
void add_layout_eval(CLI::App& app, GlobalOptions& g);
void add_layout_report(CLI::App& app, GlobalOptions& g);
void add_layout_pack(CLI::App& app, GlobalOptions& g);
// nl-profile
void add_profile_inspect(CLI::App& app, GlobalOptions& g);
void add_profile_run(CLI::App& app, GlobalOptions& g);
void add_profile_convert(CLI::App& app, GlobalOptions& g);
void add_profile_generate(CLI::App& app, GlobalOptions& g);
void add_profile_decode(CLI::App& app, GlobalOptions& g);
void add_profile_synth(CLI::App& app, GlobalOptions& g);
void add_profile_merge(CLI::App& app, GlobalOptions& g);
}  // namespace nl::cli
