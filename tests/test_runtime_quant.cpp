// Quantized images (q8_0 / q4_0, docs/formats.md "Quantized images"): ggml block layouts and error bounds, image
// sizes and per-tensor dtypes, decoding through FlashImage, refusal of dims that are not whole blocks, and the image
// id covering every manifest field that changes the computation (issue 23 item 7).
#include <doctest/doctest.h>
#include <sys/stat.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <nlohmann/json.hpp>

#include "formats/core/error.h"
#include "formats/core/half.h"
#include "formats/core/image.h"
#include "formats/core/image_writer.h"
#include "formats/core/quant.h"
#include "image_test_util.h"
#include "runtime/flash_image.h"

using namespace nl;
using nlohmann::json;

namespace {

std::string tmpdir(const std::string& name) {
  std::string d = "quant_test_" + name;
  ::mkdir(d.c_str(), 0755);
  return d;
}

std::vector<float> roundtrip(ImageDtype d, const float* x, size_t n) {
  std::vector<uint8_t> q(image_row_bytes(d, n));
  image_encode(d, x, n, q.data());
  std::vector<float> y(n);
  image_decode(d, q.data(), n, y.data());
  return y;
}

double rel_rms(const std::vector<float>& a, const std::vector<float>& b) {
  double e = 0, r = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    e += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    r += double(a[i]) * a[i];
  }
  return std::sqrt(e / r);
}

}  // namespace

TEST_CASE("q8_0 / q4_0 rows: ggml block sizes, nibble order and per-block error bounds") {
  CHECK(image_row_bytes(ImageDtype::kQ8_0, 4096) == 4352);
  CHECK(image_row_bytes(ImageDtype::kQ4_0, 4096) == 2304);
  CHECK(image_row_bytes(ImageDtype::kQ8_0, 32) == sizeof(BlockQ8_0));
  CHECK(image_row_bytes(ImageDtype::kQ4_0, 64) == 2 * sizeof(BlockQ4_0));

  // Exactly representable blocks come back exactly: q8_0 with d = 0.5, q4_0 with d = -0.25 (max = 2.0).
  float x[32];
  for (int j = 0; j < 32; ++j) x[j] = 0.5f * float(j * 8 - 124);  // multiples of 0.5 within +-62
  x[31] = 63.5f;                                                  // amax 63.5 -> d = 0.5
  CHECK(roundtrip(ImageDtype::kQ8_0, x, 32) == std::vector<float>(x, x + 32));
  BlockQ4_0 b4;
  float y[32];
  for (int j = 0; j < 32; ++j) y[j] = 0.25f * float((j % 16) - 8);  // q in [-8, 7], max |x| = 2 at q = -8
  quantize_row_q4_0(y, &b4, 32);
  CHECK(f16_to_f32(b4.d) == 0.25f);  // d = max / -8 with max = -2
  // Byte j: weight j in the low nibble, weight j + 16 in the high nibble, each + 8 (ggml's block_q4_0).
  for (int j = 0; j < 16; ++j) {
    CHECK((b4.qs[j] & 15) == (j % 16));
    CHECK((b4.qs[j] >> 4) == (j % 16));
  }
  CHECK(roundtrip(ImageDtype::kQ4_0, y, 32) == std::vector<float>(y, y + 32));

  // Random rows: every weight within half a step (q8_0) / one step (q4_0, whose top code is clamped) of the
  // source, plus the f16 rounding of the scale.
  std::mt19937_64 rng(5);
  const size_t n = 32 * 64;
  std::vector<float> src = test::random_floats(n, rng);
  for (ImageDtype d : {ImageDtype::kQ8_0, ImageDtype::kQ4_0}) {
    CAPTURE(std::string(image_dtype_name(d)));
    std::vector<float> back = roundtrip(d, src.data(), n);
    uint64_t bad = 0;
    for (size_t b = 0; b < n / 32; ++b) {
      float amax = 0;
      for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(src[b * 32 + j]));
      const double step = d == ImageDtype::kQ8_0 ? amax / 127.0 : amax / 8.0;
      const double bound = (d == ImageDtype::kQ8_0 ? 0.5 : 1.0) * step + 8.0 * 128.0 * step / 2048.0 + 1e-12;
      for (int j = 0; j < 32; ++j) bad += std::fabs(double(back[b * 32 + j]) - src[b * 32 + j]) > bound;
    }
    CHECK(bad == 0);
    const double e = rel_rms(src, back);
    MESSAGE(image_dtype_name(d) << " relative RMS error on N(0, 0.5) rows: " << e);
    CHECK(e < (d == ImageDtype::kQ8_0 ? 0.01 : 0.15));
  }
}

