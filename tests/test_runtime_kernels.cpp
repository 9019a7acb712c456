// Typed-weight kernels (runtime/model/typed_kernels.h): every SIMD path this CPU has is bitwise equal to the portable
// reference on random data with odd sizes, matches a double-precision reference within rounding, and matrix products
// give the same bits for any token count and thread count.
#include <doctest/doctest.h>
#include <omp.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <csignal>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "formats/core/half.h"
#include "formats/core/image.h"
#include "formats/core/quant.h"
#include "runtime/model/dense_bundles.h"
#include "runtime/model/model.h"
#include "runtime/model/typed_kernels.h"
#include "runtime/parallel.h"
#include "skip_util.h"

using namespace nl;

namespace {

// A [rows][cols] matrix of random weights (a few large outliers) in dtype `dt`, and its f32 decode.
struct TypedMatrix {
  ImageDtype dt;
  int rows, cols;
  size_t stride;
  std::vector<uint8_t> bytes;
  std::vector<float> f32;  // the stored values widened
  WeightView view() const { return {dt, bytes.data(), rows, cols, stride}; }
};

TypedMatrix make_matrix(ImageDtype dt, int rows, int cols, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd(0.0f, 0.05f);
  TypedMatrix m{dt, rows, cols, image_row_bytes(dt, size_t(cols)), {}, {}};
  m.bytes.resize(m.stride * size_t(rows));
  m.f32.resize(size_t(rows) * cols);
  std::vector<float> row(static_cast<size_t>(cols));
  for (int r = 0; r < rows; ++r) {
    for (int c = 0; c < cols; ++c) row[size_t(c)] = nd(rng) * (rng() % 97 == 0 ? 40.0f : 1.0f);
    uint8_t* dst = m.bytes.data() + size_t(r) * m.stride;
    if (dt == ImageDtype::kQ8_0)
      quantize_row_q8_0(row.data(), reinterpret_cast<BlockQ8_0*>(dst), size_t(cols));
    else if (dt == ImageDtype::kQ4_0)
      quantize_row_q4_0(row.data(), reinterpret_cast<BlockQ4_0*>(dst), size_t(cols));
    else
      image_encode(dt, row.data(), size_t(cols), dst);
    kernels::dequantize_row(m.view(), r, m.f32.data() + size_t(r) * cols);
  }
  return m;
}

std::vector<float> random_x(int n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(n));
  for (float& v : x) v = nd(rng);
  return x;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

struct IsaGuard {
  kernels::Isa saved = kernels::active_isa();
  ~IsaGuard() { kernels::set_isa(saved); }
};

const ImageDtype kDtypes[] = {ImageDtype::kF32, ImageDtype::kF16, ImageDtype::kBF16, ImageDtype::kQ8_0,
                              ImageDtype::kQ4_0};

}  // namespace

// The interleaved q8_0 layout (dense weights in DRAM on paths with a kernel for it) changes where the bytes lie,
// never a number: every path's matmul over the interleaved copy equals the plain portable matmul bit for bit (rows
// not a multiple of the 4-row block, 1 and several tokens, several 8-block groups).
TEST_CASE("interleaved q8_0 rows give the plain layout's numbers on every path") {
  IsaGuard guard;
  for (int cols : {256, 288, 384, 480, 768, 2048}) {  // 288-480: one group and 1-7 plain blocks after it
    for (int n : {1, 3, 6}) {
      CAPTURE(cols);
      CAPTURE(n);
      const int rows = 13;
      TypedMatrix m = make_matrix(ImageDtype::kQ8_0, rows, cols, 7 + uint64_t(cols));
      const std::vector<float> x = random_x(n * cols, 3 + uint64_t(cols));
      kernels::set_isa(kernels::Isa::kPortable);
      std::vector<float> ref(size_t(n) * rows);
      kernels::matmul(ref.data(), x.data(), m.view(), n);
      std::vector<uint8_t> copy = m.bytes;
      WeightView v{ImageDtype::kQ8_0, copy.data(), rows, cols, m.stride};
      REQUIRE(kernels::q8_interleavable(v));
      kernels::q8_interleave(&v);
      CHECK(v.q8_x8);
      CHECK(copy != m.bytes);
      CHECK(!kernels::q8_interleavable(v));
      for (kernels::Isa isa : kernels::available_isas()) {
        CAPTURE(kernels::isa_name(isa));
        kernels::set_isa(isa);
        std::vector<float> y(size_t(n) * rows, -1.0f);
        kernels::matmul(y.data(), x.data(), v, n);
        CHECK(std::memcmp(y.data(), ref.data(), y.size() * sizeof(float)) == 0);
      }
    }
  }
  // Not interleavable: other dtypes, fewer than 8 blocks, a row stride with padding.
  TypedMatrix f = make_matrix(ImageDtype::kF16, 4, 256, 1), q = make_matrix(ImageDtype::kQ8_0, 4, 224, 1);
  CHECK(!kernels::q8_interleavable(f.view()));
  CHECK(!kernels::q8_interleavable(q.view()));
  TypedMatrix p = make_matrix(ImageDtype::kQ8_0, 4, 256, 1);
  WeightView padded = p.view();
  padded.row_stride += 64;
  CHECK(!kernels::q8_interleavable(padded));
}

