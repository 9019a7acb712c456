// Model readers and writers: llama2.c .bin and Hugging Face safetensors. Conversions preserve the logits, the
// safetensors layout matches an independent numpy HF forward (rotate_half), and every malformed file gives one
// InputError naming the file.
#include <doctest/doctest.h>

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "formats/core/atomic_file.h"
#include "formats/core/error.h"
#include "formats/core/half.h"
#include "formats/llama2c.h"
#include "formats/safetensors.h"
#include "model_test_util.h"
#include "skip_util.h"

using namespace nl;
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

const fs::path kTmp = fs::absolute("model_formats_tmp");

std::string tmp(const std::string& name) {
  fs::create_directories(kTmp);
  return (kTmp / name).string();
}

std::string slurp(const std::string& p) { return read_file(p, 1ull << 32); }

void spit(const std::string& p, const std::string& s) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f.write(s.data(), std::streamsize(s.size()));
}

// Logits of `tokens` fed one at a time.
std::vector<float> logits_of(const ModelWeights& w, const std::vector<int>& tokens) {
  Model m(w);
  std::vector<float> out;
  for (size_t p = 0; p < tokens.size(); ++p) {
    const float* l = m.forward_token(tokens[p], int(p));
    out.insert(out.end(), l, l + w.config.vocab_size);
  }
  return out;
}

// The error message of reading `path` with `read`; fails the test if it reads fine.
template <class F>
std::string input_error(const std::string& path, F read) {
  try {
    read(path);
  } catch (const InputError& e) {
    const std::string m = e.what();
    CHECK_MESSAGE(m.find('\n') == std::string::npos, m);
    return m;
  }
  FAIL("accepted malformed " << path);
  return "";
}

void check_error(const std::string& msg, const std::string& path, const std::string& what) {
  INFO(msg);
  CHECK(msg.rfind(path, 0) == 0);
  CHECK(msg.find(what) != std::string::npos);
}

// Rewrites a safetensors header through `edit`, keeping the data section.
template <class F>
void edit_header(const std::string& src, const std::string& dst, F edit) {
  const std::string all = slurp(src);
  uint64_t n;
  std::memcpy(&n, all.data(), 8);
  json h = json::parse(all.substr(8, n));
  edit(h);
  std::string text = h.dump();
  const uint64_t len = text.size();
  spit(dst, std::string(reinterpret_cast<const char*>(&len), 8) + text + all.substr(8 + n));
}

std::string copy_checkpoint(const std::string& src_dir, const std::string& name) {
  const std::string d = tmp(name);
  fs::remove_all(d);
  fs::create_directories(d);
  fs::copy_file(src_dir + "/config.json", d + "/config.json");
  fs::copy_file(src_dir + "/model.safetensors", d + "/model.safetensors");
  return d;
}

}  // namespace

TEST_CASE("llama2.c -> safetensors (f32) -> reader gives identical weights and logits" *
          test::needs_models({"llama2c-stories260K/stories260K.bin"})) {
  const std::string bin = std::string(NL_MODELS_DIR) + "/llama2c-stories260K/stories260K.bin";
  const ModelWeights a = read_llama2c(bin);
  const std::string dir = tmp("stories260K-hf");
  write_safetensors_model(dir, a, TensorDtype::kF32);
  const ModelWeights b = read_model(dir);
  CHECK(b.config.dim == a.config.dim);
  CHECK(b.config.shared_classifier);
  for (size_t l = 0; l < a.layers.size(); ++l) {
    CHECK(a.layers[l].wq == b.layers[l].wq);  // permuted for HF on write, un-permuted on read
    CHECK(a.layers[l].wk == b.layers[l].wk);
    CHECK(a.layers[l].w_down == b.layers[l].w_down);
  }
  const std::vector<int> tokens = {1, 403, 407, 261, 378, 432, 383, 286, 261, 376, 298, 315};
  const float diff = test::max_abs_diff(logits_of(a, tokens), logits_of(b, tokens));
  MESSAGE("llama2.c vs safetensors max |logit diff| = " << diff);
  CHECK(diff <= 1e-5f);
  // Deterministic writer: the same weights give the same bytes.
  const std::string dir2 = tmp("stories260K-hf-again");
  write_safetensors_model(dir2, a, TensorDtype::kF32);
  CHECK(slurp(dir + "/model.safetensors") == slurp(dir2 + "/model.safetensors"));
}

