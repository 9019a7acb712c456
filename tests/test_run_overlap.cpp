// nl-run generate --overlap (layer / cross / both): the tokens equal the non-overlapped run's for every dtype,
// activation, engine and thread count (random models, the bundled tiny ReLU model with gate, lowrank and trace
// selection, stories260K where present); with io_uring the within-layer path computes bundles while other reads of
// the layer are still in the kernel's hands; the read-ahead figures are consistent. No timing is checked here.
#include <doctest/doctest.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <random>
#include <string>

#include "cli_test_util.h"
#include "formats/core/image_writer.h"
#include "formats/llama2c.h"
#include "formats/trace.h"
#include "image_test_util.h"
#include "runtime/io/engine.h"
#include "skip_util.h"

using namespace nl;
using json = nlohmann::json;

namespace {

const std::string kTiny = std::string(NL_SOURCE_DIR) + "/datasets/tiny-relu/model";

using test::Result;

Result run(const std::string& bin, const std::string& args) { return test::run_tool(bin, args, test::Stderr::kDrop); }

// nl-run -q --json [--threads T] generate ARGS.
json gen(const std::string& args, int threads = 1) {
  Result r = run("nl-run", "-q --json --threads " + std::to_string(threads) + " generate " + args);
  INFO(args);
  REQUIRE(r.rc == 0);
  return json::parse(r.out);
}

std::string dir(const std::string& n) {
  std::string d = "overlap_test_" + n;
  ::mkdir(d.c_str(), 0755);
  return d;
}

const char* const kModes[] = {"none", "layer", "cross", "both"};

// The read-ahead and overlap figures hang together.
void check_figures(const json& j, const std::string& mode) {
  const json& o = j["overlap"];
  CHECK(o["mode"] == mode);
  CHECK(o["predicted_and_needed_bundles"].get<uint64_t>() <= o["predicted_bundles"].get<uint64_t>());
  CHECK(o["predicted_and_needed_bundles"].get<uint64_t>() <= o["needed_bundles"].get<uint64_t>());
  CHECK(o["prefetch_used_bytes"].get<uint64_t>() <= o["prefetch_bytes"].get<uint64_t>());
  // Exact-read pieces read ahead whole are computed where they landed (FlashFfn::Piece::ahead), the others copied.
  const uint64_t in_place = o["pieces_in_place"].get<uint64_t>(), copied = o["pieces_copied"].get<uint64_t>();
  CHECK(o["io_wait_seconds"].get<double>() <= o["io_busy_seconds"].get<double>() + 1e-9);
  CHECK(o["bundles_computed_in_flight"].get<uint64_t>() <= o["bundles_computed"].get<uint64_t>());
  const bool cross = mode == "cross" || mode == "both", layer = mode == "layer" || mode == "both";
  CHECK((o["prefetches"].get<uint64_t>() > 0) == cross);
  // Whole or in part (tiny bundles share blocks, so an exact piece may straddle read-ahead spans).
  if (cross && o["prefetch_used_bytes"].get<uint64_t>() > 0) CHECK(in_place + copied > 0);
  if (!cross) CHECK(in_place + copied == 0);
  CHECK((o["bundles_computed"].get<uint64_t>() > 0) == layer);
  CHECK((o["layer_tokens"].get<uint64_t>() > 0) == (mode != "none"));
}

// A random model of shape c with activation act, written at dtype dt with a random layout into d.
std::string random_image(const std::string& d, ModelConfig c, FfnAct act, ImageDtype dt, uint64_t wseed,
                         uint64_t oseed) {
  c.act = act;
  const ModelWeights w = test::random_weights(c, wseed);
  ImageSpec spec;
  spec.dtype = dt;
  spec.order = test::random_order(c, oseed);
  const std::string img = d + "/m_" + std::string(ffn_act_name(act)) + "_" + image_dtype_name(dt) + ".nlw";
  image_write_model(img, w, spec);
  return img;
}

// Runs `args + extra` at 1 and 2 threads, pread and uring, every overlap mode, and checks each against the
// non-overlapped reference `ref`: the same tokens, the same needed bytes and cache hits (the cache sees the same
// tokens), consistent figures; `more(j, mode)` adds the caller's checks. Returns the number of runs.
template <class More>
int check_every_variant(const std::string& args, const std::string& extra, const json& ref, More&& more) {
  int runs = 0;
  for (int threads : {1, 2})
    for (const char* io : {"pread", "uring"})
      for (const char* mode : kModes) {
        CAPTURE(args);
        CAPTURE(threads);
        CAPTURE(io);
        CAPTURE(mode);
        const json j = gen(args + extra + "--io " + io + " --overlap " + mode, threads);
        CHECK(j["generated"] == ref["generated"]);
        CHECK(j["totals"]["bytes_needed"] == ref["totals"]["bytes_needed"]);
        CHECK(j["totals"]["cache_hits"] == ref["totals"]["cache_hits"]);
        check_figures(j, mode);
        more(j, std::string(mode));
        ++runs;
      }
  return runs;
}

}  // namespace

