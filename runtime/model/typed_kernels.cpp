// Typed-weight kernels (runtime/model/typed_kernels.h): the portable reference, x86 AVX2 (+F16C), AVX-VNNI and AVX-512
// paths, aarch64 NEON (+dotprod) paths, and the run-time dispatch. Every path follows the canonical orders the header
// defines; tests/test_runtime_kernels.cpp checks each available path bitwise against the portable one.
#include "runtime/model/typed_kernels.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <type_traits>

#include "formats/core/error.h"
#include "formats/core/half.h"
#include "runtime/model/model.h"
#include "runtime/parallel.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif
#if defined(__aarch64__)
#include <arm_neon.h>
#include <sys/auxv.h>
#ifndef HWCAP_ASIMDDP
#define HWCAP_ASIMDDP (1 << 20)
#endif
#endif

// The 8-lane helpers are always inlined into their callers; no vector ABI crosses a call.
#pragma GCC diagnostic ignored "-Wpsabi"

namespace nl::kernels {
namespace {

typedef float v8f __attribute__((vector_size(32)));

// Activations (tokens x cols) below which their quantization stays on the calling thread.
constexpr long kParallelQuant = 1L << 14;
// Outputs per down-projection chunk: one quantization block.
constexpr int kChunk = kQuantBlock;
// Tokens per token tile (matmul with n > 1): with kRowBlock rows, the tile's accumulators fill half of AVX-512's
// 32 vector registers (one 8-lane accumulator per row and token for q8_0).
constexpr int kTokenTile = 4;
// The f16 / bf16 tile's tokens: 24 accumulators, 4 converted weight vectors and one activation vector (29 of 32
// registers); each conversion serves 6 FMAs instead of 4. ~1B SiLU shape's f16 prefill, 1 thread, AMD EPYC (Zen 4), 3
// alternated rounds: 34.33 -> 35.57 tok/s at 64 prompt tokens, 31.97 -> 33.42 at 512 (faster in 6 of 6); same tokens.
constexpr int kTokenTileH16 = 6;
// Tokens per down-projection tile (down_tokens): 2 accumulators (32 outputs) each, a weight block converted once.
constexpr int kDownTokens = kDownTokenTile;

// A prepared q8_0 activation row (PreparedX::row): nb blocks, padding to 4 bytes, then nb int32 sums of each block's
// 32 quants (the VNNI paths' offset correction; exact integers).
inline size_t xq_sums_offset(int nb) { return (size_t(nb) * sizeof(BlockQ8_0) + 3) & ~size_t(3); }
inline size_t xq_record_bytes(int nb) { return xq_sums_offset(nb) + sizeof(int32_t) * size_t(nb); }
inline const int32_t* xq_sums(const BlockQ8_0* x, int nb) {
  return reinterpret_cast<const int32_t*>(reinterpret_cast<const uint8_t*>(x) + xq_sums_offset(nb));
}
// The interleaved record (PreparedX::row_x8) appends, for the token-tiled kernels, each block's scale as f32 and its
// sum times -128 (the VNNI offset correction, negated: the tile starts its sums from it), so a tile converts and
// shifts them once per token, not once per row.
inline size_t x8_record_bytes(int nb) { return xq_record_bytes(nb) + 2 * sizeof(int32_t) * size_t(nb); }
inline const float* x8_scales(const uint8_t* x, int nb) {
  return reinterpret_cast<const float*>(x + xq_record_bytes(nb));
}
inline const int32_t* x8_corr(const uint8_t* x, int nb) {
  return reinterpret_cast<const int32_t*>(x + xq_record_bytes(nb) + sizeof(float) * size_t(nb));
}

__attribute__((always_inline)) inline float reduce8(const float* a) {
  const float s0 = a[0] + a[4], s1 = a[1] + a[5], s2 = a[2] + a[6], s3 = a[3] + a[7];
  return (s0 + s2) + (s1 + s3);
}

// Where a multi-row kernel finds its rows: `stride` bytes apart (a matrix; its kernels request the next row block's
// bytes as they go), or at listed addresses (bundles scattered in the neuron cache: nothing regular to request ahead).
struct StrideRows {
  const uint8_t* w;
  size_t stride;
  static constexpr bool kAhead = true;
  const uint8_t* operator[](int r) const { return w + size_t(r) * stride; }
};
// Listed rows, and the rows of the next call (`next`, the same count; null: none) whose bytes the kernel requests
// step by step as it goes: a few lines per step spread over the compute, where one burst of the next block's whole
// rows before it stalled on full miss buffers (the listed-row kernels below; row_dots).
struct ListRows {
  const uint8_t* const* w;
  const uint8_t* const* next = nullptr;
  static constexpr bool kAhead = false;
  const uint8_t* operator[](int r) const { return w[r]; }
};

// Software prefetch of a byte range (no effect on any number). Rows inside bundles are short runs at a large
// stride ([gate | up | down] per neuron), which the hardware stream prefetchers do not follow across the gaps:
// the dot and down loops request the next rows' bytes ahead themselves.
inline void prefetch_bytes(const void* p, size_t n) {
  const char* c = static_cast<const char*>(p);
  for (size_t o = 0; o < n; o += 64) __builtin_prefetch(c + o);
}
// Neurons (down) whose column slices are requested ahead of the one being summed.
constexpr int kDownAhead = 4;
// The bytes of outputs [o0, o1) in a down column of dtype dt (block-aligned for quantized ones).
inline void prefetch_col(ImageDtype dt, const uint8_t* col, int o0, int o1) {
  if (image_dtype_quantized(dt)) {
    const size_t bb = image_row_bytes(dt, kQuantBlock), b0 = size_t(o0) / kQuantBlock;
    prefetch_bytes(col + b0 * bb, (size_t(o1 + kQuantBlock - 1) / kQuantBlock - b0) * bb);
  } else {
    const size_t es = image_row_bytes(dt, 1);
    prefetch_bytes(col + size_t(o0) * es, size_t(o1 - o0) * es);
  }
}

inline uint16_t ld16(const uint8_t* p, size_t i) {
  uint16_t v;
  std::memcpy(&v, p + 2 * i, 2);
  return v;
}
// An f16 (Bf16 false) or bf16 value widened to f32 (exact).
template <bool Bf16>
inline float h16_to_f32(uint16_t v) {
  return Bf16 ? bf16_to_f32(v) : f16_to_f32(v);
}
// The scalar tail of an f16 / bf16 row dot, elements [i, n): fma(w_j, x_j, tail) in order (every path's own tail).
template <bool Bf16>
inline float h16_tail(const uint8_t* w, const float* x, int i, int n) {
  float tail = 0.0f;
  for (; i < n; ++i) tail = std::fma(h16_to_f32<Bf16>(ld16(w, size_t(i))), x[i], tail);
  return tail;
}

using TileFn = void (*)(const uint8_t* w, size_t stride, const uint8_t* x, size_t x_stride, int nt, int n, float* y,
                        size_t y_stride);

using DownTileFn = void (*)(float* out, size_t out_stride, int len, const float* h, const uint8_t* mask,
                            const uint8_t* base, size_t slice_bytes, int hidden, int nt);

struct Table {
  float (*dot_f16)(const uint8_t* w, const float* x, int n);
  float (*dot_bf16)(const uint8_t* w, const float* x, int n);
  float (*dot_q8)(const BlockQ8_0* w, const BlockQ8_0* x, int nb);
  float (*dot_q4)(const BlockQ4_0* w, const BlockQ8_0* x, int nb);
  // kRowBlock consecutive rows (`stride` bytes apart) against one activation row: y[r] = dot_f16(w + r * stride, x).
  void (*rows_f16)(const uint8_t* w, size_t stride, const float* x, int n, float* y);
  void (*rows_bf16)(const uint8_t* w, size_t stride, const float* x, int n, float* y);
  void (*down_f16)(float* out, int o0, int o1, const float* h, const uint8_t* const* cols, int na);
  void (*down_bf16)(float* out, int o0, int o1, const float* h, const uint8_t* const* cols, int na);
  void (*down_q8)(float* out, int o0, int o1, const float* h, const uint8_t* const* cols, int na);
  void (*down_q4)(float* out, int o0, int o1, const float* h, const uint8_t* const* cols, int na);
  // kRowBlock consecutive q8_0 / q4_0 rows against one prepared q8_0 activation row (PreparedX::row, `n` = cols):
  // y[r] = dot_q8 / dot_q4 of row r, bit for bit. Null where a path has none (matmul then dots row by row).
  void (*rows_q8)(const uint8_t* w, size_t stride, const void* x, int n, float* y) = nullptr;
  void (*rows_q4)(const uint8_t* w, size_t stride, const void* x, int n, float* y) = nullptr;
  // The same for interleaved q8_0 rows (q8_interleave) against PreparedX::row_x8. Null: the portable one runs.
  void (*rows_q8x8)(const uint8_t* w, size_t stride, const void* x, int n, float* y) = nullptr;
  float (*dot_q8x8)(const uint8_t* w, const void* x, int n) = nullptr;
  // Token tiles (prefill): kRowBlock rows (`stride` bytes apart) against nt <= kTokenTile (f16 / bf16: kTokenTileH16)
  // consecutive tokens (token t's activation row at x + t * x_stride bytes), y[t * y_stride + r] = the one-row dot of
  // row r and token t, bit for bit; each weight block is loaded (and converted) once for all nt tokens. Null: matmul
  // runs token by token.
  TileFn tile_q8x8 = nullptr;
  TileFn tile_f16 = nullptr;
  TileFn tile_bf16 = nullptr;
  // Down projection of up to kDownTokens tokens over one slice block (down_tokens): h token-minor ([s][kDownTokens]),
  // mask[s] bit t = token t sums neuron s. Null: down_tokens runs down_accum token by token.
  DownTileFn down_tile_q8 = nullptr;
  DownTileFn down_tile_q4 = nullptr;
  DownTileFn down_tile_f16 = nullptr;
  DownTileFn down_tile_bf16 = nullptr;
  // The multi-row kernels prefetch the next row block themselves (prefetch_ahead): matmul adds no burst of its own.
  bool rows_prefetch = false;
};

// kRowBlock rows at listed addresses against one prepared activation row (row_dots): y[r] = row_dot of row r, bit for
// bit; `next` (null: none) lists the kRowBlock rows of the next call, requested while these are computed (ListRows).
// One per dtype; null where a path has none (row_dots then runs row_dot row by row).
using RowsListFn = void (*)(const uint8_t* const* w, const uint8_t* const* next, const void* x, int n, float* y);
struct ListTable {
  RowsListFn f32 = nullptr, f16 = nullptr, bf16 = nullptr, q8 = nullptr, q4 = nullptr;
};
const ListTable kListNone = {};

// Interleaved q8_0 (q8_interleave): a group of 8 blocks is 272 bytes, its 8 scales first, then 8 steps of 32 bytes.
constexpr int kX8Group = 8 * int(sizeof(BlockQ8_0));
constexpr int kX8Quants = 16;  // offset of the quants in a group
// Offset in a group of quant i of block j.
constexpr int x8_offset(int j, int i) { return kX8Quants + 32 * (i >> 2) + 4 * j + (i & 3); }
// nb plain blocks at `src` written interleaved to `dst` (not overlapping): the whole 8-block groups interleaved, the
// last nb % 8 blocks after them as they are (the plain layout's bytes).
void x8_interleave_row(uint8_t* dst, const uint8_t* src, int nb) {
  const int ng = nb / 8;
  std::memcpy(dst + size_t(ng) * kX8Group, src + size_t(ng) * kX8Group, size_t(nb - 8 * ng) * sizeof(BlockQ8_0));
  for (int g = 0; g < ng; ++g) {
    const BlockQ8_0* b = reinterpret_cast<const BlockQ8_0*>(src) + size_t(g) * 8;
    uint8_t* o = dst + size_t(g) * kX8Group;
    for (int j = 0; j < 8; ++j) {
      std::memcpy(o + 2 * j, &b[j].d, 2);
      for (int i = 0; i < kQuantBlock; ++i) o[x8_offset(j, i)] = uint8_t(b[j].qs[i]);
    }
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Portable reference.

template <float (*Cvt)(uint16_t)>
float dot_h16_port(const uint8_t* w, const float* x, int n) {
  float acc[32] = {};
  int i = 0;
  for (; i + 32 <= n; i += 32)
    for (int l = 0; l < 32; ++l) acc[l] = std::fma(Cvt(ld16(w, size_t(i + l))), x[i + l], acc[l]);
  float s[8];
  for (int l = 0; l < 8; ++l) s[l] = (acc[l] + acc[l + 8]) + (acc[l + 16] + acc[l + 24]);
  float tail = 0.0f;
  for (; i < n; ++i) tail = std::fma(Cvt(ld16(w, size_t(i))), x[i], tail);
  return reduce8(s) + tail;
}

template <float (*Dot)(const uint8_t*, const float*, int)>
void rows_port(const uint8_t* w, size_t stride, const float* x, int n, float* y) {
  for (int r = 0; r < kRowBlock; ++r) y[r] = Dot(w + size_t(r) * stride, x, n);
}

inline int32_t isum_q8(const BlockQ8_0& w, const BlockQ8_0& x) {
  int32_t s = 0;
  for (int j = 0; j < kQuantBlock; ++j) s += int32_t(w.qs[j]) * int32_t(x.qs[j]);
  return s;
}
inline int32_t isum_q4(const BlockQ4_0& w, const BlockQ8_0& x) {
  int32_t s = 0;
  for (int j = 0; j < kQuantBlock / 2; ++j)
    s += (int32_t(w.qs[j] & 15) - 8) * int32_t(x.qs[j]) + (int32_t(w.qs[j] >> 4) - 8) * int32_t(x.qs[j + 16]);
  return s;
}

// The float part of the block dot, shared by every path that computes per-block integer sums itself.
template <class B>
__attribute__((always_inline)) inline void block_lanes(float* acc, const int32_t* isum, const B* w,
                                                       const BlockQ8_0* x) {
  for (int l = 0; l < 8; ++l) acc[l] += float(isum[l]) * (f16_to_f32(w[l].d) * f16_to_f32(x[l].d));
}

template <class B, int32_t (*Isum)(const B&, const BlockQ8_0&)>
float dot_blocks_port(const B* w, const BlockQ8_0* x, int nb) {
  float acc[8] = {};
  int b = 0;
  for (; b + 8 <= nb; b += 8) {
    int32_t s[8];
    for (int l = 0; l < 8; ++l) s[l] = Isum(w[b + l], x[b + l]);
    block_lanes(acc, s, w + b, x + b);
  }
  float tail = 0.0f;
  for (; b < nb; ++b) tail += float(Isum(w[b], x[b])) * (f16_to_f32(w[b].d) * f16_to_f32(x[b].d));
  return reduce8(acc) + tail;
}

// dot_blocks_port's numbers from interleaved bytes: block 8g + j into lane j, reduce8, then the plain tail blocks.
float dot_q8x8_port(const uint8_t* w, const void* xv, int n) {
  const uint8_t* x = static_cast<const uint8_t*>(xv);
  const int nb = n / kQuantBlock, ng = nb / 8;
  float acc[8] = {};
  for (int g = 0; g < ng; ++g) {
    const uint8_t* wg = w + size_t(g) * kX8Group;
    const uint8_t* xg = x + size_t(g) * kX8Group;
    for (int j = 0; j < 8; ++j) {
      int32_t isum = 0;
      for (int i = 0; i < kQuantBlock; ++i)
        isum += int32_t(int8_t(wg[x8_offset(j, i)])) * int32_t(int8_t(xg[x8_offset(j, i)]));
      acc[j] += float(isum) * (f16_to_f32(ld16(wg, size_t(j))) * f16_to_f32(ld16(xg, size_t(j))));
    }
  }
  const BlockQ8_0* wt = reinterpret_cast<const BlockQ8_0*>(w + size_t(ng) * kX8Group);
  const BlockQ8_0* xt = reinterpret_cast<const BlockQ8_0*>(x + size_t(ng) * kX8Group);
  float tail = 0.0f;
  for (int b = 0; b < nb - 8 * ng; ++b)
    tail += float(isum_q8(wt[b], xt[b])) * (f16_to_f32(wt[b].d) * f16_to_f32(xt[b].d));
  return reduce8(acc) + tail;
}

template <float (*Cvt)(uint16_t)>
void down_h16_port(float* out, int o0, int o1, const float* h, const uint8_t* const* cols, int na) {
  for (int i = 0; i < na; ++i)
    for (int o = o0; o < o1; ++o) out[o] = std::fma(h[i], Cvt(ld16(cols[i], size_t(o))), out[o]);
}

void down_q8_port(float* out, int o0, int o1, const float* h, const uint8_t* const* cols, int na) {
  for (int b = o0 / kQuantBlock; b * kQuantBlock < o1; ++b)
    for (int i = 0; i < na; ++i) {
      const BlockQ8_0& blk = reinterpret_cast<const BlockQ8_0*>(cols[i])[b];
      const float c = h[i] * f16_to_f32(blk.d);
      float* y = out + size_t(b) * kQuantBlock;
      for (int j = 0; j < kQuantBlock; ++j) y[j] += c * float(blk.qs[j]);
    }
}

void down_q4_port(float* out, int o0, int o1, const float* h, const uint8_t* const* cols, int na) {
  for (int b = o0 / kQuantBlock; b * kQuantBlock < o1; ++b)
    for (int i = 0; i < na; ++i) {
      const BlockQ4_0& blk = reinterpret_cast<const BlockQ4_0*>(cols[i])[b];
      const float c = h[i] * f16_to_f32(blk.d);
      float* y = out + size_t(b) * kQuantBlock;
      for (int j = 0; j < kQuantBlock / 2; ++j) {
        y[j] += c * float(int(blk.qs[j] & 15) - 8);
        y[j + 16] += c * float(int(blk.qs[j] >> 4) - 8);
      }
    }
}

// Each output is its own sum of separately rounded products, so any vector width gives these bits: the compiler's
// vectorization for the widest unit the CPU has (x86 function clones; the baseline one elsewhere).
#if defined(__x86_64__)
__attribute__((target_clones("avx512f", "avx2", "default")))
#endif
void down_f32(float* out, int o0, int o1, const float* h, const uint8_t* const* cols, int na) {
  for (int i = 0; i < na; ++i) {
    const float* c = reinterpret_cast<const float*>(cols[i]);
    const float hi = h[i];
    for (int o = o0; o < o1; ++o) out[o] += hi * c[o];
  }
}

const Table kPortable = {dot_h16_port<f16_to_f32>,
                         dot_h16_port<bf16_to_f32>,
                         dot_blocks_port<BlockQ8_0, isum_q8>,
                         dot_blocks_port<BlockQ4_0, isum_q4>,
                         rows_port<dot_h16_port<f16_to_f32>>,
                         rows_port<dot_h16_port<bf16_to_f32>>,
                         down_h16_port<f16_to_f32>,
                         down_h16_port<bf16_to_f32>,
                         down_q8_port,
                         down_q4_port};

// ---------------------------------------------------------------------------------------------------------------
// x86: AVX2 + F16C (every x86-64-v3 CPU), and the same with VNNI integer dots (AVX-VNNI or AVX512-VNNI+VL).
#if defined(__x86_64__)
#define NL_AVX2 __attribute__((target("avx2,f16c,fma")))
#define NL_VNNI __attribute__((target("avx2,f16c,fma,avxvnni")))
// One f16 scale widened by F16C (exact, so f16_to_f32's value): the software conversion's branches cost more than
// the 32 products it scales in the down loops.
NL_AVX2 inline float f16c_to_f32(uint16_t h) { return _cvtsh_ss(h); }

template <bool Bf16>
NL_AVX2 inline __m256 cvt8(const uint8_t* p) {
  const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  if constexpr (Bf16)
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(v), 16));
  else
    return _mm256_cvtph_ps(v);
}

// R rows (`stride` bytes apart) against one x: 4 accumulators per row (lanes 0-7, 8-15, 16-23, 24-31); with R = 2,
// eight independent FMA chains hide the FMA latency that one row's four wait on.
template <bool Bf16, int R, class Rows>
NL_AVX2 inline void dot_h16_avx2_rows(Rows w, const float* x, int n, float* y) {
  __m256 a[R][4];
  for (int r = 0; r < R; ++r) a[r][0] = a[r][1] = a[r][2] = a[r][3] = _mm256_setzero_ps();
  int i = 0;
  for (; i + 32 <= n; i += 32) {
    const __m256 x0 = _mm256_loadu_ps(x + i), x1 = _mm256_loadu_ps(x + i + 8), x2 = _mm256_loadu_ps(x + i + 16),
                 x3 = _mm256_loadu_ps(x + i + 24);
    if constexpr (!Rows::kAhead)
      if (w.next)
        for (int r = 0; r < R; ++r) __builtin_prefetch(w.next[r] + 2 * size_t(i));
    for (int r = 0; r < R; ++r) {
      const uint8_t* wr = w[r] + 2 * size_t(i);
      a[r][0] = _mm256_fmadd_ps(cvt8<Bf16>(wr), x0, a[r][0]);
      a[r][1] = _mm256_fmadd_ps(cvt8<Bf16>(wr + 16), x1, a[r][1]);
      a[r][2] = _mm256_fmadd_ps(cvt8<Bf16>(wr + 32), x2, a[r][2]);
      a[r][3] = _mm256_fmadd_ps(cvt8<Bf16>(wr + 48), x3, a[r][3]);
    }
  }
  if constexpr (!Rows::kAhead)
    if (w.next && i < n)
      for (int r = 0; r < R; ++r) prefetch_bytes(w.next[r] + 2 * size_t(i), 2 * size_t(n - i));
  for (int r = 0; r < R; ++r) {
    const uint8_t* wr = w[r];
    alignas(32) float s[8];
    _mm256_store_ps(s, _mm256_add_ps(_mm256_add_ps(a[r][0], a[r][1]), _mm256_add_ps(a[r][2], a[r][3])));
    const float tail = h16_tail<Bf16>(wr, x, i, n);
    y[r] = reduce8(s) + tail;
  }
}
template <bool Bf16>
NL_AVX2 float dot_h16_avx2(const uint8_t* w, const float* x, int n) {
  float y;
  dot_h16_avx2_rows<Bf16, 1>(StrideRows{w, 0}, x, n, &y);
  return y;
}
template <bool Bf16>
NL_AVX2 void rows_h16_avx2(const uint8_t* w, size_t stride, const float* x, int n, float* y) {
  static_assert(kRowBlock % 2 == 0);
  for (int r = 0; r < kRowBlock; r += 2)
    dot_h16_avx2_rows<Bf16, 2>(StrideRows{w + size_t(r) * stride, stride}, x, n, y + r);
}
template <bool Bf16>
NL_AVX2 void rowsl_h16_avx2(const uint8_t* const* w, const uint8_t* const* next, const void* x, int n, float* y) {
  for (int r = 0; r < kRowBlock; r += 2)
    dot_h16_avx2_rows<Bf16, 2>(ListRows{w + r, next ? next + r : nullptr}, static_cast<const float*>(x), n, y + r);
}

// f32 rows at listed addresses: kernels::dot's numbers (8 lanes, products and sums rounded separately, reduce8, the
// scalar tail), R rows' add chains side by side (one row alone waits on its chain's add latency).
template <int R>
NL_AVX2 void rowsl_f32_avx2(const uint8_t* const* w, const uint8_t* const* next, const void* xv, int n, float* y) {
  const float* x = static_cast<const float*>(xv);
  __m256 a[R];
  for (int r = 0; r < R; ++r) a[r] = _mm256_setzero_ps();
  int i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 xi = _mm256_loadu_ps(x + i);
    if (next && i % 16 == 0)  // one line of each next row per 64 bytes of these
      for (int r = 0; r < R; ++r) __builtin_prefetch(next[r] + 4 * size_t(i));
    for (int r = 0; r < R; ++r)
      a[r] = _mm256_add_ps(a[r], _mm256_mul_ps(_mm256_loadu_ps(reinterpret_cast<const float*>(w[r]) + i), xi));
  }
  for (int r = 0; r < R; ++r) {
    const float* wr = reinterpret_cast<const float*>(w[r]);
    alignas(32) float s[8];
    _mm256_store_ps(s, a[r]);
    float tail = 0.0f;
    for (int j = i; j < n; ++j) tail += wr[j] * x[j];
    y[r] = reduce8(s) + tail;
    const int asked = (i + 15) / 16 * 16;  // floats whose lines the loop requested
    if (next && asked < n) prefetch_bytes(next[r] + 4 * size_t(asked), 4 * size_t(n - asked));
  }
}

// Eight int32x8 vectors to one: lane k = the sum of vector k's lanes (integer: exact in any order).
NL_AVX2 inline __m256i hsum8x8(const __m256i* s) {
  const __m256i h01 = _mm256_hadd_epi32(s[0], s[1]), h23 = _mm256_hadd_epi32(s[2], s[3]);
  const __m256i h45 = _mm256_hadd_epi32(s[4], s[5]), h67 = _mm256_hadd_epi32(s[6], s[7]);
  const __m256i a = _mm256_hadd_epi32(h01, h23), b = _mm256_hadd_epi32(h45, h67);
  return _mm256_add_epi32(_mm256_permute2x128_si256(a, b, 0x20), _mm256_permute2x128_si256(a, b, 0x31));
}

// The sum of 8 int32 lanes (exact), for one block's dot after the last whole 8-block group.
NL_AVX2 inline int32_t hsum_epi32(__m256i s) {
  __m128i v = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
  v = _mm_add_epi32(v, _mm_shuffle_epi32(v, 0x4e));
  v = _mm_add_epi32(v, _mm_shuffle_epi32(v, 0xb1));
  return _mm_cvtsi128_si32(v);
}

// 32 signed weights (-127..127 as the quantizers write them, or -8..7) times 32 int8 activations, as 8 int32 partial
// sums. maddubs on |w| and sign(w) * x is exact for |w| <= 127 (a -128 weight could saturate: no quantizer writes one).
NL_AVX2 inline __m256i idot32_avx2(__m256i w, __m256i x) {
  const __m256i aw = _mm256_sign_epi8(w, w), sx = _mm256_sign_epi8(x, w);
  return _mm256_madd_epi16(_mm256_maddubs_epi16(aw, sx), _mm256_set1_epi16(1));
}
NL_VNNI inline __m256i idot32_vnni(__m256i w, __m256i x) {
  const __m256i aw = _mm256_sign_epi8(w, w), sx = _mm256_sign_epi8(x, w);
  return _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), aw, sx);
}

