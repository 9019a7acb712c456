#include "runtime/device.h"

#include <cmath>
#include <nlohmann/json.hpp>

#include "formats/core/atomic_file.h"
#include "formats/core/error.h"
#include "nl_default_device.h"

namespace nl {

using nlohmann::json;

namespace {
// Optional string key; a present key of another type is an error (json::value would throw a type_error).
std::string opt_string(const json& j, const char* key, const std::string& fallback, const std::string& path) {
  if (!j.contains(key) || j[key].is_null()) return fallback;
  if (!j[key].is_string()) throw InputError(path, std::string("'") + key + "' must be a string");
  return j[key].get<std::string>();
}

// Optional integer key in [lo, hi]; floats and out-of-range values are errors, never converted.
int64_t opt_int(const json& j, const char* key, int64_t fallback, int64_t lo, int64_t hi, const std::string& path) {
  if (!j.contains(key)) return fallback;
  const json& v = j[key];
  if (!v.is_number_integer() || (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(hi)) || v.get<int64_t>() < lo ||
      v.get<int64_t>() > hi)
    throw InputError(path, std::string("'") + key + "' must be an integer in [" + std::to_string(lo) + ", " +
                               std::to_string(hi) + "]");
  return v.get<int64_t>();
}

CostFit parse_fit(const json& j, const std::string& path, const std::string& where) {
  CostFit f;
  for (const char* k : {"read_latency_us", "bandwidth_MBps"})
    if (!j.contains(k) || !j[k].is_number()) throw InputError(path, where + "'" + k + "' must be a number");
  f.read_latency_us = j["read_latency_us"].get<double>();
  f.bandwidth_MBps = j["bandwidth_MBps"].get<double>();
  if (!(f.read_latency_us >= 0) || !std::isfinite(f.read_latency_us) || f.read_latency_us > 1e7)
    throw InputError(path, where + "read_latency_us is out of range");
  if (!(f.bandwidth_MBps > 0) || !std::isfinite(f.bandwidth_MBps) || f.bandwidth_MBps > 1e7)
    throw InputError(path, where + "bandwidth_MBps must be positive");
  return f;
}
}  // namespace

DeviceModel device_parse(const std::string& text, const std::string& path) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {  // parse_error, and out_of_range for numbers that overflow
    throw InputError(path, std::string("not valid JSON: ") + e.what());
  }
  if (!j.is_object()) throw InputError(path, "a device profile must be a JSON object");
  if (!j.contains("format") || j["format"] != "neuralink-device")
    throw InputError(path, "format must be \"neuralink-device\"");
  if (!j.contains("version") || !j["version"].is_number_integer()) throw InputError(path, "missing integer 'version'");
  if (j["version"].is_number_unsigned() ? j["version"].get<uint64_t>() > 1 : j["version"].get<int64_t>() > 1)
    throw InputError(path, "device profile version " + j["version"].dump() + " is newer than supported (1)");
  if (j["version"].get<int64_t>() < 1) throw InputError(path, "device profile version must be >= 1");
  DeviceModel d;
  d.name = opt_string(j, "name", "unnamed", path);
  d.description = opt_string(j, "description", "", path);
  d.cost = parse_fit(j, path, "");
  d.queue_depth = static_cast<uint32_t>(opt_int(j, "queue_depth", 1, 1, 65536, path));
  int64_t bb = opt_int(j, "block_bytes", 4096, 1, 1 << 20, path);
  if ((bb & (bb - 1)) != 0) throw InputError(path, "block_bytes must be a power of two <= 1 MiB");
  d.block_bytes = static_cast<uint32_t>(bb);
  if (j.contains("qd1") && !j["qd1"].is_null()) {
    if (!j["qd1"].is_object()) throw InputError(path, "'qd1' must be an object");
    d.qd1 = parse_fit(j["qd1"], path, "qd1.");
    d.has_qd1 = true;
  }
  if (j.contains("sources") && j["sources"].is_array())
    for (const auto& s : j["sources"])
      if (s.is_string()) d.sources.push_back(s.get<std::string>());
  if (j.contains("measured")) d.json_extra = j["measured"].dump();
  return d;
}

DeviceModel device_load(const std::string& path) { return device_parse(read_file(path, 1 << 20), path); }

DeviceModel default_device() {
  static const DeviceModel d = device_parse(kDefaultDeviceJson, std::string(kDefaultDevicePath) + " (built in)");
  return d;
}

std::string DeviceModel::to_json() const {
  json j;
  j["format"] = "neuralink-device";
  j["version"] = 1;
  j["name"] = name;
  j["description"] = description;
  j["queue_depth"] = queue_depth;
  j["block_bytes"] = block_bytes;
  j["read_latency_us"] = cost.read_latency_us;
  j["bandwidth_MBps"] = cost.bandwidth_MBps;
  if (has_qd1) j["qd1"] = {{"read_latency_us", qd1.read_latency_us}, {"bandwidth_MBps", qd1.bandwidth_MBps}};
  j["sources"] = sources;
  if (!json_extra.empty()) j["measured"] = json::parse(json_extra);
  return j.dump(2) + "\n";
}

CostFit cost_fit(const std::vector<double>& bytes, const std::vector<double>& seconds) {
  if (bytes.size() != seconds.size() || bytes.size() < 2) throw InternalError("cost_fit needs two or more points");
  double n = 0, sx = 0, sy = 0, sxx = 0, sxy = 0;
  for (size_t i = 0; i < bytes.size(); ++i) {
    double w = seconds[i] > 0 ? 1.0 / (seconds[i] * seconds[i]) : 1.0;
    n += w;
    sx += w * bytes[i];
    sy += w * seconds[i];
    sxx += w * bytes[i] * bytes[i];
    sxy += w * bytes[i] * seconds[i];
  }
  double den = n * sxx - sx * sx;
  if (den <= 0) throw InternalError("cost_fit needs two distinct sizes");
  double slope = (n * sxy - sx * sy) / den;  // seconds per byte
  double icpt = (sy - slope * sx) / n;
  CostFit f;
  f.read_latency_us = std::max(0.0, icpt * 1e6);
  f.bandwidth_MBps = slope > 0 ? 1.0 / slope / 1e6 : 1e6;
  return f;
}

}  // namespace nl