TEST_CASE("--overlap: the same tokens as without, every dtype, ReLU and SiLU, pread and uring, 1 and 2 threads") {
  const std::string d = dir("random");
  ModelConfig c = test::small_config(256, 1024, 2);
  c.vocab_size = 96;
  c.seq_len = 48;
  int checked = 0;
  for (FfnAct act : {FfnAct::kRelu, FfnAct::kSilu})
    for (ImageDtype dt : {ImageDtype::kF32, ImageDtype::kF16, ImageDtype::kQ8_0}) {
      const std::string img = random_image(d, c, act, dt, 41, 6);
      const std::string args = "--image " + img + " --steps 12 --prompt-tokens 3,9,17,40 --cache-ratio 0.1 --gap 2 ";
      const json ref = gen(args + "--overlap none");
      REQUIRE(ref["generated"].size() == 12);
      checked += check_every_variant(args, "", ref, [](const json&, const std::string&) {});
    }
  CHECK(checked == 96);
}

TEST_CASE("bounded read staging: the smallest --read-batch and --read-ahead give the same tokens, every mode") {
  // --read-batch 1 stages one bundle's blocks at a time: long reads are split at bundle boundaries, every layer is
  // read, computed and released in many batches, and the read-ahead holds only its first pieces.
  const std::string d = dir("batch");
  ModelConfig c = test::small_config(256, 1024, 2);
  c.vocab_size = 96;
  c.seq_len = 48;
  int checked = 0;
  // Two images keep the run short: ReLU at q8_0 (sparse layers, cache hits) and SiLU at f32 (whole layers read).
  for (auto [act, dt] : {std::pair{FfnAct::kRelu, ImageDtype::kQ8_0}, std::pair{FfnAct::kSilu, ImageDtype::kF32}}) {
    const std::string img = random_image(d, c, act, dt, 43, 7);
    const std::string args = "--image " + img + " --steps 10 --prompt-tokens 3,9,17 --cache-ratio 0.2 --gap 3 ";
    const json ref = gen(args + "--overlap none");
    REQUIRE(ref["generated"].size() == 10);
    const bool silu = act == FfnAct::kSilu;
    checked += check_every_variant(
        args, "--read-batch 1 --read-ahead 20KiB ", ref, [&](const json& j, const std::string& mode) {
          // Split reads: more of them than the planner's (SiLU reads whole layers), never fewer.
          CHECK(j["totals"]["reads"].get<uint64_t>() >= ref["totals"]["reads"].get<uint64_t>());
          if (silu && mode == "none")
            CHECK(j["totals"]["reads"].get<uint64_t>() > ref["totals"]["reads"].get<uint64_t>());
        });
  }
  CHECK(checked == 32);
}

TEST_CASE("--overlap on the bundled tiny ReLU model: gate, lowrank and trace selection, f32 and q8_0") {
  const std::string d = dir("tiny");
  for (const char* dt : {"f32", "q8_0"}) {
    const std::string img = d + "/tiny_" + dt + ".nlw";
    REQUIRE(run("nl-layout", "-q pack --model " + kTiny + " --dtype " + dt + " --out " + img).rc == 0);
    const std::string base = "--image " + img + " --prompt-tokens 1,100,200 --steps 24 --cache-ratio 0.05 ";
    for (std::string sel : {"gate", "lowrank:16"}) {
      const json ref = gen(base + "--select " + sel);
      for (int threads : {1, 2})
        for (const char* mode : kModes) {
          CAPTURE(dt);
          CAPTURE(sel);
          CAPTURE(threads);
          CAPTURE(mode);
          const json j = gen(base + "--select " + sel + " --io uring --overlap " + mode, threads);
          CHECK(j["generated"] == ref["generated"]);
          check_figures(j, mode);
          if (std::string(mode) == "cross" && sel == "gate") {
            // ReLU sparsity: the previous token's set predicts part of the next one, not all of it.
            CHECK(j["overlap"]["predicted_and_needed_bundles"].get<uint64_t>() > 0);
            CHECK(j["overlap"]["pieces_in_place"].get<uint64_t>() > 0);  // computed where the read-ahead landed
            CHECK(j["overlap"]["late_bytes"].get<uint64_t>() > 0);
          }
        }
    }
    // Trace selection (the 7B benchmark's path): random per-token masks, read and computed for real.
    TraceWriterOptions o;
    o.model = "random";
    o.activation = "synthetic:random-masks";
    const json ref = gen(base);
    const uint32_t layers = 4, neurons = 512;
    o.n_neurons.assign(layers, neurons);
    std::mt19937_64 rng(5);
    std::vector<LayerMask> masks;
    for (uint32_t l = 0; l < layers; ++l) {
      LayerMask mk(neurons, 40);
      for (uint32_t k = 0; k < neurons; ++k)
        for (uint64_t x = 0; x < 40; ++x)
          if (rng() % 5 == 0) mk.set(k, x);
      masks.push_back(std::move(mk));
    }
    const std::string trace = d + "/random.h5";
    trace_write(trace, o, masks, {0});
    const json tref = gen(base + "--select trace:" + trace);
    for (const char* mode : kModes) {
      CAPTURE(dt);
      CAPTURE(mode);
      const json j = gen(base + "--select trace:" + trace + " --io uring --overlap " + mode, 2);
      CHECK(j["generated"] == tref["generated"]);
      CHECK(j["totals"]["bytes_needed"] == tref["totals"]["bytes_needed"]);
      check_figures(j, mode);
    }
  }
}

