// Flash image + manifest: dtype conversion against reference conversions, bundle round trip for every dtype and
// bundle kind, byte-identical output, and one clear error per kind of malformed manifest or image.
#include <doctest/doctest.h>
#include <sys/stat.h>

#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>

#include "formats/core/error.h"
#include "formats/core/half.h"
#include "formats/core/image.h"
#include "formats/core/image_writer.h"
#include "image_test_util.h"
#include "runtime/flash_image.h"

using namespace nl;
using nlohmann::json;

namespace {

// Reference bf16 rounding, computed independently: pick the nearer of the two bf16 neighbours in double
// arithmetic, ties to the even one. The largest finite bf16's upper neighbour is infinity, valued 2^128 by IEEE.
uint16_t ref_bf16(float f) {
  uint32_t u = f32_to_bits(f);
  if (std::isnan(f)) return 0;  // not compared
  const uint32_t sign = u & 0x80000000u, a = u & 0x7fffffffu;
  const uint32_t lo = a & 0xffff0000u, hi = lo + 0x10000u;
  if (a == lo) return uint16_t((sign | lo) >> 16);
  auto val = [](uint32_t bits) { return bits >= 0x7f800000u ? std::ldexp(1.0, 128) : double(bits_to_f32(bits)); };
  const double x = double(bits_to_f32(a)), dl = x - val(lo), dh = val(hi) - x;
  uint32_t pick = dl < dh ? lo : dh < dl ? hi : (((lo >> 16) & 1u) ? hi : lo);
  return uint16_t((sign | pick) >> 16);
}

#if defined(__FLT16_MAX__)
uint16_t ref_f16(float f) {
  _Float16 h = static_cast<_Float16>(f);  // the compiler's IEEE conversion (round to nearest even)
  uint16_t b;
  std::memcpy(&b, &h, 2);
  return b;
}
float ref_f16_to_f32(uint16_t b) {
  _Float16 h;
  std::memcpy(&h, &b, 2);
  return static_cast<float>(h);
}
#endif

float reference_round(ImageDtype d, float x) {
  switch (d) {
    case ImageDtype::kF32:
      return x;
    case ImageDtype::kQ8_0:
    case ImageDtype::kQ4_0:
      break;  // block formats: tests/test_runtime_quant.cpp
    case ImageDtype::kBF16:
      return bf16_to_f32(ref_bf16(x));
    case ImageDtype::kF16:
#if defined(__FLT16_MAX__)
      return ref_f16_to_f32(ref_f16(x));
#else
      return f16_to_f32(f32_to_f16(x));
#endif
  }
  return x;
}

bool same_bits(float a, float b) { return f32_to_bits(a) == f32_to_bits(b); }

std::string tmpdir(const std::string& name) {
  std::string d = "image_test_" + name;
  ::mkdir(d.c_str(), 0755);
  return d;
}

}  // namespace

TEST_CASE("bf16 conversion rounds to nearest even, as the independent reference does") {
  std::mt19937_64 rng(7);
  uint64_t checked = 0;
  for (uint32_t top = 0; top < 0x10000u; ++top) {
    const uint32_t lows[] = {0u, 1u, 0x7fffu, 0x8000u, 0x8001u, 0xffffu, uint32_t(rng() & 0xffffu)};
    for (uint32_t low : lows) {
      const float f = bits_to_f32((top << 16) | low);
      if (std::isnan(f)) {
        CHECK(std::isnan(bf16_to_f32(f32_to_bf16(f))));
        continue;
      }
      if (f32_to_bf16(f) != ref_bf16(f)) {
        FAIL_CHECK("bf16 of bits " << std::hex << ((top << 16) | low) << ": " << f32_to_bf16(f) << " vs "
                                   << ref_bf16(f));
        return;
      }
      ++checked;
    }
  }
  CHECK(checked > 400000);
  for (uint32_t h = 0; h < 0x10000u; ++h) CHECK_EQ(f32_to_bits(bf16_to_f32(uint16_t(h))), uint32_t(h) << 16);
}

