// libFuzzer harness: GGUF model input (formats/gguf.h open_gguf_source): header, metadata and tensor table checks,
// then every tensor the config implies read as f32.
#include "formats/gguf.h"
#include "fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = nl::fuzz::scratch_path("model.gguf");
  nl::fuzz::write_bytes(path, data, size);
  nl::fuzz::expect_clean(path, [&] {
    auto src = nl::open_gguf_source(path);
    nl::ModelWeights w = src->read_dense();
    if (w.tok_embeddings.size() > 2 * size) std::abort();  // nothing beyond the file (q4_0: 32 weights in 18 bytes)
    nl::LayerWeights f;
    for (int l = 0; l < src->config().n_layers; ++l) src->read_ffn(l, &f);
  });
  return 0;
}
