// Dense AND+popcount tile kernels: portable scalar (with a hardware-popcnt clone), AVX2 (nibble-LUT popcount,
// byte accumulators), AVX-512 VPOPCNTDQ. Register-blocked micro-tiles of 4x4 neuron pairs (2x4 for AVX2) so
// every loaded word is used several times. Per-function target attributes keep the file's default code portable.
#include "graph/popcount_kernels.h"

#include <immintrin.h>

#include "formats/core/error.h"

namespace nl::detail {
namespace {

// ------------------------------------------------------------------------------------------------- scalar

// Portable popcount (no POPCNT instruction needed); the compiler turns it into popcnt in the clone below.
inline uint64_t popc_swar(uint64_t x) {
  x = x - ((x >> 1) & 0x5555555555555555ull);
  x = (x & 0x3333333333333333ull) + ((x >> 2) & 0x3333333333333333ull);
  x = (x + (x >> 4)) & 0x0f0f0f0f0f0f0f0full;
  return (x * 0x0101010101010101ull) >> 56;
}

template <bool kHw>
inline uint64_t popc(uint64_t x) {
  if constexpr (kHw) return static_cast<uint64_t>(__builtin_popcountll(x));
  return popc_swar(x);
}

template <bool kHw>
inline void scalar_tile(const uint64_t* a, uint32_t na, const uint64_t* b, uint32_t nb, uint64_t stride, uint64_t nw,
                        uint32_t* cnt, uint32_t ld, bool upper) {
  uint32_t r = 0;
  for (; r + 4 <= na; r += 4) {
    uint32_t c = upper ? (r & ~3u) : 0;
    for (; c + 4 <= nb; c += 4) {
      if (upper && c + 3 <= r) continue;
      uint64_t acc[4][4] = {};
      const uint64_t* ar[4] = {a + (r + 0) * stride, a + (r + 1) * stride, a + (r + 2) * stride, a + (r + 3) * stride};
      const uint64_t* bc[4] = {b + (c + 0) * stride, b + (c + 1) * stride, b + (c + 2) * stride, b + (c + 3) * stride};
      for (uint64_t w = 0; w < nw; ++w) {
        uint64_t x0 = ar[0][w], x1 = ar[1][w], x2 = ar[2][w], x3 = ar[3][w];
        for (int y = 0; y < 4; ++y) {
          uint64_t by = bc[y][w];
          acc[0][y] += popc<kHw>(x0 & by);
          acc[1][y] += popc<kHw>(x1 & by);
          acc[2][y] += popc<kHw>(x2 & by);
          acc[3][y] += popc<kHw>(x3 & by);
        }
      }
      for (int x = 0; x < 4; ++x)
        for (int y = 0; y < 4; ++y) cnt[(r + x) * ld + c + y] += static_cast<uint32_t>(acc[x][y]);
    }
    for (; c < nb; ++c)  // column edge
      for (uint32_t x = r; x < r + 4; ++x) {
        if (upper && c <= x) continue;
        uint64_t s = 0;
        const uint64_t *p = a + x * stride, *q = b + c * stride;
        for (uint64_t w = 0; w < nw; ++w) s += popc<kHw>(p[w] & q[w]);
        cnt[x * ld + c] += static_cast<uint32_t>(s);
      }
  }
  for (; r < na; ++r)  // row edge
    for (uint32_t c = upper ? r + 1 : 0; c < nb; ++c) {
      uint64_t s = 0;
      const uint64_t *p = a + r * stride, *q = b + c * stride;
      for (uint64_t w = 0; w < nw; ++w) s += popc<kHw>(p[w] & q[w]);
      cnt[r * ld + c] += static_cast<uint32_t>(s);
    }
}

void tile_scalar(const uint64_t* a, uint32_t na, const uint64_t* b, uint32_t nb, uint64_t stride, uint64_t nw,
                 uint32_t* cnt, uint32_t ld, bool upper) {
  scalar_tile<false>(a, na, b, nb, stride, nw, cnt, ld, upper);
}

__attribute__((target("popcnt"))) void tile_scalar_popcnt(const uint64_t* a, uint32_t na, const uint64_t* b,
                                                          uint32_t nb, uint64_t stride, uint64_t nw, uint32_t* cnt,
                                                          uint32_t ld, bool upper) {
  scalar_tile<true>(a, na, b, nb, stride, nw, cnt, ld, upper);
}

// --------------------------------------------------------------------------------------------------- AVX2

#define NL_AVX2 __attribute__((target("avx2,popcnt")))

NL_AVX2 inline __m256i avx2_popcnt_bytes(__m256i x) {
  const __m256i lut =
      _mm256_setr_epi8(0, 1, 1, 2, 1, 2, 2, 3, 1, 2, 2, 3, 2, 3, 3, 4, 0, 1, 1, 2, 1, 2, 2, 3, 1, 2, 2, 3, 2, 3, 3, 4);
  const __m256i low = _mm256_set1_epi8(0x0f);
  __m256i lo = _mm256_and_si256(x, low), hi = _mm256_and_si256(_mm256_srli_epi16(x, 4), low);
  return _mm256_add_epi8(_mm256_shuffle_epi8(lut, lo), _mm256_shuffle_epi8(lut, hi));
}

NL_AVX2 inline uint64_t avx2_hsum(__m256i v) {
  return uint64_t(_mm256_extract_epi64(v, 0)) + uint64_t(_mm256_extract_epi64(v, 1)) +
         uint64_t(_mm256_extract_epi64(v, 2)) + uint64_t(_mm256_extract_epi64(v, 3));
}

// One pair over nw words (edges of the tile).
NL_AVX2 uint64_t avx2_pair(const uint64_t* p, const uint64_t* q, uint64_t nw) {
  __m256i acc = _mm256_setzero_si256();
  uint64_t w = 0;
  while (w + 4 <= nw) {
    __m256i bytes = _mm256_setzero_si256();
    // Byte counters hold at most 31 * 8 = 248 before they are widened.
    for (int it = 0; it < 31 && w + 4 <= nw; ++it, w += 4) {
      __m256i x = _mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + w)),
                                   _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + w)));
      bytes = _mm256_add_epi8(bytes, avx2_popcnt_bytes(x));
    }
    acc = _mm256_add_epi64(acc, _mm256_sad_epu8(bytes, _mm256_setzero_si256()));
  }
  uint64_t s = avx2_hsum(acc);
  for (; w < nw; ++w) s += static_cast<uint64_t>(__builtin_popcountll(p[w] & q[w]));
  return s;
}

