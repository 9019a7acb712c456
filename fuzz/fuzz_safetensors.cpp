// libFuzzer harness: safetensors header (formats/safetensors.h safetensors_header); when the header passes and
// a matching config.json sits beside it (the seed corpus' tiny model), the whole checkpoint is read too.
#include <filesystem>

#include "formats/safetensors.h"
#include "fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string dir = [] {
    std::string d = nl::fuzz::scratch_path("st");
    std::filesystem::create_directories(d);
    // config.json of the seed checkpoints (fuzz/make_corpus.cpp): the fuzzer then overwrites model.safetensors.
    nl::write_safetensors_model(d, nl::fuzz::tiny_weights());
    return d;
  }();
  const std::string path = dir + "/model.safetensors";
  nl::fuzz::write_bytes(path, data, size);
  bool header_ok = false;
  nl::fuzz::expect_clean(path, [&] {
    uint64_t start = 0;
    auto entries = nl::safetensors_header(path, &start);
    for (const auto& e : entries)
      if (e.begin > e.end || start + e.end > size) std::abort();  // offsets that pass lie inside the file
    header_ok = true;
  });
  if (header_ok) {
    try {
      nl::read_model(path);
    } catch (const nl::Error&) {
    } catch (const std::exception& e) {
      std::fprintf(stderr, "read_model let a non-toolkit exception escape: %s\n", e.what());
      std::abort();
    }
  }
  return 0;
}
