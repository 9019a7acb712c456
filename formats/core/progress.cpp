#include "formats/core/progress.h"

#include <unistd.h>

#include <cstdio>

namespace nl {

namespace {
std::atomic<bool> g_quiet{false};

std::string fmt_seconds(double s) {
  char b[32];
  if (s < 0 || s > 1e7) return "?";
  if (s < 60) {
    std::snprintf(b, sizeof b, "%.0fs", s);
  } else if (s < 3600) {
    std::snprintf(b, sizeof b, "%dm%02ds", int(s) / 60, int(s) % 60);
  } else {
    std::snprintf(b, sizeof b, "%dh%02dm", int(s) / 3600, (int(s) % 3600) / 60);
  }
  return b;
}
}  // namespace

void Progress::set_quiet(bool q) { g_quiet = q; }
bool Progress::quiet() { return g_quiet; }

Progress::Progress(std::string stage, uint64_t total, bool enabled, std::string unit)
    : stage_(std::move(stage)),
      unit_(std::move(unit)),
      total_(total),
      enabled_(enabled && !g_quiet),
      tty_(::isatty(STDERR_FILENO) == 1) {
  start_ = last_ = std::chrono::steady_clock::now();
}

Progress::~Progress() {
  if (!finished_ && enabled_ && tty_) std::fputc('\n', stderr);
}

void Progress::add(uint64_t n) {
  done_.fetch_add(n, std::memory_order_relaxed);
  maybe_draw(false);
}

void Progress::set(uint64_t d) {
  done_.store(d, std::memory_order_relaxed);
  maybe_draw(false);
}

void Progress::set_total(uint64_t total) {
  std::lock_guard<std::mutex> lock(mu_);
  total_ = total;
}

void Progress::finish() {
  if (finished_) return;
  maybe_draw(true);
  finished_ = true;
  if (enabled_ && tty_) std::fputc('\n', stderr);
}

void Progress::note(const std::string& line) {
  if (!enabled_) return;
  std::lock_guard<std::mutex> lock(mu_);
  // On a terminal, clear the bar's line; the next update redraws it below the note.
  std::fprintf(stderr, "%s%s\n", tty_ && !finished_ ? "\r\033[K" : "", line.c_str());
  std::fflush(stderr);
}

void Progress::maybe_draw(bool force) {
  if (!enabled_) return;
  auto now = std::chrono::steady_clock::now();
  std::unique_lock<std::mutex> lock(mu_, std::try_to_lock);
  if (!lock.owns_lock() && !force) return;
  if (!lock.owns_lock()) lock.lock();
  double since_last = std::chrono::duration<double>(now - last_).count();
  if (!force && since_last < (tty_ ? 0.1 : 5.0)) return;
  uint64_t shown = done_.load(std::memory_order_relaxed);
  if (force && !tty_ && shown == drawn_) return;  // the last plain line already says it
  drawn_ = shown;
  last_ = now;
  double el = std::chrono::duration<double>(now - start_).count();
  uint64_t d = shown;
  double rate = el > 0 ? double(d) / el : 0;
  char line[256];
  if (total_ > 0) {
    double frac = std::min(1.0, double(d) / double(total_));
    double left = rate > 0 ? double(total_ - std::min(d, total_)) / rate : -1;
    if (tty_) {
      char bar[31];
      int filled = int(frac * 30);
      for (int i = 0; i < 30; ++i) bar[i] = i < filled ? '#' : '-';
      bar[30] = 0;
      std::snprintf(line, sizeof line, "\r%s [%s] %llu/%llu %s %.1f/s  %s left   ", stage_.c_str(), bar,
                    (unsigned long long)d, (unsigned long long)total_, unit_.c_str(), rate,
                    force ? "0s" : fmt_seconds(left).c_str());
    } else {
      std::snprintf(line, sizeof line, "%s: %llu/%llu %s (%.0f%%), %.1f/s, %s elapsed, %s left\n", stage_.c_str(),
                    (unsigned long long)d, (unsigned long long)total_, unit_.c_str(), 100 * frac, rate,
                    fmt_seconds(el).c_str(), force ? "0s" : fmt_seconds(left).c_str());
    }
  } else {
    std::snprintf(line, sizeof line,
                  tty_ ? "\r%s: %llu %s, %.1f/s, %s elapsed   " : "%s: %llu %s, %.1f/s, %s elapsed\n", stage_.c_str(),
                  (unsigned long long)d, unit_.c_str(), rate, fmt_seconds(el).c_str());
  }
  std::fputs(line, stderr);
  std::fflush(stderr);
}

}  // namespace nl