NL_AVX2 void tile_avx2(const uint64_t* a, uint32_t na, const uint64_t* b, uint32_t nb, uint64_t stride, uint64_t nw,
                       uint32_t* cnt, uint32_t ld, bool upper) {
  const uint64_t nv = nw / 4 * 4;
  uint32_t r = 0;
  for (; r + 2 <= na; r += 2) {
    uint32_t c = upper ? (r & ~3u) : 0;
    for (; c + 4 <= nb; c += 4) {
      if (upper && c + 3 <= r) continue;
      const uint64_t *a0 = a + r * stride, *a1 = a0 + stride;
      const uint64_t *b0 = b + c * stride, *b1 = b0 + stride, *b2 = b1 + stride, *b3 = b2 + stride;
      __m256i acc[2][4];
      for (auto& row : acc)
        for (auto& v : row) v = _mm256_setzero_si256();
      uint64_t w = 0;
      while (w < nv) {
        __m256i by[2][4];
        for (auto& row : by)
          for (auto& v : row) v = _mm256_setzero_si256();
        for (int it = 0; it < 31 && w < nv; ++it, w += 4) {
          __m256i x0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a0 + w));
          __m256i x1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a1 + w));
          const uint64_t* bs[4] = {b0, b1, b2, b3};
          for (int y = 0; y < 4; ++y) {
            __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(bs[y] + w));
            by[0][y] = _mm256_add_epi8(by[0][y], avx2_popcnt_bytes(_mm256_and_si256(x0, q)));
            by[1][y] = _mm256_add_epi8(by[1][y], avx2_popcnt_bytes(_mm256_and_si256(x1, q)));
          }
        }
        for (int x = 0; x < 2; ++x)
          for (int y = 0; y < 4; ++y)
            acc[x][y] = _mm256_add_epi64(acc[x][y], _mm256_sad_epu8(by[x][y], _mm256_setzero_si256()));
      }
      const uint64_t* ar[2] = {a0, a1};
      const uint64_t* bs[4] = {b0, b1, b2, b3};
      for (int x = 0; x < 2; ++x)
        for (int y = 0; y < 4; ++y) {
          uint64_t s = avx2_hsum(acc[x][y]);
          for (uint64_t t = nv; t < nw; ++t) s += static_cast<uint64_t>(__builtin_popcountll(ar[x][t] & bs[y][t]));
          cnt[(r + x) * ld + c + y] += static_cast<uint32_t>(s);
        }
    }
    for (; c < nb; ++c)
      for (uint32_t x = r; x < r + 2; ++x)
        if (!upper || c > x) cnt[x * ld + c] += static_cast<uint32_t>(avx2_pair(a + x * stride, b + c * stride, nw));
  }
  for (; r < na; ++r)
    for (uint32_t c = upper ? r + 1 : 0; c < nb; ++c)
      cnt[r * ld + c] += static_cast<uint32_t>(avx2_pair(a + r * stride, b + c * stride, nw));
}

