// The project's one seeded random generator, SplitMix64 (Steele, Lea, Flood 2014): the same output on every
// platform and standard library (std distributions are not), so layouts, synthetic traces, images and cache
// decisions are byte-identical for a seed. Header-only; the runtime uses it too.
#pragma once
#include <cmath>
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

// Independent streams: seed each with splitmix64(key) of a key that mixes what tells them apart (layer, purpose),
// so that their states lie far apart in the one sequence.
struct SplitMix64 {
  uint64_t state;
  double spare = 0;  // normal(): Box-Muller's second value, returned by the next call
  bool has_spare = false;

  explicit SplitMix64(uint64_t seed) : state(seed) {}

  uint64_t next() { return splitmix64_next(state); }
  double uniform() { return unit_double(next()); }           // [0, 1)
  uint64_t below(uint64_t n) { return n ? next() % n : 0; }  // modulo bias is negligible for the n used here
  // Standard normal (Box-Muller, both values used). libm's log/sin/cos, not a std distribution, whose algorithm
  // differs between standard libraries.
  double normal() {
    if (has_spare) {
      has_spare = false;
      return spare;
    }
    const double u1 = 1.0 - uniform(), u2 = uniform();  // u1 in (0, 1]: log(u1) is finite
    const double r = std::sqrt(-2.0 * std::log(u1)), a = 6.283185307179586 * u2;
    spare = r * std::sin(a);
    has_spare = true;
    return r * std::cos(a);
  }
};

// Fisher-Yates shuffle of v[0, n) with `r` (std::shuffle's algorithm differs between standard libraries).
template <class T>
void shuffle_with(T* v, uint64_t n, SplitMix64& r) {
  for (uint64_t i = n; i > 1; --i) {
    const uint64_t j = r.below(i);
    const T t = v[i - 1];
    v[i - 1] = v[j];
    v[j] = t;
  }
}

}  // namespace nl
