// libFuzzer harness: device profile JSON (runtime/device.h device_load).
#include "fuzz/fuzz_util.h"
#include "runtime/device.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = nl::fuzz::scratch_path("device.json");
  nl::fuzz::write_bytes(path, data, size);
  nl::fuzz::expect_clean(path, [&] {
    nl::DeviceModel d = nl::device_load(path);
    (void)d.to_json();  // what probe re-writes must serialise
    if (!(d.cost.bandwidth_MBps > 0)) std::abort();
  });
  return 0;
}