NL_AVX2 inline __m256i q4_unpack(const BlockQ4_0& b) {
  const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b.qs));
  const __m128i m = _mm_set1_epi8(15);
  const __m256i lohi = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(v, 4), m), _mm_and_si128(v, m));
  return _mm256_sub_epi8(lohi, _mm256_set1_epi8(8));
}

NL_AVX2 inline __m256i wq32(const BlockQ8_0& b) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qs)); }
NL_AVX2 inline __m256i wq32(const BlockQ4_0& b) { return q4_unpack(b); }

// One body, two targets (the VNNI one may use VNNI anywhere, the AVX2 one must not).
#define NL_DOT_BLOCKS_X86(NAME, TARGET, IDOT)                                                                \
  template <class B, int32_t (*Isum)(const B&, const BlockQ8_0&)>                                            \
  TARGET float NAME(const B* w, const BlockQ8_0* x, int nb) {                                                \
    __m256 acc = _mm256_setzero_ps();                                                                        \
    int b = 0;                                                                                               \
    for (; b + 8 <= nb; b += 8) {                                                                            \
      __m256i s[8];                                                                                          \
      alignas(16) uint16_t dw[8], dx[8];                                                                     \
      for (int k = 0; k < 8; ++k) {                                                                          \
        s[k] = IDOT(wq32(w[b + k]), _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[b + k].qs)));      \
        dw[k] = w[b + k].d;                                                                                  \
        dx[k] = x[b + k].d;                                                                                  \
      }                                                                                                      \
      const __m256 d = _mm256_mul_ps(_mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(dw))),  \
                                     _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(dx)))); \
      acc = _mm256_add_ps(acc, _mm256_mul_ps(_mm256_cvtepi32_ps(hsum8x8(s)), d));                            \
    }                                                                                                        \
    alignas(32) float a[8];                                                                                  \
    _mm256_store_ps(a, acc);                                                                                 \
    float tail = 0.0f;                                                                                       \
    for (; b < nb; ++b) {                                                                                    \
      const int32_t isum =                                                                                   \
          hsum_epi32(IDOT(wq32(w[b]), _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[b].qs))));       \
      tail += float(isum) * (f16c_to_f32(w[b].d) * f16c_to_f32(x[b].d));                                     \
    }                                                                                                        \
    return reduce8(a) + tail;                                                                                \
  }
NL_DOT_BLOCKS_X86(dot_blocks_avx2, NL_AVX2, idot32_avx2)
NL_DOT_BLOCKS_X86(dot_blocks_vnni, NL_VNNI, idot32_vnni)
#undef NL_DOT_BLOCKS_X86

// Neuron-major over the whole output range: each column slice is read contiguously (prefetch and TLB friendly) while
// the partial sums stay in L1; per output the operations are the portable ones, in the same order.
template <bool Bf16>
NL_AVX2 void down_h16_avx2(float* out, int o0, int o1, const float* h, const uint8_t* const* cols, int na) {
  const int o8 = o0 + (o1 - o0) / 8 * 8;
  for (int i = 0; i < na; ++i) {
    if (i + kDownAhead < na) prefetch_col(ImageDtype::kF16, cols[i + kDownAhead], o0, o1);
    const __m256 hv = _mm256_set1_ps(h[i]);
    const uint8_t* c = cols[i];
    for (int o = o0; o < o8; o += 8)
      _mm256_storeu_ps(out + o, _mm256_fmadd_ps(hv, cvt8<Bf16>(c + 2 * size_t(o)), _mm256_loadu_ps(out + o)));
  }
  // The last outputs, neuron after neuron as well (each output is its own sum: the same order).
  if (o8 < o1) down_h16_port<h16_to_f32<Bf16>>(out, o8, o1, h, cols, na);
}

NL_AVX2 inline __m256 i8x8_to_f32(__m128i v) { return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v)); }

