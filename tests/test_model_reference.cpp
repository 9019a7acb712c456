// Greedy generation from BOS with the bundled llama2.c models (datasets/, NL_MODELS_DIR) reproduces
// reference-greedy.json (tokens, and the logits at positions 0..3), produced by an independent implementation of the
// llama2.c forward pass.
#include <doctest/doctest.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "formats/core/atomic_file.h"
#include "formats/llama2c.h"
#include "model_test_util.h"
#include "skip_util.h"

using namespace nl;

namespace {

void check_reference(const std::string& folder, const std::string& model_name) {
  const std::string model_path = std::string(NL_MODELS_DIR) + "/" + folder + "/" + model_name;
  const auto ref =
      nlohmann::json::parse(read_file(std::string(NL_MODELS_DIR) + "/" + folder + "/reference-greedy.json"));
  const std::vector<int> want = ref["tokens"].get<std::vector<int>>();
  const auto want_logits = ref["logits"].get<std::vector<std::vector<float>>>();

  ModelWeights w = read_llama2c(model_path);
  Model m(w);
  std::vector<std::vector<float>> logits;
  const std::vector<int> got = test::greedy(m, 1, 200, 4, &logits);
  CHECK(got == want);
  REQUIRE(logits.size() == want_logits.size());
  double max_diff = 0;
  for (size_t p = 0; p < logits.size(); ++p) {
    REQUIRE(logits[p].size() == want_logits[p].size());
    for (size_t i = 0; i < logits[p].size(); ++i)
      max_diff = std::max(max_diff, double(std::fabs(logits[p][i] - want_logits[p][i])));
  }
  MESSAGE(folder << ": " << got.size() << " tokens, max |logit - reference| = " << max_diff);
  CHECK(max_diff <= 1e-4);
}

}  // namespace

TEST_CASE("stories260K greedy generation matches the reference" *
          test::needs_models({"llama2c-stories260K/stories260K.bin", "llama2c-stories260K/reference-greedy.json"})) {
  check_reference("llama2c-stories260K", "stories260K.bin");
}

TEST_CASE("babyllama-tok105 greedy generation matches the reference" *
          test::needs_models({"babyllama-tok105/model5000.bin", "babyllama-tok105/reference-greedy.json"})) {
  check_reference("babyllama-tok105", "model5000.bin");
}
