#include <doctest/doctest.h>

#include <string>

#include "formats/core/error.h"
#include "runtime/device.h"

using namespace nl;

TEST_CASE("cost_fit recovers a and B from exact points") {
  std::vector<double> b = {4096, 65536, 1 << 20}, s;
  for (double x : b) s.push_back(20e-6 + x / 1.5e9);
  CostFit f = cost_fit(b, s);
  CHECK(f.read_latency_us == doctest::Approx(20.0).epsilon(1e-6));
  CHECK(f.bandwidth_MBps == doctest::Approx(1500.0).epsilon(1e-6));
  CHECK(f.break_even_bytes() == doctest::Approx(30000.0).epsilon(1e-6));
}

TEST_CASE("device profiles in configs/devices parse and round-trip") {
  for (const char* name : {"ufs31.json", "ufs40.json", "devbox.json"}) {
    DeviceModel d = device_load(std::string(NL_SOURCE_DIR) + "/configs/devices/" + name);
    CHECK(d.cost.read_latency_us > 0);
    CHECK(d.cost.bandwidth_MBps > 0);
    CHECK(!d.sources.empty());
    DeviceModel e = device_parse(d.to_json(), "roundtrip");
    CHECK(e.cost.read_latency_us == d.cost.read_latency_us);
    CHECK(e.queue_depth == d.queue_depth);
  }
}

TEST_CASE("malformed device profiles are rejected with the file named") {
  auto bad = [](const std::string& text, const std::string& needle) {
    try {
      device_parse(text, "dev.json");
      FAIL("accepted: " << text);
    } catch (const InputError& e) {
      std::string m = e.what();
      CHECK(m.rfind("dev.json: ", 0) == 0);
      CHECK_MESSAGE(m.find(needle) != std::string::npos, m);
    }
  };
  bad("{", "not valid JSON");
  // A number too large for a double is nlohmann's out_of_range, not a parse_error (found by fuzz_device).
  bad(R"({"format":"neuralink-device","version":1,"bandwidth_MBps":1500e888888})", "not valid JSON");
  bad("[]", "JSON object");
  bad(R"({"format":"x","version":1})", "format");
  bad(R"({"format":"neuralink-device","version":9,"read_latency_us":1,"bandwidth_MBps":1})", "newer");
  bad(R"({"format":"neuralink-device","version":1,"bandwidth_MBps":1})", "read_latency_us");
  bad(R"({"format":"neuralink-device","version":1,"read_latency_us":1,"bandwidth_MBps":-3})", "positive");
  bad(R"({"format":"neuralink-device","version":1,"read_latency_us":1,"bandwidth_MBps":3,"queue_depth":0})",
      "queue_depth");
  bad(R"({"format":"neuralink-device","version":1,"read_latency_us":1,"bandwidth_MBps":3,"block_bytes":3000})",
      "block_bytes");
  // Wrong types and out-of-range numbers were json exceptions (exit 1) or a float->int conversion (UB).
  const std::string ok = R"("format":"neuralink-device","version":1,"read_latency_us":1,"bandwidth_MBps":3)";
  bad("{" + ok + R"(,"name":7})", "'name' must be a string");
  bad("{" + ok + R"(,"description":[]})", "'description' must be a string");
  bad("{" + ok + R"(,"queue_depth":"8"})", "queue_depth");
  bad("{" + ok + R"(,"queue_depth":1e300})", "queue_depth");
  bad("{" + ok + R"(,"block_bytes":18446744073709551615})", "block_bytes");
  bad("{" + ok + R"(,"qd1":5})", "'qd1' must be an object");
  bad(R"({"format":7,"version":1})", "format");
  bad(R"({"format":"neuralink-device","version":18446744073709551615})", "newer");
  bad(R"({"format":"neuralink-device","version":0})", ">= 1");
  CHECK_NOTHROW(device_parse("{" + ok + R"(,"queue_depth":4,"name":"x"})", "dev.json"));
}
