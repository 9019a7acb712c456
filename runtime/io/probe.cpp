#include "runtime/io/probe.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <nlohmann/json.hpp>
#include <thread>

#include "formats/core/atomic_file.h"
#include "formats/core/error.h"
#include "formats/core/rng.h"
#include "runtime/io/file.h"
#ifdef NL_HAVE_URING
#include <liburing.h>
#endif

namespace nl {
namespace {

using Clock = std::chrono::steady_clock;

// O_EXCL: the probe writes only a file it created itself, never a user's file or a device.
// Registered for removal (signals, errors) only once created, so that no path of a user's file is ever registered.
void create_probe_file(const std::string& path, uint64_t bytes, std::string* created_path, int* slot) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0 && errno == EEXIST)
    throw UsageError("--file " + path +
                     " exists: the probe writes only a file it creates itself (pass --read-only "
                     "to measure an existing file by reading it)");
  if (fd < 0) throw IoError(path, errno_text("cannot create probe file"));
  *slot = cleanup_register(path);
  *created_path = path;
  const size_t chunk = 4 << 20;
  std::vector<uint64_t> data(chunk / 8);
  SplitMix64 rng(12345);
  for (uint64_t off = 0; off < bytes; off += chunk) {
    for (auto& w : data) w = rng.next();  // incompressible, so no device shortcut on zero pages
    size_t n = static_cast<size_t>(std::min<uint64_t>(chunk, bytes - off));
    if (::pwrite(fd, data.data(), n, static_cast<off_t>(off)) != static_cast<ssize_t>(n)) {
      ::close(fd);
      throw IoError(path, errno_text("cannot write probe file"));
    }
  }
  if (::fsync(fd) != 0) {
    ::close(fd);
    throw IoError(path, errno_text("fsync failed"));
  }
  (void)posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);  // advisory
  ::close(fd);
}

std::vector<uint64_t> random_offsets(uint64_t file_bytes, uint32_t size, size_t n, uint64_t seed) {
  SplitMix64 rng(seed);
  uint64_t slots = (file_bytes - size) / 4096 + 1;
  std::vector<uint64_t> v(n);
  for (auto& o : v) o = rng.below(slots) * 4096;
  return v;
}

// One read in flight. Each read is timed; the median resists stalls caused by other work on the machine.
ProbePoint measure_qd1(int fd, uint64_t file_bytes, uint32_t size, const ProbeOptions& o, uint64_t seed) {
  auto offs = random_offsets(file_bytes, size, o.max_reads_per_point, seed);
  AlignedBuffer buf(size);
  std::vector<double> times;
  times.reserve(offs.size());
  auto t0 = Clock::now();
  for (uint64_t off : offs) {
    auto a = Clock::now();
    ssize_t r = ::pread(fd, buf.data(), size, static_cast<off_t>(off));
    if (r != static_cast<ssize_t>(size)) throw IoError(o.file, errno_text("probe read failed"));
    auto b = Clock::now();
    times.push_back(std::chrono::duration<double>(b - a).count());
    if (std::chrono::duration<double>(b - t0).count() > o.seconds_per_point) break;
  }
  std::nth_element(times.begin(), times.begin() + times.size() / 2, times.end());
  return {size, 1, times.size(), times[times.size() / 2]};
}

