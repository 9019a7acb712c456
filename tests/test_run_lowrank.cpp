// nl-run generate --select lowrank:R on ReLU-gated models: at full rank, calibrated in-sample to recall 1, the
// predictor misses nothing and the tokens are the dense model's; on a model whose gate matrices are low rank plus
// noise, a rank-R predictor calibrated on another prompt reads a fraction of the FFN with high recall and reports
// recall, precision and token agreement; on the bundled tiny ReLU model the calibrated recall holds on another
// prompt and the tokens stay the exact model's; SiLU models and malformed ranks are refused.
#include <doctest/doctest.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <random>

#include "cli_test_util.h"
#include "formats/core/image_writer.h"
#include "image_test_util.h"

using namespace nl;

namespace {

using test::Result;

Result run(const std::string& args, bool merge_stderr = false) {
  return test::run_tool("nl-run", args, merge_stderr ? test::Stderr::kMerge : test::Stderr::kDrop);
}

ModelConfig relu_config() {
  ModelConfig c = test::small_config(64, 256, 2);
  c.vocab_size = 64;
  c.seq_len = 80;
  return c;
}

}  // namespace

TEST_CASE("lowrank at full rank, calibrated in-sample to recall 1: dense tokens, recall 1") {
  const std::string d = "lowrank_test";
  ::mkdir(d.c_str(), 0755);
  ModelWeights w = test::random_weights(relu_config(), 31);
  ImageSpec spec;
  spec.order = test::random_order(w.config, 4);
  image_write_model(d + "/full.nlw", w, spec);
  Result dense = run("--json generate --image " + d + "/full.nlw --select dense --prompt-tokens 1,5,9 --steps 20");
  REQUIRE(dense.rc == 0);
  auto dj = nlohmann::json::parse(dense.out);
  Result r = run("--json generate --image " + d +
                 "/full.nlw --select lowrank:64 --target-recall 1 --prompt-tokens 1,5,9 "
                 "--steps 20 --calibrate-prompt-tokens 1,5,9 --calibrate-steps 20 --cache-ratio 0.1 --gap 1");
  REQUIRE_MESSAGE(r.rc == 0, r.out);
  auto j = nlohmann::json::parse(r.out);
  const auto& p = j["predictor"];
  CHECK(j["generated"] == dj["generated"]);
  CHECK(p["dense_tokens"] == dj["generated"]);
  CHECK(p["recall"].get<double>() == 1.0);
  CHECK(p["token_agreement"].get<double>() == 1.0);
  CHECK(p["agreeing_prefix"].get<int>() == 20);
  CHECK(p["precision"].get<double>() > 0.0);
  CHECK(p["precision"].get<double>() <= 1.0);
  CHECK(j["calibration_samples"].get<uint64_t>() > 0);
}

TEST_CASE("lowrank on low-rank-plus-noise gates: selective, high recall on a held-out prompt, figures reported") {
  const std::string d = "lowrank_test";
  ::mkdir(d.c_str(), 0755);
  ModelWeights w = test::random_weights(relu_config(), 32);
  const int dim = 64, hidden = 256, r = 8;
  std::mt19937_64 rng(9);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (auto& L : w.layers) {
    std::vector<float> u(size_t(hidden) * r), v(size_t(r) * dim);
    for (float& x : u) x = nd(rng) * 0.3f;
    for (float& x : v) x = nd(rng) * 0.3f;
    for (int i = 0; i < hidden; ++i)
      for (int c = 0; c < dim; ++c) {
        float s = 0.01f * nd(rng);
        for (int k = 0; k < r; ++k) s += u[size_t(i) * r + k] * v[size_t(k) * dim + c];
        L.w_gate[size_t(i) * dim + c] = s;
      }
  }
  image_write_model(d + "/lr.nlw", w, ImageSpec{});
  Result gate = run("--json generate --image " + d + "/lr.nlw --select gate --prompt-tokens 1,7 --steps 30");
  REQUIRE(gate.rc == 0);
  auto gj = nlohmann::json::parse(gate.out);
  Result res = run("--json generate --image " + d +
                   "/lr.nlw --select lowrank:8 --target-recall 0.99 --prompt-tokens 1,7 "
                   "--steps 30 --calibrate-prompt-tokens 2,3,4 --calibrate-steps 40");
  REQUIRE_MESSAGE(res.rc == 0, res.out);
  auto j = nlohmann::json::parse(res.out);
  const auto& p = j["predictor"];
  MESSAGE("lowrank:8 recall " << p["recall"] << ", precision " << p["precision"] << ", token agreement "
                              << p["token_agreement"] << ", predicted/layer-token " << p["predicted_per_layer_token"]
                              << " of 256; reads/token " << j["per_token_mean"]["reads"] << " vs gate "
                              << gj["per_token_mean"]["reads"]);
  CHECK(p["dense_tokens"] == gj["generated"]);  // the reference run is the exact model
  CHECK(p["recall"].get<double>() >= 0.95);
  CHECK(p["precision"].get<double>() >= 0.7);
  CHECK(p["predicted_per_layer_token"].get<double>() < 0.8 * hidden);
  CHECK(p["token_agreement"].get<double>() >= 0.0);
  CHECK(p["thresholds"].size() == 2);

  // The text summary carries the same figures.
  Result txt = run("generate --image " + d + "/lr.nlw --select lowrank:8 --prompt-tokens 1,7 --steps 4");
  REQUIRE(txt.rc == 0);
  CHECK(txt.out.find("lowrank:8 predictor: recall ") != std::string::npos);
}

