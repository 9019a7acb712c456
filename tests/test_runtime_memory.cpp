// runtime/memory.h: budget sizes parse (binary, decimal, percent of MemAvailable) and bad ones are refused; the
// dense-bytes function equals what FlashImage::load_dense really holds; the plan's cache sizing fits the budget;
// the process's RSS figures are read from /proc and grow when memory is touched.
#include <doctest/doctest.h>

#include <cstring>
#include <vector>

#include "formats/core/error.h"
#include "formats/core/image_writer.h"
#include "image_test_util.h"
#include "runtime/flash_image.h"
#include "runtime/memory.h"

using namespace nl;

TEST_CASE("memory sizes parse, bad ones are refused") {
  CHECK(parse_memory_size("6GiB") == 6ULL << 30);
  CHECK(parse_memory_size("512MiB") == 512ULL << 20);
  CHECK(parse_memory_size("512m") == 512ULL << 20);
  CHECK(parse_memory_size("1.5GiB") == 3ULL << 29);
  CHECK(parse_memory_size("2GB") == 2000000000ULL);
  CHECK(parse_memory_size("4096") == 4096);
  CHECK(parse_memory_size("64KiB") == 65536);
  const uint64_t avail = mem_available_bytes();
  REQUIRE(avail > 0);
  const uint64_t p80 = parse_memory_size("80%");
  // MemAvailable moves between the two reads; within 5 %.
  CHECK(double(p80) == doctest::Approx(0.8 * double(avail)).epsilon(0.05));
  for (const char* bad : {"", "GiB", "-1GiB", "0", "12XB", "101%", "nan", "1e30TB"}) {
    CAPTURE(bad);
    CHECK_THROWS_AS(parse_memory_size(bad), UsageError);
  }
}

TEST_CASE("dense_dram_bytes is what load_dense_store holds; the budget's cache fits what is left") {
  ModelConfig c = test::small_config(64, 128, 3);
  ModelWeights w = test::random_weights(c, 4);
  const std::string img = "memory_test.nlw";
  for (ImageDtype dt : {ImageDtype::kF32, ImageDtype::kF16, ImageDtype::kQ8_0, ImageDtype::kQ4_0}) {
    CAPTURE(image_dtype_name(dt));
    ImageSpec spec;
    spec.dtype = dt;
    image_write_model(img, w, spec);
    FlashImage fi(img, IoOptions{});
    const std::unique_ptr<DenseStore> d = fi.load_dense_store();
    uint64_t norm_floats = 0;
    for (const auto& n : d->norms) norm_floats += n.size();
    CHECK(dense_dram_bytes(fi.manifest()) == d->bytes.size() + norm_floats * sizeof(float));
    uint64_t ffn = 0;
    for (int l = 0; l < 3; ++l) {
      AlignedBuffer region;
      fi.read_region(size_t(1 + l), &region);  // what --select dense holds per layer
      CHECK(region.size() >= 128 * fi.manifest().bundle_bytes);
      ffn += region.size();
    }
    CHECK(ffn_dense_dram_bytes(fi.manifest()) == ffn);
    CHECK(kv_cache_bytes(c, 10) == 2ULL * 3 * 10 * uint64_t(c.kv_dim()) * 4);
    MemoryPlan p = memory_plan(fi.manifest(), 16, FfnResidency::kGateRows, 2, 1000);
    CHECK(p.ffn_resident == 3ULL * 128 * image_row_bytes(dt, 64));
    CHECK(p.fixed() == p.baseline + p.dense + p.ffn_resident + p.kv + p.scratch + p.load_transient);
    CHECK(cache_bundles_for_budget(p, fi.manifest(), p.fixed()) == 0);
    CHECK(cache_bundles_for_budget(p, fi.manifest(), p.fixed() / 2) == 0);
    // 3 layers and one layer's worth for the admission pool (FlashFfn): 10 bundles per layer, and not 11.
    const uint64_t budget = p.fixed() + (3 + 1) * 10 * p.cache_bundle_cost + 5;
    p.cache_bundles_per_layer = cache_bundles_for_budget(p, fi.manifest(), budget);
    CHECK(p.cache_bundles_per_layer == 10);
    CHECK(p.fixed() + p.cache_bytes(3) <= budget);
    CHECK(cache_bundles_for_budget(p, fi.manifest(), uint64_t(1) << 50) == 128);  // at most the whole layer
  }
}

TEST_CASE("RSS figures come from /proc and follow touched memory") {
  const uint64_t before = current_rss_bytes(), peak0 = peak_rss_bytes();
  REQUIRE(before > 0);
  CHECK(peak0 >= before);
  std::vector<char> v(64 << 20);
  std::memset(v.data(), 1, v.size());
  CHECK(current_rss_bytes() >= before + (60 << 20));
  CHECK(peak_rss_bytes() >= before + (60 << 20));
  CHECK(format_bytes(3ULL << 29) == "1.50 GiB");
  CHECK(format_bytes(1536) == "1.5 KiB");
}
