// Co-activation counting benchmark: the machine's AND+popcount peak per kernel (tight in-L1 loop), then
// paper-shaped layers (16,384 neurons at 3.2 % active, 11,008 at 24 %, 65,536 tokens) counted to top-32 lists,
// with seconds per layer, achieved pair-word operations per second and that as a fraction of the peak, and an
// extrapolated counting time for an OPT-6.7B-shaped model (32 x 16,384 neurons, 131,072 tokens).
// Masks are random with the paper's densities: fine for counting speed (the dense kernel does the same work
// whatever the pattern), not for layout quality.
//
// Usage: graph_bench [--quick] [--json] [--kernels]   (--quick: 4x smaller layers; --kernels: also time the
// scalar and AVX2 kernels on a 2,048-neuron slice)
#include <omp.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "graph/coactivation.h"
#include "graph/popcount_kernels.h"

using namespace nl;

namespace {

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

struct Rng {  // xoshiro256**: fast, deterministic
  uint64_t s[4];
  explicit Rng(uint64_t seed) {
    for (auto& x : s) {
      seed += 0x9e3779b97f4a7c15ull;
      uint64_t z = seed;
      z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
      z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
      x = z ^ (z >> 31);
    }
  }
  static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  uint64_t next() {
    uint64_t r = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return r;
  }
};

// Random mask with each bit set independently with probability round(p*1024)/1024 (bitwise combination of
// 10 random words per word, exact to 2^-10).
LayerMask random_mask(uint32_t n, uint64_t tokens, double p, uint64_t seed) {
  LayerMask m(n, tokens);
  const uint32_t q = static_cast<uint32_t>(p * 1024 + 0.5);
#pragma omp parallel
  {
    Rng rng(seed * 1000003 + uint64_t(omp_get_thread_num()));
#pragma omp for schedule(static)
    for (int64_t v = 0; v < int64_t(n); ++v) {
      uint64_t* row = m.row(uint32_t(v));
      for (uint64_t w = 0; w < m.words; ++w) {
        uint64_t x = 0;
        for (int b = 0; b < 10; ++b) x = ((q >> b) & 1) ? (rng.next() | x) : (rng.next() & x);
        row[w] = x;
      }
      if (tokens & 63) row[m.words - 1] &= (uint64_t(1) << (tokens & 63)) - 1;
    }
  }
  return m;
}

double density(const LayerMask& m) {
  uint64_t s = 0;
  for (uint32_t v = 0; v < m.n_neurons; ++v) s += m.count(v);
  return m.n_neurons && m.n_tokens ? double(s) / (double(m.n_neurons) * double(m.n_tokens)) : 0.0;
}

// Peak AND+popcount word rate of one kernel, all threads, each on its own in-L1 arrays.
double peak_words_per_s(PopcountKernel k, int threads) {
  const uint64_t n = 256, reps = 200000;
  double best = 0;
  for (int trial = 0; trial < 3; ++trial) {
    double t0 = 0, t1 = 0;
    uint64_t sink = 0;
#pragma omp parallel num_threads(threads) reduction(+ : sink)
    {
      std::vector<uint64_t> a(n), b(n);
      Rng r(7 + uint64_t(omp_get_thread_num()));
      for (uint64_t i = 0; i < n; ++i) a[i] = r.next(), b[i] = r.next();
#pragma omp barrier
#pragma omp single
      t0 = now();
      sink += detail::and_popcount_loop(k, a.data(), b.data(), n, reps);
#pragma omp barrier
#pragma omp single
      t1 = now();
    }
    if (sink == 42) std::printf(" ");
    best = std::max(best, double(n) * double(reps) * threads / (t1 - t0));
  }
  return best;
}

struct LayerResult {
  std::string name;
  uint32_t n;
  uint64_t tokens;
  double density, seconds, word_ops;
};

LayerResult time_layer(const std::string& name, uint32_t n, uint64_t tokens, double p, PopcountKernel k,
                       uint64_t seed) {
  LayerMask m = random_mask(n, tokens, p, seed);
  CoactivationOptions o;
  o.top_k = 32;
  o.kernel = k;
  double t0 = now();
  LayerGraph g = coactivation_count(m, o);
  double t1 = now();
  if (g.nbr_len.size() != n) std::printf("unexpected result\n");
  double ops = double(n) * double(n - 1) / 2 * double(m.words);
  return {name, n, tokens, density(m), t1 - t0, ops};
}

}  // namespace

