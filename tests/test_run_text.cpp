// nl-run generate --prompt "text": the runtime's llama2.c tokenizer (runtime/tokenizer.h, found through the
// manifest's reference or --tokenizer) gives the same tokens and decoded text as nl-profile generate on the dense
// stories260K model; without a tokenizer --prompt is refused with one line.
#include <doctest/doctest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>

#include "cli_test_util.h"
#include "formats/core/atomic_file.h"
#include "skip_util.h"

namespace {
int sh(const std::string& cmd, std::string* out, bool merge_stderr = false) {
  return nl::test::sh(cmd, out, merge_stderr ? nl::test::Stderr::kMerge : nl::test::Stderr::kDrop);
}
}  // namespace

TEST_CASE("generate --prompt text: same tokens and text as nl-profile generate (stories260K)" *
          nl::test::needs_models({"llama2c-stories260K/stories260K.bin", "llama2c-stories260K/tok512.bin"})) {
  const std::string dir = std::string(NL_MODELS_DIR) + "/llama2c-stories260K/";
  struct stat st {};
  const std::string d = "run_text_test";
  ::mkdir(d.c_str(), 0755);
  const std::string bin = std::string(NL_BINARY_DIR) + "/cli/";
  std::string out;
  // pack copies the tokenizer beside the image and names the copy in the manifest (relative to the manifest).
  ::unlink((d + "/m.nlw.tokenizer").c_str());
  REQUIRE(sh(bin + "nl-layout -q pack --model " + dir + "stories260K.bin --dtype f32 --tokenizer " + dir +
                 "tok512.bin --out " + d + "/m.nlw",
             &out) == 0);
  CHECK(nlohmann::json::parse(nl::read_file(d + "/m.nlw.json"))["tokenizer"] == "m.nlw.tokenizer");
  CHECK(nl::read_file(d + "/m.nlw.tokenizer") == nl::read_file(dir + "tok512.bin"));
  // A missing tokenizer file is refused by pack with one line naming it, and nothing is written.
  CHECK(sh(bin + "nl-layout -q pack --model " + dir + "stories260K.bin --tokenizer " + d + "/absent.bin --out " + d +
               "/absent.nlw",
           &out, true) != 0);
  CHECK(out.find("absent.bin") != std::string::npos);
  CHECK(::stat((d + "/absent.nlw").c_str(), &st) != 0);

  const std::string prompt = "Once upon a time, there was a little girl";
  REQUIRE(sh(bin + "nl-profile --json generate --model " + dir + "stories260K.bin --tokenizer " + dir +
                 "tok512.bin --steps 40 --prompt \"" + prompt + "\"",
             &out) == 0);
  auto ref = nlohmann::json::parse(out);
  const auto ids = ref["tokens"].get<std::vector<int>>();

  // Prompt length in tokens: nl-run reports it.
  REQUIRE(sh(bin + "nl-run --json generate --image " + d + "/m.nlw --steps 1 --prompt \"" + prompt + "\"", &out) == 0);
  const size_t n_prompt = nlohmann::json::parse(out)["prompt_tokens"].size();
  REQUIRE(ids.size() > n_prompt);
  const int steps = int(ids.size() - n_prompt);
  REQUIRE(sh(bin + "nl-run --json generate --image " + d + "/m.nlw --steps " + std::to_string(steps) + " --prompt \"" +
                 prompt + "\"",
             &out) == 0);
  auto j = nlohmann::json::parse(out);
  CHECK(j["prompt_tokens"].get<std::vector<int>>() == std::vector<int>(ids.begin(), ids.begin() + long(n_prompt)));
  CHECK(j["generated"].get<std::vector<int>>() == std::vector<int>(ids.begin() + long(n_prompt), ids.end()));
  CHECK(j["text"] == ref["text"]);
  CHECK(j["text"].get<std::string>().rfind(prompt, 0) == 0);

  // The text summary prints the decoded text; --tokenizer overrides the manifest's reference.
  REQUIRE(sh(bin + "nl-run generate --image " + d + "/m.nlw --steps 8 --tokenizer " + dir + "tok512.bin --prompt \"" +
                 prompt + "\"",
             &out) == 0);
  CHECK(out.find("text: " + prompt) != std::string::npos);

  // Without a tokenizer, --prompt is refused.
  ::unlink((d + "/m.nlw.tokenizer").c_str());
  CHECK(sh(bin + "nl-run generate --image " + d + "/m.nlw --steps 2 --prompt hi", &out, true) == 2);
  CHECK(out.find("--prompt needs a tokenizer") != std::string::npos);
}