template <bool Q4>
NL_AVX2 void down_blocks_avx2(float* out, int o0, int o1, const float* h, const uint8_t* const* cols, int na) {
  const int b0 = o0 / kQuantBlock, b1 = (o1 + kQuantBlock - 1) / kQuantBlock;
  for (int i = 0; i < na; ++i) {
    if (i + kDownAhead < na) prefetch_col(Q4 ? ImageDtype::kQ4_0 : ImageDtype::kQ8_0, cols[i + kDownAhead], o0, o1);
    for (int b = b0; b < b1; ++b) {
      __m256i q;
      float d;
      if constexpr (Q4) {
        const BlockQ4_0& blk = reinterpret_cast<const BlockQ4_0*>(cols[i])[b];
        q = q4_unpack(blk);
        d = f16c_to_f32(blk.d);
      } else {
        const BlockQ8_0& blk = reinterpret_cast<const BlockQ8_0*>(cols[i])[b];
        q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk.qs));
        d = f16c_to_f32(blk.d);
      }
      const __m256 c = _mm256_set1_ps(h[i] * d);
      float* y = out + size_t(b) * kQuantBlock;
      const __m128i lo = _mm256_castsi256_si128(q), hi = _mm256_extracti128_si256(q, 1);
      _mm256_storeu_ps(y, _mm256_add_ps(_mm256_loadu_ps(y), _mm256_mul_ps(c, i8x8_to_f32(lo))));
      _mm256_storeu_ps(y + 8,
                       _mm256_add_ps(_mm256_loadu_ps(y + 8), _mm256_mul_ps(c, i8x8_to_f32(_mm_srli_si128(lo, 8)))));
      _mm256_storeu_ps(y + 16, _mm256_add_ps(_mm256_loadu_ps(y + 16), _mm256_mul_ps(c, i8x8_to_f32(hi))));
      _mm256_storeu_ps(y + 24,
                       _mm256_add_ps(_mm256_loadu_ps(y + 24), _mm256_mul_ps(c, i8x8_to_f32(_mm_srli_si128(hi, 8)))));
    }
  }
}

const Table kAvx2 = {dot_h16_avx2<false>,
                     dot_h16_avx2<true>,
                     dot_blocks_avx2<BlockQ8_0, isum_q8>,
                     dot_blocks_avx2<BlockQ4_0, isum_q4>,
                     rows_h16_avx2<false>,
                     rows_h16_avx2<true>,
                     down_h16_avx2<false>,
                     down_h16_avx2<true>,
                     down_blocks_avx2<false>,
                     down_blocks_avx2<true>};
const Table kAvxVnni = {dot_h16_avx2<false>,
                        dot_h16_avx2<true>,
                        dot_blocks_vnni<BlockQ8_0, isum_q8>,
                        dot_blocks_vnni<BlockQ4_0, isum_q4>,
                        rows_h16_avx2<false>,
                        rows_h16_avx2<true>,
                        down_h16_avx2<false>,
                        down_h16_avx2<true>,
                        down_blocks_avx2<false>,
                        down_blocks_avx2<true>};
// AVX-512 (F, BW, VL) with VNNI: 16-lane f16 / bf16 products, multi-row dots (kRowBlock rows give independent add
// chains; contiguous rows are read row after row, listed rows share each x load), VNNI block dots with an offset
// instead of sign fix-ups, and down accumulations that hold up to 128 outputs in registers over the listed neurons.
// Same canonical orders as above.
#define NL_512 __attribute__((target("avx2,f16c,fma,avx512f,avx512bw,avx512vl,avx512vnni")))
// Decode's q8_0 / q4_0 multi-row kernels request a later row block's bytes (`ahead` = one block, kRowBlock rows,
// further) while they compute this one, a few lines per step: spread over the compute, the requests keep memory busy
// without stalling on full miss buffers, as one burst of the whole next block before the compute did. The block
// requested is the first at least kAheadBytes ahead: one block of short rows (dim 384: 1.6-3 KB) arrived too late, and
// small-relu at 1 thread ran 1.10x (q8_0) faster with 8 KiB ahead on an Intel host (5 alternated runs; 16 KiB was
// slower); long rows (dim >= 2048) keep the next block. (The f16 / bf16 rows request nothing: see dot_h16_512_rows.)
// A prefetch never faults, so a block after the last one needs no check (the address is formed as an integer).
constexpr size_t kAheadBytes = 8 * 1024;
inline void prefetch_ahead(const uint8_t* p, size_t ahead, int bytes) {
  const size_t blocks = ahead >= kAheadBytes ? 1 : (kAheadBytes + ahead - 1) / ahead;
  prefetch_bytes(reinterpret_cast<const void*>(reinterpret_cast<uintptr_t>(p) + ahead * blocks), size_t(bytes));
}
// GCC 12's AVX-512 headers build conversions from _mm512_undefined_*() and warn about them (false positives).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

template <bool Bf16>
NL_512 inline __m512 cvt16(const uint8_t* p) {
  const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  if constexpr (Bf16)
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(v), 16));
  else
    return _mm512_cvtph_ps(v);
}

// 32 weights from one 64-byte load, as two 16-lane halves (weights 0-15, 16-31): the same values as cvt16(p) and
// cvt16(p + 32), and on an AMD EPYC (Zen 4) host 1.25x the bytes per second of the two 32-byte loads from DRAM
// (a 300 MB f16 matrix-vector microbenchmark: 24.5-25.5 GB/s against 19.4-20.5).
template <bool Bf16>
NL_512 inline void cvt32(const uint8_t* p, __m512* lo, __m512* hi) {
  const __m512i v = _mm512_loadu_si512(p);
  const __m256i l = _mm512_castsi512_si256(v), h = _mm512_extracti64x4_epi64(v, 1);
  if constexpr (Bf16) {
    *lo = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(l), 16));
    *hi = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  } else {
    *lo = _mm512_cvtph_ps(l);
    *hi = _mm512_cvtph_ps(h);
  }
}

// The canonical 32-lane fold of two 16-lane accumulators (lanes 0-15, 16-31), then reduce8.
NL_512 inline float fold32(__m512 a0, __m512 a1) {
  const __m256 s0 =
      _mm256_add_ps(_mm512_castps512_ps256(a0), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a0), 1)));
  const __m256 s1 =
      _mm256_add_ps(_mm512_castps512_ps256(a1), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a1), 1)));
  alignas(32) float s[8];
  _mm256_store_ps(s, _mm256_add_ps(s0, s1));
  return reduce8(s);
}

template <bool Bf16, int R, class Rows>
NL_512 inline void dot_h16_512_rows(Rows w, const float* x, int n, float* y) {
  __m512 a[R][2];
  for (int r = 0; r < R; ++r) a[r][0] = a[r][1] = _mm512_setzero_ps();
  int i = 0;
  if constexpr (Rows::kAhead) {
    // Contiguous rows: row after row, so that the addresses ascend as one stream the hardware prefetchers follow (the
    // rows of a block interleaved 32 weights at a time made small-relu's f16 decode 1.37-1.42x slower on an AMD EPYC
    // (Zen 4) host, whose 36 MB of f16 weights stream from DRAM: 11-12 GB/s against 20-21 in a microbenchmark). Each
    // row's operations and their order are the same either way. No software prefetch here: with the rows in order,
    // prefetch_ahead's requests made the 187M shape's f16 decode (dim 1024) 1.2-1.3x slower on that host.
    // Two 64-byte loads per step before their multiply-adds (the same order into each accumulator): 1.18x the bytes
    // per second of one per step from DRAM on that host (the 300 MB microbenchmark: 29.4-29.7 GB/s, 25.1 before).
    for (int r = 0; r < R; ++r) {
      const uint8_t* wr = w[r];
      for (i = 0; i + 64 <= n; i += 64) {
        __m512 w0, w1, w2, w3;
        cvt32<Bf16>(wr + 2 * size_t(i), &w0, &w1);
        cvt32<Bf16>(wr + 2 * size_t(i) + 64, &w2, &w3);
        a[r][0] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(x + i), a[r][0]);
        a[r][1] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(x + i + 16), a[r][1]);
        a[r][0] = _mm512_fmadd_ps(w2, _mm512_loadu_ps(x + i + 32), a[r][0]);
        a[r][1] = _mm512_fmadd_ps(w3, _mm512_loadu_ps(x + i + 48), a[r][1]);
      }
      if (i + 32 <= n) {
        __m512 w0, w1;
        cvt32<Bf16>(wr + 2 * size_t(i), &w0, &w1);
        a[r][0] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(x + i), a[r][0]);
        a[r][1] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(x + i + 16), a[r][1]);
        i += 32;
      }
    }
  } else {
    for (; i + 32 <= n; i += 32) {
      const __m512 x0 = _mm512_loadu_ps(x + i), x1 = _mm512_loadu_ps(x + i + 16);
      if (w.next)  // the next rows' line at this offset
        for (int r = 0; r < R; ++r) __builtin_prefetch(w.next[r] + 2 * size_t(i));
      for (int r = 0; r < R; ++r) {
        __m512 w0, w1;
        cvt32<Bf16>(w[r] + 2 * size_t(i), &w0, &w1);
        a[r][0] = _mm512_fmadd_ps(w0, x0, a[r][0]);
        a[r][1] = _mm512_fmadd_ps(w1, x1, a[r][1]);
      }
    }
  }
  if constexpr (!Rows::kAhead)
    if (w.next && i < n)
      for (int r = 0; r < R; ++r) prefetch_bytes(w.next[r] + 2 * size_t(i), 2 * size_t(n - i));
  for (int r = 0; r < R; ++r) {
    const float tail = h16_tail<Bf16>(w[r], x, i, n);
    y[r] = fold32(a[r][0], a[r][1]) + tail;
  }
}

template <bool Bf16>
NL_512 float dot_h16_512(const uint8_t* w, const float* x, int n) {
  float y;
  dot_h16_512_rows<Bf16, 1>(StrideRows{w, 0}, x, n, &y);
  return y;
}
template <bool Bf16>
NL_512 void rows_h16_512(const uint8_t* w, size_t stride, const float* x, int n, float* y) {
  dot_h16_512_rows<Bf16, kRowBlock>(StrideRows{w, stride}, x, n, y);
}
template <bool Bf16>
NL_512 void rowsl_h16_512(const uint8_t* const* w, const uint8_t* const* next, const void* x, int n, float* y) {
  dot_h16_512_rows<Bf16, kRowBlock>(ListRows{w, next}, static_cast<const float*>(x), n, y);
}

// 32 weights as unsigned bytes u with w = u - off: q8_0 flips the sign bit (u = w + 128), q4_0 takes the nibbles as
// they are (u = w + 8); the block's integer dot is dpbusd(u, x) - off * sum(x), exact.
NL_512 inline __m256i wu32(const BlockQ8_0& b) {
  return _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qs)), _mm256_set1_epi8(char(0x80)));
}
NL_512 inline __m256i wu32(const BlockQ4_0& b) {
  const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b.qs));
  const __m128i m = _mm_set1_epi8(15);
  return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(v, 4), m), _mm_and_si128(v, m));
}
template <class B>
constexpr int kWOffsetShift = sizeof(B) == sizeof(BlockQ8_0) ? 7 : 3;  // off = 128 (q8_0) or 8 (q4_0)

// The f16 scales of 8 consecutive blocks (stride sizeof(B)) as 8 floats; each 4-byte gather stays inside its block.
template <class B>
NL_512 inline __m256 scales8(const B* blk) {
  const __m256i idx = _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32(sizeof(B)));
  const __m256i g = _mm256_i32gather_epi32(reinterpret_cast<const int*>(&blk->d), idx, 1);
  return _mm256_cvtph_ps(_mm256_cvtepi32_epi16(g));
}

// One block's integer dot (Isum's exact value) for the blocks after the last whole 8-block group: dpbusd and an
// integer sum of the lanes. Rows of a multiple of 32 but not of 256 elements (dim 384: 4 blocks of every 12) spent
// more time in the scalar form of these few blocks, with a software f16 conversion per scale, than in the groups.
template <class B>
NL_512 inline int32_t isum_512(const B& w, const BlockQ8_0& x, int32_t xsum) {
  const __m256i s =
      _mm256_dpbusd_epi32(_mm256_setzero_si256(), wu32(w), _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.qs)));
  return hsum_epi32(s) - (xsum << kWOffsetShift<B>);
}

// The blocks after the last whole 8-block group of 4 rows at once (nt < 8 of them; row r's first at w[r]) against
// x's (xt, their sums xst): lane r of the result = 0 + v_0 + v_1 + ... in block order, v_c = float(isum) * (d_w *
// d_x): isum_512's integers and the one-row loop's float operations, bit for bit. Two blocks of the 4 rows go through
// one hsum8x8 and one vector multiply, and the 4 rows' sums are one vector's lanes: a horizontal sum and two scale
// conversions per block and row cost dim-384 rows (4 such blocks of every 12) as much as their whole 8-block group.
template <class B>
NL_512 inline __m128 tail4_blocks_512(const B* const* w, const BlockQ8_0* xt, const int32_t* xst, int nt) {
  __m128 t = _mm_setzero_ps();
  for (int c = 0; c < nt; c += 2) {
    const bool two = c + 1 < nt;
    __m256i s[8];
    const __m256i x0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xt[c].qs));
    for (int r = 0; r < 4; ++r) s[r] = _mm256_dpbusd_epi32(_mm256_setzero_si256(), wu32(w[r][c]), x0);
    if (two) {
      const __m256i x1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xt[c + 1].qs));
      for (int r = 0; r < 4; ++r) s[4 + r] = _mm256_dpbusd_epi32(_mm256_setzero_si256(), wu32(w[r][c + 1]), x1);
    } else {
      for (int r = 0; r < 4; ++r) s[4 + r] = _mm256_setzero_si256();
    }
    const int c1 = two ? c + 1 : c;  // a lone last block: the upper lanes are computed and dropped
    const __m256i corr = _mm256_slli_epi32(
        _mm256_setr_epi32(xst[c], xst[c], xst[c], xst[c], xst[c1], xst[c1], xst[c1], xst[c1]), kWOffsetShift<B>);
    const __m256i isum = _mm256_sub_epi32(hsum8x8(s), corr);
    const __m128i dw = _mm_setr_epi16(short(w[0][c].d), short(w[1][c].d), short(w[2][c].d), short(w[3][c].d),
                                      short(w[0][c1].d), short(w[1][c1].d), short(w[2][c1].d), short(w[3][c1].d));
    const short dx0 = short(xt[c].d), dx1 = short(xt[c1].d);
    const __m128i dx = _mm_setr_epi16(dx0, dx0, dx0, dx0, dx1, dx1, dx1, dx1);
    const __m256 v = _mm256_mul_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(_mm256_cvtph_ps(dw), _mm256_cvtph_ps(dx)));
    t = _mm_add_ps(t, _mm256_castps256_ps128(v));
    if (two) t = _mm_add_ps(t, _mm256_extractf128_ps(v, 1));
  }
  return t;
}

template <class B, int32_t (*Isum)(const B&, const BlockQ8_0&)>
NL_512 float dot_blocks_512(const B* w, const BlockQ8_0* x, int nb) {
  const int32_t* xs = xq_sums(x, nb);
  __m256 acc = _mm256_setzero_ps();
  int b = 0;
  for (; b + 8 <= nb; b += 8) {
    __m256i s[8];
    for (int k = 0; k < 8; ++k)
      s[k] = _mm256_dpbusd_epi32(_mm256_setzero_si256(), wu32(w[b + k]),
                                 _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[b + k].qs)));
    const __m256i corr =
        _mm256_slli_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(xs + b)), kWOffsetShift<B>);
    const __m256i isum = _mm256_sub_epi32(hsum8x8(s), corr);
    const __m256 d = _mm256_mul_ps(scales8(w + b), scales8(x + b));
    acc = _mm256_add_ps(acc, _mm256_mul_ps(_mm256_cvtepi32_ps(isum), d));
  }
  alignas(32) float a[8];
  _mm256_store_ps(a, acc);
  float tail = 0.0f;
  for (; b < nb; ++b) tail += float(isum_512(w[b], x[b], xs[b])) * (f16c_to_f32(w[b].d) * f16c_to_f32(x[b].d));
  return reduce8(a) + tail;
}