TEST_CASE("the converted checkpoint follows the HF convention: an independent numpy rotate_half forward agrees" *
          test::needs_models({"llama2c-stories260K/stories260K.bin"}) * test::needs_python("numpy", "python3-numpy")) {
  const std::string bin = std::string(NL_MODELS_DIR) + "/llama2c-stories260K/stories260K.bin";
  const ModelWeights a = read_llama2c(bin);
  const std::string dir = tmp("stories260K-hf-numpy");
  write_safetensors_model(dir, a, TensorDtype::kF32);
  const std::vector<int> tokens = {1, 403, 407, 261, 378, 432, 383, 286};
  std::string cmd = std::string(NL_PYTHON) + " " NL_SOURCE_DIR "/tests/hf_llama_reference.py " + dir;
  for (int t : tokens) cmd.append(" ").append(std::to_string(t));
  cmd += " > " + tmp("numpy_logits.json");
  REQUIRE(std::system(cmd.c_str()) == 0);
  const auto ref = json::parse(slurp(tmp("numpy_logits.json"))).get<std::vector<std::vector<float>>>();
  std::vector<float> flat;
  for (const auto& r : ref) flat.insert(flat.end(), r.begin(), r.end());
  const float diff = test::max_abs_diff(logits_of(a, tokens), flat);
  MESSAGE("toolkit vs numpy HF forward max |logit diff| = " << diff);
  CHECK(diff <= 1e-4f);
}

TEST_CASE("f16 / bf16 checkpoints read back as the reference rounding of each weight") {
  const ModelWeights a = test::random_weights(test::small_config(FfnAct::kRelu, false), 7);
  for (TensorDtype dt : {TensorDtype::kF16, TensorDtype::kBF16}) {
    const std::string dir = tmp(dt == TensorDtype::kF16 ? "small-f16" : "small-bf16");
    write_safetensors_model(dir, a, dt);
    const ModelWeights b = read_model(dir + "/config.json");
    CHECK(b.config.act == FfnAct::kRelu);
    CHECK_FALSE(b.config.shared_classifier);
    auto round = [dt](float x) {
      return dt == TensorDtype::kF16 ? f16_to_f32(f32_to_f16(x)) : bf16_to_f32(f32_to_bf16(x));
    };
    size_t bad = 0;
    for (size_t i = 0; i < a.wcls.size(); ++i) bad += b.wcls[i] != round(a.wcls[i]);
    for (size_t i = 0; i < a.layers[1].w_up.size(); ++i) bad += b.layers[1].w_up[i] != round(a.layers[1].w_up[i]);
    CHECK(bad == 0);
  }
  // Half conversions at the edges: subnormals, overflow, rounding to even.
  CHECK(f16_to_f32(0x0001) == std::ldexp(1.0f, -24));
  CHECK(f32_to_f16(std::ldexp(1.0f, -24)) == 0x0001);
  CHECK(f32_to_f16(65504.0f) == 0x7bff);
  CHECK(f32_to_f16(70000.0f) == 0x7c00);
  CHECK(f32_to_f16(1.0f + std::ldexp(1.0f, -11)) == 0x3c00);  // halfway, rounds to even
  CHECK(f32_to_bf16(1.0f) == 0x3f80);
}

TEST_CASE("separate classifier and GQA survive both formats") {
  ModelConfig c = test::small_config(FfnAct::kSilu, false);
  c.dim = 32;  // llama2.c export needs nothing special; keep the model tiny
  const ModelWeights a = test::random_weights(c, 11);
  const std::string bin = tmp("small-untied.bin");
  write_llama2c(bin, a);
  const ModelWeights b = read_model(bin);
  CHECK_FALSE(b.config.shared_classifier);
  const std::string dir = tmp("small-untied-hf");
  write_safetensors_model(dir, b);
  const ModelWeights d = read_model(dir + "/model.safetensors");
  const std::vector<int> tokens = {1, 5, 9, 2, 17, 3};
  CHECK(test::max_abs_diff(logits_of(a, tokens), logits_of(b, tokens)) == 0.0f);
  CHECK(test::max_abs_diff(logits_of(a, tokens), logits_of(d, tokens)) == 0.0f);
  // ReLU cannot be stored in llama2.c: refused rather than silently changed.
  CHECK_THROWS_AS(write_llama2c(tmp("relu.bin"), test::random_weights(test::small_config(FfnAct::kRelu), 1)),
                  UsageError);
}

