// Running the command-line tools from tests: the one popen runner the CLI tests share (exit code + captured output).
#pragma once
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <string>

namespace nl::test {

enum class Stderr { kMerge, kDrop };  // stderr interleaved with the captured stdout, or discarded

// Runs `cmd` through the shell; returns its exit code (-1 when it did not exit normally) and stores what it printed.
inline int sh(const std::string& cmd, std::string* out = nullptr, Stderr err = Stderr::kMerge) {
  FILE* p = ::popen((cmd + (err == Stderr::kMerge ? " 2>&1" : " 2>/dev/null")).c_str(), "r");
  if (!p) return -1;
  std::array<char, 4096> buf{};
  std::string s;
  while (size_t n = std::fread(buf.data(), 1, buf.size(), p)) s.append(buf.data(), n);
  const int st = ::pclose(p);
  if (out) *out = std::move(s);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

struct Result {
  int rc = -1;
  std::string out;
};

// One of the project's binaries (nl-run, nl-layout, nl-profile) from this build with `args`.
inline Result run_tool(const std::string& bin, const std::string& args, Stderr err) {
  Result r;
  r.rc = sh(std::string(NL_BINARY_DIR) + "/cli/" + bin + " " + args, &r.out, err);
  return r;
}

}  // namespace nl::test