TEST_CASE("every kernel path equals the portable reference bit for bit (row dots, matmul, down accumulation)") {
  IsaGuard guard;
  const auto isas = kernels::available_isas();
  MESSAGE("kernel paths here: " << [&] {
    std::string s;
    for (auto i : isas) s += std::string(kernels::isa_name(i)) + " ";
    return s;
  }());
  for (ImageDtype dt : kDtypes) {
    const bool q = image_dtype_quantized(dt);
    // Odd sizes: tails of every kind (not a multiple of 8 / 32 elements, or of 8 blocks).
    const std::vector<int> sizes = q ? std::vector<int>{32, 7 * 32, 8 * 32, 9 * 32, 17 * 32, 67 * 32}
                                     : std::vector<int>{1, 7, 31, 33, 64, 100, 257, 1031};
    for (int cols : sizes) {
      CAPTURE(image_dtype_name(dt));
      CAPTURE(cols);
      const int rows = 13, n = 3;
      TypedMatrix m = make_matrix(dt, rows, cols, 17 + uint64_t(cols));
      const std::vector<float> x = random_x(n * cols, 99 + uint64_t(cols));
      // Down: `rows` columns of length `cols` (the columns are the matrix rows), h random.
      const std::vector<float> h = random_x(rows, 5);
      std::vector<const uint8_t*> colp;
      for (int r = 0; r < rows; ++r) colp.push_back(m.bytes.data() + size_t(r) * m.stride);

      std::vector<float> ref_mm, ref_down;
      for (kernels::Isa isa : isas) {
        CAPTURE(kernels::isa_name(isa));
        kernels::set_isa(isa);
        std::vector<float> y(size_t(n) * rows), d(static_cast<size_t>(cols), -1.0f);
        kernels::matmul(y.data(), x.data(), m.view(), n);
        kernels::down_project(dt, d.data(), cols, h.data(), colp.data(), rows);
        if (ref_mm.empty()) {
          ref_mm = y;
          ref_down = d;
          // The portable reference against double precision over the stored values.
          for (int t = 0; t < n; ++t)
            for (int o = 0; o < rows; ++o) {
              std::vector<float> xr(x.begin() + t * cols, x.begin() + (t + 1) * cols);
              if (q) {  // the activations the kernel sees: q8_0
                std::vector<BlockQ8_0> xq(size_t(cols) / 32);
                quantize_row_q8_0(xr.data(), xq.data(), size_t(cols));
                dequantize_row_q8_0(xq.data(), xr.data(), size_t(cols));
              }
              double s = 0, mag = 0;
              for (int c = 0; c < cols; ++c) {
                s += double(m.f32[size_t(o) * cols + c]) * xr[size_t(c)];
                mag += std::fabs(double(m.f32[size_t(o) * cols + c]) * xr[size_t(c)]);
              }
              REQUIRE(std::fabs(y[size_t(t) * rows + o] - s) <= 1e-4 * mag + 1e-30);
            }
          for (int c = 0; c < cols; ++c) {
            double s = 0, mag = 0;
            for (int r = 0; r < rows; ++r) {
              s += double(h[size_t(r)]) * m.f32[size_t(r) * cols + c];
              mag += std::fabs(double(h[size_t(r)]) * m.f32[size_t(r) * cols + c]);
            }
            REQUIRE(std::fabs(d[size_t(c)] - s) <= 1e-4 * mag + 1e-30);
          }
        } else {
          CHECK(same_bits(y, ref_mm));
          CHECK(same_bits(d, ref_down));
        }
        // Token t of a batch = the same token alone (prefill = token by token).
        for (int t = 0; t < n; ++t) {
          std::vector<float> y1(static_cast<size_t>(rows));
          kernels::matmul(y1.data(), x.data() + size_t(t) * cols, m.view(), 1);
          CHECK(std::memcmp(y1.data(), y.data() + size_t(t) * rows, sizeof(float) * rows) == 0);
        }
      }
    }
  }
}

