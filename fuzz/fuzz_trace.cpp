// libFuzzer harness: trace v1 reader (formats/trace.h TraceReader) on arbitrary bytes written to a file, then
// every layer read. libhdf5 parses the container; it is not built with sanitizers, so what this harness proves is
// that our checks hold for whatever libhdf5 hands back (docs/robustness.md: known libhdf5 crashes and bounds).
#include "formats/trace.h"
#include "fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = nl::fuzz::scratch_path("trace.h5");
  nl::fuzz::write_bytes(path, data, size);
  nl::fuzz::expect_clean(path, [&] {
    nl::TraceReader r(path);
    for (uint32_t l = 0; l < r.info().n_layers; ++l) {
      nl::LayerMask m = r.read_layer(l);
      if (m.bits.size() != uint64_t(m.n_neurons) * m.words) std::abort();
    }
  });
  return 0;
}
