// Device cost model: one read of s bytes costs t(s) = a + s / B at the queue depth the runtime issues.
// Loaded from configs/devices/*.json (schema in docs/formats.md "Device profile"); written by `nl-run probe`.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace nl {

struct CostFit {
  double read_latency_us = 0;  // a
  double bandwidth_MBps = 0;   // B, in 10^6 bytes per second
  double seconds(double bytes) const { return read_latency_us * 1e-6 + bytes / (bandwidth_MBps * 1e6); }
  // Bytes whose transfer costs as much as one read: merging two reads across a gap pays while gap bytes < this.
  double break_even_bytes() const { return read_latency_us * 1e-6 * bandwidth_MBps * 1e6; }
};

struct DeviceModel {
  std::string name;
  std::string description;
  uint32_t queue_depth = 1;     // reads in flight at the operating point `cost` describes
  uint32_t block_bytes = 4096;  // alignment of direct reads
  CostFit cost;                 // at queue_depth: what eval's estimated I/O time and --gap auto use
  bool has_qd1 = false;
  CostFit qd1;  // one read in flight (optional)
  std::vector<std::string> sources;
  std::string json_extra;  // "measured" samples, kept verbatim when re-written

  std::string to_json() const;
};

// The built-in profile, for when no --device is given: configs/devices/ufs40.json (UFS 4.0 phone flash), embedded
// at build time, so its figures (a = 8.14 us per read, B = 4267 MB/s) have that file as their one source.
DeviceModel default_device();

// Parses a device profile; InputError naming `path` on any problem.
DeviceModel device_parse(const std::string& text, const std::string& path);
DeviceModel device_load(const std::string& path);

// Fit of per-read seconds against bytes: t = a + s/B, least squares on relative error (weights 1/t^2) so
// small, latency-bound reads count as much as large ones. Needs at least two distinct sizes.
CostFit cost_fit(const std::vector<double>& bytes, const std::vector<double>& seconds);

}  // namespace nl
