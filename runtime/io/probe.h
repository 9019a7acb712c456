// Disk probe: measures O_DIRECT random reads of 4 KiB..1 MiB at one read in flight and at a queue depth,
// and fits the device cost model t(s) = a + s/B for each (runtime/device.h).
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "runtime/device.h"

namespace nl {

struct ProbeOptions {
  std::string file;                  // probe file: created (O_EXCL) and removed afterwards, never an existing file...
  bool read_only = false;            // ...unless read_only: an existing regular file, only read (a real model file)
  uint64_t file_bytes = 1ull << 30;  // size used when the file is created
  uint32_t queue_depth = 32;
  double seconds_per_point = 0.4;  // time budget per (size, depth) point
  uint32_t max_reads_per_point = 4000;
  uint64_t seed = 1;
  std::vector<uint32_t> sizes = {4096, 8192, 16384, 32768, 65536, 131072, 262144, 524288, 1048576};
};

struct ProbePoint {
  uint32_t bytes = 0;
  uint32_t depth = 1;
  uint64_t reads = 0;
  double seconds_per_read = 0;  // wall time / reads (amortised over the queue at depth > 1)
};

struct ProbeResult {
  std::vector<ProbePoint> points;
  bool direct = true;  // false when O_DIRECT was refused and buffered reads were measured
  std::string engine;  // "uring" or "threads" for the queue-depth points
  DeviceModel model;
};

// Progress lines go to `log` (may be empty). Throws IoError on failures.
ProbeResult probe_run(const ProbeOptions& opts, const std::function<void(const std::string&)>& log);

}  // namespace nl