TEST_CASE("q8_0 / q4_0 images: GGUF-sized bundles and tensors, f32 norms, decoded values equal the stored blocks") {
  const std::string dir = tmpdir("images");
  for (ImageDtype dt : {ImageDtype::kQ8_0, ImageDtype::kQ4_0}) {
    for (bool gated : {true, false}) {
      CAPTURE(std::string(image_dtype_name(dt)));
      CAPTURE(gated);
      ModelConfig c = test::small_config();  // dim 64: two blocks per row
      ModelWeights w = test::random_weights(c, 7, gated);
      ImageSpec spec;
      spec.dtype = dt;
      spec.bundle_kind = gated ? BundleKind::kGated : BundleKind::kPlain;
      spec.order = test::random_order(c, 3);
      const std::string img = dir + "/m_" + image_dtype_name(dt) + (gated ? "_g" : "_p") + ".nlw";
      image_write_model(img, w, spec);
      FlashImage fi(img, IoOptions{});
      const ImageManifest& m = fi.manifest();
      const uint64_t row = dt == ImageDtype::kQ8_0 ? 2 * 34 : 2 * 18;
      CHECK(m.bundle_bytes == uint64_t(gated ? 3 : 2) * row);
      CHECK(m.ffn(0).bytes == uint64_t(c.hidden_dim) * m.bundle_bytes);
      for (const DenseTensor& t : m.dense_tensors) {
        CHECK(t.offset % 64 == 0);
        CHECK(t.dtype == (t.rows == 1 ? ImageDtype::kF32 : dt));
        CHECK(t.bytes() == t.rows * (t.rows == 1 ? 4 * t.cols : t.cols / 32 * (row / 2)));
      }
      ModelWeights d = fi.load_dense();
      CHECK(d.layers[1].rms_att == w.layers[1].rms_att);  // f32: exact
      CHECK(d.rms_final == w.rms_final);
      CHECK(d.tok_embeddings == roundtrip(dt, w.tok_embeddings.data(), w.tok_embeddings.size()));
      CHECK(d.wcls == roundtrip(dt, w.wcls.data(), w.wcls.size()));
      CHECK(d.layers[0].wk == roundtrip(dt, w.layers[0].wk.data(), w.layers[0].wk.size()));
      CHECK(rel_rms(w.layers[0].wo, d.layers[0].wo) < (dt == ImageDtype::kQ8_0 ? 0.01 : 0.15));
      // FFN: rows of gate/up and columns of down, each quantized on its own along dim.
      LayerWeights back;
      fi.load_ffn_layer(1, &back);
      const LayerWeights& L = w.layers[1];
      const size_t dim = size_t(c.dim), hid = size_t(c.hidden_dim);
      CHECK(back.w_up == roundtrip(dt, L.w_up.data(), L.w_up.size()));
      if (gated) CHECK(back.w_gate == roundtrip(dt, L.w_gate.data(), L.w_gate.size()));
      uint64_t mism = 0;
      std::vector<float> col(dim);
      for (size_t nrn = 0; nrn < hid; ++nrn) {
        for (size_t o = 0; o < dim; ++o) col[o] = L.w_down[o * hid + nrn];
        const std::vector<float> q = roundtrip(dt, col.data(), dim);
        for (size_t o = 0; o < dim; ++o) mism += back.w_down[o * hid + nrn] != q[o];
      }
      CHECK(mism == 0);
      fi.verify_all();
      // The manifest round-trips with its per-tensor dtypes.
      CHECK(manifest_to_json(manifest_parse(manifest_to_json(m), "x.json")) == manifest_to_json(m));
    }
  }
}