#if defined(__FLT16_MAX__)
TEST_CASE("f16 conversion matches the compiler's IEEE binary16 conversion") {
  // Every half value decodes exactly.
  for (uint32_t h = 0; h < 0x10000u; ++h) {
    const float a = f16_to_f32(uint16_t(h)), b = ref_f16_to_f32(uint16_t(h));
    if (std::isnan(b))
      CHECK(std::isnan(a));
    else if (!same_bits(a, b))
      FAIL_CHECK("f16 decode of " << h);
  }
  // Around every half value: itself, the midpoints to its neighbours and one f32 ulp either side (ties, carries,
  // subnormals, overflow), then random bit patterns.
  uint64_t bad = 0;
  auto check = [&](float f) {
    if (std::isnan(f)) return;
    if (f32_to_f16(f) != ref_f16(f) && ++bad < 5) FAIL_CHECK("f16 of " << f << " bits " << std::hex << f32_to_bits(f));
  };
  for (uint32_t h = 0; h < 0x7c00u; ++h) {
    const double v = ref_f16_to_f32(uint16_t(h)), up = ref_f16_to_f32(uint16_t(h + 1));
    const float mid = float((v + up) / 2);  // exact in f32: halves have 11 significant bits
    for (float f : {float(v), mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 1e30f)}) {
      check(f);
      check(-f);
    }
  }
  std::mt19937_64 rng(11);
  for (int i = 0; i < 2000000; ++i) check(bits_to_f32(uint32_t(rng())));
  CHECK(bad == 0);
  CHECK(f32_to_f16(65520.0f) == 0x7c00);  // the first value that rounds to infinity
  CHECK(f32_to_f16(65519.0f) == 0x7bff);
}
#endif

TEST_CASE("every bundle reads back through the manifest as the source rows and columns, for each dtype") {
  const std::string dir = tmpdir("roundtrip");
  for (bool gated : {true, false}) {
    for (ImageDtype dt : {ImageDtype::kF32, ImageDtype::kF16, ImageDtype::kBF16}) {
      CAPTURE(gated);
      CAPTURE(image_dtype_name(dt));
      ModelConfig c = test::small_config();
      ModelWeights w = test::random_weights(c, 42, gated);
      ImageSpec spec;
      spec.dtype = dt;
      spec.bundle_kind = gated ? BundleKind::kGated : BundleKind::kPlain;
      spec.order = test::random_order(c, 5);
      const std::string img = dir + "/m_" + image_dtype_name(dt) + (gated ? "_g" : "_p") + ".nlw";
      image_write_model(img, w, spec);

      FlashImage fi(img, IoOptions{});
      const ImageManifest& m = fi.manifest();
      CHECK(m.bundle_bytes == uint64_t(gated ? 3 : 2) * 64 * image_dtype_bytes(dt));
      CHECK(m.order == spec.order);
      const size_t dim = size_t(c.dim), hidden = size_t(c.hidden_dim);
      uint64_t mismatches = 0;
      AlignedBuffer buf;
      for (int l = 0; l < c.n_layers; ++l) {
        fi.read_region(size_t(1 + l), &buf);  // also checks the region's xxh64
        const LayerWeights& src = w.layers[size_t(l)];
        std::vector<float> part(dim);
        for (uint32_t s = 0; s < hidden; ++s) {
          const uint32_t n = m.order[size_t(l)][s];
          const uint8_t* b = buf.data() + uint64_t(s) * m.bundle_bytes;
          auto expect_row = [&](const float* want_row, size_t stride) {
            image_decode(dt, b, dim, part.data());
            for (size_t i = 0; i < dim; ++i)
              if (!same_bits(part[i], reference_round(dt, want_row[i * stride]))) ++mismatches;
            b += dim * image_dtype_bytes(dt);
          };
          if (gated) expect_row(src.w_gate.data() + n * dim, 1);
          expect_row(src.w_up.data() + n * dim, 1);
          expect_row(src.w_down.data() + n, hidden);  // the down column of neuron n
        }
      }
      CHECK(mismatches == 0);
      // Dense tensors decode to the rounded source as well.
      ModelWeights d = fi.load_dense();
      REQUIRE(d.tok_embeddings.size() == w.tok_embeddings.size());
      for (size_t i = 0; i < w.tok_embeddings.size(); ++i)
        if (!same_bits(d.tok_embeddings[i], reference_round(dt, w.tok_embeddings[i]))) ++mismatches;
      for (size_t i = 0; i < w.wcls.size(); ++i)
        if (!same_bits(d.wcls[i], reference_round(dt, w.wcls[i]))) ++mismatches;
      for (size_t i = 0; i < w.layers[1].wk.size(); ++i)
        if (!same_bits(d.layers[1].wk[i], reference_round(dt, w.layers[1].wk[i]))) ++mismatches;
      CHECK(mismatches == 0);
      LayerWeights back;
      fi.load_ffn_layer(1, &back);
      for (size_t i = 0; i < back.w_down.size(); ++i)
        if (!same_bits(back.w_down[i], reference_round(dt, w.layers[1].w_down[i]))) ++mismatches;
      CHECK(mismatches == 0);
      fi.verify_all();
      for (size_t r = 0; r < m.regions.size(); ++r) CHECK(fi.region_verified(r));
    }
  }
}