// One row's 8-block group against x's, added to acc: dot_blocks_512's operations for that group.
template <class B>
NL_512 inline __m256 group_blocks_512(const B* w, const BlockQ8_0* x, const int32_t* xs, __m256 acc) {
  __m256i s[8];
  for (int k = 0; k < 8; ++k)
    s[k] = _mm256_dpbusd_epi32(_mm256_setzero_si256(), wu32(w[k]),
                               _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[k].qs)));
  const __m256i corr = _mm256_slli_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(xs)), kWOffsetShift<B>);
  const __m256i isum = _mm256_sub_epi32(hsum8x8(s), corr);
  const __m256 d = _mm256_mul_ps(scales8(w), scales8(x));
  return _mm256_add_ps(acc, _mm256_mul_ps(_mm256_cvtepi32_ps(isum), d));
}

// R rows at once, as R independent chains (short rows of small models spend as much on the call as on the dots):
// contiguous rows row after row, listed rows one 8-block group of every row at a time. Per row, the operations and
// their order are dot_blocks_512's.
template <class B, int R, class Rows>
NL_512 inline void rows_blocks_512_at(Rows w, const void* xv, int n, float* y) {
  const BlockQ8_0* x = static_cast<const BlockQ8_0*>(xv);
  const int nb = n / kQuantBlock;
  const int32_t* xs = xq_sums(x, nb);
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  const int nb8 = nb / 8 * 8;
  if constexpr (Rows::kAhead) {
    // Contiguous rows: row after row (one ascending stream, as rows_q8x8_512), x's groups loaded again per row.
    for (int r = 0; r < R; ++r) {
      const B* wr = reinterpret_cast<const B*>(w[r]);
      for (int b = 0; b < nb8; b += 8) {
        prefetch_ahead(reinterpret_cast<const uint8_t*>(wr + b), R * w.stride, 8 * int(sizeof(B)));
        acc[r] = group_blocks_512(wr + b, x + b, xs + b, acc[r]);
      }
    }
  } else {
    for (int b = 0; b < nb8; b += 8) {
      if (w.next)  // the next rows' group at this offset (5 lines of q8_0)
        for (int r = 0; r < R; ++r) prefetch_bytes(reinterpret_cast<const B*>(w.next[r]) + b, 8 * sizeof(B));
      for (int r = 0; r < R; ++r)
        acc[r] = group_blocks_512(reinterpret_cast<const B*>(w[r]) + b, x + b, xs + b, acc[r]);
    }
    if (w.next && nb8 < nb)
      for (int r = 0; r < R; ++r)
        prefetch_bytes(reinterpret_cast<const B*>(w.next[r]) + nb8, size_t(nb - nb8) * sizeof(B));
  }
  const int b = nb8;
  // The remaining blocks, each row's in order (x's block loaded once for all rows; the next row block's requested
  // first: the groups' prefetch covers only the groups).
  if constexpr (Rows::kAhead)
    for (int r = 0; r < R; ++r)
      prefetch_ahead(reinterpret_cast<const uint8_t*>(reinterpret_cast<const B*>(w[r]) + b), R * w.stride,
                     (nb - b) * int(sizeof(B)));
  alignas(16) float tail[R] = {};
  if constexpr (R == 4) {
    const B* wt[4];
    for (int r = 0; r < 4; ++r) wt[r] = reinterpret_cast<const B*>(w[r]) + b;
    _mm_store_ps(tail, tail4_blocks_512(wt, x + b, xs + b, nb - b));
  } else {
    for (int c = b; c < nb; ++c) {
      const float dx = f16c_to_f32(x[c].d);
      for (int r = 0; r < R; ++r) {
        const B& wc = reinterpret_cast<const B*>(w[r])[c];
        tail[r] += float(isum_512(wc, x[c], xs[c])) * (f16c_to_f32(wc.d) * dx);
      }
    }
  }
  for (int r = 0; r < R; ++r) {
    alignas(32) float a[8];
    _mm256_store_ps(a, acc[r]);
    y[r] = reduce8(a) + tail[r];
  }
}
template <class B, int R>
NL_512 void rows_blocks_512(const uint8_t* w, size_t stride, const void* x, int n, float* y) {
  rows_blocks_512_at<B, R>(StrideRows{w, stride}, x, n, y);
}
template <class B>
NL_512 void rowsl_blocks_512(const uint8_t* const* w, const uint8_t* const* next, const void* x, int n, float* y) {
  rows_blocks_512_at<B, kRowBlock>(ListRows{w, next}, x, n, y);
}

// Interleaved q8_0: step s of a group puts quants 4s..4s+3 of block j in lane j, so dpbusd accumulates every
// block's exact integer sum in its own lane (two chains, even and odd steps, for latency); scales are one 16-byte
// load. The float operations and their order are dot_blocks_512's.
template <int R>
NL_512 void rows_q8x8_512(const uint8_t* w, size_t stride, const void* xv, int n, float* y) {
  const uint8_t* x = static_cast<const uint8_t*>(xv);
  const int nb = n / kQuantBlock, ng = nb / 8, nt = nb - 8 * ng;
  const int32_t* xs = xq_sums(reinterpret_cast<const BlockQ8_0*>(x), nb);
  const __m256i flip = _mm256_set1_epi8(char(0x80));
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  // Row after row (the addresses ascend as one stream the hardware prefetchers follow); x's group is loaded again
  // for each row.
  for (int r = 0; r < R; ++r)
    for (int g = 0; g < ng; ++g) {
      const uint8_t* xg = x + size_t(g) * kX8Group;
      const __m256 dx = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(xg)));
      const __m256i corr = _mm256_slli_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(xs + 8 * g)), 7);
      const __m256i* xq = reinterpret_cast<const __m256i*>(xg + kX8Quants);
      const uint8_t* wg = w + size_t(r) * stride + size_t(g) * kX8Group;
      if constexpr (R > 1) prefetch_ahead(wg, R * stride, kX8Group);
      __m256i a0 = _mm256_setzero_si256(), a1 = _mm256_setzero_si256();
      for (int k = 0; k < 8; k += 2) {
        a0 = _mm256_dpbusd_epi32(
            a0, _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(wg + kX8Quants + 32 * k)), flip),
            _mm256_loadu_si256(xq + k));
        a1 = _mm256_dpbusd_epi32(
            a1,
            _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(wg + kX8Quants + 32 * (k + 1))), flip),
            _mm256_loadu_si256(xq + k + 1));
      }
      const __m256i isum = _mm256_sub_epi32(_mm256_add_epi32(a0, a1), corr);
      const __m256 d = _mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(wg))), dx);
      acc[r] = _mm256_add_ps(acc[r], _mm256_mul_ps(_mm256_cvtepi32_ps(isum), d));
    }
  // The plain blocks after the groups, each row's in order (the next row block's requested first: the groups'
  // prefetch covers only the groups).
  if constexpr (R > 1)
    for (int r = 0; r < R; ++r)
      prefetch_ahead(w + size_t(r) * stride + size_t(ng) * kX8Group, R * stride, nt * int(sizeof(BlockQ8_0)));
  const BlockQ8_0* xt = reinterpret_cast<const BlockQ8_0*>(x + size_t(ng) * kX8Group);
  alignas(16) float tail[R] = {};
  if constexpr (R == 4) {
    const BlockQ8_0* wt[4];
    for (int r = 0; r < 4; ++r)
      wt[r] = reinterpret_cast<const BlockQ8_0*>(w + size_t(r) * stride + size_t(ng) * kX8Group);
    _mm_store_ps(tail, tail4_blocks_512(wt, xt, xs + 8 * ng, nt));
  } else {
    for (int c = 0; c < nt; ++c) {
      const float dx = f16c_to_f32(xt[c].d);
      for (int r = 0; r < R; ++r) {
        const BlockQ8_0& wc = reinterpret_cast<const BlockQ8_0*>(w + size_t(r) * stride + size_t(ng) * kX8Group)[c];
        tail[r] += float(isum_512(wc, xt[c], xs[8 * ng + c])) * (f16c_to_f32(wc.d) * dx);
      }
    }
  }
  for (int r = 0; r < R; ++r) {
    alignas(32) float a[8];
    _mm256_store_ps(a, acc[r]);
    y[r] = reduce8(a) + tail[r];
  }
}
NL_512 float dot_q8x8_512(const uint8_t* w, const void* x, int n) {
  float y;
  rows_q8x8_512<1>(w, 0, x, n, &y);
  return y;
}

// Token tile over interleaved q8_0: a row's 8-block group is 4 zmm (two steps each, xor'ed once) and dpbusd's them
// into each of T tokens; the two 256-bit halves (even and odd steps) are added as integers (exact), so each lane holds
// rows_q8x8_512's block sum and every float operation, in order, is its.
template <int T>
NL_512 void tile_q8x8_512_t(const uint8_t* w, size_t stride, const uint8_t* x, size_t xs, int n, float* y, size_t ys) {
  constexpr int R = kRowBlock;
  const int nb = n / kQuantBlock, ng = nb / 8, nt = nb - 8 * ng;
  const __m512i flip = _mm512_set1_epi8(char(0x80));
  const float* sc[T];
  const int32_t* corr[T];
  for (int t = 0; t < T; ++t) {
    sc[t] = x8_scales(x + size_t(t) * xs, nb);
    corr[t] = x8_corr(x + size_t(t) * xs, nb);
  }
  __m256 acc[R][T];
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t) acc[r][t] = _mm256_setzero_ps();
  for (int g = 0; g < ng; ++g) {
    for (int r = 0; r < R; ++r) {
      const uint8_t* wg = w + size_t(r) * stride + size_t(g) * kX8Group;
      __m512i wq[4];
      for (int k = 0; k < 4; ++k) wq[k] = _mm512_xor_si512(_mm512_loadu_si512(wg + kX8Quants + 64 * k), flip);
      const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(wg)));
      for (int t = 0; t < T; ++t) {
        const uint8_t* xg = x + size_t(t) * xs + size_t(g) * kX8Group + kX8Quants;
        // The sums start from the negated offset correction in the low half (one load, no separate subtraction):
        // exact integers, so the same block sums.
        __m512i s = _mm512_zextsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(corr[t] + 8 * g)));
        for (int k = 0; k < 4; ++k) s = _mm512_dpbusd_epi32(s, wq[k], _mm512_loadu_si512(xg + 64 * k));
        const __m256i isum = _mm256_add_epi32(_mm512_castsi512_si256(s), _mm512_extracti64x4_epi64(s, 1));
        const __m256 d = _mm256_mul_ps(dw, _mm256_loadu_ps(sc[t] + 8 * g));
        acc[r][t] = _mm256_add_ps(acc[r][t], _mm256_mul_ps(_mm256_cvtepi32_ps(isum), d));
      }
    }
  }
  static_assert(R == 4, "tail4_blocks_512 takes 4 rows");
  const BlockQ8_0* wt[R];
  for (int r = 0; r < R; ++r)
    wt[r] = reinterpret_cast<const BlockQ8_0*>(w + size_t(r) * stride + size_t(ng) * kX8Group);
  for (int t = 0; t < T; ++t) {
    // The plain blocks after the groups, in order (rows_q8x8_512's tail).
    const uint8_t* xr = x + size_t(t) * xs;
    const BlockQ8_0* xt = reinterpret_cast<const BlockQ8_0*>(xr + size_t(ng) * kX8Group);
    alignas(16) float tail[R];
    _mm_store_ps(tail, tail4_blocks_512(wt, xt, xq_sums(reinterpret_cast<const BlockQ8_0*>(xr), nb) + 8 * ng, nt));
    for (int r = 0; r < R; ++r) {
      alignas(32) float a[8];
      _mm256_store_ps(a, acc[r][t]);
      y[size_t(t) * ys + r] = reduce8(a) + tail[r];
    }
  }
}
NL_512 void tile_q8x8_512(const uint8_t* w, size_t stride, const uint8_t* x, size_t xs, int nt, int n, float* y,
                          size_t ys) {
  switch (nt) {
    case 1:
      return tile_q8x8_512_t<1>(w, stride, x, xs, n, y, ys);
    case 2:
      return tile_q8x8_512_t<2>(w, stride, x, xs, n, y, ys);
    case 3:
      return tile_q8x8_512_t<3>(w, stride, x, xs, n, y, ys);
    default:
      return tile_q8x8_512_t<4>(w, stride, x, xs, n, y, ys);
  }
}

// One pass of the f16 / bf16 token tile, over the 16-lane half H of each 32-weight step: the two halves' accumulator
// chains are independent (fold32 joins them only at the end), so each pass holds R2 x T accumulators, converts each
// row's half step once for all T tokens and loads each token's half step once for all R2 rows. Per (row, token) the
// operations and their order stay dot_h16_512_rows's. One accumulator per (row, token) instead of two lets all
// kTokenTileH16 tokens share a conversion: 4 conversions (2 uops each on the FMA ports of Intel cores) per 24 FMAs
// instead of 8 per 16 with the two-half tile of 4 rows x 2 tokens.
template <bool Bf16, int R2, int T, int H>
NL_512 inline void half_h16_512(const uint8_t* w, size_t stride, const uint8_t* x, size_t xs, int n,
                                __m512 (&a)[R2][T]) {
  for (int r = 0; r < R2; ++r)
    for (int t = 0; t < T; ++t) a[r][t] = _mm512_setzero_ps();
  for (int i = 0; i + 32 <= n; i += 32) {
    __m512 wv[R2];
    for (int r = 0; r < R2; ++r) wv[r] = cvt16<Bf16>(w + size_t(r) * stride + 2 * size_t(i) + 32 * H);
    for (int t = 0; t < T; ++t) {
      const __m512 xv = _mm512_loadu_ps(reinterpret_cast<const float*>(x + size_t(t) * xs) + i + 16 * H);
      for (int r = 0; r < R2; ++r) a[r][t] = _mm512_fmadd_ps(wv[r], xv, a[r][t]);
    }
  }
}
// Token tile over f16 / bf16 rows: kRowBlock rows against T <= kTokenTileH16 tokens, its two halves in two passes.
template <bool Bf16, int T>
NL_512 void tile_h16_512_t(const uint8_t* w, size_t stride, const uint8_t* x, size_t xs, int n, float* y, size_t ys) {
  __m512 a0[kRowBlock][T], a1[kRowBlock][T];
  half_h16_512<Bf16, kRowBlock, T, 0>(w, stride, x, xs, n, a0);
  half_h16_512<Bf16, kRowBlock, T, 1>(w, stride, x, xs, n, a1);
  const int i = n / 32 * 32;
  for (int r = 0; r < kRowBlock; ++r) {
    const uint8_t* wr = w + size_t(r) * stride;
    for (int t = 0; t < T; ++t) {
      const float* xt = reinterpret_cast<const float*>(x + size_t(t) * xs);
      const float tail = h16_tail<Bf16>(wr, xt, i, n);
      y[size_t(t) * ys + r] = fold32(a0[r][t], a1[r][t]) + tail;
    }
  }
}
template <bool Bf16>
NL_512 void tile_h16_512(const uint8_t* w, size_t stride, const uint8_t* x, size_t xs, int nt, int n, float* y,
                         size_t ys) {
  switch (nt) {
    case 1:
      return tile_h16_512_t<Bf16, 1>(w, stride, x, xs, n, y, ys);
    case 2:
      return tile_h16_512_t<Bf16, 2>(w, stride, x, xs, n, y, ys);
    case 3:
      return tile_h16_512_t<Bf16, 3>(w, stride, x, xs, n, y, ys);
    case 4:
      return tile_h16_512_t<Bf16, 4>(w, stride, x, xs, n, y, ys);
    case 5:
      return tile_h16_512_t<Bf16, 5>(w, stride, x, xs, n, y, ys);
    default:
      return tile_h16_512_t<Bf16, 6>(w, stride, x, xs, n, y, ys);
  }
}

