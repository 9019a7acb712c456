// Flash replication in the runtime (image format 1.2): an image whose FFN regions hold some neurons twice computes the
// FFN bit for bit as the image of the same layout without its replicas (the down projection sums in first-copy order
// whichever copy was read), for gate and trace selection, every stored dtype, with and without the cache, with read
// batches small enough that a second copy lands after neurons summed before it, and with --overlap layer; the reads
// really do use second copies; the manifest's replica map is checked at open.
#include <doctest/doctest.h>

#include <cstring>
#include <random>

#include "formats/core/error.h"
#include "formats/core/image.h"
#include "formats/core/image_writer.h"
#include "image_test_util.h"
#include "runtime/flash_ffn.h"
#include "runtime/flash_image.h"
#include "runtime/plan/replica_cover.h"

using namespace nl;

namespace {

// Each layer's order with a copy of every 5th neuron inserted at a pseudo-random place (far from the first copy, so
// the cover picks either copy depending on the token's other neurons).
std::vector<std::vector<uint32_t>> replicated_order(const std::vector<std::vector<uint32_t>>& base) {
  std::vector<std::vector<uint32_t>> out;
  for (const auto& o : base) {
    const size_t n = o.size();
    std::vector<std::vector<uint32_t>> after(n);
    for (size_t i = 0; i < n; i += 5) {
      const size_t t = (i * 7919 + 13) % n;
      if (o[t] != o[i]) after[t].push_back(o[i]);
    }
    std::vector<uint32_t> r;
    for (size_t s = 0; s < n; ++s) {
      r.push_back(o[s]);
      for (uint32_t v : after[s]) r.push_back(v);
    }
    out.push_back(std::move(r));
  }
  return out;
}

IoOptions buffered() {
  IoOptions io;
  io.direct = false;  // test files may sit on a file system without O_DIRECT
  return io;
}

struct Run {
  std::vector<float> out;  // every layer-token's FFN output, concatenated
  FlashCounters totals;
};

Run run_ffn(const std::string& img_path, const FlashFfnOptions& o, const ModelConfig& c, int tokens, uint64_t seed) {
  FlashImage img(img_path, buffered());
  FlashFfn ffn(img, o);
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  Run r;
  std::vector<float> x(size_t(c.dim)), y(size_t(c.dim));
  for (int t = 0; t < tokens; ++t) {
    for (int l = 0; l < c.n_layers; ++l) {
      for (float& v : x) v = nd(rng);
      if (o.select == SelectMode::kTrace) {
        std::vector<uint32_t> act;
        for (uint32_t v = 0; v < uint32_t(c.hidden_dim); ++v)
          if (rng() % 3 == 0) act.push_back(v);
        ffn.set_trace_active(l, act);
      }
      ffn.ffn(l, t, 1, x.data(), y.data(), nullptr);
      r.out.insert(r.out.end(), y.begin(), y.end());
    }
    ffn.end_token();
  }
  r.totals = ffn.totals();
  return r;
}

}  // namespace