TEST_CASE("same inputs give byte-identical image and manifest") {
  const std::string a = tmpdir("det_a"), b = tmpdir("det_b");
  ModelConfig c = test::small_config();
  ModelWeights w = test::random_weights(c, 3);
  for (const std::string& d : {a, b}) {
    ImageSpec spec;
    spec.dtype = ImageDtype::kF16;
    spec.order = test::random_order(c, 9);
    spec.tokenizer = "tok.bin";
    image_write_model(d + "/model.nlw", w, spec);
  }
  CHECK(read_file(a + "/model.nlw") == read_file(b + "/model.nlw"));
  CHECK(read_file(a + "/model.nlw.json") == read_file(b + "/model.nlw.json"));
  // Regions are 4096-aligned and the file is a whole number of blocks.
  ImageManifest m = manifest_load(a + "/model.nlw.json");
  for (const auto& r : m.regions) CHECK(r.offset % 4096 == 0);
  CHECK(read_file(a + "/model.nlw").size() == m.image_bytes);
  CHECK(m.image_bytes % 4096 == 0);
}

namespace {

struct Case {
  const char* name;
  bool image_blamed;   // the error names the image (else the manifest)
  const char* phrase;  // what the one line must say
};

// Opens the pair, expects InputError naming the right file with the phrase, on one line.
void expect_refused(const std::string& img, const Case& k, bool verify = false) {
  CAPTURE(k.name);
  std::string msg;
  try {
    FlashImage fi(img, IoOptions{});
    if (verify) fi.verify_all();
  } catch (const InputError& e) {
    msg = e.what();
  }
  CHECK_MESSAGE(!msg.empty(), "accepted a malformed pair");
  const std::string blamed = k.image_blamed ? img : img + ".json";
  CHECK_MESSAGE(msg.rfind(blamed + ": ", 0) == 0, msg);
  CHECK_MESSAGE(msg.find(k.phrase) != std::string::npos, msg);
  CHECK(msg.find('\n') == std::string::npos);
}

}  // namespace

