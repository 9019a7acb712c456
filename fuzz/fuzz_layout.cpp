// libFuzzer harness: layout JSON (formats/layout.h layout_load), with and without a trace to check against.
#include "formats/layout.h"
#include "formats/trace.h"
#include "fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = nl::fuzz::scratch_path("layout.json");
  nl::fuzz::write_bytes(path, data, size);
  nl::fuzz::expect_clean(path, [&] {
    nl::Layout l = nl::layout_load(path);
    for (const auto& L : l.layers) {  // a layout that passes holds every neuron once, `replicas` of them twice
      const size_t n = L.order.size() - L.replicas;
      std::vector<char> seen(n, 0);
      for (uint32_t v : L.order) {
        if (v >= n || seen[v] > (L.replicas ? 1 : 0)) std::abort();
        ++seen[v];
      }
      for (char c : seen)
        if (!c) std::abort();
    }
  });
  nl::TraceInfo ti;  // the shape of the seed corpus' trace: 2 layers of 3 and 2 neurons
  ti.path = "trace.h5";
  ti.n_layers = 2;
  ti.n_neurons = {3, 2};
  nl::fuzz::expect_clean(path, [&] { nl::layout_load(path, &ti); });
  return 0;
}
