// nl-run generate from flash images: --select gate gives the dense model's tokens for every layout, dtype and I/O
// engine; stories260K packed as f32 reproduces the independent reference tokens; faults stop generation with one
// clear line and a non-zero exit, never a token.
#include <doctest/doctest.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "cli_test_util.h"
#include "formats/core/error.h"
#include "formats/core/image_writer.h"
#include "formats/llama2c.h"
#include "image_test_util.h"
#include "runtime/flash_ffn.h"
#include "skip_util.h"

using namespace nl;

namespace {

using test::Result;

Result run(const std::string& args) { return test::run_tool("nl-run", args, test::Stderr::kMerge); }

std::string tokens_line(const std::string& out) {
  auto p = out.find("tokens:");
  return p == std::string::npos ? "" : out.substr(p, out.find('\n', p) - p);
}

std::string dir(const std::string& n) {
  std::string d = "run_test_" + n;
  ::mkdir(d.c_str(), 0755);
  return d;
}

// Greedy decoding from `tok` at positions [p0, p1) through `pass(token, pos)` (the logits): every step's logits.
template <class Pass>
std::vector<float> greedy_logits(int tok, int p0, int p1, int vocab, Pass&& pass) {
  std::vector<float> out;
  for (int p = p0; p < p1; ++p) {
    const float* lg = pass(tok, p);
    out.insert(out.end(), lg, lg + vocab);
    tok = int(std::max_element(lg, lg + vocab) - lg);
  }
  return out;
}

void check_same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  CHECK(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

// The 2-layer ReLU-gated model of the gate tests (random weights, seed 21).
ModelConfig gate_config() {
  ModelConfig c = test::small_config(64, 256, 2);
  c.vocab_size = 64;
  c.seq_len = 40;
  return c;
}

// Writes that model as `spec` to `img` and checks that --select gate gives --select dense's tokens under every engine
// and option set. Returns the number of runs checked.
int check_gate_equals_dense(const std::string& img, const ImageSpec& spec, const std::vector<std::string>& ios,
                            const std::vector<std::string>& extras) {
  image_write_model(img, test::random_weights(gate_config(), 21), spec);
  Result dense = run("generate --image " + img + " --select dense --steps 20 --prompt-tokens 3,9");
  REQUIRE_MESSAGE(dense.rc == 0, dense.out);
  const std::string want = tokens_line(dense.out);
  REQUIRE(want.size() > 20);
  int checked = 0;
  for (const std::string& io : ios) {
    for (const std::string& extra : extras) {
      CAPTURE(img);
      CAPTURE(io);
      CAPTURE(extra);
      Result r =
          run("generate --image " + img + " --select gate --steps 20 --prompt-tokens 3,9 --io " + io + " " + extra);
      CHECK_MESSAGE(r.rc == 0, r.out);
      CHECK(tokens_line(r.out) == want);
      ++checked;
    }
  }
  return checked;
}

// An f16 image of the gate model in a random order (seed `order_seed`) recording `policy` per layer.
ImageSpec policy_spec(uint64_t order_seed, std::vector<ImageCachePolicy> policy) {
  ImageSpec spec;
  spec.dtype = ImageDtype::kF16;
  spec.order = test::random_order(gate_config(), order_seed);
  spec.cache_policy = std::move(policy);
  return spec;
}

}  // namespace

namespace {
// Greedy tokens from token 1 over `steps` positions (each position's argmax fed back).
std::vector<int> argmax_tokens(Model& model, int steps) {
  std::vector<int> out;
  int tok = 1;
  for (int pos = 0; pos < steps; ++pos) {
    const float* lg = model.forward_token(tok, pos);
    tok = int(std::max_element(lg, lg + model.config().vocab_size) - lg);
    out.push_back(tok);
  }
  return out;
}
}  // namespace

TEST_CASE("generate --select gate equals dense for every layout, dtype and engine (ReLU-gated model)") {
  const std::string d = dir("gate");
  int checked = 0;
  for (ImageDtype dt : {ImageDtype::kF32, ImageDtype::kF16, ImageDtype::kBF16}) {
    for (int layout = 0; layout < 2; ++layout) {
      ImageSpec spec;
      spec.dtype = dt;
      if (layout == 1) spec.order = test::random_order(gate_config(), 77);
      checked +=
          check_gate_equals_dense(d + "/m_" + image_dtype_name(dt) + "_" + std::to_string(layout) + ".nlw", spec,
                                  {"pread", "preadv", "uring", "mmap"},
                                  {"--gap off", "--gap 3 --cache-ratio 0.1", "--gap 1 --cache-window 2 --no-direct"});
    }
  }
  CHECK(checked == 72);
}

TEST_CASE("a neuron cache that holds every neuron is filled at load: no token reads, the same tokens") {
  // --cache-ratio 1 (or a --memory-budget above the whole FFN) pins every slot: each layer is read at start-up in
  // long reads, and no pass, prompt or decode, reads the flash image again. Below that, tokens read as before.
  const std::string img = dir("preload") + "/m.nlw";
  REQUIRE(check_gate_equals_dense(img, policy_spec(79, {}), {"pread", "uring"}, {"--cache-ratio 1"}) == 2);
  auto figures = [&](const std::string& extra) {
    Result r = run("--json -q generate --image " + img + " --select gate --steps 12 --prompt-tokens 3,9 " + extra);
    REQUIRE_MESSAGE(r.rc == 0, r.out);
    return nlohmann::json::parse(r.out.substr(r.out.find('{')));
  };
  const auto all = figures("--cache-ratio 1");
  CHECK(all["pinned"]["bundles"].get<uint64_t>() == 2 * 256);
  CHECK(all["pinned"]["bytes_read"].get<uint64_t>() >= 2 * 256 * 3 * 64 * 2);  // every f16 bundle (3 rows of 64)
  CHECK(all["per_token_mean"]["bytes_read"].get<double>() == 0.0);
  CHECK(all["per_token_mean"]["reads"].get<double>() == 0.0);
  const auto most = figures("--cache-ratio 0.9");
  CHECK(most["pinned"]["bundles"].get<uint64_t>() == 0);
  CHECK(most["per_token_mean"]["bytes_read"].get<double>() > 0.0);
}

TEST_CASE("generate --select gate equals dense with the manifest's cache policy (pinned hot set, admission all)") {
  // The pinned bundles are loaded at start-up and served from DRAM from the first token: wrong bytes there would
  // change the tokens.
  std::vector<ImageCachePolicy> pol(2);
  pol[0] = {CacheAdmission::kAll, {}};
  for (uint32_t s = 0; s < 256; s += 12) pol[0].pinned.push_back(s);  // 22 slots, apart
  for (uint32_t s = 100; s < 118; ++s) pol[1].pinned.push_back(s);    // 18 slots, one run
  const std::string img = dir("policy") + "/m.nlw";
  check_gate_equals_dense(img, policy_spec(78, pol), {"pread", "preadv", "uring", "mmap"},
                          {"--gap 3 --cache-ratio 0.1", "--gap off --cache-ratio 0.05 --cache-window 2",
                           "--gap 3 --cache-ratio 0.1 --cache-policy all"});
  // The hot set is really held: capacity 25 per layer holds all 22 + 18 listed slots; at 0.05 (12 bundles) the
  // first 12 of each list; with --cache-policy all nothing is pinned.
  auto pinned = [&](const std::string& extra) {
    Result r = run("--json -q generate --image " + img + " --select gate --steps 4 --prompt-tokens 3 " + extra);
    REQUIRE_MESSAGE(r.rc == 0, r.out);
    auto j = nlohmann::json::parse(r.out.substr(r.out.find('{')));
    CHECK(j["cache_policy"] == (extra.find("policy all") != std::string::npos ? "all" : "manifest"));
    return j["pinned"]["bundles"].get<uint64_t>();
  };
  CHECK(pinned("--cache-ratio 0.1") == 40);
  CHECK(pinned("--cache-ratio 0.05") == 24);
  CHECK(pinned("--cache-ratio 0.1 --cache-policy all") == 0);
  CHECK(pinned("--cache-ratio 0") == 0);
}

TEST_CASE(
    "generate --select gate equals dense with the value cache (admission value, hot slots, with and without pins)") {
  // The value cache swaps much of its content every token, and a hit can leave it in the same token: wrong or
  // dropped bytes would change the tokens.
  std::vector<ImageCachePolicy> pol(2);
  pol[0] = {CacheAdmission::kValue, {}, 0, {}};
  for (uint32_t s = 0; s < 256; s += 3) pol[0].hot.push_back(255 - s);  // a partial hotness order
  pol[1] = {CacheAdmission::kValue, {7, 8, 9}, 0, {}};                  // pins, no order
  const std::string img = dir("value") + "/m.nlw";
  check_gate_equals_dense(
      img, policy_spec(79, pol), {"pread", "uring", "mmap"},
      {"--gap 3 --cache-ratio 0.1", "--gap off --cache-ratio 0.3",
       "--gap auto --cache-ratio 0.05 --device " + std::string(NL_SOURCE_DIR) + "/configs/devices/ufs40.json",
       "--gap 3 --cache-ratio 0.1 --overlap none", "--gap 3 --cache-ratio 0.1 --prefill-block 1"});
  // The cache serves hits under the value policy (else the cases above would not test it).
  Result r =
      run("--json -q generate --image " + img + " --select gate --steps 20 --prompt-tokens 3,9 --cache-ratio 0.3");
  REQUIRE_MESSAGE(r.rc == 0, r.out);
  auto j = nlohmann::json::parse(r.out.substr(r.out.find('{')));
  CHECK(j["cache_policy"] == "manifest");
  CHECK(j["pinned"]["bundles"].get<uint64_t>() == 3);  // layer 1's pins
  MESSAGE("value cache, 30 %: " << j["totals"]["cache_hits"] << " hits of " << j["totals"]["active"] << " active");
  CHECK(j["totals"]["cache_hits"].get<uint64_t>() > 0);
}

TEST_CASE("stories260K packed as f32 reproduces the reference greedy tokens through the flash image" *
          test::needs_models({"llama2c-stories260K/stories260K.bin", "llama2c-stories260K/reference-greedy.json"})) {
  const std::string model = std::string(NL_MODELS_DIR) + "/llama2c-stories260K/stories260K.bin";
  ModelWeights w = read_llama2c(model);
  const std::string img = dir("stories") + "/stories260K.nlw";
  image_write_model(img, w, ImageSpec{});
  std::ifstream f(std::string(NL_MODELS_DIR) + "/llama2c-stories260K/reference-greedy.json");
  nlohmann::json ref = nlohmann::json::parse(f);
  std::vector<int> toks = ref["tokens"].get<std::vector<int>>();
  const size_t steps = std::min<size_t>(40, toks.size() - 1);
  std::string want = "tokens:";
  for (size_t i = 1; i <= steps; ++i) {  // (" " + to_string() trips GCC 12 -Wrestrict, a known false positive)
    want += ' ';
    want += std::to_string(toks[i]);
  }
  for (const char* io : {"pread", "uring"}) {
    Result r =
        run("generate --image " + img + " --select gate --verify --steps " + std::to_string(steps) + " --io " + io);
    CHECK_MESSAGE(r.rc == 0, r.out);
    CHECK(tokens_line(r.out) == want);
  }
}

TEST_CASE("a truncated image or a corrupt region stops nl-run with one clear line, no tokens") {
  const std::string d = dir("faults");
  ModelConfig c = test::small_config(64, 128, 2);
  ModelWeights w = test::random_weights(c, 5);
  const std::string good = d + "/good.nlw";
  ImageManifest m = image_write_model(good, w, ImageSpec{});
  const std::string img = d + "/bad.nlw";
  auto fresh = [&] {
    test::copy_file(good, img);
    test::copy_file(good + ".json", img + ".json");
  };
  fresh();
  test::truncate_to(img, m.image_bytes - 4096);
  Result r = run("generate --image " + img + " --steps 4");
  CHECK(r.rc == 3);
  CHECK(r.out.find("nl-run: error: " + img + ": truncated") == 0);
  CHECK(tokens_line(r.out).empty());
  fresh();
  test::flip_byte(img, m.ffn(1).offset + 1000);
  r = run("generate --image " + img + " --steps 4");  // gate mode reads every FFN region once at start-up
  CHECK(r.rc == 3);
  CHECK(r.out.find("checksum mismatch in region 'ffn.1'") != std::string::npos);
  CHECK(std::count(r.out.begin(), r.out.end(), '\n') == 1);
  CHECK(tokens_line(r.out).empty());
}

// Issue 56 item 12: bytes the storage changes after start-up (a faulty flash, a file rewritten under the runtime)
// gave exit 0 and other tokens. With --verify-reads every bundle read is checked against the table built at start-up
// from the checksummed regions: the first read of a changed bundle throws InputError naming the option. Every I/O
// engine and overlap mode.
TEST_CASE("--verify-reads refuses bundles that changed on the storage after start-up") {
  const std::string d = dir("verify_reads");
  ModelConfig c = test::small_config(64, 256, 2);
  c.act = FfnAct::kRelu;
  const ModelWeights w = test::random_weights(c, 21);
  const std::string img = d + "/m.nlw";
  image_write_model(img, w, ImageSpec{});
  const ImageManifest man = manifest_load(img + ".json");
  const std::string pristine = d + "/pristine.nlw";
  test::copy_file(img, pristine);
  // One byte of every bundle of layer 1 (its up row: gate rows stay in DRAM in gate mode) flipped in place.
  auto corrupt = [&]() {
    std::FILE* f = std::fopen(img.c_str(), "r+b");
    REQUIRE(f);
    for (uint32_t s = 0; s < man.n_slots(1); ++s) {
      const long at = long(man.ffn(1).offset + uint64_t(s) * man.bundle_bytes + man.bundle_part_bytes() +
                           3);  // a float32 exponent byte
      REQUIRE(std::fseek(f, at, SEEK_SET) == 0);
      const int b = std::fgetc(f);
      REQUIRE(std::fseek(f, at, SEEK_SET) == 0);
      std::fputc(b ^ 0x40, f);
    }
    REQUIRE(std::fclose(f) == 0);
  };
  // Tokens of 6 greedy steps; the image is corrupted once the runtime has started (FlashFfn built).
  auto run = [&](IoKind k, OverlapMode ov, bool verify, bool damage) {
    test::copy_file(pristine, img);
    IoOptions io;
    io.kind = k;
    FlashImage fi(img, io);
    ModelWeights dw = fi.load_dense();
    FlashFfnOptions fo;
    fo.overlap = ov;
    fo.verify_reads = verify;
    FlashFfn ffn(fi, fo);
    if (damage) corrupt();
    Model model(dw, 12);
    model.set_ffn(&ffn);
    return argmax_tokens(model, 6);
  };
  const std::vector<int> ref = run(IoKind::kPread, OverlapMode::kNone, false, false);
  for (IoKind k : {IoKind::kPread, IoKind::kPreadv, IoKind::kUring}) {
    if (k == IoKind::kUring && !io_uring_available()) continue;
    for (OverlapMode ov : {OverlapMode::kNone, OverlapMode::kLayer, OverlapMode::kCross, OverlapMode::kBoth}) {
      INFO("engine " << io_kind_name(k) << ", overlap " << overlap_mode_name(ov));
      CHECK(run(k, ov, true, false) == ref);  // nothing changed: the same tokens with the checks on
      try {
        run(k, ov, true, true);
        FAIL("a changed bundle was not refused");
      } catch (const InputError& e) {
        CHECK(std::string(e.what()).find("--verify-reads") != std::string::npos);
        CHECK(std::string(e.what()).find("layer 1") != std::string::npos);
      }
    }
  }
  // Without the checks the same damage goes unnoticed (what the option is for): other tokens, no error.
  CHECK(run(IoKind::kPread, OverlapMode::kNone, false, true) != ref);
}

TEST_CASE("short reads are resumed and EIO mid-generation throws before any token is produced from bad data") {
  const std::string d = dir("inject");
  ModelConfig c = test::small_config(64, 256, 2);
  ModelWeights w = test::random_weights(c, 8);
  const std::string img = d + "/m.nlw";
  image_write_model(img, w, ImageSpec{});
  struct Fault : IoFaults {
    int64_t at;
    bool eio;
    int64_t filter(uint64_t call, uint64_t, uint64_t, int64_t res) override {
      if (int64_t(call) != at || res <= 0) return res;
      return eio ? -EIO : res / 2;
    }
  };
  auto tokens_with = [&](IoKind k, Fault* f) {
    IoOptions io;
    io.kind = k;
    io.faults = f;
    FlashImage fi(img, io);
    ModelWeights dw = fi.load_dense();
    FlashFfn ffn(fi, FlashFfnOptions{});
    Model model(dw, 12);
    model.set_ffn(&ffn);
    return argmax_tokens(model, 10);
  };
  for (IoKind k : {IoKind::kPread, IoKind::kPreadv, IoKind::kUring}) {
    const std::vector<int> clean = tokens_with(k, nullptr);
    Fault shortf;
    shortf.at = 40;  // well after start-up: during generation
    shortf.eio = false;
    CHECK(tokens_with(k, &shortf) == clean);
    Fault eio;
    eio.at = 40;
    eio.eio = true;
    CHECK_THROWS_AS(tokens_with(k, &eio), IoError);
  }
}

TEST_CASE("generate: the same tokens for 1, 2 and 4 threads, gate and dense, every dtype (batched prefill)") {
  // dim 256 and 1024 neurons: the matrix products, the up dots and the down projection run on several threads
  // (above the work threshold); a ReLU model (sparse) and a SiLU model (every neuron).
  const std::string d = dir("threads");
  ModelConfig c = test::small_config(256, 1024, 2);
  c.vocab_size = 96;
  c.seq_len = 48;
  int checked = 0;
  for (FfnAct act : {FfnAct::kRelu, FfnAct::kSilu})
    for (ImageDtype dt :
         {ImageDtype::kF32, ImageDtype::kF16, ImageDtype::kBF16, ImageDtype::kQ8_0, ImageDtype::kQ4_0}) {
      c.act = act;
      const ModelWeights w = test::random_weights(c, 33);
      ImageSpec spec;
      spec.dtype = dt;
      spec.order = test::random_order(c, 5);
      const std::string img = d + "/m_" + std::string(ffn_act_name(act)) + "_" + image_dtype_name(dt) + ".nlw";
      image_write_model(img, w, spec);
      const std::string args = " generate --image " + img + " --steps 16 --prompt-tokens 3,9,17,40,2,77,5,11,60 ";
      // -q: a slow run's progress line (stderr, merged here) must not split the tokens line.
      Result ref = run("-q --threads 1" + args + "--select dense");
      REQUIRE_MESSAGE(ref.rc == 0, ref.out);
      const std::string want = tokens_line(ref.out);
      REQUIRE(want.size() > 16);
      for (std::string threads : {"1", "2", "4"})
        for (std::string sel : {"dense", "gate"}) {
          CAPTURE(img);
          CAPTURE(threads);
          CAPTURE(sel);
          Result r = run("-q --threads " + threads + args + "--select " + sel + " --cache-ratio 0.1 --gap 2");
          CHECK_MESSAGE(r.rc == 0, r.out);
          CHECK(tokens_line(r.out) == want);
          ++checked;
        }
    }
  CHECK(checked == 60);
}

TEST_CASE("batched prefill then decode = token-by-token decode, bitwise (typed dense weights, sparse FFN)") {
  const std::string d = dir("prefill");
  ModelConfig c = test::small_config(64, 256, 2);
  c.vocab_size = 64;
  c.seq_len = 40;
  ModelWeights w = test::random_weights(c, 9);
  for (ImageDtype dt : {ImageDtype::kF32, ImageDtype::kF16, ImageDtype::kBF16, ImageDtype::kQ8_0, ImageDtype::kQ4_0}) {
    CAPTURE(image_dtype_name(dt));
    ImageSpec spec;
    spec.dtype = dt;
    const std::string img = d + "/m_" + std::string(image_dtype_name(dt)) + ".nlw";
    image_write_model(img, w, spec);
    const std::vector<int> prompt = {1, 7, 33, 2, 9, 61, 4};
    for (SelectMode sel : {SelectMode::kGate, SelectMode::kDense}) {
      auto logits_after = [&](bool batched) {
        FlashImage fi(img, IoOptions{});
        auto dense = fi.load_dense_store();
        FlashFfnOptions fo;
        fo.select = sel;
        FlashFfn ffn(fi, fo);
        Model model(dense->view, 16);
        model.set_ffn(&ffn);
        const int n = int(prompt.size());
        if (batched) {
          model.forward_sequence(prompt.data(), n - 1, 0, nullptr);
        } else {
          for (int p = 0; p + 1 < n; ++p) model.forward_token(prompt[size_t(p)], p);
        }
        return greedy_logits(prompt.back(), n - 1, n + 4, c.vocab_size,
                             [&](int t, int p) { return model.forward_token(t, p); });
      };
      check_same_bits(logits_after(true), logits_after(false));
    }
  }
}

TEST_CASE("a prompt block reads the union of its tokens' active sets once per layer: token-by-token logits, bitwise") {
  // gate, threshold and trace selections, with and without the cache, staging of 4 MiB (one batch) and of a few
  // bundles (many batches, each token's sums continued across them); SiLU under trace (gates from the bundles).
  const std::string d = dir("block");
  for (FfnAct act : {FfnAct::kRelu, FfnAct::kSilu})
    for (ImageDtype dt : {ImageDtype::kF32, ImageDtype::kF16, ImageDtype::kQ8_0}) {
      ModelConfig c = test::small_config(64, 256, 2);
      c.vocab_size = 64;
      c.seq_len = 40;
      c.act = act;
      const ModelWeights w = test::random_weights(c, 41);
      ImageSpec spec;
      spec.dtype = dt;
      spec.order = test::random_order(c, 8);
      const std::string img = d + "/m_" + std::string(ffn_act_name(act)) + "_" + image_dtype_name(dt) + ".nlw";
      image_write_model(img, w, spec);
      const std::vector<int> prompt = {1, 7, 33, 2, 9, 61, 4, 12, 50};
      const int n = int(prompt.size());
      // Trace sets: per forward pass and layer, a random half of the neurons (seeded).
      std::mt19937_64 rng(5);
      std::vector<std::vector<std::vector<uint32_t>>> sets(size_t(n + 4), std::vector<std::vector<uint32_t>>(2));
      for (auto& f : sets)
        for (auto& l : f)
          for (uint32_t k = 0; k < uint32_t(c.hidden_dim); ++k)
            if (rng() % 2) l.push_back(k);
      std::vector<SelectMode> sels = {SelectMode::kTrace};
      if (act == FfnAct::kRelu) sels = {SelectMode::kGate, SelectMode::kThreshold, SelectMode::kTrace};
      for (SelectMode sel : sels)
        for (int variant = 0; variant < 3; ++variant) {
          CAPTURE(img);
          CAPTURE(int(sel));
          CAPTURE(variant);
          uint64_t bytes[2] = {0, 0}, reads[2] = {0, 0};
          auto logits_after = [&](bool batched) {
            FlashImage fi(img, IoOptions{});
            auto dense = fi.load_dense_store();
            FlashFfnOptions fo;
            fo.select = sel;
            if (sel == SelectMode::kThreshold) fo.act_threshold = {0.05f, 0.02f};
            if (variant >= 1) fo.cache_ratio = 0.1, fo.gap = {GapMode::Fixed, 2};
            if (variant == 2) fo.read_batch_bytes = 3 * fi.manifest().bundle_bytes;
            FlashFfn ffn(fi, fo);
            Model model(dense->view, 16);
            model.set_ffn(&ffn);
            auto feed = [&](int forward, int token) {
              if (sel == SelectMode::kTrace)
                for (int l = 0; l < 2; ++l) ffn.set_trace_active(l, sets[size_t(forward)][size_t(l)], token);
            };
            if (batched) {
              for (int p = 0; p + 1 < n; ++p) feed(p, p);
              model.forward_sequence(prompt.data(), n - 1, 0, nullptr);
              ffn.end_token();
            } else {
              for (int p = 0; p + 1 < n; ++p) {
                feed(p, 0);
                model.forward_token(prompt[size_t(p)], p);
                ffn.end_token();
              }
            }
            bytes[batched] = ffn.totals().bytes_read;
            reads[batched] = ffn.totals().reads;
            REQUIRE(ffn.per_token().size() == size_t(n - 1));
            return greedy_logits(prompt.back(), n - 1, n + 3, c.vocab_size, [&](int t, int p) {
              feed(p, 0);
              const float* lg = model.forward_token(t, p);
              ffn.end_token();
              return lg;
            });
          };
          check_same_bits(logits_after(true), logits_after(false));
          // The block read each needed bundle once: fewer reads and bytes than its tokens one by one.
          if (variant == 0) {
            CHECK(bytes[1] < bytes[0]);
            CHECK(reads[1] < reads[0]);
          }
        }
    }
}