TEST_CASE("malformed manifests and images are refused with one clear line each") {
  const std::string dir = tmpdir("bad");
  ModelConfig c = test::small_config();
  ModelWeights w = test::random_weights(c, 1);
  ImageSpec spec;
  spec.order = test::random_order(c, 2);
  const std::string good = dir + "/good.nlw";
  image_write_model(good, w, spec);
  ImageSpec spec2 = spec;
  spec2.order = test::random_order(c, 3);
  image_write_model(dir + "/other.nlw", w, spec2);  // same sizes, other order: a different image id
  const json base = json::parse(read_file(good + ".json"));
  const std::string img = dir + "/bad.nlw";

  auto with_manifest = [&](const std::function<void(json&)>& edit) {
    test::copy_file(good, img);
    json j = base;
    edit(j);
    test::write_text(img + ".json", j.dump());
  };
  auto with_text = [&](const std::string& text) {
    test::copy_file(good, img);
    test::write_text(img + ".json", text);
  };

  with_text("{ \"format\": \"neuralink-image\", ");
  expect_refused(img, {"not JSON", false, "not valid JSON"});
  with_text("{ \"format\": \"neuralink-image\", \"version\": 1e999999 }");  // parser's out_of_range
  expect_refused(img, {"number overflow", false, "not valid JSON"});
  with_manifest([](json& j) { j["format"] = "neuralink-layout"; });
  expect_refused(img, {"wrong format", false, "not a flash image manifest"});
  with_manifest([](json& j) { j["version"] = 2; });
  expect_refused(img, {"future major version", false, "format version 2 is newer"});
  with_manifest([](json& j) { j["model"].erase("dim"); });
  expect_refused(img, {"missing key", false, "missing key 'model.dim'"});
  with_manifest([](json& j) { j["regions"][2]["offset"] = j["image"]["bytes"].get<uint64_t>() + 4096; });
  expect_refused(img, {"offset past EOF", false, "runs past the end of the image"});
  with_manifest([](json& j) { j["regions"][2]["offset"] = j["regions"][1]["offset"]; });
  expect_refused(img, {"overlapping regions", false, "overlap"});
  with_manifest([](json& j) { j["regions"][1]["offset"] = j["regions"][1]["offset"].get<uint64_t>() + 8; });
  expect_refused(img, {"misaligned region", false, "is not 4096-aligned"});
  with_manifest([](json& j) { j["bundle"]["bytes"] = j["bundle"]["bytes"].get<uint64_t>() + 4; });
  expect_refused(img, {"bundle size", false, "inconsistent with the model"});
  with_manifest([](json& j) { j["order"][0][0] = j["order"][0][1]; });
  expect_refused(img, {"order not a permutation", false, "not a permutation"});
  with_manifest([](json& j) { j["regions"][1]["xxh64"] = "0123456789abcdef"; });
  expect_refused(img, {"edited checksum", false, "does not match its region table"});
  with_manifest([](json& j) { j["dtype"] = "q4"; });
  expect_refused(img, {"unknown dtype", false, "unknown dtype 'q4'"});
  // Found by fuzz/fuzz_manifest: the version was narrowed to 32 bits before the check (2^32 + 1 read as 1),
  // and a model float beyond FLT_MAX was converted regardless.
  with_manifest([](json& j) { j["version"] = (1ull << 32) + 1; });
  expect_refused(img, {"version wraps to 1", false, "format version 4294967297 is newer"});
  with_manifest([](json& j) { j["version_minor"] = 1ull << 40; });
  expect_refused(img, {"absurd minor version", false, "version_minor"});
  with_manifest([](json& j) { j["model"]["rope_theta"] = 1e300; });
  expect_refused(img, {"rope_theta beyond float", false, "model.rope_theta is out of range"});
  with_manifest([](json& j) { j["regions"][1]["offset"] = -4096; });
  expect_refused(img, {"negative offset", false, "non-negative integer"});
  with_manifest([](json& j) { j["regions"].erase(2); });
  expect_refused(img, {"region missing", false, "has 2 regions"});
  with_manifest([](json& j) { j["image"]["bytes"] = j["image"]["bytes"].get<uint64_t>() + 100; });
  expect_refused(img, {"image size not aligned", false, "not a multiple of 4096"});
  with_manifest([](json& j) { j["model"]["hidden_dim"] = 1u << 29; });
  expect_refused(img, {"region size vs config", false, "expected hidden_dim"});

  // The optional per-layer cache policy (docs/formats.md "Cache policy").
  with_manifest([](json& j) { j["cache_policy"] = {{"admission", "all"}}; });
  expect_refused(img, {"cache policy not an array", false, "'cache_policy' must be an array"});
  with_manifest([](json& j) { j["cache_policy"] = json::array({json::object()}); });
  expect_refused(
      img, {"cache policy for one of two layers", false, "cache_policy has 1 entries, expected one per layer (2)"});
  with_manifest([](json& j) { j["cache_policy"] = json::array({json::object(), 3}); });
  expect_refused(img, {"cache policy entry not an object", false, "cache_policy[1] must be an object"});
  with_manifest([](json& j) { j["cache_policy"] = json::array({{{"admission", "lru"}}, json::object()}); });
  expect_refused(img, {"unknown admission", false, "cache_policy[0].admission 'lru' is not"});
  with_manifest([](json& j) { j["cache_policy"] = json::array({{{"admission", 1}}, json::object()}); });
  expect_refused(img, {"admission not a string", false, "cache_policy[0].admission must be a string"});
  with_manifest([](json& j) { j["cache_policy"] = json::array({json::object(), {{"small_fraction", "x"}}}); });
  expect_refused(img, {"small fraction not a number", false, "cache_policy[1].small_fraction must be a number"});
  for (double bad : {0.0, 1.0, 1.5, -0.25}) {
    with_manifest([&](json& j) { j["cache_policy"] = json::array({json::object(), {{"small_fraction", bad}}}); });
    expect_refused(
        img, {"small fraction out of range", false, "cache_policy[1].small_fraction must be strictly between 0 and 1"});
  }
  with_manifest([&](json& j) {
    j["cache_policy"] = json::array({json::object(), {{"pinned_slots", {0, base["model"]["hidden_dim"]}}}});
  });
  expect_refused(img,
                 {"pinned slot out of range", false, "cache_policy[1].pinned_slots: slot 96 is out of range [0, 96)"});
  with_manifest([](json& j) { j["cache_policy"] = json::array({{{"pinned_slots", {4, 5, 4}}}, json::object()}); });
  expect_refused(img, {"pinned slot twice", false, "cache_policy[0].pinned_slots lists slot 4 twice"});
  with_manifest([](json& j) { j["cache_policy"] = json::array({{{"pinned_slots", {-1}}}, json::object()}); });
  expect_refused(img, {"negative pinned slot", false, "pinned_slots entries must be slot indices"});
  with_manifest([](json& j) { j["cache_policy"] = json::array({{{"pinned_slots", 7}}, json::object()}); });
  expect_refused(img, {"pinned slots not an array", false, "pinned_slots must be an array"});
  with_manifest([](json& j) { j["cache_policy"] = json::array({{{"hot_slots", {3, 96}}}, json::object()}); });
  expect_refused(img, {"hot slot out of range", false, "cache_policy[0].hot_slots: slot 96 is out of range [0, 96)"});
  with_manifest([](json& j) { j["cache_policy"] = json::array({json::object(), {{"hot_slots", {2, 2}}}}); });
  expect_refused(img, {"hot slot twice", false, "cache_policy[1].hot_slots lists slot 2 twice"});
  with_manifest([](json& j) { j["cache_policy"] = json::array({{{"hot_slots", "x"}}, json::object()}); });
  expect_refused(img, {"hot slots not an array", false, "hot_slots must be an array"});
  with_manifest([](json& j) { j["cache_policy"] = json::array({{{"admission", "lru"}}, json::object()}); });
  expect_refused(img, {"unknown admission", false, "cache_policy[0].admission 'lru' is not \"all\""});

  // Image-side problems: the manifest is fine, the image is not the one it describes.
  with_manifest([](json&) {});
  test::truncate_to(img, base["image"]["bytes"].get<uint64_t>() - 4096);
  expect_refused(img, {"truncated image", true, "truncated"});
  with_manifest([](json&) {});
  test::truncate_to(img, 100);
  expect_refused(img, {"image cut inside its header block", true, "truncated"});
  with_manifest([](json&) {});
  test::flip_byte(img, 0);
  expect_refused(img, {"bad magic", true, "bad magic"});
  test::copy_file(dir + "/other.nlw", img);
  test::write_text(img + ".json", base.dump());
  expect_refused(img, {"image of another pack", true, "does not match its manifest"});
  with_manifest([](json&) {});
  test::flip_byte(img, base["regions"][2]["offset"].get<uint64_t>() + 77);
  {
    FlashImage fi(img, IoOptions{});               // opening reads no FFN payload ...
    CHECK_THROWS_AS(fi.verify_all(), InputError);  // ... verifying does
  }
  expect_refused(img, {"checksum mismatch", true, "checksum mismatch in region 'ffn.1'"}, true);

  // Forward compatibility: unknown keys are ignored, a newer minor version is accepted.
  with_manifest([](json& j) {
    j["future_key"] = {{"anything", 1}};
    j["model"]["future_model_key"] = true;
    j["version_minor"] = 7;
  });
  FlashImage ok(img, IoOptions{});
  ok.verify_all();
  CHECK(ok.manifest().version_minor == 7);
  CHECK(ok.manifest().cache_policy.empty());  // a manifest without the key: no policy
  with_manifest([](json& j) {
    j["cache_policy"] = json::array({{{"admission", "linking-aligned"}, {"future", 1}}, {{"pinned_slots", {9, 2}}}});
  });
  FlashImage ok2(img, IoOptions{});
  REQUIRE(ok2.manifest().cache_policy.size() == 2);
  CHECK(ok2.manifest().cache_policy[0].admission == CacheAdmission::kLinkingAligned);
  with_manifest([](json& j) { j["cache_policy"] = json::array({{{"admission", "isolated"}}, json::object()}); });
  CHECK(FlashImage(img, IoOptions{}).manifest().cache_policy[0].admission == CacheAdmission::kIsolated);
  with_manifest([](json& j) {
    j["cache_policy"] = json::array({{{"admission", "linking-aligned"}, {"future", 1}}, {{"pinned_slots", {9, 2}}}});
  });
  CHECK(ok2.manifest().cache_policy[0].pinned.empty());
  CHECK(ok2.manifest().cache_policy[1].admission == CacheAdmission::kUnset);
  CHECK(ok2.manifest().cache_policy[1].pinned == std::vector<uint32_t>{9, 2});
}

