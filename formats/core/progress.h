// Progress reporting for long work (profiling, counting, solving, packing, benchmarks): a redrawn bar with
// stage, done/total, rate and time left when stderr is a terminal; a plain line every few seconds otherwise;
// nothing when disabled (--quiet). Thread-safe: update() may be called from OpenMP workers.
#pragma once
#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>

namespace nl {

class Progress {
 public:
  // total = 0 means unknown (no bar, no time left).
  Progress(std::string stage, uint64_t total, bool enabled, std::string unit = "");
  ~Progress();
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  void add(uint64_t n = 1);        // n more items done
  void set(uint64_t done);         // absolute count
  void set_total(uint64_t total);  // when the total becomes known after construction
  void finish();                   // final line with the total time
  // An informational line that does not garble the bar (printed above it on a terminal); silent when disabled.
  void note(const std::string& line);

  // Global default for `enabled` (set once from --quiet by the binaries).
  static void set_quiet(bool quiet);
  static bool quiet();

 private:
  void maybe_draw(bool force);
  std::string stage_, unit_;
  uint64_t total_;
  bool enabled_, tty_, finished_ = false;
  std::atomic<uint64_t> done_{0};
  uint64_t drawn_ = UINT64_MAX;  // count shown by the last plain line (finish() does not repeat it)
  std::chrono::steady_clock::time_point start_, last_;
  std::mutex mu_;
};

}  // namespace nl
