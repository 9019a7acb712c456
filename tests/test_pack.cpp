// nl-layout pack on stories260K and the bundled tiny ReLU model with random layouts: byte-identical outputs across
// runs; the permuted export (llama2.c and safetensors) computes the same function over the model's whole context
// (greedy tokens equal, f32 logits within 1e-5).
#include <doctest/doctest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cmath>
#include <cstdio>
#include <functional>
#include <nlohmann/json.hpp>
#include <random>
#include <set>

#include "cli_test_util.h"
#include "formats/core/atomic_file.h"
#include "formats/core/error.h"
#include "formats/layout.h"
#include "formats/llama2c.h"
#include "formats/model_source.h"
#include "formats/safetensors.h"
#include "runtime/flash_image.h"
#include "runtime/model/model.h"
#include "skip_util.h"

using namespace nl;

namespace {
using test::sh;
Layout random_layout(const ModelConfig& c, uint64_t seed) {
  Layout lay;
  lay.method = "greedy";
  std::mt19937_64 rng(seed);
  for (int l = 0; l < c.n_layers; ++l) {
    LayoutLayer L;
    L.order.resize(size_t(c.hidden_dim));
    for (uint32_t i = 0; i < L.order.size(); ++i) L.order[i] = i;
    std::shuffle(L.order.begin(), L.order.end(), rng);
    lay.layers.push_back(L);
  }
  return lay;
}

std::vector<std::vector<uint32_t>> orders(const Layout& lay) {
  std::vector<std::vector<uint32_t>> o;
  for (const auto& L : lay.layers) o.push_back(L.order);
  return o;
}

// The export streams; the reference permutes the whole model in memory and writes it with the in-memory writer
// (what pack did before it streamed). Both must give the same bytes.
void check_same_as_in_memory_safetensors(const std::string& input, const Layout& lay, const std::string& exported,
                                         const std::string& ref_dir) {
  ModelWeights ref = read_safetensors_model(input);
  ffn_permute(ref, orders(lay));
  write_safetensors_model(ref_dir, ref);
  CHECK(read_file(exported + "/model.safetensors") == read_file(ref_dir + "/model.safetensors"));
  CHECK(read_file(exported + "/config.json") == read_file(ref_dir + "/config.json"));
}

// Greedy generation over the model's whole context on the original and the permuted model: the tokens are equal
// at every position and the largest |logit difference| over all positions is returned (the bound: 1e-5).
float max_logit_diff_full_context(const ModelWeights& w, const ModelWeights& p, float* max_logit = nullptr) {
  Model m0(w), m1(p);
  const int vocab = w.config.vocab_size;
  int t0 = 1, t1 = 1;
  float max_diff = 0, biggest = 0;
  for (int pos = 0; pos < m0.max_seq(); ++pos) {
    const float* a = m0.forward_token(t0, pos);
    std::vector<float> la(a, a + vocab);
    const float* b = m1.forward_token(t1, pos);
    for (int i = 0; i < vocab; ++i) {
      max_diff = std::max(max_diff, std::fabs(la[size_t(i)] - b[i]));
      biggest = std::max(biggest, std::fabs(la[size_t(i)]));
    }
    t0 = int(std::max_element(la.begin(), la.end()) - la.begin());
    t1 = int(std::max_element(b, b + vocab) - b);
    REQUIRE_MESSAGE(t0 == t1, "greedy tokens differ at position " << pos);
  }
  if (max_logit) *max_logit = biggest;
  return max_diff;
}

}  // namespace