// Neurons per group of the down accumulations: the next group's columns are requested while one is summed.
constexpr int kDownGroup = 8;

// NP runs of 32 outputs from o (NP at most kDownSpanRuns) held in registers over all na neurons, neuron after
// neuron: each column's slice is read as one ascending run (the dense FFN's [chunk][neuron][outputs] layout: one
// stream), where a pass of 32 outputs at a time over kDownGroup neurons came back to each slice once per 32 outputs.
// The slices are requested in software by the share of the region's neurons that are listed (`stream`, the rule
// below): from that share on, every line of the region in address order (one unbroken stream: with half the neurons
// listed, the listed slices alone ran 1.5x slower than the whole region, 256 B read and 256 B skipped), below it each
// listed slice a few neurons ahead (before: a slice only when it began more than 1 KiB after the previous one, which
// the hardware prefetchers were left to follow; requesting every slice made the 187M shape's f16 decode 1.08x slower
// in an earlier measurement, against which the stream is the answer). The q8_0 / q4_0 spans do the same
// (down_blocks_span). A microbenchmark of one 5,632-neuron f16 chunk of 128 outputs per layer, 1 thread,
// AMD EPYC: 50 % listed 1,894 us per layer with the former rule, 1,606 with each slice 8 ahead, 1,255-1,310 streaming;
// 20 % listed 859, 678 and 953-995; all listed 962 without requests, 957-1,033 streaming. The ~1B shape's dense decode
// (half its random gates > 0) ran 8.6 -> 10.8 tok/s (1 thread, faster in 6 of 6 alternated rounds), small-relu's (20-28
// % active) 456.0 -> 513.5 (8 of 10).
constexpr int kDownSpanRuns = 4;
// The spans' request rule, in one place for every dtype: from kStreamShare of the region's neurons listed on, every
// line in address order up to kStreamAhead listed neurons ahead (request_lines); below it each listed slice
// kSliceAhead neurons ahead.
constexpr double kStreamShare = 0.4;
constexpr int kStreamAhead = 2;
constexpr int kSliceAhead = 8;
// Whether na listed slices of `slice` bytes each stream: their bytes are kStreamShare or more of the region's bytes
// from the first listed slice to the end of the last.
inline bool stream_region(const uint8_t* const* cols, int na, double slice) {
  return na * slice >= kStreamShare * (double(cols[na - 1] - cols[0]) + slice);
}
// Streaming: request every line from pf up to `to` and move pf there.
[[gnu::always_inline]] inline void request_lines(const uint8_t*& pf, const uint8_t* to) {
  for (; pf < to; pf += 64) __builtin_prefetch(pf);
}
template <bool Bf16, int NP>
NL_512 inline void down_h16_span(float* out, int o, const float* h, const uint8_t* const* cols, int na, bool stream) {
  __m512 a[NP][2];
  for (int p = 0; p < NP; ++p) {
    a[p][0] = _mm512_loadu_ps(out + o + 32 * p);
    a[p][1] = _mm512_loadu_ps(out + o + 32 * p + 16);
  }
  const uint8_t* pf = na ? cols[0] + 2 * size_t(o) : nullptr;  // stream: the next line to request
  for (int k = 0; k < na; ++k) {
    if (stream) {
      request_lines(pf, cols[std::min(k + kStreamAhead, na - 1)] + 2 * size_t(o) + 64 * NP);
    } else if (k + kSliceAhead < na) {
      prefetch_col(ImageDtype::kF16, cols[k + kSliceAhead], o, o + 32 * NP);
    }
    const __m512 hv = _mm512_set1_ps(h[k]);
    const uint8_t* c = cols[k] + 2 * size_t(o);
    for (int p = 0; p < NP; ++p) {
      a[p][0] = _mm512_fmadd_ps(hv, cvt16<Bf16>(c + 64 * p), a[p][0]);
      a[p][1] = _mm512_fmadd_ps(hv, cvt16<Bf16>(c + 64 * p + 32), a[p][1]);
    }
  }
  for (int p = 0; p < NP; ++p) {
    _mm512_storeu_ps(out + o + 32 * p, a[p][0]);
    _mm512_storeu_ps(out + o + 32 * p + 16, a[p][1]);
  }
}

// Whether the columns lie packed in ascending order, on average at most 1 KiB apart: the dense FFN's slices
// ([chunk][neuron][outputs]). Bundles (the cache's and the staging's, 1.2-24 KiB each) are not. Every column must
// follow the one before it: a list that mixes two allocations (bundles in the read staging and cache hits in the
// slab, in slot order) can start and end close together, and streaming it would request every line between the two
// allocations (terabytes of address space: a layer-token that never finished, --overlap layer with cache hits).
inline bool packed(const uint8_t* const* cols, int na) {
  if (na <= 0) return false;
  const auto first = reinterpret_cast<uintptr_t>(cols[0]), last = reinterpret_cast<uintptr_t>(cols[na - 1]);
  if (last < first || last - first > size_t(na) * 1024) return false;
  for (int k = 1; k < na; ++k)  // ascending and within [first, last]: every column inside the one stream
    if (reinterpret_cast<uintptr_t>(cols[k]) < reinterpret_cast<uintptr_t>(cols[k - 1])) return false;
  return true;
}

// Down accumulation: out[o] gets h_0 w_0[o], h_1 w_1[o], ... added one at a time in list order. Packed columns: a
// span of outputs at a time over all neurons (each slice one ascending run of the one stream). Spread columns: 8
// neurons at a time over all outputs, each column read whole (spans there, 256 B of every bundle per pass, made the
// 1B shape's cached-bundle decode 1.16x slower: 12.1 -> 10.4 tok/s at 1 thread, f16).
template <bool Bf16>
NL_512 void down_h16_512(float* out, int o0, int o1, const float* h, const uint8_t* const* cols, int na) {
  const int o32 = o0 + (o1 - o0) / 32 * 32;
  if (!packed(cols, na)) {
    for (int i0 = 0; i0 < na; i0 += kDownGroup) {
      const int k1 = std::min(kDownGroup, na - i0);
      // The next group's columns, requested line by line as this group's outputs go (kDownGroup lines per 32
      // outputs), not as one burst of whole columns before them (as row_dots).
      const int n1 = std::min(kDownGroup, na - i0 - kDownGroup);
      const uint8_t* const* nx = cols + i0 + kDownGroup;
      __m512 hv[kDownGroup];
      for (int k = 0; k < k1; ++k) hv[k] = _mm512_set1_ps(h[i0 + k]);
      for (int o = o0; o < o32; o += 32) {
        for (int k = 0; k < n1; ++k) __builtin_prefetch(nx[k] + 2 * size_t(o));
        __m512 a0 = _mm512_loadu_ps(out + o), a1 = _mm512_loadu_ps(out + o + 16);
        for (int k = 0; k < k1; ++k) {
          const uint8_t* c = cols[i0 + k] + 2 * size_t(o);
          a0 = _mm512_fmadd_ps(hv[k], cvt16<Bf16>(c), a0);
          a1 = _mm512_fmadd_ps(hv[k], cvt16<Bf16>(c + 32), a1);
        }
        _mm512_storeu_ps(out + o, a0);
        _mm512_storeu_ps(out + o + 16, a1);
      }
      for (int k = 0; k < n1; ++k)  // the last line a misaligned column reaches, and the outputs after o32
        prefetch_bytes(nx[k] + 2 * size_t(o32), 2 * size_t(o1 - o32) + 63);
    }
  } else {
    // Stream or not by the listed share of the region's neurons, each slice 2 (o1 - o0) bytes (the dense layout).
    const bool stream = stream_region(cols, na, 2.0 * (o1 - o0));
    for (int o = o0; o < o32; o += 32 * kDownSpanRuns) {
      switch (std::min(kDownSpanRuns, (o32 - o) / 32)) {
        case 1:
          down_h16_span<Bf16, 1>(out, o, h, cols, na, stream);
          break;
        case 2:
          down_h16_span<Bf16, 2>(out, o, h, cols, na, stream);
          break;
        case 3:
          down_h16_span<Bf16, 3>(out, o, h, cols, na, stream);
          break;
        default:
          down_h16_span<Bf16, 4>(out, o, h, cols, na, stream);
      }
    }
  }
  // The last outputs, neuron after neuron as well (each output is its own sum: the same order).
  if (o32 < o1) down_h16_port<h16_to_f32<Bf16>>(out, o32, o1, h, cols, na);
}

NL_512 inline void q32_to_f32(const BlockQ8_0& b, __m512* lo, __m512* hi) {
  *lo = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b.qs))));
  *hi = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b.qs + 16))));
}
NL_512 inline void q32_to_f32(const BlockQ4_0& b, __m512* lo, __m512* hi) {
  const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b.qs));
  const __m128i m = _mm_set1_epi8(15), eight = _mm_set1_epi8(8);
  *lo = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_sub_epi8(_mm_and_si128(v, m), eight)));
  *hi = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(v, 4), m), eight)));
}

// NP quantization blocks of outputs from block b (a down_h16_span for blocks): each neuron's slice one ascending run.
template <class B, int NP>
NL_512 inline void down_blocks_span(float* out, int b, const float* h, const uint8_t* const* cols, int na,
                                    bool stream) {
  float* y = out + size_t(b) * kQuantBlock;
  __m512 a[NP][2];
  for (int p = 0; p < NP; ++p) {
    a[p][0] = _mm512_loadu_ps(y + 32 * p);
    a[p][1] = _mm512_loadu_ps(y + 32 * p + 16);
  }
  const uint8_t* pf = na ? cols[0] + size_t(b) * sizeof(B) : nullptr;  // stream: the next line to request
  for (int k = 0; k < na; ++k) {
    if (stream) {
      request_lines(pf, cols[std::min(k + kStreamAhead, na - 1)] + size_t(b + NP) * sizeof(B));
    } else if (k + kSliceAhead < na) {
      prefetch_bytes(cols[k + kSliceAhead] + size_t(b) * sizeof(B), NP * sizeof(B));
    }
    const B* blk = reinterpret_cast<const B*>(cols[k]) + b;
    for (int p = 0; p < NP; ++p) {
      const __m512 c = _mm512_set1_ps(h[k] * f16c_to_f32(blk[p].d));
      __m512 lo, hi;
      q32_to_f32(blk[p], &lo, &hi);
      a[p][0] = _mm512_add_ps(a[p][0], _mm512_mul_ps(c, lo));
      a[p][1] = _mm512_add_ps(a[p][1], _mm512_mul_ps(c, hi));
    }
  }
  for (int p = 0; p < NP; ++p) {
    _mm512_storeu_ps(y + 32 * p, a[p][0]);
    _mm512_storeu_ps(y + 32 * p + 16, a[p][1]);
  }
}
template <class B>
NL_512 void down_blocks_512(float* out, int o0, int o1, const float* h, const uint8_t* const* cols, int na) {
  const int b0 = o0 / kQuantBlock, b1 = (o1 + kQuantBlock - 1) / kQuantBlock;
  if (!packed(cols, na)) {  // as down_h16_512
    for (int i0 = 0; i0 < na; i0 += kDownGroup) {
      const int k1 = std::min(kDownGroup, na - i0);
      // The next group's blocks, requested block by block as this group's go (each block's first byte: a block is
      // shorter than a line, so the starts reach every line but a misaligned column's last; that one after the loop).
      const int n1 = std::min(kDownGroup, na - i0 - kDownGroup);
      const uint8_t* const* nx = cols + i0 + kDownGroup;
      for (int b = b0; b < b1; ++b) {
        for (int k = 0; k < n1; ++k) __builtin_prefetch(reinterpret_cast<const B*>(nx[k]) + b);
        float* y = out + size_t(b) * kQuantBlock;
        __m512 a0 = _mm512_loadu_ps(y), a1 = _mm512_loadu_ps(y + 16);
        for (int k = 0; k < k1; ++k) {
          const B& blk = reinterpret_cast<const B*>(cols[i0 + k])[b];
          const __m512 c = _mm512_set1_ps(h[i0 + k] * f16c_to_f32(blk.d));
          __m512 lo, hi;
          q32_to_f32(blk, &lo, &hi);
          a0 = _mm512_add_ps(a0, _mm512_mul_ps(c, lo));
          a1 = _mm512_add_ps(a1, _mm512_mul_ps(c, hi));
        }
        _mm512_storeu_ps(y, a0);
        _mm512_storeu_ps(y + 16, a1);
      }
      for (int k = 0; k < n1; ++k)
        __builtin_prefetch(reinterpret_cast<const uint8_t*>(reinterpret_cast<const B*>(nx[k]) + b1) - 1);
    }
    return;
  }
  // Stream or not by the listed share of the region's neurons, each slice (b1 - b0) blocks (the dense layout).
  const bool stream = stream_region(cols, na, double(b1 - b0) * sizeof(B));
  for (int b = b0; b < b1; b += kDownSpanRuns) {
    switch (std::min(kDownSpanRuns, b1 - b)) {
      case 1:
        down_blocks_span<B, 1>(out, b, h, cols, na, stream);
        break;
      case 2:
        down_blocks_span<B, 2>(out, b, h, cols, na, stream);
        break;
      case 3:
        down_blocks_span<B, 3>(out, b, h, cols, na, stream);
        break;
      default:
        down_blocks_span<B, 4>(out, b, h, cols, na, stream);
    }
  }
}

// A down tile's mask when all of its T tokens list a neuron.
template <int T>
constexpr unsigned kAllTokens = (1u << T) - 1u;

