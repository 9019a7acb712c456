// The project's one seeded random generator, SplitMix64 (Steele, Lea, Flood 2014): the same output on every
// platform and standard library (std distributions are not), so layouts, synthetic traces, images and cache
// decisions are byte-identical for a seed. Header-only; the runtime uses it too.
#pragma once
#include <cstdint>

namespace nl {

inline constexpr uint64_t kSplitMixGamma = 0x9E3779B97F4A7C15ull;  // the golden-ratio increment

// One step: advances `state` by the gamma and returns the mixed value.
inline uint64_t splitmix64_next(uint64_t& state) {
  uint64_t z = (state += kSplitMixGamma);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// The first output of a generator seeded with x: a 64-bit hash of x.
inline uint64_t splitmix64(uint64_t x) { return splitmix64_next(x); }

// The top 53 bits as a double in [0, 1).
inline double unit_double(uint64_t z) { return double(z >> 11) * (1.0 / 9007199254740992.0); }

struct SplitMix64 {
  uint64_t state;
  uint64_t next() { return splitmix64_next(state); }
  double uniform() { return unit_double(next()); }
  uint64_t below(uint64_t n) { return n ? next() % n : 0; }  // modulo bias is negligible for the n used here
};

}  // namespace nl