TEST_CASE("pack: deterministic image, function-preserving permuted export (stories260K)" *
          test::needs_models({"llama2c-stories260K/stories260K.bin"})) {
  const std::string model = std::string(NL_MODELS_DIR) + "/llama2c-stories260K/stories260K.bin";
  struct stat st {};
  ::mkdir("pack_test", 0755);
  ModelWeights w = read_llama2c(model);
  const Layout lay = random_layout(w.config, 3);
  layout_write("pack_test/layout.json", lay);
  const std::string tokenizer = std::string(NL_MODELS_DIR) + "/llama2c-stories260K/tok512.bin";
  const std::string bin = std::string(NL_BINARY_DIR) + "/cli/";
  for (const char* d : {"a", "b"}) {
    ::mkdir((std::string("pack_test/") + d).c_str(), 0755);
    std::string out;
    int rc =
        sh(bin + "nl-layout pack --model " + model + " --layout pack_test/layout.json --dtype f16 --out pack_test/" +
               d + "/m.nlw --export-permuted pack_test/" + d + "/permuted.bin --tokenizer " + tokenizer,
           &out);
    REQUIRE_MESSAGE(rc == 0, out);
  }
  CHECK(read_file("pack_test/a/m.nlw") == read_file("pack_test/b/m.nlw"));
  CHECK(read_file("pack_test/a/m.nlw.json") == read_file("pack_test/b/m.nlw.json"));
  CHECK(read_file("pack_test/a/m.nlw.tokenizer") == read_file(tokenizer));  // copied beside the image
  CHECK(read_file("pack_test/a/permuted.bin") == read_file("pack_test/b/permuted.bin"));
  // The streamed export equals the whole model permuted in memory and written by write_llama2c; so does the
  // identity export (no layout) through the streaming path's API.
  ModelWeights ref = w;
  ffn_permute(ref, orders(lay));
  write_llama2c("pack_test/ref.bin", ref);
  CHECK(read_file("pack_test/a/permuted.bin") == read_file("pack_test/ref.bin"));
  open_model_source(model)->write_permuted("pack_test/identity.bin", {});
  write_llama2c("pack_test/ref_identity.bin", w);
  CHECK(read_file("pack_test/identity.bin") == read_file("pack_test/ref_identity.bin"));
  // An order that is not a permutation is refused before anything is written.
  auto bad = orders(lay);
  bad[1][0] = bad[1][1];
  CHECK_THROWS_AS(open_model_source(model)->write_permuted("pack_test/bad.bin", bad), UsageError);
  CHECK(::stat("pack_test/bad.bin", &st) != 0);

  ModelWeights p = read_llama2c("pack_test/a/permuted.bin");
  CHECK(p.layers[0].w_up != w.layers[0].w_up);  // really permuted
  // Only the summation order of the down projection changes, and the dense forward sums it in double.
  float max_logit = 0;
  const float max_diff = max_logit_diff_full_context(w, p, &max_logit);
  MESSAGE("stories260K permuted llama2.c export: max |logit difference| over all "
          << w.config.seq_len << " positions " << max_diff << " (max |logit| " << max_logit << ")");
  CHECK(max_diff <= 1e-5f);

  // A wrong layout is refused with one line naming it.
  write_file_atomic("pack_test/bad_layout.json", "{\"format\": \"neuralink-layout\"");
  std::string out;
  CHECK(sh(bin + "nl-layout pack --model " + model + " --layout pack_test/bad_layout.json --out pack_test/x.nlw",
           &out) == 3);
  CHECK(out.find("pack_test/bad_layout.json: ") != std::string::npos);
}

TEST_CASE(
    "pack streams from safetensors: same image as from llama2.c; permuted safetensors export preserves the function" *
    test::needs_models({"llama2c-stories260K/stories260K.bin"})) {
  const std::string model = std::string(NL_MODELS_DIR) + "/llama2c-stories260K/stories260K.bin";
  ::mkdir("pack_st", 0755);
  ModelWeights w = read_llama2c(model);
  write_safetensors_model("pack_st/hf", w);
  const Layout lay = random_layout(w.config, 5);
  layout_write("pack_st/layout.json", lay);
  const std::string bin = std::string(NL_BINARY_DIR) + "/cli/";
  std::string out;
  REQUIRE_MESSAGE(
      sh(bin + "nl-layout -q pack --model " + model + " --layout pack_st/layout.json --dtype bf16 --out pack_st/a.nlw",
         &out) == 0,
      out);
  REQUIRE_MESSAGE(
      sh(bin + "nl-layout -q pack --model pack_st/hf --layout pack_st/layout.json --dtype bf16 --out pack_st/b.nlw "
               "--export-permuted pack_st/hf_perm",
         &out) == 0,
      out);
  // The FFN regions (everything but the manifest's source fields) are the same bytes.
  CHECK(read_file("pack_st/a.nlw") == read_file("pack_st/b.nlw"));

  check_same_as_in_memory_safetensors("pack_st/hf", lay, "pack_st/hf_perm", "pack_st/hf_ref");
  ModelWeights p = read_safetensors_model("pack_st/hf_perm");
  CHECK(p.layers[1].w_gate != w.layers[1].w_gate);
  const float max_diff = max_logit_diff_full_context(w, p);
  MESSAGE("stories260K permuted safetensors export: max |logit difference| over all " << w.config.seq_len
                                                                                      << " positions " << max_diff);
  CHECK(max_diff <= 1e-5f);
}

