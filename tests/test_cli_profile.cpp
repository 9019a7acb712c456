// nl-profile run / convert / generate as a user calls them: exit codes, one-line errors, JSON summaries.
#include <doctest/doctest.h>

#include <array>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "formats/core/atomic_file.h"
#include "formats/trace.h"
#include "model_test_util.h"
#include "skip_util.h"

namespace fs = std::filesystem;

namespace {

struct Result {
  int code;
  std::string out, err;
};

Result run(const std::string& args) {
  fs::create_directories("cli_profile_tmp");
  const std::string o = "cli_profile_tmp/stdout", e = "cli_profile_tmp/stderr";
  const int rc = std::system((std::string(NL_BINARY_DIR) + "/cli/nl-profile " + args + " >" + o + " 2>" + e).c_str());
  return {WEXITSTATUS(rc), nl::read_file(o), nl::read_file(e)};
}

std::string tmp(const std::string& n) { return fs::absolute("cli_profile_tmp/" + n).string(); }

}  // namespace

// stories260K: a SiLU model (the calibrated default rule, relu>0 refused) with a llama2.c tokenizer.
TEST_CASE("nl-profile run: text -> profile + test traces with a JSON summary" *
          nl::test::needs_models({"llama2c-stories260K/stories260K.bin", "llama2c-stories260K/tok512.bin"})) {
  const std::string bin = std::string(NL_MODELS_DIR) + "/llama2c-stories260K/stories260K.bin";
  const std::string tok = std::string(NL_MODELS_DIR) + "/llama2c-stories260K/tok512.bin";
  fs::create_directories("cli_profile_tmp");
  {
    std::ofstream t(tmp("story.txt"));
    for (int i = 0; i < 40; ++i)
      t << "Once upon a time, there was a little dog. He liked to play in the park with his friend " << i << ".\n\n";
  }
  Result r = run("run --model " + bin + " --tokenizer " + tok + " --text " + tmp("story.txt") + " --out " +
                 tmp("p.h5") + " --test-out " + tmp("t.h5") + " --seq-len 64 --json");
  INFO(r.err);
  REQUIRE(r.code == 0);
  const auto j = nlohmann::json::parse(r.out);
  CHECK(j["activation"] == "abs>calibrated:0.3");
  CHECK(j["thresholds"].size() == 5);
  CHECK(j["profile"]["n_tokens"].get<uint64_t>() > 500);
  CHECK(j["test"]["n_tokens"].get<uint64_t>() > 0);
  nl::TraceReader tr(tmp("t.h5"));
  CHECK(tr.info().n_tokens == j["test"]["n_tokens"].get<uint64_t>());
  CHECK(r.err.find("calibrating") != std::string::npos);

  // Token-id input, absolute rule, token by token, quiet: nothing on stderr.
  std::ofstream(tmp("ids.txt")) << "# ids\n403 407 261 378 432 383 286 261 376 298\n315 421 395\n";
  r = run("run --quiet --model " + bin + " --token-ids " + tmp("ids.txt") + " --out " + tmp("ids.h5") +
          " --activation 'abs>0.2' --batch 1");
  CHECK(r.code == 0);
  CHECK(r.err.empty());
  CHECK(r.out.find("13 tokens") == std::string::npos);  // 13 ids + BOS = 14 tokens
  CHECK(r.out.find("14 tokens in 1 sequences") != std::string::npos);

  // Bad input: one line, exit 3 (file) or 2 (usage).
  std::ofstream(tmp("bad.bin")) << "this is not a model at all, just text padding to 28+ bytes";
  r = run("run --model " + tmp("bad.bin") + " --tokenizer " + tok + " --text " + tmp("story.txt") + " --out " +
          tmp("x.h5"));
  CHECK(r.code == 3);
  CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
  CHECK(r.err.rfind("nl-profile: error: " + tmp("bad.bin") + ": ", 0) == 0);
  CHECK_FALSE(fs::exists(tmp("x.h5")));
  r = run("run --model " + bin + " --token-ids " + tmp("ids.txt") + " --out " + tmp("x.h5") + " --activation 'relu>0'");
  CHECK(r.code == 2);
  CHECK(r.err.find("needs an FFN with exact zeros") != std::string::npos);
  r = run("run --model " + bin + " --text " + tmp("story.txt") + " --out " + tmp("x.h5"));
  CHECK(r.code == 2);
}

// Issue 57: the bundled model's folder is called `model`, and the trace (and the report, and this command's summary)
// called it "model model"; the name is now the folder above it, however --model names the folder.
TEST_CASE("nl-profile run names a model folder called `model` after its parent") {
  const std::string dir = std::string(NL_SOURCE_DIR) + "/datasets/tiny-relu/model";
  std::ofstream(tmp("relu_ids.txt")) << "100 200 300 400 500 600 700 800\n";
  int k = 0;
  for (const std::string& m : {dir, dir + "/", dir + "/config.json", dir + "/model.safetensors", dir + "/../model"}) {
    const std::string out = tmp("name" + std::to_string(k++) + ".h5");
    Result r = run("run --model " + m + " --token-ids " + tmp("relu_ids.txt") + " --out " + out);
    INFO(m << "\n" << r.err);
    REQUIRE(r.code == 0);
    CHECK(r.out.rfind("model tiny-relu: 4 layers x 512 neurons (relu)", 0) == 0);
    CHECK(nl::TraceReader(out).info().model == "tiny-relu");
  }
  // --model-name still wins.
  Result r = run("run --json --model " + dir + " --model-name mine --token-ids " + tmp("relu_ids.txt") + " --out " +
                 tmp("named.h5"));
  REQUIRE(r.code == 0);
  CHECK(nlohmann::json::parse(r.out)["model"] == "mine");
}

TEST_CASE("nl-profile convert and generate" *
          nl::test::needs_models({"llama2c-stories260K/stories260K.bin", "llama2c-stories260K/tok512.bin"})) {
  const std::string bin = std::string(NL_MODELS_DIR) + "/llama2c-stories260K/stories260K.bin";
  const std::string tok = std::string(NL_MODELS_DIR) + "/llama2c-stories260K/tok512.bin";
  Result r = run("convert --model " + bin + " --out " + tmp("hf"));
  REQUIRE(r.code == 0);
  CHECK(fs::exists(tmp("hf/config.json")));
  r = run("generate --model " + tmp("hf") + " --tokenizer " + tok + " --steps 30 --json");
  REQUIRE(r.code == 0);
  const auto j = nlohmann::json::parse(r.out);
  CHECK(j["text"].get<std::string>().rfind("Once upon a time, there was a little girl named Lily.", 0) == 0);
  r = run("convert --model " + tmp("hf") + " --to llama2c --out " + tmp("back.bin"));
  REQUIRE(r.code == 0);
  CHECK(nl::read_file(tmp("back.bin")).substr(28, 4096) == nl::read_file(bin).substr(28, 4096));
}
