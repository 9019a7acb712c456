// libFuzzer harness: layout JSON (formats/layout.h layout_load), with and without a trace to check against.
#include "formats/layout.h"
#include "formats/trace.h"
#include "fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = nl::fuzz::scratch_path("layout.json");
  nl::fuzz::write_bytes(path, data, size);
  nl::fuzz::expect_clean(path, [&] {
    nl::Layout l = nl::layout_load(path);
    for (const auto& L : l.layers) {  // a layout that passes is a permutation per layer
      std::vector<char> seen(L.order.size(), 0);
      for (uint32_t v : L.order) {
        if (v >= L.order.size() || seen[v]) std::abort();
        seen[v] = 1;
      }
    }
  });
  nl::TraceInfo ti;  // the shape of the seed corpus' trace: 2 layers of 3 and 2 neurons
  ti.path = "trace.h5";
  ti.n_layers = 2;
  ti.n_neurons = {3, 2};
  nl::fuzz::expect_clean(path, [&] { nl::layout_load(path, &ti); });
  return 0;
}