TEST_CASE(
    "permuted export of the bundled tiny ReLU model (safetensors) preserves the function over its whole context") {
  const std::string model = std::string(NL_SOURCE_DIR) + "/datasets/tiny-relu/model";
  ::mkdir("pack_tiny", 0755);
  ModelWeights w = read_safetensors_model(model);
  const Layout lay = random_layout(w.config, 7);
  layout_write("pack_tiny/layout.json", lay);
  const std::string bin = std::string(NL_BINARY_DIR) + "/cli/";
  std::string out;
  REQUIRE_MESSAGE(sh(bin + "nl-layout -q pack --model " + model +
                         " --layout pack_tiny/layout.json --out pack_tiny/m.nlw "
                         "--export-permuted pack_tiny/perm",
                     &out) == 0,
                  out);
  check_same_as_in_memory_safetensors(model, lay, "pack_tiny/perm", "pack_tiny/ref");
  // A bf16 input: the streamed copy converts every tensor to f32 as the reader does.
  write_safetensors_model("pack_tiny/bf16", w, TensorDtype::kBF16);
  REQUIRE_MESSAGE(
      sh(bin + "nl-layout -q pack --model pack_tiny/bf16 --layout pack_tiny/layout.json --out pack_tiny/b.nlw "
               "--export-permuted pack_tiny/bf16_perm",
         &out) == 0,
      out);
  check_same_as_in_memory_safetensors("pack_tiny/bf16", lay, "pack_tiny/bf16_perm", "pack_tiny/bf16_ref");
  ModelWeights p = read_safetensors_model("pack_tiny/perm");
  CHECK(p.layers[0].w_down != w.layers[0].w_down);
  CHECK(p.layers[0].w_down.size() == w.layers[0].w_down.size());
  float max_logit = 0;
  const float max_diff = max_logit_diff_full_context(w, p, &max_logit);
  MESSAGE("tiny-relu permuted safetensors export: max |logit difference| over all "
          << w.config.seq_len << " positions " << max_diff << " (max |logit| " << max_logit << ")");
  CHECK(max_diff <= 1e-5f);
}

