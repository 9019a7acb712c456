// libFuzzer harness: llama2.c `.bin` (formats/llama2c.h read_llama2c): header checks, size arithmetic, reads.
#include "formats/llama2c.h"
#include "fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = nl::fuzz::scratch_path("model.bin");
  nl::fuzz::write_bytes(path, data, size);
  nl::fuzz::expect_clean(path, [&] {
    nl::ModelWeights w = nl::read_llama2c(path);
    if (w.tok_embeddings.size() * 4 > size) std::abort();  // nothing larger than the file was allocated
  });
  return 0;
}