// Down projection of T tokens over one block of neuron slices: per 32 outputs, each neuron's quantization block is
// widened once and added into the sums of the tokens that list it (mask), h_t * d rounded, then times q, then added:
// per token and output down_blocks_512's operations in slot order.
template <class B, int T>
NL_512 void down_tile_blocks_512_t(float* out, size_t ldo, int len, const float* h, const uint8_t* mask,
                                   const uint8_t* base, size_t cb, int hidden) {
  const int nblk = (len + kQuantBlock - 1) / kQuantBlock;
  for (int b = 0; b < nblk; ++b) {
    __m512 acc[T][2];
    for (int t = 0; t < T; ++t) acc[t][0] = acc[t][1] = _mm512_setzero_ps();
    for (int s = 0; s < hidden; ++s) {
      const unsigned m = mask[s];
      if (!m) continue;
      const B& blk = *reinterpret_cast<const B*>(base + size_t(s) * cb + size_t(b) * sizeof(B));
      __m512 lo, hi;
      q32_to_f32(blk, &lo, &hi);
      const float d = f16c_to_f32(blk.d);
      const float* hs = h + size_t(s) * kDownTokens;
      if (m == kAllTokens<T>) {  // every token lists the neuron (a SiLU model: always)
        for (int t = 0; t < T; ++t) {
          const __m512 c = _mm512_set1_ps(hs[t] * d);
          acc[t][0] = _mm512_add_ps(acc[t][0], _mm512_mul_ps(c, lo));
          acc[t][1] = _mm512_add_ps(acc[t][1], _mm512_mul_ps(c, hi));
        }
      } else {  // per token a masked add: no data-dependent branch per (neuron, token) at ReLU densities
        for (int t = 0; t < T; ++t) {
          const __mmask16 k = __mmask16(-int(m >> t & 1u));
          const __m512 c = _mm512_set1_ps(hs[t] * d);
          acc[t][0] = _mm512_mask_add_ps(acc[t][0], k, acc[t][0], _mm512_mul_ps(c, lo));
          acc[t][1] = _mm512_mask_add_ps(acc[t][1], k, acc[t][1], _mm512_mul_ps(c, hi));
        }
      }
    }
    for (int t = 0; t < T; ++t) {
      float* y = out + size_t(t) * ldo + size_t(b) * kQuantBlock;
      const int k = std::min(kQuantBlock, len - b * kQuantBlock);
      if (k == kQuantBlock) {
        _mm512_storeu_ps(y, acc[t][0]);
        _mm512_storeu_ps(y + 16, acc[t][1]);
      } else {
        alignas(64) float a[32];
        _mm512_store_ps(a, acc[t][0]);
        _mm512_store_ps(a + 16, acc[t][1]);
        std::memcpy(y, a, sizeof(float) * size_t(k));
      }
    }
  }
}
// The same for f16 / bf16 slices: per 32 outputs each neuron's weights widened once; per token and output
// down_h16_512's operations (h_t * w, then added) in slot order. len: any; the last partial 32 run element by element.
template <bool Bf16, int T>
NL_512 void down_tile_h16_512_t(float* out, size_t ldo, int len, const float* h, const uint8_t* mask,
                                const uint8_t* base, size_t cb, int hidden) {
  const int l32 = len / 32 * 32;
  for (int o = 0; o < l32; o += 32) {
    __m512 acc[T][2];
    for (int t = 0; t < T; ++t) acc[t][0] = acc[t][1] = _mm512_setzero_ps();
    for (int s = 0; s < hidden; ++s) {
      const unsigned m = mask[s];
      if (!m) continue;
      const uint8_t* c = base + size_t(s) * cb + 2 * size_t(o);
      const __m512 lo = cvt16<Bf16>(c), hi = cvt16<Bf16>(c + 32);
      const float* hs = h + size_t(s) * kDownTokens;
      if (m == kAllTokens<T>) {  // as down_tile_blocks_512_t: plain adds when every token lists the neuron
        for (int t = 0; t < T; ++t) {
          const __m512 hv = _mm512_set1_ps(hs[t]);
          acc[t][0] = _mm512_fmadd_ps(hv, lo, acc[t][0]);
          acc[t][1] = _mm512_fmadd_ps(hv, hi, acc[t][1]);
        }
      } else {
        for (int t = 0; t < T; ++t) {  // masked adds
          const __mmask16 k = __mmask16(-int(m >> t & 1u));
          const __m512 hv = _mm512_set1_ps(hs[t]);
          acc[t][0] = _mm512_mask3_fmadd_ps(hv, lo, acc[t][0], k);
          acc[t][1] = _mm512_mask3_fmadd_ps(hv, hi, acc[t][1], k);
        }
      }
    }
    for (int t = 0; t < T; ++t) {
      _mm512_storeu_ps(out + size_t(t) * ldo + o, acc[t][0]);
      _mm512_storeu_ps(out + size_t(t) * ldo + o + 16, acc[t][1]);
    }
  }
  for (int t = 0; t < T; ++t)
    for (int o = l32; o < len; ++o) {
      float a = 0.0f;
      for (int s = 0; s < hidden; ++s)
        if (mask[s] >> t & 1u) {
          const uint16_t v = ld16(base + size_t(s) * cb, size_t(o));
          a = std::fma(h[size_t(s) * kDownTokens + size_t(t)], h16_to_f32<Bf16>(v), a);
        }
      out[size_t(t) * ldo + o] = a;
    }
}
// f(std::integral_constant<int, nt>{}) for a tile of nt tokens (1..kDownTokens): the down tiles keep their per-token
// accumulators in registers, so the count is a template argument.
template <class F>
inline void with_token_count(int nt, F&& f) {
  static_assert(kDownTokens == 8, "one case per token count below the full tile");
  switch (nt) {
    case 1:
      return f(std::integral_constant<int, 1>{});
    case 2:
      return f(std::integral_constant<int, 2>{});
    case 3:
      return f(std::integral_constant<int, 3>{});
    case 4:
      return f(std::integral_constant<int, 4>{});
    case 5:
      return f(std::integral_constant<int, 5>{});
    case 6:
      return f(std::integral_constant<int, 6>{});
    case 7:
      return f(std::integral_constant<int, 7>{});
    default:
      return f(std::integral_constant<int, kDownTokens>{});
  }
}
template <bool Bf16>
NL_512 void down_tile_h16_512(float* out, size_t ldo, int len, const float* h, const uint8_t* mask, const uint8_t* base,
                              size_t cb, int hidden, int nt) {
  with_token_count(
      nt, [&](auto T) { down_tile_h16_512_t<Bf16, decltype(T)::value>(out, ldo, len, h, mask, base, cb, hidden); });
}

template <class B>
NL_512 void down_tile_blocks_512(float* out, size_t ldo, int len, const float* h, const uint8_t* mask,
                                 const uint8_t* base, size_t cb, int hidden, int nt) {
  with_token_count(
      nt, [&](auto T) { down_tile_blocks_512_t<B, decltype(T)::value>(out, ldo, len, h, mask, base, cb, hidden); });
}

const Table kAvx512 = {dot_h16_512<false>,
                       dot_h16_512<true>,
                       dot_blocks_512<BlockQ8_0, isum_q8>,
                       dot_blocks_512<BlockQ4_0, isum_q4>,
                       rows_h16_512<false>,
                       rows_h16_512<true>,
                       down_h16_512<false>,
                       down_h16_512<true>,
                       down_blocks_512<BlockQ8_0>,
                       down_blocks_512<BlockQ4_0>,
                       rows_blocks_512<BlockQ8_0, kRowBlock>,
                       rows_blocks_512<BlockQ4_0, kRowBlock>,
                       rows_q8x8_512<kRowBlock>,
                       dot_q8x8_512,
                       tile_q8x8_512,
                       tile_h16_512<false>,
                       tile_h16_512<true>,
                       down_tile_blocks_512<BlockQ8_0>,
                       down_tile_blocks_512<BlockQ4_0>,
                       down_tile_h16_512<false>,
                       down_tile_h16_512<true>,
                       true};
const ListTable kListAvx2 = {rowsl_f32_avx2<kRowBlock>, rowsl_h16_avx2<false>, rowsl_h16_avx2<true>};
const ListTable kList512 = {rowsl_f32_avx2<kRowBlock>, rowsl_h16_512<false>, rowsl_h16_512<true>,
                            rowsl_blocks_512<BlockQ8_0>, rowsl_blocks_512<BlockQ4_0>};
#pragma GCC diagnostic pop
#endif

// ---------------------------------------------------------------------------------------------------------------
// aarch64: NEON is baseline; the dot-product instructions (vdotq_s32) are chosen when the CPU has them.
#if defined(__aarch64__)
template <bool Bf16>
inline void cvt8(const uint8_t* p, float32x4_t* lo, float32x4_t* hi) {
  const uint16x8_t v = vld1q_u16(reinterpret_cast<const uint16_t*>(p));
  if constexpr (Bf16) {
    *lo = vreinterpretq_f32_u32(vshll_n_u16(vget_low_u16(v), 16));
    *hi = vreinterpretq_f32_u32(vshll_n_u16(vget_high_u16(v), 16));
  } else {
    *lo = vcvt_f32_f16(vreinterpret_f16_u16(vget_low_u16(v)));
    *hi = vcvt_f32_f16(vreinterpret_f16_u16(vget_high_u16(v)));
  }
}

template <bool Bf16>
float dot_h16_neon(const uint8_t* w, const float* x, int n) {
  float32x4_t a[8];
  for (auto& v : a) v = vdupq_n_f32(0.0f);
  int i = 0;
  for (; i + 32 <= n; i += 32)
    for (int k = 0; k < 4; ++k) {
      float32x4_t lo, hi;
      cvt8<Bf16>(w + 2 * (i + 8 * k), &lo, &hi);
      a[2 * k] = vfmaq_f32(a[2 * k], lo, vld1q_f32(x + i + 8 * k));
      a[2 * k + 1] = vfmaq_f32(a[2 * k + 1], hi, vld1q_f32(x + i + 8 * k + 4));
    }
  float s[8];
  vst1q_f32(s, vaddq_f32(vaddq_f32(a[0], a[2]), vaddq_f32(a[4], a[6])));
  vst1q_f32(s + 4, vaddq_f32(vaddq_f32(a[1], a[3]), vaddq_f32(a[5], a[7])));
  const float tail = h16_tail<Bf16>(w, x, i, n);
  return reduce8(s) + tail;
}

// One f16 scale widened by the FP16 conversion instruction (exact, so f16_to_f32's value; base ARMv8).
inline float f16n_to_f32(uint16_t h) { return vgetq_lane_f32(vcvt_f32_f16(vreinterpret_f16_u16(vdup_n_u16(h))), 0); }
inline int8x16x2_t wq32(const BlockQ8_0& b) { return {vld1q_s8(b.qs), vld1q_s8(b.qs + 16)}; }
inline int8x16x2_t wq32(const BlockQ4_0& b) {
  const uint8x16_t v = vld1q_u8(b.qs);
  const int8x16_t eight = vdupq_n_s8(8);
  return {vsubq_s8(vreinterpretq_s8_u8(vandq_u8(v, vdupq_n_u8(15))), eight),
          vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8(v, 4)), eight)};
}

inline int32_t idot32_neon(int8x16x2_t w, const int8_t* xq) {
  const int8x16_t x0 = vld1q_s8(xq), x1 = vld1q_s8(xq + 16);
  int32x4_t s = vpaddlq_s16(vmull_s8(vget_low_s8(w.val[0]), vget_low_s8(x0)));
  s = vpadalq_s16(s, vmull_high_s8(w.val[0], x0));
  s = vpadalq_s16(s, vmull_s8(vget_low_s8(w.val[1]), vget_low_s8(x1)));
  s = vpadalq_s16(s, vmull_high_s8(w.val[1], x1));
  return vaddvq_s32(s);
}
#define NL_DOTPROD __attribute__((target("arch=armv8.2-a+dotprod")))
NL_DOTPROD inline int32_t idot32_dotprod(int8x16x2_t w, const int8_t* xq) {
  const int8x16_t x0 = vld1q_s8(xq), x1 = vld1q_s8(xq + 16);
  return vaddvq_s32(vdotq_s32(vdotq_s32(vdupq_n_s32(0), w.val[0], x0), w.val[1], x1));
}

#define NL_DOT_BLOCKS_NEON(NAME, TARGET, IDOT)                                                                  \
  template <class B, int32_t (*Isum)(const B&, const BlockQ8_0&)>                                               \
  TARGET float NAME(const B* w, const BlockQ8_0* x, int nb) {                                                   \
    float acc[8] = {};                                                                                          \
    int b = 0;                                                                                                  \
    for (; b + 8 <= nb; b += 8) {                                                                               \
      int32_t s[8];                                                                                             \
      for (int l = 0; l < 8; ++l) s[l] = IDOT(wq32(w[b + l]), x[b + l].qs);                                     \
      block_lanes(acc, s, w + b, x + b);                                                                        \
    }                                                                                                           \
    float tail = 0.0f;                                                                                          \
    for (; b < nb; ++b) tail += float(IDOT(wq32(w[b]), x[b].qs)) * (f16n_to_f32(w[b].d) * f16n_to_f32(x[b].d)); \
    return reduce8(acc) + tail;                                                                                 \
  }
NL_DOT_BLOCKS_NEON(dot_blocks_neon, , idot32_neon)
NL_DOT_BLOCKS_NEON(dot_blocks_dotprod, NL_DOTPROD, idot32_dotprod)
#undef NL_DOT_BLOCKS_NEON

// Interleaved q8_0 (q8_interleave) with the dot-product instructions: a 32-byte step holds 4 quants of blocks 0-3
// then of blocks 4-7, so two sdot chains hold the 8 blocks' exact integer sums lane by lane (signed x signed: no
// offset correction). The float operations and their order are dot_blocks_dotprod's.
template <int R>
NL_DOTPROD void rows_q8x8_dotprod(const uint8_t* w, size_t stride, const void* xv, int n, float* y) {
  const uint8_t* x = static_cast<const uint8_t*>(xv);
  const int nb = n / kQuantBlock, ng = nb / 8;
  float32x4_t acc[R][2];
  for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = vdupq_n_f32(0.0f);
  for (int g = 0; g < ng; ++g) {
    const uint8_t* xg = x + size_t(g) * kX8Group;
    const uint16x8_t xd = vld1q_u16(reinterpret_cast<const uint16_t*>(xg));
    const float32x4_t dx0 = vcvt_f32_f16(vreinterpret_f16_u16(vget_low_u16(xd)));
    const float32x4_t dx1 = vcvt_f32_f16(vreinterpret_f16_u16(vget_high_u16(xd)));
    int8x16_t xq[16];
    for (int k = 0; k < 16; ++k) xq[k] = vld1q_s8(reinterpret_cast<const int8_t*>(xg + kX8Quants + 16 * k));
    for (int r = 0; r < R; ++r) {
      const uint8_t* wg = w + size_t(r) * stride + size_t(g) * kX8Group;
      int32x4_t s0 = vdupq_n_s32(0), s1 = vdupq_n_s32(0);
      for (int k = 0; k < 8; ++k) {
        s0 = vdotq_s32(s0, vld1q_s8(reinterpret_cast<const int8_t*>(wg + kX8Quants + 32 * k)), xq[2 * k]);
        s1 = vdotq_s32(s1, vld1q_s8(reinterpret_cast<const int8_t*>(wg + kX8Quants + 32 * k + 16)), xq[2 * k + 1]);
      }
      const uint16x8_t wd = vld1q_u16(reinterpret_cast<const uint16_t*>(wg));
      const float32x4_t d0 = vmulq_f32(vcvt_f32_f16(vreinterpret_f16_u16(vget_low_u16(wd))), dx0);
      const float32x4_t d1 = vmulq_f32(vcvt_f32_f16(vreinterpret_f16_u16(vget_high_u16(wd))), dx1);
      acc[r][0] = vaddq_f32(acc[r][0], vmulq_f32(vcvtq_f32_s32(s0), d0));
      acc[r][1] = vaddq_f32(acc[r][1], vmulq_f32(vcvtq_f32_s32(s1), d1));
    }
  }
  const BlockQ8_0* xt = reinterpret_cast<const BlockQ8_0*>(x + size_t(ng) * kX8Group);
  for (int r = 0; r < R; ++r) {
    float a[8];
    vst1q_f32(a, acc[r][0]);
    vst1q_f32(a + 4, acc[r][1]);
    // The plain blocks after the groups, in order.
    const BlockQ8_0* wt = reinterpret_cast<const BlockQ8_0*>(w + size_t(r) * stride + size_t(ng) * kX8Group);
    float tail = 0.0f;
    for (int c = 0; c < nb - 8 * ng; ++c)
      tail += float(idot32_dotprod(wq32(wt[c]), xt[c].qs)) * (f16n_to_f32(wt[c].d) * f16n_to_f32(xt[c].d));
    y[r] = reduce8(a) + tail;
  }
}
NL_DOTPROD float dot_q8x8_dotprod(const uint8_t* w, const void* x, int n) {
  float y;
  rows_q8x8_dotprod<1>(w, 0, x, n, &y);
  return y;
}