// --synthetic-shape: random FFN weights of a given shape (I/O benchmarks, no model file). Byte-identical for equal
// inputs; a layout only moves bundles (decoding in original order gives the identity image's weights); the bundle
// size follows the shape; bad shapes are usage errors.
TEST_CASE("pack --synthetic-shape: deterministic random FFN of the shape, layouts only move bundles") {
  ::mkdir("pack_syn", 0755);
  ::mkdir("pack_syn/b", 0755);
  const std::string bin = std::string(NL_BINARY_DIR) + "/cli/nl-layout pack ";
  Layout lay;
  lay.method = "frequency";
  std::mt19937_64 rng(5);
  for (int l = 0; l < 2; ++l) {
    LayoutLayer L;
    L.order.resize(96);
    for (uint32_t i = 0; i < L.order.size(); ++i) L.order[i] = i;
    std::shuffle(L.order.begin(), L.order.end(), rng);
    lay.layers.push_back(L);
  }
  layout_write("pack_syn/layout.json", lay);
  std::string out;
  REQUIRE_MESSAGE(sh(bin + "--synthetic-shape 64x96xgated --layers 2 --out pack_syn/a.nlw", &out) == 0, out);
  REQUIRE_MESSAGE(sh(bin + "--synthetic-shape 64x96xgated --layers 2 --out pack_syn/b/a.nlw", &out) == 0, out);
  REQUIRE_MESSAGE(
      sh(bin + "--synthetic-shape 64x96xgated --layers 2 --layout pack_syn/layout.json --out pack_syn/p.nlw", &out) ==
          0,
      out);
  REQUIRE_MESSAGE(sh(bin + "--synthetic-shape 64x96xgated --layers 2 --seed 2 --out pack_syn/s.nlw", &out) == 0, out);
  CHECK(read_file("pack_syn/a.nlw") == read_file("pack_syn/b/a.nlw"));
  CHECK(read_file("pack_syn/a.nlw.json") == read_file("pack_syn/b/a.nlw.json"));
  CHECK(read_file("pack_syn/a.nlw") != read_file("pack_syn/s.nlw"));

  FlashImage a("pack_syn/a.nlw", IoOptions{}), p("pack_syn/p.nlw", IoOptions{});
  CHECK(a.manifest().dtype == ImageDtype::kF16);  // the paper's element type is the synthetic default
  CHECK(a.manifest().bundle_kind == BundleKind::kGated);
  CHECK(a.manifest().bundle_bytes == 3 * 64 * 2);
  CHECK(p.manifest().order[1] == lay.layers[1].order);
  for (int l = 0; l < 2; ++l) {
    LayerWeights wa, wp;
    a.load_ffn_layer(l, &wa);
    p.load_ffn_layer(l, &wp);
    CHECK(wa.w_gate == wp.w_gate);
    CHECK(wa.w_up == wp.w_up);
    CHECK(wa.w_down == wp.w_down);
    float lo = 0, hi = 0;
    for (float v : wa.w_up) lo = std::min(lo, v), hi = std::max(hi, v);
    CHECK(lo < -0.05f);  // random, not zeros: a zero image could read faster from a thin-provisioned disk
    CHECK(hi > 0.05f);
    CHECK(hi <= 0.126f);  // uniform in +-1/sqrt(dim)
  }

  // A greedy+ls layout records the bundle bytes its objective priced: pack says when the image's differ (it still
  // packs: the order is valid, only chosen for other reads), and is silent when they agree.
  lay.method = "greedy+ls";
  lay.parameters = {{"bundle_bytes", 204}};  // 3 q8_0 rows of 64: 3 x 2 blocks x 34 bytes
  layout_write("pack_syn/layout_ls.json", lay);
  const std::string ls = "--synthetic-shape 64x96xgated --layers 2 --layout pack_syn/layout_ls.json ";
  REQUIRE_MESSAGE(sh(bin + ls + "--out pack_syn/w16.nlw", &out) == 0, out);
  CHECK(out.find("warning: pack_syn/layout_ls.json was solved for 204-byte bundles, this f16 image has 384-byte") !=
        std::string::npos);
  REQUIRE_MESSAGE(sh(bin + ls + "--dtype q8_0 --out pack_syn/w8.nlw", &out) == 0, out);
  CHECK(out.find("warning") == std::string::npos);
  CHECK(FlashImage("pack_syn/w8.nlw", IoOptions{}).manifest().bundle_bytes == 204);

  // Named paper shapes (neuron counts seen through the layout check, before anything large is written).
  CHECK(sh(bin + "--synthetic-shape opt-6.7b --layers 2 --layout pack_syn/layout.json --out pack_syn/x.nlw", &out) ==
        3);
  CHECK(out.find("the model has 16384") != std::string::npos);
  CHECK(sh(bin + "--synthetic-shape llama2-7b-prosparse --layers 2 --layout pack_syn/layout.json --out pack_syn/x.nlw",
           &out) == 3);
  CHECK(out.find("the model has 11008") != std::string::npos);
  // Bad input: unknown shape, both --model and --synthetic-shape, a layout of the wrong width.
  CHECK(sh(bin + "--synthetic-shape opt-9b --out pack_syn/x.nlw", &out) == 2);
  CHECK(out.find("--synthetic-shape opt-9b") != std::string::npos);
  CHECK(sh(bin + "--synthetic-shape 64x96xsparse --out pack_syn/x.nlw", &out) == 2);
  CHECK(sh(bin + "--synthetic-shape 64x96 --model pack_syn/a.nlw --out pack_syn/x.nlw", &out) == 2);
  CHECK(sh(bin + "--synthetic-shape 64x97 --layers 2 --layout pack_syn/layout.json --out pack_syn/x.nlw", &out) == 3);
  CHECK(out.find("pack_syn/layout.json") != std::string::npos);
  struct stat st {};
  CHECK(::stat("pack_syn/x.nlw", &st) != 0);  // nothing written on error
}

