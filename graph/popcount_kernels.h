// Dense AND+popcount tile kernels behind run-time dispatch (internal to graph/). Each kernel adds
// popcount(a_r & b_c) over `nwords` words into cnt[r*ld + c] for a block of rows a_0..a_{na-1} and
// b_0..b_{nb-1} (rows `stride` words apart). With `upper`, a == b and na == nb: only entries c > r are
// needed (micro-tiles wholly on or below the diagonal are skipped; others may be computed anyway). The ISA variants are
// compiled with per-function target attributes, so the default build stays portable; dense_tile_kernel() hands out only
// what the CPU runs.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>

#include "graph/coactivation.h"

namespace nl::detail {

// Layers with fewer neurons are counted on one thread: a parallel region costs more than their work.
inline constexpr uint32_t kParallelMin = 256;

using DenseTileFn = void (*)(const uint64_t* a, uint32_t na, const uint64_t* b, uint32_t nb, uint64_t stride,
                             uint64_t nwords, uint32_t* cnt, uint32_t ld, bool upper);

// The tile kernel for an already resolved (non-Auto, supported) kernel.
DenseTileFn dense_tile_kernel(PopcountKernel k);

// Peak probe for the benchmark: the work of `reps` passes of AND+popcount over a[0..n) & b[0..n) (n a multiple
// of 32, in L1) in the kernel's tightest form (AVX-512: a register-resident 4x4 block, as in the tile kernel).
// Returns the summed count so the work cannot be elided.
uint64_t and_popcount_loop(PopcountKernel k, const uint64_t* a, const uint64_t* b, uint64_t n, uint64_t reps);

// Receives counted blocks: cnt[r*ld + c] = C[i0 + r][j0 + c], meaningful only where j0 + c > i0 + r. Called
// from OpenMP worker `tid`; blocks from different calls never share a pair.
using TileSink =
    std::function<void(int tid, uint32_t i0, uint32_t ni, uint32_t j0, uint32_t nj, const uint32_t* cnt, uint64_t ld)>;

// Sparse (vertical Harley-Seal) counting of one chunk (rows `stride` words apart, first `nw` used), AVX-512
// F/BW/VBMI2 only; see sparse_vertical.cpp. Extra memory: 2 bytes per set bit of the chunk, plus per thread a
// 4 MiB token-major block and an n x 512 uint32 panel.
bool sparse_vertical_supported();
void sparse_vertical_chunk(const uint64_t* bits, uint32_t n, uint64_t stride, uint64_t nw, const TileSink& sink);

}  // namespace nl::detail
