// The bundled ReLU models (datasets/tiny-relu/model, float32; datasets/small-relu/model, bfloat16, trained on a GPU)
// through the toolkit's safetensors reader and C++ forward: greedy generation reproduces the PyTorch reference tokens
// written by train.py.
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

// Runs every reference run of datasets/NAME/model/reference-greedy.json through nl-profile generate.
void check_reference(const std::string& name) {
  const std::string dir = std::string(NL_SOURCE_DIR) + "/datasets/" + name + "/model";
  const auto ref = nlohmann::json::parse(slurp(dir + "/reference-greedy.json"));
  REQUIRE(ref["runs"].size() == 2);
  const std::string tmp = "cli_" + name + "_tmp";
  fs::create_directories(tmp);
  for (const auto& r : ref["runs"]) {
    CAPTURE(r["name"].get<std::string>());
    std::string cmd = std::string(NL_BINARY_DIR) + "/cli/nl-profile generate --model " + dir + " --tokenizer " + dir +
                      "/tokenizer.model --steps " + std::to_string(r["tokens"].size()) + " --json -q";
    // The prompt run starts from BOS + the encoded prompt; its text is what train.py encoded.
    if (r["name"] == "prompt") cmd += " --prompt 'And God said unto Moses,'";
    const std::string out = fs::absolute(tmp + "/out.json").string();
    REQUIRE(std::system((cmd + " > " + out).c_str()) == 0);
    const auto j = nlohmann::json::parse(slurp(out));
    CHECK(j["tokens"] == r["tokens"]);
  }
}

}  // namespace

TEST_CASE("tiny-relu: nl-profile generate reproduces the PyTorch greedy reference") { check_reference("tiny-relu"); }

TEST_CASE("small-relu: nl-profile generate reproduces the PyTorch greedy reference") { check_reference("small-relu"); }