#ifdef NL_HAVE_URING
bool measure_uring(int fd, uint64_t file_bytes, uint32_t size, const ProbeOptions& o, uint64_t seed, ProbePoint* out) {
  io_uring ring;
  if (io_uring_queue_init(o.queue_depth, &ring, 0) != 0) return false;
  auto offs = random_offsets(file_bytes, size, o.max_reads_per_point, seed);
  AlignedBuffer buf(size_t(size) * o.queue_depth);
  size_t next = 0, inflight = 0, done = 0;
  bool stop = false;
  auto t0 = Clock::now();
  auto submit_one = [&](uint32_t slot) {
    io_uring_sqe* sqe = io_uring_get_sqe(&ring);
    io_uring_prep_read(sqe, fd, buf.data() + size_t(slot) * size, size, offs[next++]);
    io_uring_sqe_set_data64(sqe, slot);
    ++inflight;
  };
  for (uint32_t s = 0; s < o.queue_depth && next < offs.size(); ++s) submit_one(s);
  io_uring_submit(&ring);
  while (inflight > 0) {
    io_uring_cqe* cqe = nullptr;
    int rc = io_uring_wait_cqe(&ring, &cqe);
    if (rc < 0) {
      io_uring_queue_exit(&ring);
      throw IoError(o.file, std::string("io_uring wait failed: ") + std::strerror(-rc));
    }
    if (cqe->res != static_cast<int>(size)) {
      int res = cqe->res;
      io_uring_queue_exit(&ring);
      throw IoError(o.file, std::string("probe read failed: ") + (res < 0 ? std::strerror(-res) : "short read"));
    }
    uint32_t slot = static_cast<uint32_t>(io_uring_cqe_get_data64(cqe));
    io_uring_cqe_seen(&ring, cqe);
    --inflight;
    ++done;
    if (!stop && (done & 15) == 0 && std::chrono::duration<double>(Clock::now() - t0).count() > o.seconds_per_point)
      stop = true;
    if (!stop && next < offs.size()) {
      submit_one(slot);
      io_uring_submit(&ring);
    }
  }
  double s = std::chrono::duration<double>(Clock::now() - t0).count();
  io_uring_queue_exit(&ring);
  *out = {size, o.queue_depth, done, s / static_cast<double>(done)};
  return true;
}
#endif

// Queue depth emulated with threads doing pread (when io_uring is missing or refused).
ProbePoint measure_threads(int fd, uint64_t file_bytes, uint32_t size, const ProbeOptions& o, uint64_t seed) {
  auto offs = random_offsets(file_bytes, size, o.max_reads_per_point, seed);
  std::atomic<size_t> next{0};
  std::atomic<bool> stop{false}, failed{false};
  auto t0 = Clock::now();
  std::vector<std::thread> th;
  for (uint32_t i = 0; i < o.queue_depth; ++i)
    th.emplace_back([&] {
      AlignedBuffer buf(size);
      for (;;) {
        size_t k = next.fetch_add(1);
        if (k >= offs.size() || stop.load()) return;
        if (::pread(fd, buf.data(), size, static_cast<off_t>(offs[k])) != static_cast<ssize_t>(size)) failed = true;
        if (std::chrono::duration<double>(Clock::now() - t0).count() > o.seconds_per_point) stop = true;
      }
    });
  for (auto& t : th) t.join();
  if (failed) throw IoError(o.file, "probe read failed");
  double s = std::chrono::duration<double>(Clock::now() - t0).count();
  size_t done = std::min(next.load(), offs.size());
  return {size, o.queue_depth, done, s / static_cast<double>(done)};
}

}  // namespace