// Quantized images from real models (docs/runtime.md "Quantized images"): pack at q8_0 / q4_0, byte-identical
// repacks, the image opens and decodes, and the report's greedy agreement with f32 (issue 18: q8_0 >= 95 % of 64
// tokens; q4_0 reported only).
namespace {
nlohmann::json pack_quantized(const std::string& model, const std::string& dtype, const std::string& out_dir) {
  const std::string bin = std::string(NL_BINARY_DIR) + "/cli/nl-layout -q --json pack ";
  std::string out, out2;
  ::mkdir(out_dir.c_str(), 0755);
  ::mkdir((out_dir + "/again").c_str(), 0755);
  const int rc = sh(bin + "--model " + model + " --dtype " + dtype + " --out " + out_dir + "/m.nlw", &out);
  REQUIRE_MESSAGE(rc == 0, out);
  REQUIRE_MESSAGE(sh(bin + "--model " + model + " --dtype " + dtype + " --out " + out_dir + "/again/m.nlw", &out2) == 0,
                  out2);
  CHECK(read_file(out_dir + "/m.nlw") == read_file(out_dir + "/again/m.nlw"));
  CHECK(read_file(out_dir + "/m.nlw.json") == read_file(out_dir + "/again/m.nlw.json"));
  FlashImage img(out_dir + "/m.nlw", IoOptions{});
  img.verify_all();
  CHECK(image_dtype_name(img.manifest().dtype) == dtype);
  ModelWeights d = img.load_dense();
  CHECK(d.layers[0].wq.size() == size_t(d.config.dim) * size_t(d.config.dim));
  return nlohmann::json::parse(out);
}
}  // namespace

TEST_CASE("pack --dtype q8_0 / q4_0 of stories260K and tiny-relu: deterministic, decodes, reports its error") {
  const std::string stories = std::string(NL_MODELS_DIR) + "/llama2c-stories260K/stories260K.bin";
  const std::string tiny = std::string(NL_SOURCE_DIR) + "/datasets/tiny-relu/model";
  struct stat st {};
  std::vector<std::pair<std::string, std::string>> models = {{"tiny-relu", tiny}};
  if (::stat(stories.c_str(), &st) == 0)
    models.push_back({"stories260K", stories});
  else
    MESSAGE("stories260K skipped: " << stories << " is absent");
  for (const auto& [name, path] : models) {
    for (const char* dtype : {"q8_0", "q4_0"}) {
      CAPTURE(name);
      CAPTURE(std::string(dtype));
      const nlohmann::json j = pack_quantized(path, dtype, "pack_q_" + name + "_" + dtype);
      const auto& q = j.at("quantization");
      const auto& lg = q.at("logits");
      const double agree = lg.at("greedy_agreement").get<double>();
      MESSAGE(name << " " << std::string(dtype) << ": greedy agreement with f32 " << lg.at("greedy_agree") << "/"
                   << lg.at("positions") << ", free-running common prefix " << lg.at("free_running_common_prefix")
                   << ", max |logit diff| " << lg.at("max_abs_logit_diff") << ", relative RMS "
                   << q.at("relative_rms_error").dump());
      CHECK(lg.at("positions") == 64);
      for (const char* kind : {"embeddings", "attention.wq", "attention.wo", "ffn.up", "ffn.down"})
        CHECK(q.at("relative_rms_error").at(kind).get<double>() > 0);
      CHECK(q.at("relative_rms_error").at("norms").get<double>() == 0);  // norms stay f32
      if (std::string(dtype) == "q8_0") {
        CHECK(agree >= 0.95);
        CHECK(q.at("relative_rms_error").at("ffn.up").get<double>() < 0.02);
      }
    }
  }
}

TEST_CASE("pack refuses a quantized dtype for a dim that is not a multiple of 32, writing nothing") {
  ::mkdir("pack_q_dim", 0755);
  const std::string bin = std::string(NL_BINARY_DIR) + "/cli/nl-layout pack ";
  const std::string tok = std::string(NL_SOURCE_DIR) + "/datasets/tiny-relu/model/tokenizer.model";
  std::string out;
  for (const char* dtype : {"q8_0", "q4_0"}) {
    CHECK(sh(bin + "--synthetic-shape 48x64 --layers 2 --dtype " + dtype + " --tokenizer " + tok +
                 " --out pack_q_dim/x.nlw",
             &out) == 2);
    CHECK_MESSAGE(out.find("dim 48 is not a multiple of 32") != std::string::npos, out);
    CHECK(std::count(out.begin(), out.end(), '\n') == 1);
  }
  struct stat st {};
  CHECK(::stat("pack_q_dim/x.nlw", &st) != 0);
  CHECK(::stat("pack_q_dim/x.nlw.json", &st) != 0);
  CHECK(::stat("pack_q_dim/x.nlw.tokenizer", &st) != 0);
  CHECK(sh(bin + "--synthetic-shape 48x64 --layers 2 --dtype q5_1 --out pack_q_dim/x.nlw", &out) == 2);
}

