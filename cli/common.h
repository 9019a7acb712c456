// Shared by the three binaries: one top-level error handler, global options, small printing helpers.
// cli/ parses arguments and prints; the work happens in the modules below it.
#pragma once
#include <CLI/CLI.hpp>
#include <functional>
#include <string>

namespace nl::cli {

struct GlobalOptions {
  bool quiet = false;  // no progress or informational lines on stderr
  bool json = false;   // machine-readable output on stdout where a command prints figures
  int threads = 0;     // OpenMP threads; 0 = all cores
};

// Global options every binary accepts (--quiet, --json, --threads).
void add_global_options(CLI::App& app, GlobalOptions& g);
// Applies --threads etc.; call at the start of each subcommand callback.
void apply_global_options(const GlobalOptions& g);

// Builds the app with `setup`, parses, runs the chosen subcommand, and maps every error to one line on
// stderr ("<name>: error: ...") and the exit code documented in docs/cli.md.
int run_main(const std::string& name, const std::string& description, int argc, char** argv,
             const std::function<void(CLI::App&)>& setup);

// An informational line on stderr unless --quiet.
void info(const GlobalOptions& g, const std::string& line);

}  // namespace nl::cli
