// Shared by the three binaries: one top-level error handler, global options, small printing helpers.
// cli/ parses arguments and prints; the work happens in the modules below it.
#pragma once
#include <CLI/CLI.hpp>
#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "formats/core/number_text.h"  // float_arg_problem

namespace nl::cli {

// The most worker threads a command may use (--threads, OMP_NUM_THREADS): each costs a stack and per-thread
// buffers, and 4096 threads took 7 GB before doing anything. docs/cli.md states it.
inline constexpr int kMaxThreads = 256;

struct GlobalOptions {
  bool quiet = false;  // no progress or informational lines on stderr
  bool json = false;   // machine-readable output on stdout where a command prints figures
  int threads = 0;     // OpenMP threads; 0 = all cores
};

// The one checked parser for numbers the CLIs read from text by hand (ranges "A:B", slices "I/N", lists, "name:N"
// forms): the whole text must be the number, within [lo, hi]; otherwise a UsageError naming `option` (exit 2), never
// an internal error from std::stoull or a wrapped-around value.
uint64_t parse_uint_arg(const std::string& option, const std::string& text, uint64_t lo = 0, uint64_t hi = UINT64_MAX);
// A finite, non-subnormal decimal (0 allowed) within [lo, hi]: NaN, infinities, subnormals and trailing junk are a
// UsageError naming `option`.
double parse_double_arg(const std::string& option, const std::string& text, double lo = -1e308, double hi = 1e308);
// float_arg_problem (formats/core/number_text.h): the check every FLOAT option gets (run_main adds it).

// Work that cannot fit is refused before it starts (docs/robustness.md "Impossible work"): `what` needs about
// `bytes` of memory and MemAvailable is less: IoError (exit 4, the out-of-memory code) with both figures.
void require_memory(const std::string& what, uint64_t bytes);

// Global options every binary accepts (--quiet, --json, --threads).
void add_global_options(CLI::App& app, GlobalOptions& g);
// Applies --threads etc.; call at the start of each subcommand callback. Refuses OMP_NUM_THREADS above kMaxThreads
// (UsageError) and creates the OpenMP threads now, after checking the system lets them be created: a refusal is an
// IoError naming --threads (exit 4), not libgomp's own "Thread creation failed" (exit 1) in the middle of the work.
void apply_global_options(const GlobalOptions& g);

// `--prompt ""` generates from BOS alone, as llama.cpp's `llama-cli -p ""` and llama2.c's `run` do; never silently:
// one warning line on stderr, even with --quiet (docs/cli.md).
void warn_empty_prompt(const std::string& binary);

// Builds the app with `setup`, parses, runs the chosen subcommand, and maps every error to one line on
// stderr ("<name>: error: ...") and the exit code documented in docs/cli.md.
int run_main(const std::string& name, const std::string& description, int argc, char** argv,
             const std::function<void(CLI::App&)>& setup);

// A path a command reads or writes, with the option that named it (for the error line).
struct NamedPath {
  std::string option, path;
};

// The files of one command, checked before any work (docs/robustness.md "Inputs and outputs"):
//  - an input that exists must be a regular file, or a folder (each regular file in it counts as an input); a FIFO,
//    device or socket is refused (InputError, exit 3): nothing may block or read without end;
//  - an output's folder must exist (UsageError, exit 2: a typo'd folder is found now, not after an hour of work)
//    and be writable (IoError, exit 4); an existing output must be a regular file (never a folder, FIFO or device);
//  - no output may be the same file as an input or another output (device + inode after resolving links; an
//    output not yet there by its folder's device + inode and its name): UsageError, exit 2.
// Callers list the files an option implies too (an image's manifest and tokenizer, a model folder's files).
void check_paths(const std::vector<NamedPath>& inputs, const std::vector<NamedPath>& outputs);

// Each of `paths` named by `option` (an option given several times).
std::vector<NamedPath> named_paths(const std::string& option, const std::vector<std::string>& paths);

// The files a Hugging Face model folder output holds (config.json, model.safetensors), for check_paths; the folder
// itself when it does not exist yet.
std::vector<NamedPath> hf_folder_outputs(const std::string& option, const std::string& folder);

// What JSON output does with text that is not UTF-8 (a byte token, a non-UTF-8 prompt, path or tokenizer piece):
// each byte of an invalid sequence becomes U+FFFD (kReplace) or the four characters "\xNN" (kEscape).
enum class InvalidUtf8 { kReplace, kEscape };
// `s` with valid UTF-8 kept and each byte of an invalid sequence (overlong forms, surrogates and code points past
// U+10FFFF included) treated as `mode` says.
std::string utf8_for_json(const std::string& s, InvalidUtf8 mode);
// Every JSON document the CLIs print or write: each string (keys too) passes through utf8_for_json, so invalid text
// never becomes an exception that loses the output; text mode prints the raw bytes.
std::string json_dump(const nlohmann::json& j, int indent = -1, InvalidUtf8 mode = InvalidUtf8::kReplace);

// An error message as one printable line: control bytes, newlines and bytes that are not well-formed UTF-8 become
// \xNN (a message may quote bytes of a damaged input file; the terminal must not interpret them).
std::string printable(const std::string& s);

// An informational line on stderr unless --quiet.
void info(const GlobalOptions& g, const std::string& line);

}  // namespace nl::cli
