// libFuzzer harness: flash image manifest (formats/core/image.h manifest_parse), as nl-run opens it.
#include "formats/core/image.h"
#include "fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = nl::fuzz::scratch_path("model.nlw.json");
  nl::fuzz::write_bytes(path, data, size);
  nl::fuzz::expect_clean(path, [&] {
    nl::ImageManifest m = nl::manifest_load(path);
    // A manifest that passes must be usable: every tensor and region lookup stays inside the image.
    for (const auto& t : m.dense_tensors)
      if (t.offset + t.bytes() > m.dense().bytes) std::abort();
    for (int l = 0; l < m.config.n_layers; ++l)
      if (m.ffn(l).offset + m.ffn(l).bytes > m.image_bytes) std::abort();
  });
  return 0;
}
