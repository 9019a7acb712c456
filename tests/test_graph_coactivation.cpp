// Co-activation counting: every kernel and path equals a naive per-token double loop (odd sizes, empty and
// all-active layers, token counts not multiples of 64), kernels agree, streaming equals in-memory.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdio>
#include <random>
#include <string>
#include <tuple>

#include "formats/core/error.h"
#include "formats/trace.h"
#include "graph/coactivation.h"
#include "skip_util.h"

using namespace nl;

namespace {

LayerMask random_mask(uint32_t n, uint64_t tokens, double p, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::bernoulli_distribution on(p);
  LayerMask m(n, tokens);
  // Per-neuron rates vary around p so counts differ and top-k ties are not the only case.
  for (uint32_t i = 0; i < n; ++i) {
    std::bernoulli_distribution on_i(std::min(1.0, p * (0.5 + double(i % 7) / 6.0)));
    for (uint64_t t = 0; t < tokens; ++t)
      if (p >= 1.0 ? true : on_i(rng)) m.set(i, t);
  }
  return m;
}

// Naive reference: per-token double loop over active neurons.
struct Naive {
  uint32_t n;
  std::vector<uint64_t> freq;
  std::vector<uint32_t> c;  // n x n
  explicit Naive(const LayerMask& m) : n(m.n_neurons), freq(n, 0), c(size_t(n) * n, 0) {
    for (uint64_t t = 0; t < m.n_tokens; ++t) {
      std::vector<uint32_t> act = m.active_at(t);
      for (uint32_t a : act) {
        ++freq[a];
        for (uint32_t b : act)
          if (a != b) ++c[size_t(a) * n + b];
      }
    }
  }
  uint32_t at(uint32_t i, uint32_t j) const { return c[size_t(i) * n + j]; }
};

void check_against(const LayerGraph& g, const Naive& ref, uint32_t k, bool full) {
  REQUIRE(g.n_neurons == ref.n);
  CHECK(g.freq == ref.freq);
  if (full) {
    REQUIRE(g.has_full());
    for (uint32_t i = 0; i < ref.n; ++i)
      for (uint32_t j = i + 1; j < ref.n; ++j) REQUIRE_MESSAGE(g.pair(i, j) == ref.at(i, j), "pair " << i << "," << j);
  } else {
    CHECK(g.upper.empty());
  }
  CHECK(g.k == k);
  if (k == 0) {
    CHECK(g.nbr.empty());
    return;
  }
  REQUIRE(g.nbr_len.size() == ref.n);
  for (uint32_t v = 0; v < ref.n; ++v) {
    std::vector<std::pair<uint32_t, uint32_t>> all;  // (count, u)
    for (uint32_t u = 0; u < ref.n; ++u)
      if (u != v && ref.at(v, u) > 0) all.emplace_back(ref.at(v, u), u);
    std::sort(all.begin(), all.end(),
              [](auto a, auto b) { return a.first != b.first ? a.first > b.first : a.second < b.second; });
    const size_t len = std::min<size_t>(all.size(), k);
    REQUIRE_MESSAGE(g.nbr_len[v] == len, "neuron " << v);
    for (size_t e = 0; e < len; ++e) {
      REQUIRE_MESSAGE(g.nbr[size_t(v) * k + e] == all[e].second, "neuron " << v << " rank " << e);
      REQUIRE(g.nbr_cnt[size_t(v) * k + e] == all[e].first);
    }
  }
}

std::vector<PopcountKernel> supported_kernels() {
  std::vector<PopcountKernel> ks;
  for (auto k : {PopcountKernel::Scalar, PopcountKernel::Avx2, PopcountKernel::Avx512})
    if (popcount_kernel_supported(k)) ks.push_back(k);
  return ks;
}

// Every supported (method, kernel) combination: dense with each kernel, and sparse.
std::vector<std::pair<CountMethod, PopcountKernel>> supported_configs() {
  std::vector<std::pair<CountMethod, PopcountKernel>> cs;
  for (auto k : supported_kernels()) cs.emplace_back(CountMethod::Dense, k);
  if (count_method_supported(CountMethod::Sparse))
    cs.emplace_back(CountMethod::Sparse, PopcountKernel::Auto);
  else
    MESSAGE("sparse counting not supported on this CPU (needs AVX-512 F/BW/VBMI2): not tested here");
  return cs;
}

struct Shape {
  uint32_t n;
  uint64_t tokens;
  double p;
};

}  // namespace