// Rows at listed addresses (the neuron cache's bundles): row_dots gives row_dot's bits row by row, on every path, for
// row counts around the kernels' row block and rows listed out of order (one twice); bundle_coefficients gives the
// one-neuron-at-a-time coefficients g_i * (up_i . x) with given, ReLU and SiLU gates (h = 0 where the gate is 0).
TEST_CASE("row_dots and bundle_coefficients equal row_dot row by row, bit for bit, every path") {
  IsaGuard guard;
  for (ImageDtype dt : kDtypes) {
    const bool q = image_dtype_quantized(dt);
    const std::vector<int> sizes =
        q ? std::vector<int>{32, 9 * 32, 12 * 32, 67 * 32} : std::vector<int>{7, 33, 100, 384, 1031};
    for (int cols : sizes) {
      CAPTURE(image_dtype_name(dt));
      CAPTURE(cols);
      const int rows = 37;  // bundles of [gate | up]: rows 2s and 2s + 1 of the matrix
      TypedMatrix m = make_matrix(dt, 2 * rows, cols, 41 + uint64_t(cols));
      const std::vector<float> x = random_x(cols, 43 + uint64_t(cols));
      kernels::PreparedX px;
      px.prepare(dt, x.data(), 1, cols);
      std::vector<const uint8_t*> list, bundles;
      for (int r = rows - 1; r >= 0; --r) list.push_back(m.bytes.data() + size_t(2 * r + 1) * m.stride);
      list.push_back(list[3]);
      for (int r = 0; r < rows; ++r) bundles.push_back(m.bytes.data() + size_t(2 * r) * m.stride);
      std::vector<float> gv(static_cast<size_t>(rows));
      for (int r = 0; r < rows; ++r) gv[size_t(r)] = r % 3 == 0 ? 0.0f : float(r - 18) / 7.0f;
      for (kernels::Isa isa : kernels::available_isas()) {
        CAPTURE(kernels::isa_name(isa));
        kernels::set_isa(isa);
        for (int n : {1, 3, 4, 5, 8, int(list.size())}) {
          std::vector<float> got(static_cast<size_t>(n), -1.0f);
          kernels::row_dots(dt, list.data(), n, px.row(0), cols, got.data());
          for (int i = 0; i < n; ++i) {
            const float want = kernels::row_dot(dt, list[size_t(i)], px.row(0), cols);
            CHECK(std::memcmp(&got[size_t(i)], &want, sizeof want) == 0);
          }
        }
        // Given / ReLU / FATReLU (floor 0.3) / SiLU gates, and dReLU's up through max(., 0) with given and own gates.
        const kernels::BundleAct acts[] = {
            {kernels::BundleGate::kGiven, 0.0f, false}, {kernels::BundleGate::kRelu, 0.0f, false},
            {kernels::BundleGate::kRelu, 0.3f, false},  {kernels::BundleGate::kSilu, 0.0f, false},
            {kernels::BundleGate::kGiven, 0.0f, true},  {kernels::BundleGate::kRelu, 0.0f, true}};
        for (const kernels::BundleAct& act : acts) {
          CAPTURE(int(act.gate));
          CAPTURE(act.floor);
          CAPTURE(act.up_relu);
          std::vector<float> h(static_cast<size_t>(rows), -1.0f);
          // the matrix rows hold [gate | up] pairs: stride 2 rows, so the up row follows at m.stride bytes, which
          // image_row_bytes(dt, cols) is (rows packed at their own size)
          REQUIRE(m.stride == image_row_bytes(dt, size_t(cols)));
          kernels::bundle_coefficients(dt, cols, px.row(0), act, gv.data(), bundles.data(), rows, h.data());
          int up_zeroed = 0;
          for (int r = 0; r < rows; ++r) {
            float g = gv[size_t(r)];
            if (act.gate != kernels::BundleGate::kGiven) {
              g = kernels::row_dot(dt, bundles[size_t(r)], px.row(0), cols);
              if (act.gate == kernels::BundleGate::kRelu)
                g = g > act.floor ? g : 0.0f;
              else
                g = g / (1.0f + std::exp(-g));
            }
            float u = kernels::row_dot(dt, bundles[size_t(r)] + m.stride, px.row(0), cols);
            if (act.up_relu && !(u > 0.0f)) {
              u = 0.0f;
              up_zeroed += g != 0.0f;
            }
            const float want = g == 0.0f ? 0.0f : g * u;
            CHECK(std::memcmp(&h[size_t(r)], &want, sizeof want) == 0);
          }
          if (act.up_relu) CHECK(up_zeroed > 0);  // the case has neurons whose up x <= 0 under a nonzero gate
        }
      }
    }
  }
}