TEST_CASE("whole synthetic models: every tensor random and seeded per tensor, generation runs, labelled synthetic") {
  ::mkdir("pack_whole", 0755);
  const std::string bin = std::string(NL_BINARY_DIR) + "/cli/";
  std::string out;
  REQUIRE_MESSAGE(sh(bin + "nl-layout pack --synthetic-shape tiny-test --out pack_whole/a.nlw", &out) == 0, out);
  CHECK(out.find("synthetic random weights: meaningless text, real timing") != std::string::npos);
  REQUIRE_MESSAGE(sh(bin + "nl-layout -q pack --synthetic-shape tiny-test --out pack_whole/b.nlw", &out) == 0, out);
  REQUIRE_MESSAGE(
      sh(bin + "nl-layout -q pack --synthetic-shape tiny-test --dtype q8_0 --out pack_whole/q.nlw", &out) == 0, out);
  REQUIRE_MESSAGE(
      sh(bin + "nl-layout -q pack --synthetic-shape tiny-test --layers 1 --out pack_whole/one.nlw", &out) == 0, out);
  CHECK(read_file("pack_whole/a.nlw") == read_file("pack_whole/b.nlw"));
  FlashImage a("pack_whole/a.nlw", IoOptions{}), q("pack_whole/q.nlw", IoOptions{}),
      one("pack_whole/one.nlw", IoOptions{});
  const ModelConfig& c = a.manifest().config;
  CHECK(c.dim == 64);
  CHECK(c.n_layers == 2);
  CHECK(c.n_heads == 4);
  CHECK(c.hidden_dim == 256);
  CHECK(c.act == FfnAct::kRelu);
  CHECK(a.manifest().source.find("synthetic random weights: meaningless text, real timing") != std::string::npos);
  CHECK(one.manifest().config.n_layers == 1);
  ModelWeights w = a.load_dense();
  for (int l = 0; l < c.n_layers; ++l) a.load_ffn_layer(l, &w.layers[size_t(l)]);
  // Per-tensor streams: the one-layer model's layer 0 and embeddings are the two-layer model's.
  ModelWeights w1 = one.load_dense();
  one.load_ffn_layer(0, &w1.layers[0]);
  CHECK(w1.tok_embeddings == w.tok_embeddings);
  CHECK(w1.layers[0].wq == w.layers[0].wq);
  CHECK(w1.layers[0].w_down == w.layers[0].w_down);
  CHECK(w.layers[0].wq != w.layers[1].wq);
  CHECK(w.layers[1].rms_att == std::vector<float>(64, 1.0f));
  // Finite, non-degenerate logits over the whole context (the variance-preserving scale).
  Model m(w);
  int tok = 1;
  std::set<int> seen;
  for (int pos = 0; pos < m.max_seq(); ++pos) {
    const float* lg = m.forward_token(tok, pos);
    for (int i = 0; i < c.vocab_size; ++i) REQUIRE(std::isfinite(lg[i]));
    tok = int(std::max_element(lg, lg + c.vocab_size) - lg);
    seen.insert(tok);
  }
  CHECK(seen.size() > 1);
  CHECK(q.manifest().dtype == ImageDtype::kQ8_0);
  // --synthetic-act silu: the same weights, a SiLU FFN (what llama.cpp's LLaMA arch computes); refused for FFN-only
  // shapes and without --synthetic-shape (exit 2, nothing written).
  REQUIRE_MESSAGE(
      sh(bin + "nl-layout -q pack --synthetic-shape tiny-test --synthetic-act silu --out pack_whole/s.nlw", &out) == 0,
      out);
  FlashImage si("pack_whole/s.nlw", IoOptions{});
  CHECK(si.manifest().config.act == FfnAct::kSilu);
  ModelWeights ws = si.load_dense();
  si.load_ffn_layer(0, &ws.layers[0]);
  CHECK(ws.tok_embeddings == w.tok_embeddings);
  CHECK(ws.layers[0].w_gate == w.layers[0].w_gate);
  CHECK(ws.layers[0].w_down == w.layers[0].w_down);
  CHECK(sh(bin + "nl-layout -q pack --synthetic-shape opt-350m --synthetic-act silu --out pack_whole/x.nlw", &out) ==
        2);
  CHECK(sh(bin + "nl-layout -q pack --model pack_whole/a.nlw --synthetic-act silu --out pack_whole/x.nlw", &out) == 2);
  struct stat st {};
  CHECK(::stat("pack_whole/x.nlw", &st) != 0);
}