template <bool Bf16>
void down_h16_neon(float* out, int o0, int o1, const float* h, const uint8_t* const* cols, int na) {
  int o = o0;
  for (; o + 16 <= o1; o += 16) {
    float32x4_t a[4];
    for (int k = 0; k < 4; ++k) a[k] = vld1q_f32(out + o + 4 * k);
    for (int i = 0; i < na; ++i) {
      const float32x4_t hv = vdupq_n_f32(h[i]);
      float32x4_t c0, c1, c2, c3;
      cvt8<Bf16>(cols[i] + 2 * size_t(o), &c0, &c1);
      cvt8<Bf16>(cols[i] + 2 * size_t(o + 8), &c2, &c3);
      a[0] = vfmaq_f32(a[0], hv, c0);
      a[1] = vfmaq_f32(a[1], hv, c1);
      a[2] = vfmaq_f32(a[2], hv, c2);
      a[3] = vfmaq_f32(a[3], hv, c3);
    }
    for (int k = 0; k < 4; ++k) vst1q_f32(out + o + 4 * k, a[k]);
  }
  if (o < o1) down_h16_port<h16_to_f32<Bf16>>(out, o, o1, h, cols, na);
}

template <class B>
void down_blocks_neon(float* out, int o0, int o1, const float* h, const uint8_t* const* cols, int na) {
  for (int b = o0 / kQuantBlock; b * kQuantBlock < o1; ++b) {
    float32x4_t a[8];
    for (int k = 0; k < 8; ++k) a[k] = vld1q_f32(out + size_t(b) * kQuantBlock + 4 * k);
    for (int i = 0; i < na; ++i) {
      const B& blk = reinterpret_cast<const B*>(cols[i])[b];
      const int8x16x2_t q = wq32(blk);
      const float32x4_t c = vdupq_n_f32(h[i] * f16n_to_f32(blk.d));
      for (int k = 0; k < 2; ++k) {
        const int16x8_t lo = vmovl_s8(vget_low_s8(q.val[k])), hi = vmovl_s8(vget_high_s8(q.val[k]));
        a[4 * k + 0] = vaddq_f32(a[4 * k + 0], vmulq_f32(c, vcvtq_f32_s32(vmovl_s16(vget_low_s16(lo)))));
        a[4 * k + 1] = vaddq_f32(a[4 * k + 1], vmulq_f32(c, vcvtq_f32_s32(vmovl_s16(vget_high_s16(lo)))));
        a[4 * k + 2] = vaddq_f32(a[4 * k + 2], vmulq_f32(c, vcvtq_f32_s32(vmovl_s16(vget_low_s16(hi)))));
        a[4 * k + 3] = vaddq_f32(a[4 * k + 3], vmulq_f32(c, vcvtq_f32_s32(vmovl_s16(vget_high_s16(hi)))));
      }
    }
    float* y = out + size_t(b) * kQuantBlock;
    for (int k = 0; k < 8; ++k) vst1q_f32(y + 4 * k, a[k]);
  }
}

const Table kNeon = {dot_h16_neon<false>,
                     dot_h16_neon<true>,
                     dot_blocks_neon<BlockQ8_0, isum_q8>,
                     dot_blocks_neon<BlockQ4_0, isum_q4>,
                     rows_port<dot_h16_neon<false>>,
                     rows_port<dot_h16_neon<true>>,
                     down_h16_neon<false>,
                     down_h16_neon<true>,
                     down_blocks_neon<BlockQ8_0>,
                     down_blocks_neon<BlockQ4_0>};
const Table kNeonDot = {dot_h16_neon<false>,
                        dot_h16_neon<true>,
                        dot_blocks_dotprod<BlockQ8_0, isum_q8>,
                        dot_blocks_dotprod<BlockQ4_0, isum_q4>,
                        rows_port<dot_h16_neon<false>>,
                        rows_port<dot_h16_neon<true>>,
                        down_h16_neon<false>,
                        down_h16_neon<true>,
                        down_blocks_neon<BlockQ8_0>,
                        down_blocks_neon<BlockQ4_0>,
                        nullptr,
                        nullptr,
                        rows_q8x8_dotprod<kRowBlock>,
                        dot_q8x8_dotprod};
#endif

bool isa_supported(Isa isa) {
  switch (isa) {
    case Isa::kPortable:
      return true;
#if defined(__x86_64__)
    case Isa::kAvx2:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c") && __builtin_cpu_supports("fma");
    case Isa::kAvxVnni:
      return isa_supported(Isa::kAvx2) && __builtin_cpu_supports("avxvnni");
    case Isa::kAvx512:
      return isa_supported(Isa::kAvx2) && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
#endif
#if defined(__aarch64__)
    case Isa::kNeon:
      return true;
    case Isa::kNeonDot:
      return (getauxval(AT_HWCAP) & HWCAP_ASIMDDP) != 0;
#endif
    default:
      return false;
  }
}

// A path's kernel tables: the strided and single-row kernels, and the multi-row kernels over listed rows.
struct Tables {
  const Table* table;
  const ListTable* list;
};
Tables tables_of(Isa isa) {
  switch (isa) {
#if defined(__x86_64__)
    case Isa::kAvx2:
      return {&kAvx2, &kListAvx2};
    case Isa::kAvxVnni:
      return {&kAvxVnni, &kListAvx2};
    case Isa::kAvx512:
      return {&kAvx512, &kList512};
#endif
#if defined(__aarch64__)
    case Isa::kNeon:
      return {&kNeon, &kListNone};
    case Isa::kNeonDot:
      return {&kNeonDot, &kListNone};
#endif
    default:
      return {&kPortable, &kListNone};
  }
}

Isa best_isa() {
  const std::vector<Isa> a = available_isas();
  return a.back();
}

Isa g_isa = best_isa();
const Table* g_table = tables_of(g_isa).table;
const ListTable* g_list = tables_of(g_isa).list;

}  // namespace

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::kPortable:
      return "portable";
    case Isa::kAvx2:
      return "avx2";
    case Isa::kAvxVnni:
      return "avx-vnni";
    case Isa::kAvx512:
      return "avx512-vnni";
    case Isa::kNeon:
      return "neon";
    case Isa::kNeonDot:
      return "neon-dotprod";
  }
  return "?";
}

std::vector<Isa> available_isas() {
  std::vector<Isa> out;
  for (Isa i : {Isa::kPortable, Isa::kAvx2, Isa::kAvxVnni, Isa::kAvx512, Isa::kNeon, Isa::kNeonDot})
    if (isa_supported(i)) out.push_back(i);
  return out;
}

Isa active_isa() { return g_isa; }

void set_isa(Isa isa) {
  if (!isa_supported(isa)) throw InternalError(std::string("kernel path ") + isa_name(isa) + " is not available here");
  g_isa = isa;
  g_table = tables_of(isa).table;
  g_list = tables_of(isa).list;
}

void PreparedX::prepare(ImageDtype w_dtype, const float* x, int n, int cols) {
  dtype_ = w_dtype;
  x_ = x;
  cols_ = cols;
  rec8_ = 0;
  if (!image_dtype_quantized(w_dtype)) return;
  if (cols % kQuantBlock != 0)
    throw InternalError("quantized weights with " + std::to_string(cols) + " columns (not a multiple of 32)");
  const int nb = cols / kQuantBlock;
  rec_ = xq_record_bytes(nb);
  q_.resize(size_t(n) * rec_ / sizeof(uint32_t));
  const bool x8 = w_dtype == ImageDtype::kQ8_0 && nb >= 8;  // the interleaved copy (row_x8) too
  if (x8) {
    rec8_ = x8_record_bytes(nb);
    q8_.resize(size_t(n) * rec8_ / sizeof(uint32_t));
  }
  // Token by token, each token's record its own: any split over threads gives the same bytes (a prefill's
  // quantization no longer runs on one thread while the others wait).
  parallel_for(n, long(n) * cols >= kParallelQuant, [&](long t) {
    uint8_t* r = reinterpret_cast<uint8_t*>(q_.data()) + size_t(t) * rec_;
    BlockQ8_0* blk = reinterpret_cast<BlockQ8_0*>(r);
    quantize_row_q8_0(x + size_t(t) * cols, blk, size_t(cols));
    int32_t* sums = reinterpret_cast<int32_t*>(r + xq_sums_offset(nb));
    for (int b = 0; b < nb; ++b) {
      int32_t s = 0;
      for (int j = 0; j < kQuantBlock; ++j) s += blk[b].qs[j];
      sums[b] = s;
    }
    if (!x8) return;
    uint8_t* dst = reinterpret_cast<uint8_t*>(q8_.data()) + size_t(t) * rec8_;
    x8_interleave_row(dst, r, nb);  // same bytes moved, then the extras
    std::memcpy(dst + xq_sums_offset(nb), r + xq_sums_offset(nb), sizeof(int32_t) * size_t(nb));
    float* sc = const_cast<float*>(x8_scales(dst, nb));
    int32_t* corr = const_cast<int32_t*>(x8_corr(dst, nb));
    for (int b = 0; b < nb; ++b) {
      sc[b] = f16_to_f32(blk[b].d);
      corr[b] = -(sums[b] * 128);
    }
  });
}

const void* PreparedX::row_x8(int t) const {
  if (dtype_ != ImageDtype::kQ8_0 || cols_ < 8 * kQuantBlock)
    throw InternalError("PreparedX::row_x8: not a q8_0 record of at least one 8-block group");
  return reinterpret_cast<const uint8_t*>(q8_.data()) + size_t(t) * rec8_;
}

bool q8_interleave_pays() { return g_table->rows_q8x8 != nullptr; }

bool q8_interleavable(const WeightView& w) {
  return w.dtype == ImageDtype::kQ8_0 && !w.q8_x8 && w.cols % kQuantBlock == 0 && w.cols >= 8 * kQuantBlock &&
         w.row_stride == image_row_bytes(ImageDtype::kQ8_0, size_t(w.cols));
}

void q8_interleave(WeightView* w) {
  if (!q8_interleavable(*w)) throw InternalError("q8_interleave: not an interleavable q8_0 matrix");
  uint8_t* data = const_cast<uint8_t*>(w->data);  // the caller owns these bytes (see the header)
  std::vector<uint8_t> tmp(w->row_stride);
  for (int r = 0; r < w->rows; ++r) {
    uint8_t* row = data + size_t(r) * w->row_stride;
    std::memcpy(tmp.data(), row, w->row_stride);
    x8_interleave_row(row, tmp.data(), w->cols / kQuantBlock);
  }
  w->q8_x8 = true;
}

bool q8_interleave_if_pays(WeightView* w) {
  if (!q8_interleave_pays() || !q8_interleavable(*w)) return false;
  q8_interleave(w);
  return true;
}

size_t PreparedX::row_bytes() const { return image_dtype_quantized(dtype_) ? rec_ : size_t(cols_) * sizeof(float); }

const void* PreparedX::row(int t) const {
  if (image_dtype_quantized(dtype_)) return reinterpret_cast<const uint8_t*>(q_.data()) + size_t(t) * rec_;
  return x_ + size_t(t) * cols_;
}

float row_dot(ImageDtype dt, const uint8_t* w, const void* x, int n) {
  switch (dt) {
    case ImageDtype::kF32:
      return dot(reinterpret_cast<const float*>(w), static_cast<const float*>(x), n);
    case ImageDtype::kF16:
      return g_table->dot_f16(w, static_cast<const float*>(x), n);
    case ImageDtype::kBF16:
      return g_table->dot_bf16(w, static_cast<const float*>(x), n);
    case ImageDtype::kQ8_0:
      return g_table->dot_q8(reinterpret_cast<const BlockQ8_0*>(w), static_cast<const BlockQ8_0*>(x), n / kQuantBlock);
    case ImageDtype::kQ4_0:
      return g_table->dot_q4(reinterpret_cast<const BlockQ4_0*>(w), static_cast<const BlockQ8_0*>(x), n / kQuantBlock);
  }
  throw InternalError("row_dot: unknown dtype");
}

void row_dots(ImageDtype dt, const uint8_t* const* w, int n, const void* x, int cols, float* y) {
  const RowsListFn fn = dt == ImageDtype::kF32    ? g_list->f32
                        : dt == ImageDtype::kF16  ? g_list->f16
                        : dt == ImageDtype::kBF16 ? g_list->bf16
                        : dt == ImageDtype::kQ8_0 ? g_list->q8
                                                  : g_list->q4;
  // Listed rows are scattered: nothing a hardware prefetcher follows. Each block of rows requests the next block's
  // bytes as it computes, a few lines per step (the first block is the caller's to request: prefetch_bundles); a last
  // partial block is requested whole first. The whole next block as one burst before each block's dots instead: the
  // 1B shape's every-bundle-cached q8_0 decode 1.25x slower at 1 thread on an AMD EPYC (Zen 4) host.
  const size_t rb = image_row_bytes(dt, size_t(cols));
  int i = 0;
  if (fn)
    for (; i + kRowBlock <= n; i += kRowBlock) {
      const bool whole = i + 2 * kRowBlock <= n;
      if (!whole)
        for (int j = i + kRowBlock; j < n; ++j) prefetch_bytes(w[j], rb);
      fn(w + i, whole ? w + i + kRowBlock : nullptr, x, cols, y + i);
    }
  for (; i < n; ++i) y[i] = row_dot(dt, w[i], x, cols);
}