// Prefill's token tiles (several tokens per weight load) change the loop, never a number: every (row, token) of a
// matmul over n = 1..13 tokens equals that token alone on the same path and on the portable one, for every dtype, the
// interleaved q8_0 layout, row counts that are not a multiple of the row block (or span several panels of blocks) and
// token counts of every remainder.
TEST_CASE("matmul over n tokens (token tiles) equals each token alone, bit for bit, every path") {
  IsaGuard guard;
  struct Case {
    ImageDtype dt;
    bool x8;
    int cols;
  };
  const Case cases[] = {
      {ImageDtype::kQ8_0, true, 256},  {ImageDtype::kQ8_0, true, 768}, {ImageDtype::kQ8_0, false, 288},
      {ImageDtype::kQ8_0, true, 384},  {ImageDtype::kQ8_0, true, 480}, {ImageDtype::kQ4_0, false, 320},
      {ImageDtype::kF16, false, 97},   {ImageDtype::kF16, false, 256}, {ImageDtype::kBF16, false, 131},
      {ImageDtype::kBF16, false, 512}, {ImageDtype::kF32, false, 75}};
  for (const Case& c : cases)
    for (int rows : {4, 13, 37, 133}) {  // 133: three panels of row blocks (the last one short) and a row left over
      const std::string dtype = image_dtype_name(c.dt);
      CAPTURE(dtype);
      CAPTURE(c.x8);
      CAPTURE(c.cols);
      CAPTURE(rows);
      TypedMatrix m = make_matrix(c.dt, rows, c.cols, 41 + uint64_t(rows) + uint64_t(c.cols));
      WeightView v = m.view();
      std::vector<uint8_t> copy = m.bytes;
      if (c.x8) {
        v.data = copy.data();
        REQUIRE(kernels::q8_interleavable(v));
        kernels::q8_interleave(&v);
      }
      const int max_n = 13;  // two whole tiles of the widest (f16 / bf16: 6 tokens), every remainder
      const std::vector<float> x = random_x(max_n * c.cols, 77 + uint64_t(rows));
      // The reference: each token alone on the portable path.
      kernels::set_isa(kernels::Isa::kPortable);
      std::vector<float> ref(size_t(max_n) * rows);
      for (int t = 0; t < max_n; ++t)
        kernels::matmul(ref.data() + size_t(t) * rows, x.data() + size_t(t) * c.cols, v, 1);
      for (kernels::Isa isa : kernels::available_isas()) {
        const std::string path = kernels::isa_name(isa);
        CAPTURE(path);
        kernels::set_isa(isa);
        std::vector<float> alone(size_t(max_n) * rows);
        for (int t = 0; t < max_n; ++t)
          kernels::matmul(alone.data() + size_t(t) * rows, x.data() + size_t(t) * c.cols, v, 1);
        CHECK(std::memcmp(alone.data(), ref.data(), alone.size() * sizeof(float)) == 0);
        for (int n = 1; n <= max_n; ++n) {
          CAPTURE(n);
          std::vector<float> y(size_t(n) * rows, -1.0f);
          kernels::matmul(y.data(), x.data(), v, n);
          CHECK(std::memcmp(y.data(), ref.data(), y.size() * sizeof(float)) == 0);
        }
      }
    }
}