// Issue 18 item 8: pack records the planner settings the layout was solved for (or nl-layout eval's defaults) and
// nl-run uses them unless the user passes the option. Issue 23 item 7 at the command line: an edited manifest field
// that changes the computation is refused by nl-run with exit 3 and one line.
TEST_CASE("pack records the layout's planner settings; nl-run follows them unless told otherwise") {
  const std::string model = std::string(NL_SOURCE_DIR) + "/datasets/tiny-relu/model";
  ::mkdir("pack_plan", 0755);
  ModelWeights w = read_safetensors_model(model);
  Layout solved = random_layout(w.config, 11);
  solved.method = "greedy+ls";
  solved.parameters = {{"gap", "3"}, {"cache_ratio", 0.1}, {"device", "ufs40"}, {"admission", "all"}};
  layout_write("pack_plan/solved.json", solved);
  Layout plain = random_layout(w.config, 12);  // records no planner settings: eval's defaults
  layout_write("pack_plan/plain.json", plain);
  const std::string bin = std::string(NL_BINARY_DIR) + "/cli/";
  std::string out;
  REQUIRE_MESSAGE(
      sh(bin + "nl-layout -q pack --model " + model + " --layout pack_plan/solved.json --out pack_plan/s.nlw", &out) ==
          0,
      out);
  REQUIRE_MESSAGE(
      sh(bin + "nl-layout -q pack --model " + model + " --layout pack_plan/plain.json --out pack_plan/p.nlw", &out) ==
          0,
      out);
  REQUIRE_MESSAGE(sh(bin + "nl-layout -q pack --model " + model + " --out pack_plan/i.nlw", &out) == 0, out);
  const ImageManifest ms = manifest_load("pack_plan/s.nlw.json"), mp = manifest_load("pack_plan/p.nlw.json");
  CHECK(ms.planner.gap == "3");
  CHECK(ms.planner.cache_ratio == 0.1);
  CHECK(ms.planner.cache_admission == CacheAdmission::kAll);
  CHECK(ms.planner.from == "layout");
  CHECK(mp.planner.gap == "auto");  // nl-layout eval's defaults
  CHECK(mp.planner.cache_ratio == 0.05);
  CHECK(mp.planner.device == "ufs40");
  CHECK(mp.planner.read_latency_us > 0);
  CHECK(manifest_load("pack_plan/i.nlw.json").planner.empty());  // identity: nothing was evaluated
  // A layout solved for another device needs its profile.
  solved.parameters["device"] = "emmc51";
  layout_write("pack_plan/other.json", solved);
  CHECK(sh(bin + "nl-layout -q pack --model " + model + " --layout pack_plan/other.json --out pack_plan/o.nlw", &out) ==
        2);
  CHECK(out.find("was solved for device 'emmc51'") != std::string::npos);

  auto run = [&](const std::string& img, const std::string& extra) {
    std::string o;
    const int rc = sh(bin + "nl-run -q --json generate --no-direct --image " + img + " --steps 3 --prompt-tokens 1 " +
                          extra + " 2>/dev/null",
                      &o);
    REQUIRE_MESSAGE(rc == 0, o);
    return nlohmann::json::parse(o.substr(o.find('{')));
  };
  auto j = run("pack_plan/s.nlw", "");
  CHECK(j["gap"] == "3");
  CHECK(j["cache_ratio"] == 0.1);
  j = run("pack_plan/s.nlw", "--gap off");
  CHECK(j["gap"] == "off");
  CHECK(j["cache_ratio"] == 0.1);
  j = run("pack_plan/s.nlw", "--cache-ratio 0");
  CHECK(j["gap"] == "3");
  CHECK(j["cache_ratio"] == 0.0);
  j = run("pack_plan/p.nlw", "");  // gap auto with the manifest's device fit, no --device needed
  CHECK(j["gap"] == "auto");
  CHECK(j["cache_ratio"] == 0.05);
  j = run("pack_plan/i.nlw", "");  // nl-run's own defaults
  CHECK(j["gap"] == "off");
  CHECK(j["cache_ratio"] == 0.0);

  // Issue 57: the note "planner settings from the manifest" was printed as the image opened, so an error found after
  // that (here: prompt + steps beyond the context) came as two lines; the note now comes with the summary.
  CHECK(
      sh("(" + bin + "nl-run generate --no-direct --image pack_plan/s.nlw --prompt-tokens 1 --steps 100000 >/dev/null)",
         &out) == 2);
  CHECK_MESSAGE(std::count(out.begin(), out.end(), '\n') == 1, out);
  CHECK(out.rfind("nl-run: error: ", 0) == 0);
  REQUIRE(sh("(" + bin + "nl-run generate --no-direct --image pack_plan/s.nlw --prompt-tokens 1 --steps 3 >/dev/null)",
             &out) == 0);
  CHECK_MESSAGE(out.find("planner settings from the manifest (layout): gap 3 cache ratio 0.1") != std::string::npos,
                out);

  // Malformed planner settings: exit 3, one line naming the manifest.
  nlohmann::json mj = nlohmann::json::parse(read_file("pack_plan/s.nlw.json"));
  mj["planner"]["gap"] = "sometimes";
  write_file_atomic("pack_plan/s.nlw.json", mj.dump());
  CHECK(sh(bin + "nl-run generate --no-direct --image pack_plan/s.nlw --steps 1", &out) == 3);
  CHECK_MESSAGE(out.find("pack_plan/s.nlw.json: planner.gap 'sometimes'") != std::string::npos, out);
  mj["planner"]["gap"] = "off";
  mj["planner"]["cache_ratio"] = 2;
  write_file_atomic("pack_plan/s.nlw.json", mj.dump());
  CHECK(sh(bin + "nl-run generate --no-direct --image pack_plan/s.nlw --steps 1", &out) == 3);
  CHECK(out.find("planner.cache_ratio must be a number in [0, 1]") != std::string::npos);
}

