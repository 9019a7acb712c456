// libFuzzer harness: safetensors header (formats/safetensors.h safetensors_header); when the header passes, the whole
// checkpoint is read too, beside each of three config.json files (the seed corpus' tiny Llama, OPT and Phi models),
// so the Llama, OPT and Phi tensor readers all see every input.
#include <filesystem>
#include <utility>
#include <vector>

#include "formats/safetensors.h"
#include "fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::vector<std::string> dirs = [] {
    std::vector<std::string> v;
    const std::pair<const char*, nl::ModelWeights> models[] = {
        {"st", nl::fuzz::tiny_weights()},
        {"st-opt", nl::fuzz::tiny_arch_weights(nl::ModelArch::kOpt)},
        {"st-phi", nl::fuzz::tiny_arch_weights(nl::ModelArch::kPhi)}};
    for (const auto& [name, w] : models) {
      std::string d = nl::fuzz::scratch_path(name);
      std::filesystem::create_directories(d);
      // config.json of the seed checkpoints (fuzz/make_corpus.cpp): the fuzzer then overwrites model.safetensors.
      nl::write_safetensors_model(d, w);
      v.push_back(d);
    }
    return v;
  }();
  const std::string path = dirs[0] + "/model.safetensors";
  for (const std::string& d : dirs) nl::fuzz::write_bytes(d + "/model.safetensors", data, size);
  bool header_ok = false;
  nl::fuzz::expect_clean(path, [&] {
    uint64_t start = 0;
    auto entries = nl::safetensors_header(path, &start);
    for (const auto& e : entries)
      if (e.begin > e.end || start + e.end > size) std::abort();  // offsets that pass lie inside the file
    header_ok = true;
  });
  if (header_ok) {
    for (const std::string& d : dirs) {
      try {
        nl::read_model(d + "/model.safetensors");
      } catch (const nl::Error&) {
      } catch (const std::exception& e) {
        std::fprintf(stderr, "read_model let a non-toolkit exception escape: %s\n", e.what());
        std::abort();
      }
    }
  }
  return 0;
}
