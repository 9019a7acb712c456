// The deterministic truncated SVD behind --select lowrank:R: Jacobi eigenvalues of a known matrix, exact recovery of
// a rank-r matrix and of a full-rank one at full rank, known singular values, Eckart-Young optimality against the
// leading singular values, and byte-identical factors across runs.
#include <doctest/doctest.h>

#include <cmath>
#include <random>

#include "runtime/lowrank.h"

using namespace nl;

namespace {
std::vector<float> randn(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = nd(rng);
  return v;
}

// max |G - A B| over all entries.
double reconstruction_error(const std::vector<float>& g, const LowRankFactors& f) {
  double worst = 0;
  for (int r = 0; r < f.rows; ++r)
    for (int c = 0; c < f.cols; ++c) {
      double s = 0;
      for (int k = 0; k < f.rank; ++k) s += double(f.a[size_t(r) * f.rank + k]) * f.b[size_t(k) * f.cols + c];
      worst = std::max(worst, std::fabs(s - g[size_t(r) * f.cols + c]));
    }
  return worst;
}
}  // namespace

TEST_CASE("symmetric_eigen: known 3x3") {
  // [[2,1,0],[1,2,0],[0,0,5]]: eigenvalues 5, 3, 1.
  std::vector<double> m = {2, 1, 0, 1, 2, 0, 0, 0, 5}, vals, vecs;
  symmetric_eigen(m, 3, &vals, &vecs);
  CHECK(vals[0] == doctest::Approx(5));
  CHECK(vals[1] == doctest::Approx(3));
  CHECK(vals[2] == doctest::Approx(1));
  CHECK(std::fabs(vecs[0 * 3 + 1]) == doctest::Approx(std::sqrt(0.5)));  // (1,1,0)/sqrt2 for 3
  CHECK(std::fabs(vecs[2 * 3 + 0]) == doctest::Approx(1));               // e3 for 5
}

TEST_CASE("lowrank_fit recovers low-rank and full-rank matrices; singular values; determinism") {
  const int rows = 96, cols = 40, r = 5;
  auto u = randn(size_t(rows) * r, 1), v = randn(size_t(r) * cols, 2);
  std::vector<float> g(size_t(rows) * cols, 0.0f);
  for (int i = 0; i < rows; ++i)
    for (int j = 0; j < cols; ++j)
      for (int k = 0; k < r; ++k) g[size_t(i) * cols + j] += u[size_t(i) * r + k] * v[size_t(k) * cols + j];
  LowRankFactors f = lowrank_fit(g.data(), rows, cols, r, 7);
  CHECK(f.rank == r);
  CHECK(reconstruction_error(g, f) < 1e-3);

  // Full rank of a random matrix reproduces it; rank is clamped to min(rows, cols).
  auto h = randn(size_t(rows) * cols, 3);
  LowRankFactors full = lowrank_fit(h.data(), rows, cols, 1000, 7);
  CHECK(full.rank == cols);
  CHECK(reconstruction_error(h, full) < 1e-4);

  // Truncation error of rank k equals the (k+1)-th singular value (spectral norm; max-entry error is below it),
  // and predict() equals A (B x).
  LowRankFactors k8 = lowrank_fit(h.data(), rows, cols, 8, 7, 8);
  for (int j = 0; j < 8; ++j) CHECK(k8.sigma[size_t(j)] == doctest::Approx(full.sigma[size_t(j)]).epsilon(1e-3));
  CHECK(reconstruction_error(h, k8) <= full.sigma[8] * 1.001);
  auto x = randn(size_t(cols), 4);
  std::vector<float> s(static_cast<size_t>(rows)), tmp(8);
  k8.predict(x.data(), s.data(), tmp.data());
  for (int i = 0; i < rows; ++i) {
    double want = 0;
    for (int k = 0; k < 8; ++k) {
      double bx = 0;
      for (int c = 0; c < cols; ++c) bx += double(k8.b[size_t(k) * cols + c]) * x[size_t(c)];
      want += double(k8.a[size_t(i) * 8 + k]) * bx;
    }
    CHECK(s[size_t(i)] == doctest::Approx(want).epsilon(1e-4));
  }
  // Singular values of diag(9, 4, 1) padded with zeros.
  std::vector<float> d(size_t(6) * 4, 0.0f);
  d[0] = 9;
  d[1 * 4 + 1] = -4;
  d[2 * 4 + 2] = 1;
  LowRankFactors fd = lowrank_fit(d.data(), 6, 4, 4, 1);
  CHECK(fd.sigma[0] == doctest::Approx(9));
  CHECK(fd.sigma[1] == doctest::Approx(4));
  CHECK(fd.sigma[2] == doctest::Approx(1));
  CHECK(fd.sigma[3] == doctest::Approx(0).epsilon(1e-6));

  LowRankFactors again = lowrank_fit(h.data(), rows, cols, 8, 7, 8);
  CHECK(again.a == k8.a);
  CHECK(again.b == k8.b);
}