TEST_CASE("the cache policy round-trips through the manifest; images without one keep their manifest bytes") {
  const std::string d = tmpdir("policy");
  ModelConfig c = test::small_config();
  ModelWeights w = test::random_weights(c, 3);
  ImageSpec spec;
  spec.order = test::random_order(c, 9);
  image_write_model(d + "/plain.nlw", w, spec);
  const std::string plain = read_file(d + "/plain.nlw.json");
  CHECK(plain.find("cache_policy") == std::string::npos);
  CHECK(manifest_load(d + "/plain.nlw.json").cache_policy.empty());
  // Policies that record nothing are not written either.
  spec.cache_policy.resize(2);
  image_write_model(d + "/empty.nlw", w, spec);
  CHECK(read_file(d + "/empty.nlw.json").find("cache_policy") == std::string::npos);
  spec.cache_policy[0] = {CacheAdmission::kAll, {7, 3, 95}};  // hottest first: the order is kept, not sorted
  spec.cache_policy[1] = {CacheAdmission::kUnset, {0}, 0.25};
  image_write_model(d + "/pol.nlw", w, spec);
  ImageManifest m = manifest_load(d + "/pol.nlw.json");
  REQUIRE(m.cache_policy.size() == 2);
  CHECK(m.cache_policy[0].admission == CacheAdmission::kAll);
  CHECK(m.cache_policy[0].pinned == std::vector<uint32_t>{7, 3, 95});
  CHECK(m.cache_policy[1].admission == CacheAdmission::kUnset);
  CHECK(m.cache_policy[1].pinned == std::vector<uint32_t>{0});
  CHECK(m.cache_policy[0].small_fraction == 0.0);
  CHECK(m.cache_policy[1].small_fraction == 0.25);
  CHECK(m.cache_policy[0].hot.empty());
  CHECK(manifest_to_json(m) == read_file(d + "/pol.nlw.json"));
  // The value cache and its hotness order (slots, hottest first, kept as given).
  spec.cache_policy[1] = {CacheAdmission::kValue, {0}, 0, {5, 0, 17}};
  image_write_model(d + "/val.nlw", w, spec);
  const ImageManifest mv = manifest_load(d + "/val.nlw.json");
  CHECK(mv.cache_policy[1].admission == CacheAdmission::kValue);
  CHECK(mv.cache_policy[1].hot == std::vector<uint32_t>{5, 0, 17});
  CHECK(manifest_to_json(mv) == read_file(d + "/val.nlw.json"));
  // The writer refuses, with the reader's words (one check: image_cache_policy_problem), what the reader would.
  auto refused = [&](const std::string& expect) {
    std::string what;
    try {
      image_write_model(d + "/bad.nlw", w, spec);
    } catch (const UsageError& e) {
      what = e.what();
    }
    CHECK_MESSAGE(what.find("cannot pack: " + expect) != std::string::npos, what);
  };
  spec.cache_policy[1] = {CacheAdmission::kValue, {}, 0, {5, 5}};
  refused("cache_policy[1].hot_slots lists slot 5 twice");
  spec.cache_policy[1] = {CacheAdmission::kAll, {4, 4}};
  refused("cache_policy[1].pinned_slots lists slot 4 twice");
  {  // a second copy is neither pinned nor ranked: the cache is keyed by a neuron's first copy
    ImageSpec rep = spec;
    rep.order[1].push_back(rep.order[1][0]);  // the last slot holds a second copy of slot 0's neuron
    rep.cache_policy[1] = {CacheAdmission::kValue, {}, 0, {size_t(c.hidden_dim)}};
    std::string what;
    try {
      image_write_model(d + "/bad.nlw", w, rep);
    } catch (const UsageError& e) {
      what = e.what();
    }
    CHECK_MESSAGE(what.find("cache_policy[1].hot_slots: slot " + std::to_string(c.hidden_dim) +
                            " holds a second copy (list the first)") != std::string::npos,
                  what);
  }
  // The image bytes do not depend on the policy (only the manifest does).
  CHECK(read_file(d + "/pol.nlw") == read_file(d + "/plain.nlw"));
  // The writer refuses a policy the reader would refuse (an unknown admission cannot be represented: CacheAdmission).
  spec.cache_policy[1] = {CacheAdmission::kAll, {96}};
  CHECK_THROWS_AS(image_write_model(d + "/bad.nlw", w, spec), UsageError);
  spec.cache_policy[1] = {CacheAdmission::kAll, {}, 1.0};
  CHECK_THROWS_AS(image_write_model(d + "/bad.nlw", w, spec), UsageError);
  spec.cache_policy.resize(1);
  CHECK_THROWS_AS(image_write_model(d + "/bad.nlw", w, spec), UsageError);
}

