// Sparse co-activation counting (AVX-512F/BW/VBMI2): row i of C restricted to a block of 512 neurons is the sum,
// over the tokens t where neuron i fires, of the block's token-major bit row at t. Those 512-bit rows are added
// into vertical counters with a Harley-Seal carry-save tree (2 ternary-logic ops per row), so the work is
// (active fraction) x (dense pair work) / ~1.5 instead of every pair x every token word. Exact.
//
// Per chunk: (1) every neuron's active tokens as u16 offsets within 16,384-token blocks (vpcompressw, branch
// free); (2) for each 512-neuron column block (OpenMP), for each token block, a token-major transpose of the
// block (64 B per token); for each row i below the block's end, its active tokens' rows go through the tree,
// the carry-save planes go into byte counters, byte counters widen into a u32 panel; (3) the panel goes to the
// sink (upper triangle / top-k).
#include <immintrin.h>
#include <omp.h>
#include <sys/mman.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <vector>

#include "formats/core/huge_pages.h"
#include "graph/popcount_kernels.h"

namespace nl::detail {
namespace {

#define NL_SPARSE __attribute__((target("avx512f,avx512bw,avx512vbmi2,popcnt,bmi,bmi2")))

constexpr uint32_t kColBlock = 512;  // neurons per column block: one zmm per token row
// 16,384 tokens per block: the block's token-major rows (1 MiB) stay in L2 while every row i gathers from them
// (a 4 MiB block measured ~10x slower: each gathered line came from L3).
constexpr uint64_t kTokBlockWords = 256;

// In-place transpose of a 64x64 bit matrix: bit c of a[r] <-> bit r of a[c].
inline void transpose64(uint64_t a[64]) {
  uint64_t m = 0x00000000FFFFFFFFull;
  for (int j = 32; j != 0; j >>= 1, m ^= (m << j)) {
    for (int k = 0; k < 64; k = ((k | j) + 1) & ~j) {
      uint64_t t = ((a[k] >> j) ^ a[k | j]) & m;
      a[k] ^= t << j;
      a[k | j] ^= t;
    }
  }
}

// Active-token lists: for neuron v and token block b, offsets (u16, token - block start) in
// list[start[b * n + v] .. start[b * n + v + 1]). Block-major, so that the rows' lists of one token block, which
// the count reads row after row, lie one after another (neuron-major, every row's list began on another page: a
// TLB miss and a cache miss per row and block).
struct TokenLists {
  uint64_t n = 0, nb = 0;
  std::vector<uint64_t> start;
  std::vector<uint16_t> list;
  // Neuron v's list in token block b is list[start[at(v, b)] .. start[at(v, b) + 1]).
  size_t at(uint64_t v, uint64_t b) const { return size_t(b * n + v); }
};

NL_SPARSE void build_lists(const uint64_t* bits, uint32_t n, uint64_t stride, uint64_t nw, TokenLists& tl) {
  tl.n = n;
  tl.nb = (nw + kTokBlockWords - 1) / kTokBlockWords;
  const uint64_t nb = tl.nb;
  tl.start.assign(uint64_t(n) * nb + 1, 0);
#pragma omp parallel for schedule(static) if (n >= kParallelMin)
  for (int64_t v = 0; v < int64_t(n); ++v) {
    const uint64_t* r = bits + size_t(v) * stride;
    for (uint64_t b = 0; b < nb; ++b) {
      uint64_t c = 0;
      for (uint64_t w = b * kTokBlockWords; w < std::min(nw, (b + 1) * kTokBlockWords); ++w)
        c += static_cast<uint64_t>(__builtin_popcountll(r[w]));
      tl.start[tl.at(uint64_t(v), b) + 1] = c;
    }
  }
  for (size_t i = 1; i < tl.start.size(); ++i) tl.start[i] += tl.start[i - 1];
  resize_huge(tl.list, size_t(tl.start.back()));
  const __m512i iota = _mm512_set_epi16(31, 30, 29, 28, 27, 26, 25, 24, 23, 22, 21, 20, 19, 18, 17, 16, 15, 14, 13, 12,
                                        11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
#pragma omp parallel for schedule(static) if (n >= kParallelMin)
  for (int64_t v = 0; v < int64_t(n); ++v) {
    const uint64_t* r = bits + size_t(v) * stride;
    uint16_t* out = nullptr;
    for (uint64_t w = 0; w < nw; ++w) {
      if (w % kTokBlockWords == 0) out = tl.list.data() + tl.start[tl.at(uint64_t(v), w / kTokBlockWords)];
      const uint64_t x = r[w];
      if (!x) continue;
      const uint16_t base = static_cast<uint16_t>((w % kTokBlockWords) * 64);
      const __mmask32 lo = static_cast<__mmask32>(x), hi = static_cast<__mmask32>(x >> 32);
      const int nlo = __builtin_popcount(lo), nhi = __builtin_popcount(hi);
      // Masked stores: a full-width store would spill into the next neuron's list, which another thread owns.
      _mm512_mask_storeu_epi16(out, _bzhi_u32(~0u, nlo),
                               _mm512_maskz_compress_epi16(lo, _mm512_add_epi16(iota, _mm512_set1_epi16(short(base)))));
      out += nlo;
      _mm512_mask_storeu_epi16(
          out, _bzhi_u32(~0u, nhi),
          _mm512_maskz_compress_epi16(hi, _mm512_add_epi16(iota, _mm512_set1_epi16(short(base + 32)))));
      out += nhi;
    }
  }
}

// Token-major rows of column block [j0, j0 + nj) for token words [w0, w0 + nwb): tt[t*8 + q] holds neurons
// j0 + 64q .. j0 + 64q + 63 at token w0*64 + t.
void transpose_block(const uint64_t* bits, uint32_t j0, uint32_t nj, uint64_t stride, uint64_t w0, uint64_t nwb,
                     uint64_t* tt) {
  uint64_t a[64];
  for (uint32_t q = 0; q < 8; ++q) {
    const uint32_t g0 = q * 64;
    for (uint64_t w = 0; w < nwb; ++w) {
      for (uint32_t r = 0; r < 64; ++r) a[r] = g0 + r < nj ? bits[size_t(j0 + g0 + r) * stride + w0 + w] : 0;
      transpose64(a);
      for (uint32_t t = 0; t < 64; ++t) tt[(w * 64 + t) * 8 + q] = a[t];
    }
  }
}

#define NL_CSA(h, l, a, b, c)                        \
  do {                                               \
    const __m512i a_ = (a), b_ = (b), c_ = (c);      \
    h = _mm512_ternarylogic_epi64(a_, b_, c_, 0xE8); \
    l = _mm512_ternarylogic_epi64(a_, b_, c_, 0x96); \
  } while (0)

// Adds bits of `plane` (512 lanes) times `weight` into the 8 byte-counter vectors.
NL_SPARSE inline void add_plane(__m512i c8[8], __m512i plane, int weight) {
  alignas(64) uint64_t m[8];
  _mm512_store_si512(m, plane);
  const __m512i w = _mm512_set1_epi8(static_cast<char>(weight));
  for (int g = 0; g < 8; ++g) c8[g] = _mm512_mask_add_epi8(c8[g], static_cast<__mmask64>(m[g]), c8[g], w);
}

// Widens the byte counters into acc[0..512) (added, or stored when `store`: acc's first write) and clears them.
NL_SPARSE inline void widen(__m512i c8[8], uint32_t* acc, bool store) {
  // Masked forms: GCC 12's unmasked extract/convert warn about an uninitialised pass-through operand.
#define NL_WIDEN(q)                                                                                 \
  do {                                                                                              \
    __m512i v = _mm512_maskz_cvtepu8_epi32(0xFFFF, _mm512_maskz_extracti32x4_epi32(0xF, c8[g], q)); \
    uint32_t* p = acc + g * 64 + (q)*16;                                                            \
    _mm512_storeu_si512(p, store ? v : _mm512_add_epi32(_mm512_loadu_si512(p), v));                 \
  } while (0)
  for (int g = 0; g < 8; ++g) {
    NL_WIDEN(0);
    NL_WIDEN(1);
    NL_WIDEN(2);
    NL_WIDEN(3);
    c8[g] = _mm512_setzero_si512();
  }
#undef NL_WIDEN
}

// acc[0..512) += sum over offsets o in list[0..len) of the 512-bit row tt[o] (acc = that sum when `first`: acc is not
// read, so the panel needs no zeroing pass).
NL_SPARSE void accumulate_row(const uint16_t* list, uint64_t len, const uint64_t* tt, const uint64_t* zero,
                              uint32_t* acc, bool first) {
  __m512i ones = _mm512_setzero_si512(), twos = ones, fours = ones, eights = ones;
  __m512i c8[8];
  for (auto& c : c8) c = _mm512_setzero_si512();
  int groups = 0;
  uint64_t k = 0;
  for (; k < len; k += 16) {
    const bool full = k + 16 <= len;
    __m512i d[16];
    if (full)
      for (int m = 0; m < 16; ++m) d[m] = _mm512_loadu_si512(tt + uint64_t(list[k + m]) * 8);
    else
      for (int m = 0; m < 16; ++m)
        d[m] = k + m < len ? _mm512_loadu_si512(tt + uint64_t(list[k + m]) * 8) : _mm512_loadu_si512(zero);
    __m512i twosA, twosB, foursA, foursB, eightsA, eightsB, sixteens;
    NL_CSA(twosA, ones, ones, d[0], d[1]);
    NL_CSA(twosB, ones, ones, d[2], d[3]);
    NL_CSA(foursA, twos, twos, twosA, twosB);
    NL_CSA(twosA, ones, ones, d[4], d[5]);
    NL_CSA(twosB, ones, ones, d[6], d[7]);
    NL_CSA(foursB, twos, twos, twosA, twosB);
    NL_CSA(eightsA, fours, fours, foursA, foursB);
    NL_CSA(twosA, ones, ones, d[8], d[9]);
    NL_CSA(twosB, ones, ones, d[10], d[11]);
    NL_CSA(foursA, twos, twos, twosA, twosB);
    NL_CSA(twosA, ones, ones, d[12], d[13]);
    NL_CSA(twosB, ones, ones, d[14], d[15]);
    NL_CSA(foursB, twos, twos, twosA, twosB);
    NL_CSA(eightsB, fours, fours, foursA, foursB);
    NL_CSA(sixteens, eights, eights, eightsA, eightsB);
    add_plane(c8, sixteens, 16);
    // Byte counters: 14 groups x 16 + the planes' 15 = 239 <= 255 at the final flush.
    if (++groups == 14) {
      widen(c8, acc, first);
      first = false;
      groups = 0;
    }
  }
  add_plane(c8, ones, 1);
  add_plane(c8, twos, 2);
  add_plane(c8, fours, 4);
  add_plane(c8, eights, 8);
  widen(c8, acc, first);
}

}  // namespace

bool sparse_vertical_supported() {
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vbmi2") && __builtin_cpu_supports("popcnt") && __builtin_cpu_supports("bmi2");
}

void sparse_vertical_chunk(const uint64_t* bits, uint32_t n, uint64_t stride, uint64_t nw, const TileSink& sink) {
  if (n < 2 || nw == 0) return;
  TokenLists tl;
  build_lists(bits, n, stride, nw, tl);
  const uint32_t ncb = (n + kColBlock - 1) / kColBlock;
  alignas(64) static const uint64_t zero[8] = {};
#pragma omp parallel if (n >= kParallelMin)
  {
    // The transposed block is read at random rows: one 2 MiB huge page where the kernel grants it (no TLB misses).
    constexpr size_t kHuge = size_t(2) << 20;
    const size_t tt_bytes = (kTokBlockWords * 64 * 8 * sizeof(uint64_t) + kHuge - 1) / kHuge * kHuge;
    std::unique_ptr<uint64_t, void (*)(void*)> tt_mem(static_cast<uint64_t*>(std::aligned_alloc(kHuge, tt_bytes)),
                                                      std::free);
    if (!tt_mem) throw std::bad_alloc();
    madvise(tt_mem.get(), tt_bytes, MADV_HUGEPAGE);
    struct {
      uint64_t* p;
      uint64_t* data() const { return p; }
    } tt{tt_mem.get()};
    std::vector<uint32_t> acc;
    const int tid = omp_get_thread_num();
    // Later column blocks have more rows above them: hand them out first.
#pragma omp for schedule(dynamic, 1)
    for (int64_t cb = int64_t(ncb) - 1; cb >= 0; --cb) {
      const uint32_t j0 = uint32_t(cb) * kColBlock, nj = std::min(kColBlock, n - j0);
      const uint32_t rows = j0 + nj - 1;  // rows i < j0 + nj - 1 have some j > i in the block
      // Every row's first token block stores its counts (zeros where it has no token there): no zeroing pass over
      // the panel (up to 32 MiB per column block) before it.
      if (acc.size() < size_t(rows) * kColBlock) acc.resize(size_t(rows) * kColBlock);
      for (uint64_t b = 0; b < tl.nb; ++b) {
        const uint64_t w0 = b * kTokBlockWords, nwb = std::min(kTokBlockWords, nw - w0);
        transpose_block(bits, j0, nj, stride, w0, nwb, tt.data());
        for (uint32_t i = 0; i < rows; ++i) {
          const uint64_t s = tl.start[tl.at(i, b)], e = tl.start[tl.at(i, b) + 1];
          uint32_t* a = acc.data() + size_t(i) * kColBlock;
          if (s != e)
            accumulate_row(tl.list.data() + s, e - s, tt.data(), zero, a, b == 0);
          else if (b == 0)
            std::memset(a, 0, kColBlock * sizeof(uint32_t));
        }
      }
      if (rows > 0) sink(tid, 0, rows, j0, nj, acc.data(), kColBlock);
    }
  }
}

}  // namespace nl::detail