TEST_CASE("every kernel equals a naive double loop on random layers") {
  const Shape shapes[] = {{0, 100, 0.3}, {1, 100, 0.5},    {2, 65, 0.5},   {3, 1, 1.0},     {5, 63, 0.4},
                          {7, 64, 0.2},  {13, 200, 0.0},   {17, 129, 1.0}, {131, 333, 0.1}, {257, 1000, 0.05},
                          {130, 0, 0.5}, {9, 40000, 0.02}, {66, 4097, 0.3}};
  uint64_t seed = 1;
  for (const Shape& s : shapes) {
    LayerMask m = random_mask(s.n, s.tokens, s.p, seed++);
    Naive ref(m);
    for (auto [method, kern] : supported_configs())
      for (uint32_t k : {0u, 1u, 4u, 300u})
        for (bool full : {false, true}) {
          CAPTURE(s.n);
          CAPTURE(s.tokens);
          CAPTURE(s.p);
          CAPTURE(count_method_name(method));
          CAPTURE(popcount_kernel_name(kern));
          CAPTURE(k);
          CAPTURE(full);
          CoactivationOptions o;
          o.top_k = k;
          o.full_matrix = full;
          o.kernel = kern;
          o.method = method;
          check_against(coactivation_count(m, o), ref, k, full);
        }
  }
}

TEST_CASE("kernels agree with each other and with the pair reference on a larger layer") {
  LayerMask m = random_mask(300, 5000, 0.24, 99);
  CoactivationOptions o;
  o.full_matrix = true;
  o.kernel = PopcountKernel::Scalar;
  LayerGraph ref = coactivation_count(m, o);
  for (uint32_t i = 0; i < 300; i += 7)
    for (uint32_t j = i + 1; j < 300; j += 3) REQUIRE(ref.pair(i, j) == coactivation_pair(m, i, j));
  for (auto [method, kern] : supported_configs()) {
    o.kernel = kern;
    o.method = method;
    LayerGraph g = coactivation_count(m, o);
    CHECK(g.upper == ref.upper);
    CHECK(g.nbr == ref.nbr);
    CHECK(g.nbr_cnt == ref.nbr_cnt);
    CHECK(g.nbr_len == ref.nbr_len);
    CHECK(g.freq == ref.freq);
  }
  o.kernel = PopcountKernel::Auto;
  o.method = CountMethod::Auto;
  CHECK(coactivation_count(m, o).upper == ref.upper);
}

TEST_CASE("sparse equals dense across column-block (512) and token-block (16,384) boundaries" *
          nl::test::skip_unless(count_method_supported(CountMethod::Sparse),
                                "sparse counting not supported on this CPU")) {
  // Skewed rates: some rows have far more than 16 x 14 active tokens per block (byte-counter widening).
  for (auto [n, tokens, p] : {std::tuple<uint32_t, uint64_t, double>{600, 40001, 0.01}, {515, 3000, 0.9}}) {
    LayerMask m = random_mask(n, tokens, p, n);
    CoactivationOptions o;
    o.full_matrix = true;
    o.top_k = 16;
    o.method = CountMethod::Dense;
    LayerGraph d = coactivation_count(m, o);
    o.method = CountMethod::Sparse;
    LayerGraph s = coactivation_count(m, o);
    CHECK(d.upper == s.upper);
    CHECK(d.nbr == s.nbr);
    CHECK(d.nbr_cnt == s.nbr_cnt);
    for (uint32_t i = 0; i < n; i += 97)
      for (uint32_t j = i + 1; j < n; j += 89) REQUIRE(s.pair(i, j) == coactivation_pair(m, i, j));
  }
}

TEST_CASE("a reused matrix of any contents is overwritten to the fresh count (dense and sparse)") {
  for (auto method : {CountMethod::Dense, CountMethod::Sparse}) {
    if (!count_method_supported(method)) continue;
    for (auto [n, tokens, p] : {std::tuple<uint32_t, uint64_t, double>{600, 20001, 0.03}, {70, 3001, 0.2}}) {
      LayerMask m = random_mask(n, tokens, p, n + 1);
      CoactivationOptions o;
      o.full_matrix = true;
      o.top_k = 8;
      o.method = method;
      const LayerGraph fresh = coactivation_count(m, o);
      std::vector<uint32_t> reuse(size_t(n) * (n - 1) / 2, 0xDEADBEEFu);  // garbage, as a spare holds
      const uint32_t* storage = reuse.data();
      const LayerGraph again = coactivation_count(m, o, &reuse);
      CHECK(reuse.empty());
      CHECK(again.upper.data() == storage);  // the spare's storage was used, not a fresh allocation
      CHECK(again.upper == fresh.upper);
      CHECK(again.nbr == fresh.nbr);
      CHECK(again.nbr_cnt == fresh.nbr_cnt);
      std::vector<uint32_t> wrong(7, 1);  // another layer width: left alone, a fresh matrix counted
      CHECK(coactivation_count(m, o, &wrong).upper == fresh.upper);
      CHECK(wrong.size() == 7);
    }
  }
}

