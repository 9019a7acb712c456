// The bundled tiny ReLU model (datasets/tiny-relu/model) through the toolkit's safetensors reader and C++
// forward: greedy generation reproduces the PyTorch reference tokens written by train.py.
#include <doctest/doctest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

namespace fs = std::filesystem;

namespace {

std::string slurp(const std::string& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

TEST_CASE("tiny-relu: nl-profile generate reproduces the PyTorch greedy reference") {
  const std::string dir = std::string(NL_SOURCE_DIR) + "/datasets/tiny-relu/model";
  const auto ref = nlohmann::json::parse(slurp(dir + "/reference-greedy.json"));
  fs::create_directories("cli_tiny_relu_tmp");
  for (const auto& r : ref["runs"]) {
    CAPTURE(r["name"].get<std::string>());
    std::string cmd = std::string(NL_BINARY_DIR) + "/cli/nl-profile generate --model " + dir + " --tokenizer " + dir +
                      "/tokenizer.model --steps " + std::to_string(r["tokens"].size()) + " --json -q";
    // The prompt run starts from BOS + the encoded prompt; its text is what train.py encoded.
    if (r["name"] == "prompt") cmd += " --prompt 'And God said unto Moses,'";
    const std::string out = fs::absolute("cli_tiny_relu_tmp/out.json").string();
    REQUIRE(std::system((cmd + " > " + out).c_str()) == 0);
    const auto j = nlohmann::json::parse(slurp(out));
    CHECK(j["tokens"] == r["tokens"]);
  }
}