TEST_CASE("a replicated image computes the FFN bit for bit as the same layout without replicas") {
  const ModelConfig c = test::small_config(64, 256, 2);
  const ModelWeights w = test::random_weights(c, 5);
  const auto rep = replicated_order(test::random_order(c, 9));
  std::vector<std::vector<uint32_t>> prim;
  for (const auto& o : rep) prim.push_back(primary_order(o, uint32_t(c.hidden_dim)));
  int cases = 0;
  for (ImageDtype dt : {ImageDtype::kF32, ImageDtype::kF16, ImageDtype::kQ8_0}) {
    ImageSpec sp;
    sp.dtype = dt;
    sp.order = rep;
    const std::string a = std::string("rrep_") + image_dtype_name(dt) + ".nlw";
    const std::string b = std::string("rprim_") + image_dtype_name(dt) + ".nlw";
    const ImageManifest mr = image_write_model(a, w, sp);
    sp.order = prim;
    const ImageManifest mp = image_write_model(b, w, sp);
    REQUIRE(mr.replicated());
    CHECK(mr.version_minor == kImageVersionMinorReplicas);
    CHECK(!mp.replicated());
    CHECK(mp.version_minor == kImageVersionMinor);  // unreplicated images keep format 1.1
    CHECK(mr.replicas[0] == rep[0].size() - 256);
    CHECK(mr.ffn(0).bytes == rep[0].size() * mr.bundle_bytes);
    // A copy's bundle is its first copy's bytes.
    {
      FlashImage fi(a, buffered());
      AlignedBuffer buf;
      fi.read_region(1, &buf);
      const ReplicaMap rm = ReplicaMap::from_order(rep[0], 256);
      for (uint32_t v = 0; v < 256; ++v)
        if (rm.second[v] != kNoSlot)
          CHECK(std::memcmp(buf.data() + rm.first[v] * mr.bundle_bytes, buf.data() + rm.second[v] * mr.bundle_bytes,
                            mr.bundle_bytes) == 0);
    }
    for (SelectMode sel : {SelectMode::kGate, SelectMode::kTrace}) {
      for (int variant = 0; variant < 4; ++variant) {
        FlashFfnOptions o;
        o.select = sel;
        o.gap = variant == 0 ? GapPolicy{GapMode::Off, 0} : GapPolicy{GapMode::Fixed, 3};
        o.cost = {60.0, 2000.0};
        o.cache_ratio = variant >= 2 ? 0.1 : 0.0;
        // Two bundles' worth of staging plus the alignment: every layer-token reads in many batches, so second copies
        // land after neurons that sum before them.
        if (variant == 1 || variant == 3) o.read_batch_bytes = 2 * mr.bundle_bytes + 2 * 4096;
        o.overlap = variant == 3 ? OverlapMode::kLayer : OverlapMode::kNone;
        CAPTURE(image_dtype_name(dt));
        CAPTURE(int(sel));
        CAPTURE(variant);
        const Run rr = run_ffn(a, o, c, 12, 77), rp = run_ffn(b, o, c, 12, 77);
        REQUIRE(rr.out.size() == rp.out.size());
        CHECK(std::memcmp(rr.out.data(), rp.out.data(), rr.out.size() * sizeof(float)) == 0);
        CHECK(rr.totals.active == rp.totals.active);
        CHECK(rr.totals.replica_reads > 0);  // the case this test exists for
        CHECK(rp.totals.replica_reads == 0);
        ++cases;
      }
    }
  }
  CHECK(cases == 24);
}

TEST_CASE("dense, lowrank and cross overlap refuse replicated images with a usage error") {
  const ModelConfig c = test::small_config(64, 96, 2);
  const ModelWeights w = test::random_weights(c, 6);
  ImageSpec sp;
  sp.order = replicated_order(test::random_order(c, 2));
  image_write_model("rrefuse.nlw", w, sp);
  FlashImage img("rrefuse.nlw", buffered());
  FlashFfnOptions o;
  o.select = SelectMode::kDense;
  CHECK_THROWS_AS(FlashFfn(img, o), UsageError);
  o.select = SelectMode::kLowRank;
  o.lowrank_rank = 4;
  CHECK_THROWS_AS(FlashFfn(img, o), UsageError);
  o.select = SelectMode::kGate;
  o.overlap = OverlapMode::kCross;
  CHECK_THROWS_AS(FlashFfn(img, o), UsageError);
  o.overlap = OverlapMode::kLayer;
  CHECK_NOTHROW(FlashFfn(img, o));
}

TEST_CASE("the image writer refuses an order with a neuron three times or one left out") {
  const ModelConfig c = test::small_config(64, 96, 2);
  const ModelWeights w = test::random_weights(c, 6);
  ImageSpec sp;
  sp.order.assign(2, {});
  for (auto& o : sp.order) {
    for (uint32_t v = 0; v < 96; ++v) o.push_back(v);
    o.push_back(0);
    o.push_back(1);  // neurons 0 and 1 twice: valid
  }
  auto bad = sp;
  bad.order[1].push_back(0);  // neuron 0 three times
  CHECK_THROWS_AS(image_write_model("rbad.nlw", w, bad), UsageError);
  bad = sp;
  bad.order[0][5] = 2;  // neuron 5 left out, 2 twice: the length still fits
  CHECK_THROWS_AS(image_write_model("rbad.nlw", w, bad), UsageError);
  CHECK(image_write_model("rbad.nlw", w, sp).replicas == std::vector<uint32_t>{2, 2});
}