TEST_CASE("a quantized image needs dim % 32 == 0: refused before anything is written") {
  const std::string dir = tmpdir("dim");
  ModelConfig c = test::small_config(48, 64, 2);  // 48 = 1.5 blocks
  c.n_heads = 4;
  ModelWeights w = test::random_weights(c, 1);
  for (ImageDtype dt : {ImageDtype::kQ8_0, ImageDtype::kQ4_0}) {
    ImageSpec spec;
    spec.dtype = dt;
    const std::string img = dir + "/m.nlw";
    try {
      image_write_model(img, w, spec);
      FAIL("accepted dim 48");
    } catch (const UsageError& e) {
      CHECK(std::string(e.what()).find("dim 48 is not a multiple of 32") != std::string::npos);
    }
    struct stat st {};
    CHECK(::stat(img.c_str(), &st) != 0);
    CHECK(::stat((img + ".json").c_str(), &st) != 0);
  }
  ImageSpec spec;
  spec.dtype = ImageDtype::kF16;  // the plain dtypes have no block constraint
  image_write_model(dir + "/f16.nlw", w, spec);
}

TEST_CASE("per-tensor dtypes in the manifest: absent = the storage rule, anything else refused") {
  const std::string dir = tmpdir("tensor_dtype");
  ModelConfig c = test::small_config();
  ModelWeights w = test::random_weights(c, 2);
  ImageSpec spec;
  spec.dtype = ImageDtype::kQ8_0;
  const std::string good = dir + "/good.nlw";
  image_write_model(good, w, spec);
  const json base = json::parse(read_file(good + ".json"));
  CHECK(base["dense_tensors"][1]["dtype"] == "f32");   // layers.0.rms_att
  CHECK(base["dense_tensors"][2]["dtype"] == "q8_0");  // layers.0.wq
  auto parse_edited = [&](const std::function<void(json&)>& edit) -> std::string {
    json j = base;
    edit(j);
    try {
      manifest_parse(j.dump(), "m.json");
    } catch (const InputError& e) {
      return e.what();
    }
    return "";
  };
  // Without the keys (as 1.0 manifests are written) the same dtypes follow, and the id still matches.
  CHECK(parse_edited([](json& j) {
          for (auto& t : j["dense_tensors"]) t.erase("dtype");
        }) == "");
  CHECK(parse_edited([](json& j) { j["dense_tensors"][2]["dtype"] = "q8"; }).find("dtype must be one of") !=
        std::string::npos);
  CHECK(parse_edited([](json& j) { j["dense_tensors"][2]["dtype"] = 8; }).find("dtype must be one of") !=
        std::string::npos);
  CHECK(parse_edited([](json& j) {
          j["dense_tensors"][2]["dtype"] = "f16";
        }).find("'layers.0.wq' has dtype f16, a q8_0 image stores it as q8_0") != std::string::npos);
  CHECK(parse_edited([](json& j) {
          j["dense_tensors"][1]["dtype"] = "q8_0";
        }).find("'layers.0.rms_att' has dtype q8_0") != std::string::npos);
  CHECK(parse_edited([](json& j) {
          j["model"]["dim"] = 48;
          j["model"]["n_heads"] = 4;
        }).find("multiple of 32") != std::string::npos);
}