// The down projection of several tokens at once (prefill's dense FFN) equals down_accum token by token over each
// token's own list of neurons (h != 0, slot order), every path, for every token count up to past two tiles.
TEST_CASE("down_tokens equals down_accum token by token, bit for bit, every path") {
  IsaGuard guard;
  for (ImageDtype dt : kDtypes) {
    const std::string dtype = image_dtype_name(dt);
    CAPTURE(dtype);
    const int hidden = 77, max_n = 17;
    const std::vector<int> lens =
        image_dtype_quantized(dt) ? std::vector<int>{32, 96, 128} : std::vector<int>{45, 96, 128};
    for (int len : lens) {
      CAPTURE(len);
      TypedMatrix m = make_matrix(dt, hidden, len, 5 + uint64_t(len));
      std::vector<float> h = random_x(max_n * hidden, 9);
      for (size_t i = 0; i < h.size(); ++i)
        if (i % 5 == 1 || i % 7 == 3) h[i] = 0.0f;                        // tokens differ in the neurons they sum
      for (int s = 0; s < hidden; ++s) h[size_t(4 * hidden + s)] = 0.0f;  // a token summing nothing
      std::vector<float> want(size_t(max_n) * len);
      kernels::set_isa(kernels::Isa::kPortable);
      for (int t = 0; t < max_n; ++t) {
        std::vector<float> hk;
        std::vector<const uint8_t*> cols;
        for (int s = 0; s < hidden; ++s)
          if (h[size_t(t * hidden + s)] != 0.0f) {
            hk.push_back(h[size_t(t * hidden + s)]);
            cols.push_back(m.bytes.data() + size_t(s) * m.stride);
          }
        kernels::down_accum(dt, want.data() + size_t(t) * len, 0, len, hk.data(), cols.data(), int(hk.size()));
      }
      for (kernels::Isa isa : kernels::available_isas()) {
        const std::string path = kernels::isa_name(isa);
        CAPTURE(path);
        kernels::set_isa(isa);
        for (int n : {1, 2, 7, 8, 9, 17}) {
          CAPTURE(n);
          std::vector<float> got(size_t(n) * len, -1.0f);
          kernels::DownCoeffs dc;
          dc.prepare(h.data(), size_t(hidden), hidden, n);
          kernels::down_tokens(dt, got.data(), size_t(len), len, dc, m.bytes.data(), m.stride);
          CHECK(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)) == 0);
        }
      }
    }
  }
}

TEST_CASE("matrix products and the down projection give the same bits for 1, 2, 3 and 4 threads") {
  const int saved = omp_get_max_threads();
  for (ImageDtype dt : kDtypes) {
    CAPTURE(image_dtype_name(dt));
    const int rows = 301, cols = 640, n = 5, active = 211;
    TypedMatrix m = make_matrix(dt, rows, cols, 3);
    const std::vector<float> x = random_x(n * cols, 4), h = random_x(active, 6);
    std::vector<const uint8_t*> colp;
    for (int r = 0; r < active; ++r) colp.push_back(m.bytes.data() + size_t(r) * m.stride);
    std::vector<float> ref_y, ref_d;
    for (int threads : {1, 2, 3, 4}) {
      omp_set_num_threads(threads);
      std::vector<float> y(size_t(n) * rows), d(static_cast<size_t>(cols));
      kernels::matmul(y.data(), x.data(), m.view(), n);
      kernels::down_project(dt, d.data(), cols, h.data(), colp.data(), active);
      if (ref_y.empty()) {
        ref_y = y;
        ref_d = d;
      }
      CHECK(same_bits(y, ref_y));
      CHECK(same_bits(d, ref_d));
    }
  }
  omp_set_num_threads(saved);
}

TEST_CASE("the down projection of a list in pieces (accumulate) gives the bits of the whole list, every path") {
  // FlashFfn projects a layer batch by batch (its read staging is bounded) and must equal one projection in slot order.
  IsaGuard guard;
  const int saved = omp_get_max_threads();
  for (kernels::Isa isa : kernels::available_isas()) {
    kernels::set_isa(isa);
    for (ImageDtype dt : kDtypes) {
      CAPTURE(kernels::isa_name(isa));
      CAPTURE(image_dtype_name(dt));
      const int rows = 97, cols = 640;
      TypedMatrix m = make_matrix(dt, rows, cols, 8);
      const std::vector<float> h = random_x(rows, 9);
      std::vector<const uint8_t*> colp;
      for (int r = 0; r < rows; ++r) colp.push_back(m.bytes.data() + size_t(r) * m.stride);
      std::vector<float> whole(static_cast<size_t>(cols));
      kernels::down_project(dt, whole.data(), cols, h.data(), colp.data(), rows);
      for (int threads : {1, 3}) {
        omp_set_num_threads(threads);
        std::vector<float> d(static_cast<size_t>(cols), 123.0f);  // overwritten by the first piece
        int i0 = 0, k = 0;
        for (int len : {0, 1, 30, 2, 64}) {
          kernels::down_project(dt, d.data(), cols, h.data() + i0, colp.data() + i0, len, k++ > 0);
          i0 += len;
        }
        REQUIRE(i0 == rows);
        CHECK(same_bits(d, whole));
      }
    }
  }
  omp_set_num_threads(saved);
}