TEST_CASE("lowrank refuses SiLU models and malformed ranks") {
  const std::string d = "lowrank_test";
  ::mkdir(d.c_str(), 0755);
  ModelConfig c = relu_config();
  c.act = FfnAct::kSilu;
  image_write_model(d + "/silu.nlw", test::random_weights(c, 3), ImageSpec{});
  Result r = run("generate --image " + d + "/silu.nlw --select lowrank:4 --steps 2", true);
  CHECK(r.rc == 2);
  CHECK(r.out.find("SiLU") != std::string::npos);
  for (const char* bad : {"lowrank:0", "lowrank:", "lowrank:4x", "lowrank"}) {
    Result b = run(std::string("generate --image ") + d + "/silu.nlw --select " + bad + " --steps 2", true);
    CHECK(b.rc != 0);
    CHECK(b.out.find("lowrank:R") != std::string::npos);
  }
}

TEST_CASE("lowrank on the bundled tiny ReLU model: recall near the target, tokens of the exact model") {
  const std::string model = std::string(NL_SOURCE_DIR) + "/datasets/tiny-relu/model";  // in the repository
  const std::string d = "lowrank_test";
  ::mkdir(d.c_str(), 0755);
  const std::string pack = std::string(NL_BINARY_DIR) + "/cli/nl-layout -q pack --model " + model +
                           " --dtype f16 --out " + d + "/relu.nlw > /dev/null 2>&1";
  REQUIRE(std::system(pack.c_str()) == 0);
  const std::string common = "--json generate --image " + d + "/relu.nlw --prompt-tokens 1,100,200,300 --steps 40 ";
  Result gate = run(common + "--select gate");
  REQUIRE(gate.rc == 0);
  auto gj = nlohmann::json::parse(gate.out);
  for (int rank : {32, 128}) {
    CAPTURE(rank);
    Result r = run(common + "--select lowrank:" + std::to_string(rank) +
                   " --target-recall 0.99 --calibrate-prompt-tokens 1,5,6,7 --calibrate-steps 80");
    REQUIRE_MESSAGE(r.rc == 0, r.out);
    auto j = nlohmann::json::parse(r.out);
    const auto& p = j["predictor"];
    MESSAGE("tiny-relu lowrank:" << rank << " recall " << p["recall"] << ", precision " << p["precision"]
                                 << ", token agreement " << p["token_agreement"] << ", bytes needed/token "
                                 << j["per_token_mean"]["bytes_needed"] << " vs gate "
                                 << gj["per_token_mean"]["bytes_needed"]);
    CHECK(p["dense_tokens"] == gj["generated"]);
    CHECK(p["recall"].get<double>() >= 0.97);
    CHECK(p["recall"].get<double>() <= 1.0);
    CHECK(p["token_agreement"].get<double>() >= 0.9);
    if (rank == 128) CHECK(p["precision"].get<double>() >= 0.999);  // full rank (dim 128): scores ~ the exact gate
  }
}