int main(int argc, char** argv) {
  bool quick = false, json = false, kernels = false;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--quick")) quick = true;
    else if (!std::strcmp(argv[i], "--json")) json = true;
    else if (!std::strcmp(argv[i], "--kernels")) kernels = true;
    else {
      std::fprintf(stderr, "usage: graph_bench [--quick] [--json] [--kernels]\n");
      return 2;
    }
  }
  const int threads = omp_get_max_threads();
  const PopcountKernel best = popcount_kernel_resolve(PopcountKernel::Auto);
  std::printf("graph_bench: %d threads, auto kernel = %s\n", threads, popcount_kernel_name(best));

  // 1. Peak per kernel.
  std::vector<std::pair<PopcountKernel, double>> peaks;
  for (auto k : {PopcountKernel::Scalar, PopcountKernel::Avx2, PopcountKernel::Avx512}) {
    if (!popcount_kernel_supported(k)) continue;
    double p1 = peak_words_per_s(k, 1), pn = peak_words_per_s(k, threads);
    peaks.emplace_back(k, pn);
    std::printf("peak %-7s AND+popcount, in L1: %7.2f Gword/s on 1 thread, %7.2f Gword/s on %d threads\n",
                popcount_kernel_name(k), p1 / 1e9, pn / 1e9, threads);
  }
  double peak_best = 0;
  for (auto& [k, p] : peaks)
    if (k == best) peak_best = p;

  // 2. Paper-shaped layers with the auto kernel.
  const uint32_t scale = quick ? 4 : 1;
  const uint64_t tokens = 65536 / scale;
  std::vector<LayerResult> res;
  res.push_back(time_layer("opt-like 3.2%", 16384 / scale, tokens, 0.032, best, 1));
  res.push_back(time_layer("llama-like 24%", 11008 / scale, tokens, 0.24, best, 2));
  for (auto& r : res)
    std::printf("layer %-15s %6u neurons x %6llu tokens, %.2f %% active: %7.3f s, %7.2f Gword-op/s = %5.1f %% of "
                "%s peak\n",
                r.name.c_str(), r.n, (unsigned long long)r.tokens, 100 * r.density, r.seconds,
                r.word_ops / r.seconds / 1e9, 100 * r.word_ops / r.seconds / peak_best, popcount_kernel_name(best));

  // 3. OPT-6.7B-shaped model: one measured 16,384 x 131,072 layer (quick: scaled from the layer above).
  double opt_layer_s;
  if (!quick) {
    LayerResult big = time_layer("opt-6.7b layer", 16384, 131072, 0.032, best, 3);
    opt_layer_s = big.seconds;
    std::printf("layer %-15s %6u neurons x %6llu tokens, %.2f %% active: %7.3f s, %7.2f Gword-op/s\n",
                big.name.c_str(), big.n, (unsigned long long)big.tokens, 100 * big.density, big.seconds,
                big.word_ops / big.seconds / 1e9);
  } else {
    opt_layer_s = res[0].seconds * double(scale) * scale * scale * 2;  // n^2 * tokens scaling
  }
  std::printf("OPT-6.7B-shaped model (32 x 16384 neurons, 131072 tokens): counting %.1f s on %d threads "
              "(EXTRAPOLATED: 32 x one %s layer)\n",
              32 * opt_layer_s, threads, quick ? "scaled" : "measured");

  // 4. Other kernels on a slice, relative to the best.
  if (kernels) {
    for (auto k : {PopcountKernel::Scalar, PopcountKernel::Avx2, PopcountKernel::Avx512}) {
      if (!popcount_kernel_supported(k)) continue;
      LayerResult r = time_layer("slice", 2048, 65536 / scale, 0.032, k, 4);
      double pk = 0;
      for (auto& [kk, p] : peaks)
        if (kk == k) pk = p;
      std::printf("kernel %-7s 2048 x %llu slice: %7.3f s, %7.2f Gword-op/s = %5.1f %% of its own peak\n",
                  popcount_kernel_name(k), (unsigned long long)r.tokens, r.seconds, r.word_ops / r.seconds / 1e9,
                  100 * r.word_ops / r.seconds / pk);
    }
  }
  if (json) {
    std::printf("{\"threads\": %d, \"kernel\": \"%s\", \"peak_words_per_s\": %.6g, \"layers\": [", threads,
                popcount_kernel_name(best), peak_best);
    for (size_t i = 0; i < res.size(); ++i)
      std::printf("%s{\"name\": \"%s\", \"n\": %u, \"tokens\": %llu, \"seconds\": %.6g, \"word_ops_per_s\": %.6g}",
                  i ? ", " : "", res[i].name.c_str(), res[i].n, (unsigned long long)res[i].tokens, res[i].seconds,
                  res[i].word_ops / res[i].seconds);
    std::printf("], \"opt67b_counting_s_extrapolated\": %.6g}\n", 32 * opt_layer_s);
  }
  return 0;
}