// A list mixing two allocations (FlashFfn's down projection under --overlap layer: bundles in the read staging and
// cache hits in the slab, in slot order) whose first and last columns lie close together, ascending, while a column
// between them lies far above: it once passed the packed-columns test and the streaming path requested every line
// between the two allocations (a layer-token that never finished). In a child process with an alarm, so the bug
// fails the test instead of hanging it; the bits must equal the same columns listed from one buffer.
TEST_CASE("the down projection of columns from two far-apart allocations finishes, with the bits of one buffer") {
  IsaGuard guard;
  // Two fixed places 96 TiB apart, below the 47-bit user address space's end (x86-64 and aarch64 alike).
  const size_t len = 1 << 20;
#ifndef MAP_FIXED_NOREPLACE
#define MAP_FIXED_NOREPLACE 0x100000
#endif
  auto map_at = [len](uintptr_t at) {
    void* p = ::mmap(reinterpret_cast<void*>(at), len, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
    if (p != MAP_FAILED && p != reinterpret_cast<void*>(at)) ::munmap(p, len), p = MAP_FAILED;  // hint not honoured
    return p == MAP_FAILED ? nullptr : static_cast<uint8_t*>(p);
  };
  uint8_t* a = map_at(uintptr_t(0x100000000000));
  uint8_t* b = map_at(uintptr_t(0x700000000000));
  if (!a || !b) {
    if (a) ::munmap(a, len);
    if (b) ::munmap(b, len);
    nl::test::skip_part("far-apart columns: no fixed mappings at 16 TiB and 112 TiB in this address space");
    return;
  }
  for (ImageDtype dt : kDtypes) {
    CAPTURE(image_dtype_name(dt));
    const int rows = 5, cols = 256;
    TypedMatrix m = make_matrix(dt, rows, cols, 21);
    const std::vector<float> h = random_x(rows, 22);
    // Rows 0, 1, 3, 4 packed in `a` (stride: the row's bytes), row 2 in `b`; the same rows packed in one buffer.
    std::vector<const uint8_t*> mixed, one;
    for (int r = 0; r < rows; ++r) {
      uint8_t* at = r == 2 ? b : a + size_t(r < 2 ? r : r - 1) * m.stride;
      std::memcpy(at, m.bytes.data() + size_t(r) * m.stride, m.stride);
      mixed.push_back(at);
      one.push_back(m.bytes.data() + size_t(r) * m.stride);
    }
    for (kernels::Isa isa : kernels::available_isas()) {
      CAPTURE(kernels::isa_name(isa));
      kernels::set_isa(isa);
      std::vector<float> ref(static_cast<size_t>(cols)), got(static_cast<size_t>(cols));
      kernels::down_project(dt, ref.data(), cols, h.data(), one.data(), rows);
      const pid_t pid = ::fork();
      REQUIRE(pid >= 0);
      if (pid == 0) {
        ::alarm(20);
        kernels::down_project(dt, got.data(), cols, h.data(), mixed.data(), rows);
        ::_exit(same_bits(got, ref) ? 0 : 1);
      }
      int status = 0;
      REQUIRE(::waitpid(pid, &status, 0) == pid);
      INFO("child status " << status << " (SIGALRM " << SIGALRM << ": the projection did not finish in 20 s)");
      CHECK(WIFEXITED(status));
      CHECK((WIFEXITED(status) && WEXITSTATUS(status) == 0));
    }
  }
  ::munmap(a, len), ::munmap(b, len);
}

TEST_CASE("the dense FFN over re-laid-out bundles equals the gated bundle FFN bit for bit (every path, 1-3 threads)") {
  IsaGuard guard;
  const int saved = omp_get_max_threads();
  for (ImageDtype dt : kDtypes) {
    CAPTURE(image_dtype_name(dt));
    // dim 320: two down chunks of 128 and a partial one; hidden 77: not a multiple of any group.
    // n = 11: a whole down tile of 8 tokens and a partial one.
    const int dim = 320, hidden = 77, n = 11;
    const size_t rb = image_row_bytes(dt, size_t(dim)), bb = 3 * rb + 64;  // padded bundles, as images may be
    TypedMatrix gate = make_matrix(dt, hidden, dim, 11), up = make_matrix(dt, hidden, dim, 12),
                down = make_matrix(dt, hidden, dim, 13);
    std::vector<uint8_t> bundles(size_t(hidden) * bb, 0xAB);
    std::vector<const uint8_t*> bp;
    for (int s = 0; s < hidden; ++s) {
      uint8_t* b = bundles.data() + size_t(s) * bb;
      std::memcpy(b, gate.bytes.data() + size_t(s) * rb, rb);
      std::memcpy(b + rb, up.bytes.data() + size_t(s) * rb, rb);
      std::memcpy(b + 2 * rb, down.bytes.data() + size_t(s) * rb, rb);
      bp.push_back(b);
    }
    const std::vector<float> x = random_x(n * dim, 21);
    kernels::DenseBundles db(dt, dim, hidden, bundles.data(), bb);
    for (FfnAct act : {FfnAct::kRelu, FfnAct::kFatRelu, FfnAct::kDRelu, FfnAct::kSilu}) {
      CAPTURE(ffn_act_name(act));
      ModelConfig c;
      c.act = act;
      if (act == FfnAct::kFatRelu) c.fatrelu_threshold = 0.2f;
      // The gated path: per token, sparse gates from the bundles' own rows (with the model's floor and dReLU's up
      // rule); SiLU gates given (as FlashFfn computes them).
      const bool sparse = ffn_act_sparse(act);
      kernels::BundleAct ba;
      ba.floor = c.gate_floor();
      ba.up_relu = act == FfnAct::kDRelu;
      std::vector<float> want(size_t(n) * dim);
      for (int t = 0; t < n; ++t) {
        kernels::PreparedX px;
        px.prepare(dt, x.data() + size_t(t) * dim, 1, dim);
        std::vector<float> g(static_cast<size_t>(hidden));
        kernels::matmul(g.data(), px, gate.view(), 1);
        for (float& v : g) v = v / (1.0f + std::exp(-v));
        kernels::ffn_bundles(dt, dim, px, sparse ? nullptr : g.data(), bp.data(), hidden, want.data() + size_t(t) * dim,
                             ba);
      }
      for (kernels::Isa isa : kernels::available_isas()) {
        CAPTURE(kernels::isa_name(isa));
        kernels::set_isa(isa);
        for (int threads : {1, 2, 3}) {
          omp_set_num_threads(threads);
          std::vector<float> got(size_t(n) * dim, -1.0f);
          db.ffn(x.data(), n, c, got.data());
          CHECK(same_bits(got, want));
          std::vector<float> one(static_cast<size_t>(dim));  // token by token: the same numbers
          db.ffn(x.data() + dim, 1, c, one.data());
          CHECK(std::memcmp(one.data(), want.data() + dim, sizeof(float) * dim) == 0);
        }
      }
    }
  }
  omp_set_num_threads(saved);
}

// quantize_row_q8_0 rounds in integer steps where every |x * id| <= 128 (vectorizable) and with roundf elsewhere:
// the quants equal roundf's on random rows, exact halves (k + 0.5 after scaling), zeros and a tiny block.
TEST_CASE("quantize_row_q8_0 rounds half away from zero exactly as roundf") {
  std::mt19937_64 rng(29);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(size_t(kQuantBlock) * 64);
  for (size_t i = 0; i < x.size(); ++i) x[i] = nd(rng);
  for (int j = 0; j < kQuantBlock; ++j) x[size_t(j)] = float(j - 16) + 0.5f;
  for (int j = 0; j < kQuantBlock; ++j) x[size_t(kQuantBlock + j)] = float(2 * j - 31) / 2.0f * (15.5f / 127.0f);
  for (int j = 0; j < kQuantBlock; ++j) x[size_t(2 * kQuantBlock + j)] = 0.0f;
  for (int j = 0; j < kQuantBlock; ++j) x[size_t(3 * kQuantBlock + j)] = 1e-39f * float(j - 16);  // 1/d overflows
  std::vector<BlockQ8_0> q(x.size() / kQuantBlock);
  quantize_row_q8_0(x.data(), q.data(), x.size());
  for (size_t b = 0; b < q.size(); ++b) {
    const float* xb = x.data() + b * kQuantBlock;
    float amax = 0.0f;
    for (int j = 0; j < kQuantBlock; ++j) amax = std::max(amax, std::fabs(xb[j]));
    const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
    CHECK(q[b].d == f32_to_f16(d));
    for (int j = 0; j < kQuantBlock; ++j) {
      const float v = xb[j] * id;
      if (!(std::fabs(v) <= 128.0f)) continue;  // out of int8 range: no defined value to compare
      CHECK(int(q[b].qs[j]) == int(std::roundf(v)));
    }
  }
}

// The attention kernel (built for the machine's widest vectors) against its definition written out in scalars:
// dot()'s order (8 lane sums, the fixed reduction tree, the tail), the softmax, then the values summed position by
// position from zero. Widths with and without a tail, positions with and without a remainder of 8 and of 4.
TEST_CASE("attend equals the scalar definition bit for bit") {
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> u(-2.0f, 2.0f);
  for (int hd : {8, 12, 16, 48, 64, 128})
    for (int n_pos : {1, 3, 4, 7, 8, 15, 17, 33}) {
      const size_t stride = size_t(hd) * 3;  // heads side by side in a cache row
      std::vector<float> q(static_cast<size_t>(hd)), k(size_t(n_pos) * stride), v(size_t(n_pos) * stride);
      for (float& f : q) f = u(rng);
      for (float& f : k) f = u(rng);
      for (float& f : v) f = u(rng);
      const float scale = 1.0f / std::sqrt(float(hd));
      const size_t np = static_cast<size_t>(n_pos), nh = static_cast<size_t>(hd);
      std::vector<float> att(np), o(nh), ref_att(np), ref(nh, 0.0f);
      kernels::attend(o.data(), q.data(), k.data(), v.data(), stride, n_pos, hd, scale, att.data());
      for (int p = 0; p < n_pos; ++p) {
        const float* kr = k.data() + size_t(p) * stride;
        float lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        int i = 0;
        for (; i + 8 <= hd; i += 8)
          for (int l = 0; l < 8; ++l) lane[l] = lane[l] + q[size_t(i + l)] * kr[i + l];
        float tail = 0.0f;
        for (; i < hd; ++i) tail = tail + q[size_t(i)] * kr[i];
        const float s0 = lane[0] + lane[4], s1 = lane[1] + lane[5], s2 = lane[2] + lane[6], s3 = lane[3] + lane[7];
        ref_att[size_t(p)] = (((s0 + s2) + (s1 + s3)) + tail) * scale;
      }
      kernels::softmax(ref_att.data(), n_pos);
      for (int p = 0; p < n_pos; ++p)
        for (int i = 0; i < hd; ++i) ref[size_t(i)] = ref[size_t(i)] + ref_att[size_t(p)] * v[size_t(p) * stride + i];
      CAPTURE(hd);
      CAPTURE(n_pos);
      CHECK(std::memcmp(att.data(), ref_att.data(), sizeof(float) * att.size()) == 0);
      CHECK(std::memcmp(o.data(), ref.data(), sizeof(float) * o.size()) == 0);
    }
}

TEST_CASE("parallel_for / parallel_region: every index once; a region only where it runs on more than one thread") {
  const int saved = omp_get_max_threads();
  for (int threads : {1, 2}) {
    omp_set_num_threads(threads);
    for (bool worth : {false, true}) {
      CAPTURE(threads);
      CAPTURE(worth);
      const bool region = worth && threads > 1;
      std::vector<int> hits(1001, 0);
      std::vector<int> inside(1001, -1);
      parallel_for(long(hits.size()), worth, [&](long i) {
        ++hits[size_t(i)];
        inside[size_t(i)] = omp_in_parallel() ? 1 : 0;
      });
      CHECK(std::count(hits.begin(), hits.end(), 1) == long(hits.size()));
      CHECK(std::count(inside.begin(), inside.end(), region ? 1 : 0) == long(inside.size()));
      // An orphaned worksharing loop inside the region body covers the range once either way.
      std::vector<int> seen(777, 0);
      int calls = 0;
      parallel_region(worth, [&] {
#pragma omp atomic
        ++calls;
#pragma omp for schedule(static)
        for (int i = 0; i < int(seen.size()); ++i) ++seen[size_t(i)];
      });
      CHECK(calls == (region ? threads : 1));
      CHECK(std::count(seen.begin(), seen.end(), 1) == long(seen.size()));
    }
  }
  omp_set_num_threads(saved);
}