TEST_CASE("nl-run refuses a manifest whose computation fields were edited: exit 3, one line") {
  const std::string model = std::string(NL_SOURCE_DIR) + "/datasets/tiny-relu/model";
  ::mkdir("pack_edit", 0755);
  const std::string bin = std::string(NL_BINARY_DIR) + "/cli/";
  std::string out;
  REQUIRE_MESSAGE(sh(bin + "nl-layout -q pack --model " + model + " --dtype f16 --out pack_edit/good.nlw", &out) == 0,
                  out);
  const nlohmann::json base = nlohmann::json::parse(read_file("pack_edit/good.nlw.json"));
  REQUIRE(sh(bin + "nl-run -q generate --no-direct --image pack_edit/good.nlw --steps 2", &out) == 0);
  const std::vector<std::pair<const char*, std::function<void(nlohmann::json&)>>> edits = {
      {"ffn_act", [](nlohmann::json& j) { j["model"]["ffn_act"] = "silu"; }},
      {"norm_eps", [](nlohmann::json& j) { j["model"]["norm_eps"] = 1e-6; }},
      {"rope_theta", [](nlohmann::json& j) { j["model"]["rope_theta"] = 20000.0; }},
      {"n_heads + n_kv_heads",
       [](nlohmann::json& j) {
         j["model"]["n_heads"] = 8;
         j["model"]["n_kv_heads"] = 4;
       }},
      {"n_kv_heads", [](nlohmann::json& j) { j["model"]["n_kv_heads"] = 1; }},
      {"tensor offset",
       [](nlohmann::json& j) {
         j["dense_tensors"][3]["offset"] = j["dense_tensors"][3]["offset"].get<uint64_t>() + 64;
       }},
      {"two tensor offsets swapped",
       [](nlohmann::json& j) { std::swap(j["dense_tensors"][2]["offset"], j["dense_tensors"][4]["offset"]); }},
      {"order", [](nlohmann::json& j) { std::swap(j["order"][0][0], j["order"][0][1]); }},
  };
  for (const auto& [what, edit] : edits) {
    CAPTURE(what);
    ::unlink("pack_edit/bad.nlw");
    REQUIRE(::link("pack_edit/good.nlw", "pack_edit/bad.nlw") == 0);
    nlohmann::json j = base;
    edit(j);
    write_file_atomic("pack_edit/bad.nlw.json", j.dump());
    CHECK(sh(bin + "nl-run -q generate --no-direct --image pack_edit/bad.nlw --steps 2", &out) == 3);
    CHECK_MESSAGE(std::count(out.begin(), out.end(), '\n') == 1, out);
    CHECK_MESSAGE(out.find("pack_edit/bad.nlw.json: ") != std::string::npos, out);
  }
}