TEST_CASE("an image holding NaN or Inf dense weights is refused when they are loaded") {
  const std::string dir = tmpdir("nonfinite");
  ModelConfig c = test::small_config();
  for (int kind = 0; kind < 2; ++kind) {
    CAPTURE(kind);
    ModelWeights w = test::random_weights(c, 11);
    // A norm vector (checked by both loaders) or an embedding (decoded, so checked, by load_dense).
    if (kind == 0)
      w.rms_final[3] = std::numeric_limits<float>::quiet_NaN();
    else
      w.tok_embeddings[7] = std::numeric_limits<float>::infinity();
    ImageSpec spec;
    spec.dtype = ImageDtype::kF32;
    spec.order = test::random_order(c, 5);
    const std::string img = dir + "/nf" + std::to_string(kind) + ".nlw";
    image_write_model(img, w, spec);
    FlashImage fi(img, IoOptions{});
    CHECK_THROWS_WITH_AS(fi.load_dense(), doctest::Contains(kind == 0 ? "is NaN" : "is infinite"), InputError);
    if (kind == 0) {
      FlashImage fs(img, IoOptions{});
      CHECK_THROWS_WITH_AS(fs.load_dense_store(), doctest::Contains("'rms_final' element 3 is NaN"), InputError);
    }
  }
}