TEST_CASE("the image id covers every manifest field that changes the computation (issue 23 item 7)") {
  const std::string dir = tmpdir("id");
  ModelConfig c = test::small_config();
  ModelWeights w = test::random_weights(c, 4);
  ImageSpec spec;
  spec.dtype = ImageDtype::kF16;
  spec.order = test::random_order(c, 6);
  const std::string good = dir + "/good.nlw";
  image_write_model(good, w, spec);
  const json base = json::parse(read_file(good + ".json"));
  const std::string img = dir + "/bad.nlw";
  auto refused = [&](const char* what, const std::function<void(json&)>& edit) {
    CAPTURE(what);
    test::copy_file(good, img);
    json j = base;
    edit(j);
    test::write_text(img + ".json", j.dump());
    std::string msg;
    try {
      FlashImage fi(img, IoOptions{});
    } catch (const InputError& e) {
      msg = e.what();
    }
    CHECK_MESSAGE(!msg.empty(), "accepted an edited manifest");
    CHECK(msg.find('\n') == std::string::npos);
    return msg;
  };
  auto id_refused = [&](const char* what, const std::function<void(json&)>& edit) {
    const std::string msg = refused(what, edit);
    CHECK_MESSAGE(msg.find("does not match its region table and the model") != std::string::npos, msg);
  };
  id_refused("ffn_act", [](json& j) { j["model"]["ffn_act"] = "silu"; });
  id_refused("norm_eps", [](json& j) { j["model"]["norm_eps"] = 1e-6; });
  id_refused("rope_theta", [](json& j) { j["model"]["rope_theta"] = 500000.0; });
  // Same tensor shapes (kv_dim 32 either way), other attention: only the id can tell.
  id_refused("n_heads and n_kv_heads", [](json& j) {
    j["model"]["n_heads"] = 8;
    j["model"]["n_kv_heads"] = 4;
  });
  refused("n_kv_heads", [](json& j) { j["model"]["n_kv_heads"] = 4; });
  id_refused("seq_len", [](json& j) { j["model"]["seq_len"] = 16; });
  id_refused("order", [](json& j) { std::swap(j["order"][1][0], j["order"][1][1]); });
  // The dense tensors are packed without gaps here, so a moved or swapped offset aliases a neighbour: the layout
  // check refuses it before the id is compared (the id covers offsets too).
  refused("tensor offset moved back", [](json& j) {
    j["dense_tensors"].back()["offset"] = j["dense_tensors"].back()["offset"].get<uint64_t>() - 64;
  });
  refused("tensor offset moved onto its neighbour", [](json& j) { j["dense_tensors"][0]["offset"] = 64; });
  refused("two tensor offsets swapped",
          [](json& j) { std::swap(j["dense_tensors"][2]["offset"], j["dense_tensors"][3]["offset"]); });
  // Claiming the 1.0 id rule (which covers only the region table) does not help: the header says 1.1.
  const std::string regions_id = hex64(image_id_of(manifest_load(good + ".json").regions));
  const std::string msg = refused("downgraded to 1.0", [&](json& j) {
    j["version_minor"] = 0;
    j["image"]["id"] = regions_id;
    j["model"]["ffn_act"] = "silu";
  });
  CHECK(msg.find("format version 1.1, its manifest says 1.0") != std::string::npos);
  // Advisory fields are not covered: the source path, the tokenizer reference.
  test::copy_file(good, img);
  json j = base;
  j["source"]["path"] = "elsewhere.bin";
  test::write_text(img + ".json", j.dump());
  CHECK_NOTHROW(FlashImage(img, IoOptions{}));
}

TEST_CASE("format 1.0 images (id over the region table, no tensor dtypes) still open") {
  const std::string dir = tmpdir("v10");
  ModelConfig c = test::small_config();
  ModelWeights w = test::random_weights(c, 8);
  ImageSpec spec;
  spec.dtype = ImageDtype::kBF16;
  const std::string img = dir + "/old.nlw";
  image_write_model(img, w, spec);
  // Rewrite it as a 1.0 writer did: header minor 0, manifest minor 0 without tensor dtypes, id over the regions.
  ImageManifest m = manifest_load(img + ".json");
  const uint64_t old_id = image_id_of(m.regions);
  json j = json::parse(read_file(img + ".json"));
  j["version_minor"] = 0;
  j["image"]["id"] = hex64(old_id);
  for (auto& t : j["dense_tensors"]) t.erase("dtype");
  test::write_text(img + ".json", j.dump(1) + "\n");
  std::string bytes = read_file(img);
  ImageHeader h;
  std::memcpy(&h, bytes.data(), sizeof h);
  h.version_minor = 0;
  h.image_id = old_id;
  std::memcpy(bytes.data(), &h, sizeof h);
  test::write_text(img, bytes);
  FlashImage fi(img, IoOptions{});
  CHECK(fi.manifest().version_minor == 0);
  CHECK(fi.manifest().dense_tensors[2].dtype == ImageDtype::kBF16);
  fi.verify_all();
  CHECK(fi.load_dense().layers[0].wq.size() == w.layers[0].wq.size());
  // The 1.0 id covers only the regions: that is why 1.1 exists; a 1.0 manifest over a 1.1 header is refused
  // (test above), and this one's header says 1.0.
}
