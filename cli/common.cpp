#include "cli/common.h"

#include <omp.h>

#include <cstdio>
#include <exception>
#include <iostream>
#include <new>

#include "formats/core/error.h"
#include "formats/core/progress.h"
#include "nl_version.h"

namespace nl::cli {

void add_global_options(CLI::App& app, GlobalOptions& g) {
  app.add_flag("-q,--quiet", g.quiet, "Print no progress or informational lines")->group("Global");
  app.add_flag("--json", g.json, "Print machine-readable JSON on stdout where figures are printed")->group("Global");
  app.add_option("--threads", g.threads, "Worker threads (0 = all cores)")
      ->check(CLI::Range(0, 4096))
      ->group("Global");
}

void apply_global_options(const GlobalOptions& g) {
  Progress::set_quiet(g.quiet);
  if (g.threads > 0) omp_set_num_threads(g.threads);
}

void info(const GlobalOptions& g, const std::string& line) {
  if (!g.quiet) std::fprintf(stderr, "%s\n", line.c_str());
}

int run_main(const std::string& name, const std::string& description, int argc, char** argv,
             const std::function<void(CLI::App&)>& setup) {
  try {
    CLI::App app(description, name);
    app.set_version_flag("-V,--version", name + " " + NL_VERSION);
    app.require_subcommand(1);
    app.fallthrough();
    setup(app);
    try {
      app.parse(argc, argv);
    } catch (const CLI::CallForHelp& e) {
      return app.exit(e);
    } catch (const CLI::CallForAllHelp& e) {
      return app.exit(e);
    } catch (const CLI::CallForVersion& e) {
      return app.exit(e);
    } catch (const CLI::ParseError& e) {
      std::fprintf(stderr, "%s: error: %s (run '%s --help')\n", name.c_str(), e.what(), name.c_str());
      return kExitUsage;
    }
    std::fflush(stdout);
    return kExitOk;
  } catch (const Error& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "%s: error: %s\n", name.c_str(), e.what());
    return e.exit_code();
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "%s: error: out of memory\n", name.c_str());
    return kExitInternal;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: internal error: %s\n", name.c_str(), e.what());
    return kExitInternal;
  }
}

}  // namespace nl::cli