TEST_CASE("--overlap layer with io_uring computes bundles while the layer's other reads are in flight" *
          test::skip_unless(io_uring_available(), "io_uring unavailable in this kernel or build")) {
  const std::string d = dir("inflight");
  const std::string img = d + "/tiny.nlw";
  REQUIRE(run("nl-layout", "-q pack --model " + kTiny + " --dtype f32 --out " + img).rc == 0);
  // Queue depth 1: after each completion the engine hands the next read to the kernel before returning, so every
  // bundle computed before a layer's last completion was computed with a read in flight, whatever the disk's speed.
  const json j = gen("--image " + img +
                     " --prompt-tokens 1,100,200 --steps 16 --io uring --queue-depth 1 "
                     "--overlap layer");
  CHECK(j["overlap"]["engine_async"] == true);
  const uint64_t computed = j["overlap"]["bundles_computed"].get<uint64_t>();
  const uint64_t in_flight = j["overlap"]["bundles_computed_in_flight"].get<uint64_t>();
  MESSAGE("bundles computed " << computed << ", of them with a read in flight " << in_flight << ", reads "
                              << j["totals"]["reads"]);
  CHECK(computed > 0);
  CHECK(in_flight > 0);
  CHECK(in_flight < computed);  // each layer's last read: computed after the last completion
  // A synchronous engine computes the same bundles with nothing in flight.
  const json p = gen("--image " + img + " --prompt-tokens 1,100,200 --steps 16 --io pread --overlap layer");
  CHECK(p["overlap"]["engine_async"] == false);
  CHECK(p["overlap"]["bundles_computed"] == computed);
  CHECK(p["overlap"]["bundles_computed_in_flight"] == 0);
  CHECK(p["generated"] == j["generated"]);
  // The default staging is cut to a layer's FFN region (memory.h ffn_staging): a layer-token's reads fit one batch
  // unless their block padding overflows it.
  const uint64_t batches_default = j["overlap"]["batches"].get<uint64_t>();
  const uint64_t ahead_default = j["overlap"]["batches_read_ahead"].get<uint64_t>();
  CHECK(batches_default > 0);
  CHECK(ahead_default * 4 < batches_default);
  // Many batches per layer-token: each batch after a layer-token's first is read into the second buffer while the
  // one before it is read and computed, with the same tokens.
  const json b =
      gen("--image " + img + " --prompt-tokens 1,100,200 --steps 16 --io uring --overlap layer --read-batch 1");
  const uint64_t batches = b["overlap"]["batches"].get<uint64_t>();
  const uint64_t ahead = b["overlap"]["batches_read_ahead"].get<uint64_t>();
  MESSAGE("--read-batch 1: batches " << batches << ", read ahead " << ahead);
  CHECK(ahead > 0);
  CHECK(ahead < batches);  // every layer-token's first batch has no batch before it
  CHECK(ahead > ahead_default);
  CHECK(b["generated"] == j["generated"]);
}

TEST_CASE("--overlap on stories260K: the same tokens as without, f32 and q8_0, 1 and 2 threads" *
          test::needs_models({"llama2c-stories260K/stories260K.bin"})) {
  const std::string d = dir("stories");
  const std::string model = std::string(NL_MODELS_DIR) + "/llama2c-stories260K/stories260K.bin";
  for (const char* dt : {"f32", "q8_0"}) {
    const std::string img = d + "/s_" + dt + ".nlw";
    REQUIRE(run("nl-layout", "-q pack --model " + model + " --dtype " + dt + " --out " + img).rc == 0);
    const std::string base = "--image " + img + " --prompt-tokens 1 --steps 32 --ignore-eos --cache-ratio 0.1 ";
    const json ref = gen(base);
    REQUIRE(ref["generated"].size() == 32);
    for (int threads : {1, 2})
      for (const char* mode : kModes) {
        CAPTURE(dt);
        CAPTURE(threads);
        CAPTURE(mode);
        const json j = gen(base + "--io uring --overlap " + mode, threads);
        CHECK(j["generated"] == ref["generated"]);
        check_figures(j, mode);
      }
  }
}