TEST_CASE("method dispatch") {
  for (auto m : {CountMethod::Auto, CountMethod::Dense, CountMethod::Sparse})
    CHECK(count_method_parse(count_method_name(m)) == m);
  CHECK_THROWS_AS(count_method_parse("magic"), UsageError);
  CHECK(count_method_resolve(CountMethod::Auto, 0.9) == CountMethod::Dense);
  CHECK(count_method_resolve(CountMethod::Dense, 0.01) == CountMethod::Dense);
  if (count_method_supported(CountMethod::Sparse))
    CHECK(count_method_resolve(CountMethod::Auto, 0.03) == CountMethod::Sparse);
  else
    CHECK_THROWS_AS(count_method_resolve(CountMethod::Sparse, 0.03), UsageError);
}

TEST_CASE("kernel dispatch: names round-trip, Auto resolves to a supported kernel") {
  for (auto k : {PopcountKernel::Auto, PopcountKernel::Scalar, PopcountKernel::Avx2, PopcountKernel::Avx512})
    CHECK(popcount_kernel_parse(popcount_kernel_name(k)) == k);
  CHECK_THROWS_AS(popcount_kernel_parse("sse9"), UsageError);
  PopcountKernel r = popcount_kernel_resolve(PopcountKernel::Auto);
  CHECK(r != PopcountKernel::Auto);
  CHECK(popcount_kernel_supported(r));
  if (__builtin_cpu_supports("avx512vpopcntdq")) CHECK(r == PopcountKernel::Avx512);
}

TEST_CASE("streaming a trace in chunks equals counting it in memory") {
  const std::string path = "test_graph_stream.h5";
  std::vector<LayerMask> masks = {random_mask(70, 3001, 0.1, 5), random_mask(0, 3001, 0.1, 6),
                                  random_mask(33, 3001, 1.0, 7), random_mask(45, 3001, 0.0, 8)};
  TraceWriterOptions wo;
  wo.model = "m";
  wo.activation = "synthetic";
  for (auto& m : masks) wo.n_neurons.push_back(m.n_neurons);
  trace_write(path, wo, masks, {0});
  TraceReader r(path);
  for (uint32_t l = 0; l < masks.size(); ++l)
    for (uint64_t chunk_bytes : {uint64_t(1), uint64_t(70 * 8 * 16), uint64_t(1) << 30})
      for (uint32_t k : {0u, 5u})
        for (bool full : {false, true}) {
          CAPTURE(l);
          CAPTURE(chunk_bytes);
          CAPTURE(k);
          CAPTURE(full);
          CoactivationOptions o;
          o.top_k = k;
          o.full_matrix = full;
          o.chunk_bytes = chunk_bytes;
          LayerGraph a = coactivation_count(masks[l], o), b = coactivation_count_trace(r, l, o);
          CHECK(a.n_tokens == b.n_tokens);
          CHECK(a.freq == b.freq);
          CHECK(a.upper == b.upper);
          CHECK(a.nbr == b.nbr);
          CHECK(a.nbr_cnt == b.nbr_cnt);
          CHECK(a.nbr_len == b.nbr_len);
        }
  std::remove(path.c_str());
}

TEST_CASE("build_topk from the full matrix equals counting top-k directly") {
  LayerMask m = random_mask(150, 700, 0.2, 11);
  CoactivationOptions o;
  o.full_matrix = true;
  o.top_k = 9;
  LayerGraph g = coactivation_count(m, o);
  LayerGraph h = g;
  coactivation_build_topk(h, 9);
  CHECK(h.nbr == g.nbr);
  CHECK(h.nbr_cnt == g.nbr_cnt);
  CHECK(h.nbr_len == g.nbr_len);
  coactivation_build_topk(h, 0);
  CHECK(h.nbr.empty());
}