namespace {
// kRowBlock rows per pass, the passes split over threads: block(first row, x_t, y[kRowBlock]) for whole blocks when
// has_block, one(row, x_t) for every other row, where x_t = (x.*row_of)(t). Each output (t, o) is computed by one
// call, whichever thread runs it; a block's bytes stay in cache across the tokens.
// With n > 1 and a token-tile kernel, whole row blocks run as tiles of tile_tokens tokens (x_bytes: from one token's
// row to the next), each (row, token) with the one-row numbers, in panels of kPanelBlocks row blocks: per panel, each
// token tile runs over all the panel's blocks, so the tile's activations (tile_tokens rows) stay in L1 while the
// panel's weights (64 rows, 256 KiB of f16 at 2048 columns) stay in L2. Block by block over all tokens instead, every
// block streamed the whole prompt's activations from L2 again.
constexpr int kPanelBlocks = 16;
template <class Block, class One>
void matmul_row_blocks(float* y, const PreparedX& x, const void* (PreparedX::*row_of)(int) const, size_t x_bytes,
                       TileFn tile, int tile_tokens, const WeightView& w, int n, bool has_block, Block block, One one) {
  const int rows = w.rows;
  const size_t rb = image_row_bytes(w.dtype, size_t(w.cols));
  const long bytes = long(n) * rows * long(rb);
  const int groups = (rows + kRowBlock - 1) / kRowBlock;
  // Whole blocks that run as token tiles (the panels), then the rest block by block.
  const int tiled = tile && n > 1 ? rows / kRowBlock : 0;
  const int panels = (tiled + kPanelBlocks - 1) / kPanelBlocks;
  const uint8_t* x0 = tiled ? static_cast<const uint8_t*>((x.*row_of)(0)) : nullptr;
  parallel_region(bytes > kParallelBytes, [&] {
#pragma omp for schedule(static) nowait
    for (int p = 0; p < panels; ++p) {
      const int g0 = p * kPanelBlocks, g1 = std::min(tiled, g0 + kPanelBlocks);
      for (int t = 0; t < n; t += tile_tokens)
        for (int gi = g0; gi < g1; ++gi) {
          const int o0 = gi * kRowBlock;
          if (t == 0 && gi + 1 < g1)  // the panel's first pass brings its rows in
            for (int r = o0 + kRowBlock; r < o0 + 2 * kRowBlock; ++r) prefetch_bytes(w.row(r), rb);
          tile(w.row(o0), w.row_stride, x0 + size_t(t) * x_bytes, x_bytes, std::min(tile_tokens, n - t), w.cols,
               y + size_t(t) * rows + o0, size_t(rows));
        }
    }
#pragma omp for schedule(static)
    for (int gi = tiled; gi < groups; ++gi) {
      const int o0 = gi * kRowBlock;
      if (!(has_block && n == 1 && g_table->rows_prefetch))  // else the row kernels prefetch as they go
        for (int r = o0 + kRowBlock; r < std::min(rows, o0 + 2 * kRowBlock); ++r) prefetch_bytes(w.row(r), rb);
      for (int t = 0; t < n; ++t) {
        const void* xt = (x.*row_of)(t);
        if (has_block && o0 + kRowBlock <= rows) {
          float yr[kRowBlock];
          block(w.row(o0), xt, yr);
          for (int r = 0; r < kRowBlock; ++r) y[size_t(t) * rows + o0 + r] = yr[r];
        } else {
          for (int o = o0; o < std::min(rows, o0 + kRowBlock); ++o) y[size_t(t) * rows + o] = one(w.row(o), xt);
        }
      }
    }
  });
}
}  // namespace

void matmul(float* y, const PreparedX& x, const WeightView& w, int n) {
  const int rows = w.rows, cols = w.cols;
  const size_t stride = w.row_stride;
  if (w.q8_x8) {
    if (x.dtype() != ImageDtype::kQ8_0) throw InternalError("matmul: interleaved q8_0 weights, other activations");
    auto rows_x8 = g_table->rows_q8x8;
    auto dot_x8 = g_table->dot_q8x8 ? g_table->dot_q8x8 : dot_q8x8_port;
    matmul_row_blocks(
        y, x, &PreparedX::row_x8, x.row_x8_bytes(), g_table->tile_q8x8, kTokenTile, w, n, rows_x8 != nullptr,
        [&](const uint8_t* p, const void* xt, float* yr) { rows_x8(p, stride, xt, cols, yr); },
        [&](const uint8_t* p, const void* xt) { return dot_x8(p, xt, cols); });
    return;
  }
  auto rows_fn = w.dtype == ImageDtype::kF16    ? g_table->rows_f16
                 : w.dtype == ImageDtype::kBF16 ? g_table->rows_bf16
                                                : nullptr;
  auto rows_q = w.dtype == ImageDtype::kQ8_0   ? g_table->rows_q8
                : w.dtype == ImageDtype::kQ4_0 ? g_table->rows_q4
                                               : nullptr;
  auto one = [&](const uint8_t* p, const void* xt) { return row_dot(w.dtype, p, xt, cols); };
  const TileFn tile = w.dtype == ImageDtype::kF16    ? g_table->tile_f16
                      : w.dtype == ImageDtype::kBF16 ? g_table->tile_bf16
                                                     : nullptr;
  if (rows_fn || rows_q) {
    matmul_row_blocks(
        y, x, &PreparedX::row, x.row_bytes(), tile, kTokenTileH16, w, n, true,
        [&](const uint8_t* p, const void* xt, float* yr) {
          if (rows_fn)
            rows_fn(p, stride, static_cast<const float*>(xt), cols, yr);
          else
            rows_q(p, stride, xt, cols, yr);
        },
        one);
    return;
  }
  // No multi-row kernel (f32 with a row stride, the paths without one): row by row. No software prefetch: the rows
  // ascend as one stream the hardware prefetchers follow, and a whole row requested a block ahead (24 lines at once
  // at dim 384) made small-relu's f32 decode 1.16-1.24x slower on an AMD EPYC (Zen 4) host.
  const size_t rb = image_row_bytes(w.dtype, size_t(cols));
  parallel_for(rows, long(n) * rows * long(rb) > kParallelBytes, [&](long o) {
    const uint8_t* wr = w.row(int(o));
    for (int t = 0; t < n; ++t) y[size_t(t) * rows + size_t(o)] = one(wr, x.row(t));
  });
}

void matmul(float* y, const float* x, const WeightView& w, int n) {
  // Contiguous f32 with a token tile's worth of rows (prompt blocks): the tiled fp32 kernel (same per-output order as
  // dot, so as row_dot). Decode (fewer tokens) goes row by row below, the next rows prefetched and split over threads
  // from kParallelBytes on: small-relu's f32 decode 1.10-1.27x faster than the fp32 kernel's 4-row tiles, which stay
  // on one thread below 2M multiply-adds (every matrix of a small model).
  if (n >= kTokenTile && w.dtype == ImageDtype::kF32 && w.row_stride == size_t(w.cols) * sizeof(float) &&
      reinterpret_cast<uintptr_t>(w.data) % alignof(float) == 0) {
    matmul(y, x, reinterpret_cast<const float*>(w.data), n, w.cols, w.rows);
    return;
  }
  thread_local PreparedX px;
  px.prepare(w.dtype, x, n, w.cols);
  matmul(y, px, w, n);
}

void dequantize_row(const WeightView& w, int r, float* out) {
  if (w.q8_x8) throw InternalError("dequantize_row: interleaved q8_0 rows (embedding tables are never interleaved)");
  const uint8_t* p = w.row(r);
  switch (w.dtype) {
    case ImageDtype::kQ8_0:
      dequantize_row_q8_0(reinterpret_cast<const BlockQ8_0*>(p), out, size_t(w.cols));
      break;
    case ImageDtype::kQ4_0:
      dequantize_row_q4_0(reinterpret_cast<const BlockQ4_0*>(p), out, size_t(w.cols));
      break;
    default:
      image_decode(w.dtype, p, size_t(w.cols), out);
  }
}

void down_accum(ImageDtype dt, float* out, int o0, int o1, const float* h, const uint8_t* const* cols, int n_active,
                bool accumulate) {
  // The per-dtype paths add to out[] in list order; starting from zero or from an earlier list's sums gives the bits
  // of one sum over both lists.
  if (!accumulate) std::fill(out + o0, out + o1, 0.0f);
  switch (dt) {
    case ImageDtype::kF32:
      return down_f32(out, o0, o1, h, cols, n_active);
    case ImageDtype::kF16:
      return g_table->down_f16(out, o0, o1, h, cols, n_active);
    case ImageDtype::kBF16:
      return g_table->down_bf16(out, o0, o1, h, cols, n_active);
    case ImageDtype::kQ8_0:
      return g_table->down_q8(out, o0, o1, h, cols, n_active);
    case ImageDtype::kQ4_0:
      return g_table->down_q4(out, o0, o1, h, cols, n_active);
  }
  throw InternalError("down_accum: unknown dtype");
}

void down_project(ImageDtype dt, float* out, int dim, const float* h, const uint8_t* const* cols, int n_active,
                  bool accumulate) {
  // Contiguous output ranges (whole blocks of 32), one per thread: every output is summed in list order by one thread,
  // so the split (and the thread count) never changes a bit.
  const int chunks = (dim + kChunk - 1) / kChunk;
  const long bytes = long(image_row_bytes(dt, size_t(dim))) * n_active;
  parallel_region(bytes > kParallelBytes, [&] {
    const int nt = omp_get_num_threads(), t = omp_get_thread_num();
    const int c0 = int(long(chunks) * t / nt), c1 = int(long(chunks) * (t + 1) / nt);
    if (c1 > c0) down_accum(dt, out, c0 * kChunk, std::min(dim, c1 * kChunk), h, cols, n_active, accumulate);
  });
}

void DownCoeffs::prepare(const float* h, size_t h_stride, int hidden, int n) {
  n_ = n;
  hidden_ = hidden;
  const int tiles = (n + kDownTokens - 1) / kDownTokens;
  th_.resize(size_t(tiles) * size_t(hidden) * kDownTokens);  // used only where the mask says so: no clearing
  mask_.assign(size_t(tiles) * size_t(hidden), 0);
  idx_.resize(size_t(n) * size_t(hidden));
  hk_.resize(size_t(n) * size_t(hidden));
  count_.resize(size_t(n));
  for (int t = 0; t < n; ++t) {
    const float* ht = h + size_t(t) * h_stride;
    float* th = th_.data() + size_t(t / kDownTokens) * size_t(hidden) * kDownTokens + size_t(t % kDownTokens);
    uint8_t* m = mask_.data() + size_t(t / kDownTokens) * size_t(hidden);
    uint32_t* idx = idx_.data() + size_t(t) * size_t(hidden);
    float* hk = hk_.data() + size_t(t) * size_t(hidden);
    int k = 0;
    for (int s = 0; s < hidden; ++s)
      if (ht[s] != 0.0f) {
        th[size_t(s) * kDownTokens] = ht[s];
        m[s] = uint8_t(m[s] | 1u << (t % kDownTokens));
        idx[k] = uint32_t(s);
        hk[k++] = ht[s];
      }
    count_[size_t(t)] = k;
  }
}

void down_tokens(ImageDtype dt, float* out, size_t out_stride, int len, const DownCoeffs& h, const uint8_t* base,
                 size_t slice_bytes) {
  static_assert(kDownTokens == kDownTokenTile);
  const int n = h.tokens(), hidden = h.hidden();
  const DownTileFn tile = dt == ImageDtype::kQ8_0   ? g_table->down_tile_q8
                          : dt == ImageDtype::kQ4_0 ? g_table->down_tile_q4
                          : dt == ImageDtype::kF16  ? g_table->down_tile_f16
                          : dt == ImageDtype::kBF16 ? g_table->down_tile_bf16
                                                    : nullptr;
  if (!tile || n == 1) {  // token by token over each token's list
    thread_local std::vector<const uint8_t*> cols;
    cols.resize(size_t(hidden));
    for (int t = 0; t < n; ++t) {
      const int k = h.count(t);
      const uint32_t* idx = h.idx(t);
      for (int i = 0; i < k; ++i) cols[size_t(i)] = base + size_t(idx[i]) * slice_bytes;
      down_accum(dt, out + size_t(t) * out_stride, 0, len, h.hk(t), cols.data(), k);
    }
    return;
  }
  for (int t0 = 0, ti = 0; t0 < n; t0 += kDownTokens, ++ti)
    tile(out + size_t(t0) * out_stride, out_stride, len, h.tile_h(ti), h.tile_mask(ti), base, slice_bytes, hidden,
         std::min(kDownTokens, n - t0));
}

void prefetch_bundles(ImageDtype dt, int dim, BundleGate gate, const uint8_t* const* bundles, int n) {
  const size_t rb = image_row_bytes(dt, size_t(dim));
  for (int i = 0; i < std::min(n, kRowBlock); ++i)
    prefetch_bytes(bundles[i] + (gate == BundleGate::kGiven ? rb : 0), gate == BundleGate::kGiven ? rb : 2 * rb);
}

namespace {
// kSilu / kGelu: the smooth gate activation (model_weights.h ffn_act_smooth).
inline float smooth_gate(BundleGate gate, float v) {
  return ffn_act_smooth(gate == BundleGate::kGelu ? FfnAct::kGelu : FfnAct::kSilu, v);
}
}  // namespace

void bundle_coefficients(ImageDtype dt, int dim, const void* x, const BundleAct& act, const float* g,
                         const uint8_t* const* bundles, int n, float* h) {
  const BundleGate gate = act.gate;
  const float floor = act.floor;
  const size_t rb = image_row_bytes(dt, size_t(dim));
  const uint8_t* rows[kBundleChunk];
  float gv[kBundleChunk], up[kBundleChunk];
  int keep[kBundleChunk];
  for (int c = 0; c < n; c += kBundleChunk) {
    const int m = std::min(kBundleChunk, n - c);
    if (c + kBundleChunk < n) prefetch_bundles(dt, dim, gate, bundles + c + kBundleChunk, n - c - kBundleChunk);
    if (act.plain) {  // h is the activation itself
      if (gate == BundleGate::kGiven) {
        for (int i = 0; i < m; ++i) h[c + i] = g[c + i];
        continue;
      }
      row_dots(dt, bundles + c, m, x, dim, gv);
      for (int i = 0; i < m; ++i) {
        const float v = gv[i] + (act.bias ? act.bias[c + i] : 0.0f);
        h[c + i] = gate == BundleGate::kRelu ? (v > floor ? v : 0.0f) : smooth_gate(gate, v);
      }
      continue;
    }
    if (gate == BundleGate::kGiven) {
      for (int i = 0; i < m; ++i) gv[i] = g[c + i];
    } else {
      row_dots(dt, bundles + c, m, x, dim, gv);
      for (int i = 0; i < m; ++i) {
        float& gi = gv[i];
        if (gate == BundleGate::kRelu) {
          if (!(gi > floor)) gi = 0.0f;
        } else {
          gi = smooth_gate(gate, gi);
        }
      }
    }
    int u = 0;
    for (int i = 0; i < m; ++i) {
      if (gv[i] == 0.0f) {
        h[c + i] = 0.0f;
      } else {
        rows[u] = bundles[c + i] + rb;
        keep[u++] = i;
      }
    }
    row_dots(dt, rows, u, x, dim, up);
    if (act.up_relu)
      for (int q = 0; q < u; ++q) up[q] = up[q] > 0.0f ? up[q] : 0.0f;
    for (int q = 0; q < u; ++q) h[c + keep[q]] = gv[keep[q]] * up[q];
  }
}

void ffn_bundles(ImageDtype dt, int dim, const PreparedX& x, const float* g, const uint8_t* const* bundles, int n,
                 float* out, const BundleAct& act) {
  // Scratch per calling thread, used through plain pointers (a thread_local named inside the parallel region would
  // be each worker's own, empty one).
  thread_local std::vector<float> h_buf;
  thread_local std::vector<const uint8_t*> down_buf;
  h_buf.resize(size_t(n));
  down_buf.resize(size_t(n));
  float* h = h_buf.data();
  const uint8_t** down = down_buf.data();
  const size_t rb = image_row_bytes(dt, size_t(dim));
  const void* xr = x.row(0);
  const int chunks = (n + kBundleChunk - 1) / kBundleChunk;
  parallel_for(chunks, 2L * n * long(rb) > kParallelBytes, [&](long c) {  // gate and up rows
    const int i0 = int(c) * kBundleChunk, m = std::min(kBundleChunk, n - i0);
    BundleAct a = act;
    a.gate = g ? BundleGate::kGiven : BundleGate::kRelu;
    if (act.bias) a.bias = act.bias + i0;
    bundle_coefficients(dt, dim, xr, a, g ? g + i0 : nullptr, bundles + i0, m, h + i0);
  });
  int k = 0;
  for (int i = 0; i < n; ++i)
    if (g || h[size_t(i)] != 0.0f) {
      h[size_t(k)] = h[size_t(i)];
      down[size_t(k++)] = bundles[i] + (act.plain ? 1 : 2) * rb;
    }
  down_project(dt, out, dim, h, down, k);
}

}  // namespace nl::kernels