ProbeResult probe_run(const ProbeOptions& o, const std::function<void(const std::string&)>& log) {
  auto say = [&](const std::string& s) {
    if (log) log(s);
  };
  ProbeResult res;
  struct stat st {};
  uint32_t max_size = 0;
  for (uint32_t s : o.sizes) {
    if (s == 0 || s % 4096 != 0) throw UsageError("probe sizes must be positive multiples of 4096");
    max_size = std::max(max_size, s);
  }
  // Removes the file this run created on every way out: return, exception, SIGINT/SIGTERM (signal registry).
  struct Created {
    std::string path;
    int slot = -1;
    ~Created() {
      if (path.empty()) return;
      ::unlink(path.c_str());
      cleanup_unregister(slot);
    }
  } created_file;
  if (o.read_only) {
    ::close(open_regular_input(o.file));  // refuses FIFOs and devices
    if (::stat(o.file.c_str(), &st) != 0) throw IoError(o.file, errno_text("cannot stat"));
    if (static_cast<uint64_t>(st.st_size) < uint64_t(max_size) * 64)
      throw UsageError("--read-only --file " + o.file + " holds " + std::to_string(st.st_size) +
                       " bytes; the probe needs at least " + std::to_string(uint64_t(max_size) * 64));
  } else {
    create_probe_file(o.file, o.file_bytes, &created_file.path, &created_file.slot);
    say("created probe file " + o.file + " (" + std::to_string(o.file_bytes >> 20) + " MiB)");
    ::stat(o.file.c_str(), &st);
  }
  uint64_t file_bytes = static_cast<uint64_t>(st.st_size) & ~uint64_t(4095);
  OpenedFile opened = open_for_reading(o.file, true);
  int fd = opened.fd;
  if (!opened.direct) {
    say("warning: O_DIRECT refused on " + o.file + "; measuring buffered reads after dropping the file's cache");
    res.direct = false;
    (void)posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);  // advisory
  }
  std::unique_ptr<int, void (*)(int*)> guard(&fd, [](int* f) { ::close(*f); });

  uint64_t seed = o.seed;
  res.engine = "threads";
  for (uint32_t size : o.sizes) {
    ProbePoint p1 = measure_qd1(fd, file_bytes, size, o, seed++);
    res.points.push_back(p1);
    // Three short repeats, median kept: a queue of reads is sensitive to other work on the machine.
    ProbeOptions o3 = o;
    o3.seconds_per_point = o.seconds_per_point / 3;
    std::vector<ProbePoint> reps;
    for (int rep = 0; rep < 3; ++rep) {
      ProbePoint pq;
      bool have = false;
#ifdef NL_HAVE_URING
      have = measure_uring(fd, file_bytes, size, o3, seed++, &pq);
      if (have) res.engine = "uring";
#endif
      if (!have) pq = measure_threads(fd, file_bytes, size, o3, seed++);
      reps.push_back(pq);
    }
    std::sort(reps.begin(), reps.end(),
              [](const ProbePoint& a, const ProbePoint& b) { return a.seconds_per_read < b.seconds_per_read; });
    ProbePoint pq = reps[1];
    res.points.push_back(pq);
    char line[200];
    std::snprintf(line, sizeof line, "%8u B  qd1: %8.1f us/read %9.1f MB/s   qd%u: %8.1f us/read %9.1f MB/s", size,
                  p1.seconds_per_read * 1e6, size / p1.seconds_per_read / 1e6, pq.depth, pq.seconds_per_read * 1e6,
                  size / pq.seconds_per_read / 1e6);
    say(line);
  }

  std::vector<double> b1, s1, bq, sq;
  nlohmann::json measured = nlohmann::json::array();
  for (const auto& p : res.points) {
    (p.depth == 1 ? b1 : bq).push_back(p.bytes);
    (p.depth == 1 ? s1 : sq).push_back(p.seconds_per_read);
    measured.push_back(
        {{"bytes", p.bytes}, {"queue_depth", p.depth}, {"reads", p.reads}, {"us_per_read", p.seconds_per_read * 1e6}});
  }
  DeviceModel& d = res.model;
  d.name = "probed";
  d.description = std::string("Measured by nl-run probe with ") +
                  (res.direct ? "O_DIRECT" : "buffered (O_DIRECT refused)") + " random reads on " + o.file +
                  "; queue-depth engine: " + res.engine;
  d.queue_depth = o.queue_depth;
  d.cost = cost_fit(bq, sq);
  d.has_qd1 = true;
  d.qd1 = cost_fit(b1, s1);
  d.sources = {"nl-run probe (this machine)"};
  nlohmann::json extra = {{"direct", res.direct}, {"engine", res.engine}, {"points", measured}};
  d.json_extra = extra.dump();
  return res;
}

}  // namespace nl
