// Co-activation counting benchmark: the machine's AND+popcount peak per kernel (tight in-L1 loop), then
// paper-shaped layers (16,384 neurons at 3.2 % active, 11,008 at 24 %, 65,536 tokens) counted to top-32 lists,
// with seconds per layer, achieved pair-word operations per second and that as a fraction of the peak, and an
// extrapolated counting time for an OPT-6.7B-shaped model (32 x 16,384 neurons, 131,072 tokens).
// Masks are random with the paper's densities: fine for counting speed (the dense kernel does the same work
// whatever the pattern), not for layout quality.
//
// The sparse method (AVX-512) is timed on the same masks; its rate is reported as dense-equivalent pair-word
// operations per second (the work the dense method would have done), which can exceed the popcount peak.
//
// Usage: graph_bench [--quick] [--json] [--kernels]   (--quick: 4x smaller layers; --kernels: also time the
// scalar and AVX2 kernels on a 2,048-neuron slice)
#include <omp.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <string>
#include <vector>

#include "formats/core/rng.h"
#include "graph/coactivation.h"
#include "graph/popcount_kernels.h"

using namespace nl;

namespace {

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// Process CPU seconds: on a shared machine, CPU seconds / threads is the wall time the run would take alone.
double cpu_now() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

// Random mask with each bit set independently with probability round(p*1024)/1024 (bitwise combination of
// 10 random words per word, exact to 2^-10).
LayerMask random_mask(uint32_t n, uint64_t tokens, double p, uint64_t seed) {
  LayerMask m(n, tokens);
  const uint32_t q = static_cast<uint32_t>(p * 1024 + 0.5);
#pragma omp parallel
  {
    SplitMix64 rng(splitmix64(seed * 1000003 + uint64_t(omp_get_thread_num())));  // formats/core/rng.h
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
      SplitMix64 r(splitmix64(7 + uint64_t(omp_get_thread_num())));
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
  double density, seconds, word_ops, cpu_seconds;
};

LayerResult time_mask(const std::string& name, const LayerMask& m, PopcountKernel k, CountMethod method) {
  const uint32_t n = m.n_neurons;
  const uint64_t tokens = m.n_tokens;
  CoactivationOptions o;
  o.top_k = 32;
  o.kernel = k;
  o.method = method;
  double c0 = cpu_now(), t0 = now();
  LayerGraph g = coactivation_count(m, o);
  double t1 = now(), c1 = cpu_now();
  if (g.nbr_len.size() != n) std::printf("unexpected result\n");
  double ops = double(n) * double(n - 1) / 2 * double(m.words);
  return {name, n, tokens, density(m), t1 - t0, ops, c1 - c0};
}

LayerResult time_layer(const std::string& name, uint32_t n, uint64_t tokens, double p, PopcountKernel k, uint64_t seed,
                       CountMethod method = CountMethod::Dense) {
  return time_mask(name, random_mask(n, tokens, p, seed), k, method);
}

}  // namespace

int main(int argc, char** argv) {
  bool quick = false, json = false, kernels = false;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--quick"))
      quick = true;
    else if (!std::strcmp(argv[i], "--json"))
      json = true;
    else if (!std::strcmp(argv[i], "--kernels"))
      kernels = true;
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

  // 2. Paper-shaped layers: dense (auto kernel) and sparse, same masks, to top-32 lists.
  const uint32_t scale = quick ? 4 : 1;
  const uint64_t tokens = 65536 / scale;
  const bool sparse_ok = count_method_supported(CountMethod::Sparse);
  struct Shape {
    const char* name;
    uint32_t n;
    double p;
  };
  const Shape shapes[] = {{"opt-like 3.2%", 16384 / scale, 0.032}, {"llama-like 24%", 11008 / scale, 0.24}};
  std::vector<LayerResult> res, res_sparse;
  for (const Shape& sh : shapes) {
    LayerMask m = random_mask(sh.n, tokens, sh.p, sh.n);
    res.push_back(time_mask(sh.name, m, best, CountMethod::Dense));
    if (sparse_ok) res_sparse.push_back(time_mask(sh.name, m, best, CountMethod::Sparse));
  }
  for (size_t i = 0; i < res.size(); ++i) {
    const LayerResult& r = res[i];
    std::printf("layer %-15s %6u neurons x %6llu tokens, %.2f %% active\n", r.name.c_str(), r.n,
                (unsigned long long)r.tokens, 100 * r.density);
    std::printf("   dense  %-7s %8.3f s/layer wall (%.3f CPU-s), %7.2f Gword-op/s = %5.1f %% of the %s peak\n",
                popcount_kernel_name(best), r.seconds, r.cpu_seconds, r.word_ops / r.seconds / 1e9,
                100 * r.word_ops / r.seconds / peak_best, popcount_kernel_name(best));
    if (sparse_ok) {
      const LayerResult& q = res_sparse[i];
      std::printf(
          "   sparse         %8.3f s/layer wall (%.3f CPU-s), %7.2f dense-equivalent Gword-op/s = %5.2f x the "
          "peak; %.2f x faster than dense (wall), %.2f x (CPU)\n",
          q.seconds, q.cpu_seconds, q.word_ops / q.seconds / 1e9, q.word_ops / q.seconds / peak_best,
          r.seconds / q.seconds, r.cpu_seconds / q.cpu_seconds);
    }
  }

  // 3. OPT-6.7B-shaped model: one measured 16,384 x 131,072 layer with the auto method (quick: scaled).
  double opt_layer_s, opt_layer_cpu;
  const CountMethod auto_m = count_method_resolve(CountMethod::Auto, 0.032);
  if (!quick) {
    LayerResult big = time_layer("opt-6.7b layer", 16384, 131072, 0.032, best, 3, auto_m);
    opt_layer_s = big.seconds;
    opt_layer_cpu = big.cpu_seconds;
    std::printf("layer %-15s %6u neurons x %6llu tokens, %.2f %% active, %s: %7.3f s wall (%.3f CPU-s)\n",
                big.name.c_str(), big.n, (unsigned long long)big.tokens, 100 * big.density, count_method_name(auto_m),
                big.seconds, big.cpu_seconds);
  } else {
    const LayerResult& r0 = sparse_ok ? res_sparse[0] : res[0];
    opt_layer_s = r0.seconds * double(scale) * scale * scale * 2;  // n^2 * tokens scaling
    opt_layer_cpu = r0.cpu_seconds * double(scale) * scale * scale * 2;
  }
  std::printf(
      "OPT-6.7B-shaped model (32 x 16384 neurons, 131072 tokens, 3.2 %% active), %s: counting %.1f s wall on %d "
      "threads, %.1f CPU-s = %.1f s if the %d threads had their cores alone (EXTRAPOLATED: 32 x one %s layer)\n",
      count_method_name(auto_m), 32 * opt_layer_s, threads, 32 * opt_layer_cpu, 32 * opt_layer_cpu / threads, threads,
      quick ? "scaled" : "measured");

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
      std::printf(
          "%s{\"name\": \"%s\", \"n\": %u, \"tokens\": %llu, \"dense_seconds\": %.6g, "
          "\"dense_word_ops_per_s\": %.6g, \"sparse_seconds\": %.6g}",
          i ? ", " : "", res[i].name.c_str(), res[i].n, (unsigned long long)res[i].tokens, res[i].seconds,
          res[i].word_ops / res[i].seconds, sparse_ok ? res_sparse[i].seconds : 0.0);
    std::printf("], \"opt67b_counting_s_extrapolated\": %.6g}\n", 32 * opt_layer_s);
  }
  return 0;
}
