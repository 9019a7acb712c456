// Registration functions, one per subcommand (one option-group function per concern inside each file).
#pragma once
#include "cli/common.h"

namespace nl::cli {
// nl-run
void add_run_probe(CLI::App& app, GlobalOptions& g);
// nl-layout
// (subcommands arrive with their modules: graph, solve, eval, pack)
// nl-profile
void add_profile_inspect(CLI::App& app, GlobalOptions& g);
void add_profile_synth(CLI::App& app, GlobalOptions& g);
}  // namespace nl::cli
