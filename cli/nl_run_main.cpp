// nl-run: the thin on-device runtime. Subcommands are registered here; each lives in cli/run_<name>.cpp.
#include "cli/commands.h"
#include "cli/common.h"

int main(int argc, char** argv) {
  return nl::cli::run_main("nl-run", "Neuralink runtime: reads active FFN neurons from a flash image", argc, argv,
                           [](CLI::App& app) {
                             static nl::cli::GlobalOptions g;
                             nl::cli::add_global_options(app, g);
                             nl::cli::add_run_probe(app, g);
                             nl::cli::add_run_generate(app, g);
#ifdef NL_FULL_BUILD
                             nl::cli::add_run_replay(app, g);
#endif
                           });
}