// ------------------------------------------------------------------------------------------------ AVX-512

#define NL_AVX512 __attribute__((target("avx512f,avx512vpopcntdq,popcnt")))

// Horizontal sum (GCC 12's _mm512_reduce_add_epi64 warns about an uninitialised temporary under target attributes).
NL_AVX512 inline uint64_t avx512_hsum(__m512i v) {
  __m256i h = _mm256_add_epi64(_mm512_mask_extracti64x4_epi64(_mm256_setzero_si256(), 0xff, v, 0),
                               _mm512_mask_extracti64x4_epi64(_mm256_setzero_si256(), 0xff, v, 1));
  __m128i q = _mm_add_epi64(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
  return uint64_t(_mm_cvtsi128_si64(q)) + uint64_t(_mm_extract_epi64(q, 1));
}

NL_AVX512 uint64_t avx512_pair(const uint64_t* p, const uint64_t* q, uint64_t nw) {
  __m512i acc = _mm512_setzero_si512();
  uint64_t w = 0;
  for (; w + 8 <= nw; w += 8)
    acc = _mm512_add_epi64(acc,
                           _mm512_popcnt_epi64(_mm512_and_si512(_mm512_loadu_si512(p + w), _mm512_loadu_si512(q + w))));
  if (w < nw) {
    __mmask8 m = static_cast<__mmask8>((1u << (nw - w)) - 1);
    acc = _mm512_add_epi64(acc, _mm512_popcnt_epi64(_mm512_and_si512(_mm512_maskz_loadu_epi64(m, p + w),
                                                                     _mm512_maskz_loadu_epi64(m, q + w))));
  }
  return avx512_hsum(acc);
}

NL_AVX512 void tile_avx512(const uint64_t* a, uint32_t na, const uint64_t* b, uint32_t nb, uint64_t stride, uint64_t nw,
                           uint32_t* cnt, uint32_t ld, bool upper) {
  const uint64_t nv = nw / 8 * 8;
  const __mmask8 tail = static_cast<__mmask8>((1u << (nw - nv)) - 1);
  uint32_t r = 0;
  for (; r + 4 <= na; r += 4) {
    uint32_t c = upper ? (r & ~3u) : 0;
    for (; c + 4 <= nb; c += 4) {
      if (upper && c + 3 <= r) continue;
      const uint64_t *a0 = a + r * stride, *a1 = a0 + stride, *a2 = a1 + stride, *a3 = a2 + stride;
      const uint64_t *b0 = b + c * stride, *b1 = b0 + stride, *b2 = b1 + stride, *b3 = b2 + stride;
      __m512i s00 = _mm512_setzero_si512(), s01 = s00, s02 = s00, s03 = s00, s10 = s00, s11 = s00, s12 = s00, s13 = s00,
              s20 = s00, s21 = s00, s22 = s00, s23 = s00, s30 = s00, s31 = s00, s32 = s00, s33 = s00;
#define NL_ACC(s, x, y) s = _mm512_add_epi64(s, _mm512_popcnt_epi64(_mm512_and_si512(x, y)))
#define NL_STEP(LOAD, off)                                                                                    \
  do {                                                                                                        \
    const __m512i x0 = LOAD(a0 + (off)), x1 = LOAD(a1 + (off)), x2 = LOAD(a2 + (off)), x3 = LOAD(a3 + (off)); \
    const __m512i y0 = LOAD(b0 + (off)), y1 = LOAD(b1 + (off)), y2 = LOAD(b2 + (off)), y3 = LOAD(b3 + (off)); \
    NL_ACC(s00, x0, y0);                                                                                      \
    NL_ACC(s01, x0, y1);                                                                                      \
    NL_ACC(s02, x0, y2);                                                                                      \
    NL_ACC(s03, x0, y3);                                                                                      \
    NL_ACC(s10, x1, y0);                                                                                      \
    NL_ACC(s11, x1, y1);                                                                                      \
    NL_ACC(s12, x1, y2);                                                                                      \
    NL_ACC(s13, x1, y3);                                                                                      \
    NL_ACC(s20, x2, y0);                                                                                      \
    NL_ACC(s21, x2, y1);                                                                                      \
    NL_ACC(s22, x2, y2);                                                                                      \
    NL_ACC(s23, x2, y3);                                                                                      \
    NL_ACC(s30, x3, y0);                                                                                      \
    NL_ACC(s31, x3, y1);                                                                                      \
    NL_ACC(s32, x3, y2);                                                                                      \
    NL_ACC(s33, x3, y3);                                                                                      \
  } while (0)
#define NL_LOADU(p) _mm512_loadu_si512(p)
#define NL_LOADT(p) _mm512_maskz_loadu_epi64(tail, p)
      for (uint64_t w = 0; w < nv; w += 8) NL_STEP(NL_LOADU, w);
      if (tail) NL_STEP(NL_LOADT, nv);
#undef NL_LOADT
#undef NL_LOADU
#undef NL_STEP
#undef NL_ACC
      uint32_t* o = cnt + r * ld + c;
#define NL_OUT(x, y, s) o[(x)*ld + (y)] += static_cast<uint32_t>(avx512_hsum(s))
      NL_OUT(0, 0, s00);
      NL_OUT(0, 1, s01);
      NL_OUT(0, 2, s02);
      NL_OUT(0, 3, s03);
      NL_OUT(1, 0, s10);
      NL_OUT(1, 1, s11);
      NL_OUT(1, 2, s12);
      NL_OUT(1, 3, s13);
      NL_OUT(2, 0, s20);
      NL_OUT(2, 1, s21);
      NL_OUT(2, 2, s22);
      NL_OUT(2, 3, s23);
      NL_OUT(3, 0, s30);
      NL_OUT(3, 1, s31);
      NL_OUT(3, 2, s32);
      NL_OUT(3, 3, s33);
#undef NL_OUT
    }
    for (; c < nb; ++c)
      for (uint32_t x = r; x < r + 4; ++x)
        if (!upper || c > x) cnt[x * ld + c] += static_cast<uint32_t>(avx512_pair(a + x * stride, b + c * stride, nw));
  }
  for (; r < na; ++r)
    for (uint32_t c = upper ? r + 1 : 0; c < nb; ++c)
      cnt[r * ld + c] += static_cast<uint32_t>(avx512_pair(a + r * stride, b + c * stride, nw));
}

// ------------------------------------------------------------------------------------------- peak probes

uint64_t loop_scalar(const uint64_t* a, const uint64_t* b, uint64_t n, uint64_t reps) {
  uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  for (uint64_t r = 0; r < reps; ++r) {
    for (uint64_t w = 0; w < n; w += 4) {
      s0 += popc_swar(a[w] & b[w]);
      s1 += popc_swar(a[w + 1] & b[w + 1]);
      s2 += popc_swar(a[w + 2] & b[w + 2]);
      s3 += popc_swar(a[w + 3] & b[w + 3]);
    }
    __asm__ volatile("" : "+r"(s0));  // keep the passes from being folded into one
  }
  return s0 + s1 + s2 + s3;
}

__attribute__((target("popcnt"))) uint64_t loop_scalar_popcnt(const uint64_t* a, const uint64_t* b, uint64_t n,
                                                              uint64_t reps) {
  uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  for (uint64_t r = 0; r < reps; ++r) {
    for (uint64_t w = 0; w < n; w += 4) {
      s0 += static_cast<uint64_t>(__builtin_popcountll(a[w] & b[w]));
      s1 += static_cast<uint64_t>(__builtin_popcountll(a[w + 1] & b[w + 1]));
      s2 += static_cast<uint64_t>(__builtin_popcountll(a[w + 2] & b[w + 2]));
      s3 += static_cast<uint64_t>(__builtin_popcountll(a[w + 3] & b[w + 3]));
    }
    __asm__ volatile("" : "+r"(s0));
  }
  return s0 + s1 + s2 + s3;
}

NL_AVX2 uint64_t loop_avx2(const uint64_t* a, const uint64_t* b, uint64_t n, uint64_t reps) {
  __m256i acc = _mm256_setzero_si256();
  for (uint64_t r = 0; r < reps; ++r) {
    for (uint64_t w = 0; w < n;) {
      __m256i b0 = _mm256_setzero_si256(), b1 = b0;
      for (int it = 0; it < 31 && w < n; ++it, w += 8) {
        b0 = _mm256_add_epi8(b0, avx2_popcnt_bytes(_mm256_and_si256(_mm256_loadu_si256((const __m256i*)(a + w)),
                                                                    _mm256_loadu_si256((const __m256i*)(b + w)))));
        b1 = _mm256_add_epi8(b1, avx2_popcnt_bytes(_mm256_and_si256(_mm256_loadu_si256((const __m256i*)(a + w + 4)),
                                                                    _mm256_loadu_si256((const __m256i*)(b + w + 4)))));
      }
      acc = _mm256_add_epi64(acc, _mm256_sad_epu8(b0, _mm256_setzero_si256()));
      acc = _mm256_add_epi64(acc, _mm256_sad_epu8(b1, _mm256_setzero_si256()));
    }
  }
  return avx2_hsum(acc);
}

// Register-resident 4x4 block: 16 AND+popcount+add per 8 loaded-once vectors, no memory traffic, so this is
// the ALU ceiling the tile kernel can approach. The empty asm makes the inputs opaque each pass.
NL_AVX512 uint64_t loop_avx512(const uint64_t* a, const uint64_t* b, uint64_t n, uint64_t reps) {
  __m512i x0 = _mm512_loadu_si512(a), x1 = _mm512_loadu_si512(a + 8), x2 = _mm512_loadu_si512(a + 16),
          x3 = _mm512_loadu_si512(a + 24), y0 = _mm512_loadu_si512(b), y1 = _mm512_loadu_si512(b + 8),
          y2 = _mm512_loadu_si512(b + 16), y3 = _mm512_loadu_si512(b + 24);
  __m512i s00 = _mm512_setzero_si512(), s01 = s00, s02 = s00, s03 = s00, s10 = s00, s11 = s00, s12 = s00, s13 = s00,
          s20 = s00, s21 = s00, s22 = s00, s23 = s00, s30 = s00, s31 = s00, s32 = s00, s33 = s00;
  const uint64_t iters = reps * (n / 8) / 16;  // 16 vector pair-ops (= 128 words) per iteration
  for (uint64_t r = 0; r < iters; ++r) {
    __asm__ volatile("" : "+v"(x0), "+v"(x1), "+v"(x2), "+v"(x3), "+v"(y0), "+v"(y1), "+v"(y2), "+v"(y3));
#define NL_ACC(s, x, y) s = _mm512_add_epi64(s, _mm512_popcnt_epi64(_mm512_and_si512(x, y)))
    NL_ACC(s00, x0, y0);
    NL_ACC(s01, x0, y1);
    NL_ACC(s02, x0, y2);
    NL_ACC(s03, x0, y3);
    NL_ACC(s10, x1, y0);
    NL_ACC(s11, x1, y1);
    NL_ACC(s12, x1, y2);
    NL_ACC(s13, x1, y3);
    NL_ACC(s20, x2, y0);
    NL_ACC(s21, x2, y1);
    NL_ACC(s22, x2, y2);
    NL_ACC(s23, x2, y3);
    NL_ACC(s30, x3, y0);
    NL_ACC(s31, x3, y1);
    NL_ACC(s32, x3, y2);
    NL_ACC(s33, x3, y3);
#undef NL_ACC
  }
  __m512i t = _mm512_add_epi64(_mm512_add_epi64(_mm512_add_epi64(s00, s01), _mm512_add_epi64(s02, s03)),
                               _mm512_add_epi64(_mm512_add_epi64(s10, s11), _mm512_add_epi64(s12, s13)));
  __m512i u = _mm512_add_epi64(_mm512_add_epi64(_mm512_add_epi64(s20, s21), _mm512_add_epi64(s22, s23)),
                               _mm512_add_epi64(_mm512_add_epi64(s30, s31), _mm512_add_epi64(s32, s33)));
  return avx512_hsum(_mm512_add_epi64(t, u));
}

}  // namespace

DenseTileFn dense_tile_kernel(PopcountKernel k) {
  switch (k) {
    case PopcountKernel::Avx512:
      return tile_avx512;
    case PopcountKernel::Avx2:
      return tile_avx2;
    case PopcountKernel::Scalar:
      return __builtin_cpu_supports("popcnt") ? tile_scalar_popcnt : tile_scalar;
    case PopcountKernel::Auto:
      break;
  }
  throw InternalError("dense_tile_kernel: kernel not resolved");
}

uint64_t and_popcount_loop(PopcountKernel k, const uint64_t* a, const uint64_t* b, uint64_t n, uint64_t reps) {
  switch (k) {
    case PopcountKernel::Avx512:
      return loop_avx512(a, b, n, reps);
    case PopcountKernel::Avx2:
      return loop_avx2(a, b, n, reps);
    case PopcountKernel::Scalar:
      return __builtin_cpu_supports("popcnt") ? loop_scalar_popcnt(a, b, n, reps) : loop_scalar(a, b, n, reps);
    case PopcountKernel::Auto:
      break;
  }
  throw InternalError("and_popcount_loop: kernel not resolved");
}

}  // namespace nl::detail