TEST_CASE("malformed llama2.c files: one clear error each") {
  const ModelWeights a = test::random_weights(test::small_config(), 3);
  const std::string good = tmp("good.bin");
  write_llama2c(good, a);
  const std::string bytes = slurp(good);
  auto read = [](const std::string& p) { read_llama2c(p); };
  auto with_header = [&](const std::string& name, int field, int32_t value) {
    std::string s = bytes;
    std::memcpy(s.data() + 4 * field, &value, 4);
    const std::string p = tmp(name);
    spit(p, s);
    return p;
  };
  std::string p = tmp("truncated.bin");
  spit(p, bytes.substr(0, bytes.size() - 100));
  check_error(input_error(p, read), p, "truncated");
  p = tmp("trailing.bin");
  spit(p, bytes + "extra");
  check_error(input_error(p, read), p, "trailing data");
  p = tmp("tiny.bin");
  spit(p, bytes.substr(0, 10));
  check_error(input_error(p, read), p, "too small");
  p = with_header("negative_dim.bin", 0, -24);
  check_error(input_error(p, read), p, "dim = -24 is out of range");
  p = with_header("absurd_dim.bin", 1, 1 << 30);  // must not try to allocate gigabytes
  check_error(input_error(p, read), p, "hidden_dim = 1073741824 is out of range");
  p = with_header("absurd_layers.bin", 2, 100000);
  check_error(input_error(p, read), p, "n_layers = 100000");
  p = with_header("heads_mismatch.bin", 3, 5);
  check_error(input_error(p, read), p, "not a multiple of n_heads");
  p = with_header("size_mismatch.bin", 5, 20);  // plausible header, wrong vocabulary: sizes disagree
  check_error(input_error(p, read), p, "implies");
  p = with_header("versioned.bin", 0, int32_t(0x616b3432));
  check_error(input_error(p, read), p, "not supported");
}

