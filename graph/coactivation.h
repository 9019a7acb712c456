// Co-activation counting: for one layer, how often each neuron fires (f) and how often each pair fires in the
// same token (C = AᵀA over the bit-packed trace masks), plus per-neuron top-k neighbour lists.
//
// CONTRACT used by layout/ (solvers) — keep these signatures stable; make them fast behind them.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "formats/core/bitmask.h"

namespace nl {

class TraceReader;

enum class PopcountKernel { Auto, Scalar, Avx2, Avx512 };
// Dense: AND+popcount over every neuron pair and token word (`kernel` above). Sparse: for each neuron, the
// token-major bit rows of the tokens where it fires are summed into vertical carry-save counters, so the work
// scales with the active fraction (AVX-512 F/BW/VBMI2 only). Auto: sparse where the CPU has it and the layer's
// active fraction is below kSparseMaxDensity, else dense. Both are exact and give identical results.
enum class CountMethod { Auto, Dense, Sparse };

struct CoactivationOptions {
  uint32_t top_k = 32;       // neighbours kept per neuron (0 = none)
  bool full_matrix = false;  // keep the full upper-triangle counts
  PopcountKernel kernel = PopcountKernel::Auto;
  CountMethod method = CountMethod::Auto;
  // Streaming from a trace: at most this many bytes of mask words are held per chunk of tokens. When a layer
  // needs more than one chunk and top-k is wanted, the full upper triangle is accumulated internally
  // (n*(n-1)/2 uint32) and reduced to top-k at the end.
  uint64_t chunk_bytes = 512ull << 20;
  // coactivation_count_trace only: count tokens [token_begin, min(token_end, n_tokens)) of the trace (a slice
  // that one machine of several counts; graph files of disjoint slices sum exactly with graph_file_merge).
  uint64_t token_begin = 0;
  uint64_t token_end = UINT64_MAX;
};

struct LayerGraph {
  uint32_t n_neurons = 0;
  uint64_t n_tokens = 0;
  std::vector<uint64_t> freq;  // f(v): tokens at which v fires
  // Top-k neighbours of each neuron: nbr[v*k .. v*k+k), by decreasing count, ties by increasing index;
  // only pairs with count > 0; nbr_len[v] entries are valid.
  uint32_t k = 0;
  std::vector<uint32_t> nbr, nbr_cnt, nbr_len;
  // Full upper triangle (i < j), row-major packed, when full_matrix was requested; empty otherwise.
  std::vector<uint32_t> upper;

  bool has_full() const { return !upper.empty() || n_neurons < 2; }
  static uint64_t upper_index(uint32_t n, uint32_t i, uint32_t j) {  // requires i < j
    return uint64_t(i) * (2ull * n - i - 1) / 2 + (j - i - 1);
  }
  // C[i][j] from the full matrix (requires has_full()); C[i][i] = f(i).
  uint32_t pair(uint32_t i, uint32_t j) const {
    if (i == j) return static_cast<uint32_t>(freq[i]);
    if (i > j) std::swap(i, j);
    return upper[upper_index(n_neurons, i, j)];
  }
};

// Counts one in-memory layer. reuse (optional): the full matrix of an earlier count of as many neurons (any contents),
// given up to hold this one's when opt.full_matrix (saves zeroing and faulting in 4 bytes per pair); left empty
// then, else untouched.
LayerGraph coactivation_count(const LayerMask& mask, const CoactivationOptions& opt,
                              std::vector<uint32_t>* reuse = nullptr);
// Counts one layer of a trace, streaming tokens in chunks so memory stays bounded.
LayerGraph coactivation_count_trace(const TraceReader& trace, uint32_t layer, const CoactivationOptions& opt);

// Co-activation count of a pair computed directly from the mask (reference; O(words)).
uint32_t coactivation_pair(const LayerMask& mask, uint32_t i, uint32_t j);

// (Re)builds g's top-k lists (k neighbours per neuron) from g.upper, which must be present. Used after merging
// full matrices from shards.
void coactivation_build_topk(LayerGraph& g, uint32_t k);
// g's top-k lists for another k, from g.upper (which must be present), leaving g as it is: a graph holding only
// n_neurons, k, nbr, nbr_cnt and nbr_len (the same lists coactivation_build_topk would write).
LayerGraph coactivation_topk_lists(const LayerGraph& g, uint32_t k);

// Kernel dispatch. supported(): the CPU runs it (Auto and Scalar always). resolve(): Auto becomes the best
// supported kernel; an explicitly requested unsupported kernel is a UsageError.
bool popcount_kernel_supported(PopcountKernel k);
PopcountKernel popcount_kernel_resolve(PopcountKernel k);
const char* popcount_kernel_name(PopcountKernel k);          // "auto", "scalar", "avx2", "avx512"
PopcountKernel popcount_kernel_parse(const std::string& s);  // inverse of name(); UsageError otherwise

// Method dispatch, as for kernels: Sparse needs AVX-512 F/BW/VBMI2. resolve(m, density) picks for Auto.
// Measured crossover on this project's dev machine: sparse ~2x faster than dense at 10 % active, even at 24 %.
inline constexpr double kSparseMaxDensity = 0.2;
bool count_method_supported(CountMethod m);
CountMethod count_method_resolve(CountMethod m, double density);
const char* count_method_name(CountMethod m);  // "auto", "dense", "sparse"
CountMethod count_method_parse(const std::string& s);

}  // namespace nl
