// nl-profile: activation traces. Subcommands are registered here; each lives in cli/profile_<name>.cpp.
#include "cli/commands.h"
#include "cli/common.h"

int main(int argc, char** argv) {
  return nl::cli::run_main("nl-profile", "Neuralink profiler: record which FFN neurons fire, as HDF5 traces", argc,
                           argv, [](CLI::App& app) {
                             static nl::cli::GlobalOptions g;
                             nl::cli::add_global_options(app, g);
                             nl::cli::add_profile_run(app, g);
                             nl::cli::add_profile_inspect(app, g);
                             nl::cli::add_profile_convert(app, g);
                             nl::cli::add_profile_generate(app, g);
                             nl::cli::add_profile_decode(app, g);
                             nl::cli::add_profile_synth(app, g);
                             nl::cli::add_profile_merge(app, g);
                           });
}