TEST_CASE("malformed safetensors checkpoints: one clear error each") {
  const ModelWeights a = test::random_weights(test::small_config(), 5);
  const std::string good = tmp("st-good");
  write_safetensors_model(good, a);
  auto read = [](const std::string& p) { read_model(p); };
  const std::string tensors = good + "/model.safetensors";
  const std::string all = slurp(tensors);

  std::string d = copy_checkpoint(good, "st-huge-header");
  std::string s = all;
  const uint64_t huge = ~uint64_t(0) - 4;  // header length overflow: 8 + n wraps around
  std::memcpy(s.data(), &huge, 8);
  spit(d + "/model.safetensors", s);
  check_error(input_error(d, read), d + "/model.safetensors", "header length");

  d = copy_checkpoint(good, "st-truncated");
  spit(d + "/model.safetensors", all.substr(0, all.size() - 64));
  check_error(input_error(d, read), d + "/model.safetensors", "out of range");

  d = copy_checkpoint(good, "st-bad-json");
  s = all;
  s[8] = '[';
  s[9] = '!';
  spit(d + "/model.safetensors", s);
  check_error(input_error(d, read), d + "/model.safetensors", "not valid JSON");

  d = copy_checkpoint(good, "st-unknown-dtype");
  edit_header(tensors, d + "/model.safetensors", [](json& h) { h["model.norm.weight"]["dtype"] = "F8_E4M3"; });
  check_error(input_error(d, read), d + "/model.safetensors", "unknown or unsupported dtype 'F8_E4M3'");

  d = copy_checkpoint(good, "st-offsets");
  edit_header(tensors, d + "/model.safetensors",
              [](json& h) { h["model.norm.weight"]["data_offsets"][1] = 1ull << 40; });
  check_error(input_error(d, read), d + "/model.safetensors", "out of range");

  d = copy_checkpoint(good, "st-span");
  edit_header(tensors, d + "/model.safetensors", [](json& h) { h["model.norm.weight"]["shape"] = {25}; });
  check_error(input_error(d, read), d + "/model.safetensors", "shape and dtype need");

  d = copy_checkpoint(good, "st-negative-dim");
  edit_header(tensors, d + "/model.safetensors", [](json& h) { h["model.norm.weight"]["shape"] = {-24}; });
  check_error(input_error(d, read), d + "/model.safetensors", "negative");

  d = copy_checkpoint(good, "st-absurd-dims");  // 2^40 x 2^40 elements: must not overflow into a small size
  edit_header(tensors, d + "/model.safetensors", [](json& h) {
    h["model.norm.weight"]["shape"] = {1ull << 40, 1ull << 40};
  });
  check_error(input_error(d, read), d + "/model.safetensors", "absurdly large");

  d = copy_checkpoint(good, "st-not-object");
  edit_header(tensors, d + "/model.safetensors", [](json& h) { h["model.norm.weight"] = 5; });
  check_error(input_error(d, read), d + "/model.safetensors", "entry needs dtype");

  d = copy_checkpoint(good, "st-missing");
  edit_header(tensors, d + "/model.safetensors", [](json& h) { h.erase("model.layers.1.mlp.up_proj.weight"); });
  // Its bytes are still there: a gap between tensors, refused as the reference loader does (issue 23 item 9).
  check_error(input_error(d, read), d + "/model.safetensors", "leaving a gap after");

  d = copy_checkpoint(good, "st-overlap");  // two tensors on the same bytes
  edit_header(tensors, d + "/model.safetensors", [](json& h) {
    h["model.layers.1.input_layernorm.weight"]["data_offsets"] =
        h["model.layers.0.input_layernorm.weight"]["data_offsets"];
  });
  check_error(input_error(d, read), d + "/model.safetensors", "inside tensor");

  d = copy_checkpoint(good, "st-shape");
  edit_header(tensors, d + "/model.safetensors", [](json& h) {
    h["model.norm.weight"]["shape"] = {4, 6};  // same byte count, wrong shape
  });
  check_error(input_error(d, read), d + "/model.safetensors", "config.json implies [24]");

  auto with_config = [&](const std::string& name, auto edit) {
    const std::string dd = copy_checkpoint(good, name);
    json c = json::parse(slurp(dd + "/config.json"));
    edit(c);
    spit(dd + "/config.json", c.dump());
    return dd;
  };
  d = with_config("cfg-act", [](json& c) { c["hidden_act"] = "gelu"; });
  check_error(input_error(d, read), d + "/config.json", "hidden_act 'gelu'");
  d = with_config("cfg-missing", [](json& c) { c.erase("hidden_size"); });
  check_error(input_error(d, read), d + "/config.json", "missing key 'hidden_size'");
  d = with_config("cfg-type", [](json& c) { c["num_hidden_layers"] = "two"; });
  check_error(input_error(d, read), d + "/config.json", "wrong type");
  d = with_config("cfg-negative", [](json& c) { c["intermediate_size"] = -5; });
  check_error(input_error(d, read), d + "/config.json", "out of range");
  // Found by fuzz review: json's get<int64_t>/get<float> converted 1e300 (undefined behaviour) instead of refusing.
  d = with_config("cfg-float-int", [](json& c) { c["hidden_size"] = 1e300; });
  check_error(input_error(d, read), d + "/config.json", "an integer is needed");
  d = with_config("cfg-huge-eps", [](json& c) { c["rms_norm_eps"] = 1e300; });
  check_error(input_error(d, read), d + "/config.json", "out of range");
  d = with_config("cfg-model-type", [](json& c) { c["model_type"] = "gpt2"; });
  check_error(input_error(d, read), d + "/config.json", "model_type 'gpt2'");
  d = with_config("cfg-scaling", [](json& c) { c["rope_scaling"] = {{"type", "linear"}, {"factor", 2.0}}; });
  check_error(input_error(d, read), d + "/config.json", "rope_scaling");

  d = copy_checkpoint(good, "no-config");
  fs::remove(d + "/config.json");
  check_error(input_error(d, read), d + "/config.json", "missing");
}

TEST_CASE("weights that disagree with their config are refused by the model") {
  ModelWeights w = test::random_weights(test::small_config(), 9);
  w.layers[1].wk.pop_back();
  CHECK_THROWS_AS(Model m(w), InputError);
}
