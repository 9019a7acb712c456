// Activation bitmaps as stored in trace v1: neuron-major rows of 64-bit words, bit t%64 of word t/64 set
// iff the neuron is active at token t (least significant bit first). Plain data, no HDF5.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "formats/core/huge_pages.h"

// The portable x86-64 baseline has no popcnt instruction (libgcc's bit-twiddling __popcountdi2 instead): hot
// popcount loops outside the dispatched kernels carry this attribute, which adds a popcnt clone picked at load time.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__POPCNT__)
#define NL_POPCNT_CLONES __attribute__((target_clones("popcnt", "default")))
#else
#define NL_POPCNT_CLONES
#endif

namespace nl {

inline uint64_t words_for_tokens(uint64_t n_tokens) { return (n_tokens + 63) / 64; }

struct LayerMask {
  uint32_t n_neurons = 0;
  uint64_t n_tokens = 0;
  uint64_t words = 0;          // words per neuron row = words_for_tokens(n_tokens)
  std::vector<uint64_t> bits;  // n_neurons * words

  LayerMask() = default;
  LayerMask(uint32_t neurons, uint64_t tokens) : n_neurons(neurons), n_tokens(tokens), words(words_for_tokens(tokens)) {
    assign_huge(bits, size_t(neurons) * words, uint64_t(0));
  }

  const uint64_t* row(uint32_t n) const { return bits.data() + size_t(n) * words; }
  uint64_t* row(uint32_t n) { return bits.data() + size_t(n) * words; }
  bool test(uint32_t n, uint64_t t) const { return (row(n)[t >> 6] >> (t & 63)) & 1u; }
  void set(uint32_t n, uint64_t t) { row(n)[t >> 6] |= uint64_t(1) << (t & 63); }
  // Number of tokens at which neuron n is active.
  uint64_t count(uint32_t n) const {
    uint64_t c = 0;
    const uint64_t* r = row(n);
    for (uint64_t w = 0; w < words; ++w) c += static_cast<uint64_t>(__builtin_popcountll(r[w]));
    return c;
  }
  // Active neurons at token t, ascending. O(n_neurons); fine for tests and replay set-up.
  std::vector<uint32_t> active_at(uint64_t t) const {
    std::vector<uint32_t> out;
    for (uint32_t n = 0; n < n_neurons; ++n)
      if (test(n, t)) out.push_back(n);
    return out;
  }
};

}  // namespace nl
