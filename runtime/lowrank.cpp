// Deterministic truncated SVD for the low-rank activation predictor (runtime/lowrank.h).
#include "runtime/lowrank.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "formats/core/rng.h"

namespace nl {

namespace {

// Orthonormalises the k columns of q [n][k] in place (modified Gram-Schmidt, twice for stability). A column that
// vanishes relative to its length before projection (rank-deficient input: what is left is rounding noise, which
// would normalise to a copy of an earlier column) is replaced by a unit vector orthogonal to the previous ones.
void orthonormalize(std::vector<double>& q, int n, int k) {
  for (int pass = 0; pass < 2; ++pass) {
    for (int j = 0; j < k; ++j) {
      double nn0 = 0;
      for (int r = 0; r < n; ++r) nn0 += q[size_t(r) * k + j] * q[size_t(r) * k + j];
      for (int i = 0; i < j; ++i) {
        double d = 0;
        for (int r = 0; r < n; ++r) d += q[size_t(r) * k + i] * q[size_t(r) * k + j];
        for (int r = 0; r < n; ++r) q[size_t(r) * k + j] -= d * q[size_t(r) * k + i];
      }
      double nn = 0;
      for (int r = 0; r < n; ++r) nn += q[size_t(r) * k + j] * q[size_t(r) * k + j];
      if (nn < 1e-300 || nn <= 1e-20 * nn0) {
        // Try unit vectors until one has an orthogonal component.
        for (int e = 0; e < n; ++e) {
          for (int r = 0; r < n; ++r) q[size_t(r) * k + j] = r == (e + j) % n ? 1.0 : 0.0;
          for (int i = 0; i < j; ++i) {
            double d = q[size_t((e + j) % n) * k + i];
            for (int r = 0; r < n; ++r) q[size_t(r) * k + j] -= d * q[size_t(r) * k + i];
          }
          nn = 0;
          for (int r = 0; r < n; ++r) nn += q[size_t(r) * k + j] * q[size_t(r) * k + j];
          if (nn > 1e-12) break;
        }
      }
      const double inv = 1.0 / std::sqrt(nn);
      for (int r = 0; r < n; ++r) q[size_t(r) * k + j] *= inv;
    }
  }
}

// y [rows][k] = G [rows][cols] * q [cols][k]
void mul_g(const float* g, int rows, int cols, const std::vector<double>& q, int k, std::vector<double>& y) {
  y.assign(size_t(rows) * k, 0.0);
#pragma omp parallel for schedule(static)
  for (int r = 0; r < rows; ++r) {
    double* yr = y.data() + size_t(r) * k;
    const float* gr = g + size_t(r) * cols;
    for (int c = 0; c < cols; ++c) {
      const double v = gr[c];
      const double* qc = q.data() + size_t(c) * k;
      for (int j = 0; j < k; ++j) yr[j] += v * qc[j];
    }
  }
}

// q [cols][k] = G^T [cols][rows] * y [rows][k]; fixed summation order (rows ascending) per output.
void mul_gt(const float* g, int rows, int cols, const std::vector<double>& y, int k, std::vector<double>& q) {
  q.assign(size_t(cols) * k, 0.0);
#pragma omp parallel for schedule(static)
  for (int c = 0; c < cols; ++c) {
    double* qc = q.data() + size_t(c) * k;
    for (int r = 0; r < rows; ++r) {
      const double v = g[size_t(r) * cols + c];
      const double* yr = y.data() + size_t(r) * k;
      for (int j = 0; j < k; ++j) qc[j] += v * yr[j];
    }
  }
}

}  // namespace

void symmetric_eigen(std::vector<double>& m, int n, std::vector<double>* values, std::vector<double>* vectors) {
  std::vector<double> v(size_t(n) * n, 0.0);
  for (int i = 0; i < n; ++i) v[size_t(i) * n + i] = 1.0;
  auto at = [&](int i, int j) -> double& { return m[size_t(i) * n + j]; };
  for (int sweep = 0; sweep < 100; ++sweep) {
    double off = 0, diag = 0;
    for (int i = 0; i < n; ++i)
      for (int j = 0; j < n; ++j) (i == j ? diag : off) += at(i, j) * at(i, j);
    if (off <= 1e-30 * std::max(diag, 1e-300)) break;
    for (int p = 0; p < n - 1; ++p) {
      for (int q = p + 1; q < n; ++q) {
        const double apq = at(p, q);
        if (std::fabs(apq) < 1e-300) continue;
        const double theta = (at(q, q) - at(p, p)) / (2.0 * apq);
        const double t = (theta >= 0 ? 1.0 : -1.0) / (std::fabs(theta) + std::sqrt(theta * theta + 1.0));
        const double c = 1.0 / std::sqrt(t * t + 1.0), s = t * c;
        for (int k = 0; k < n; ++k) {  // columns p, q
          const double mkp = at(k, p), mkq = at(k, q);
          at(k, p) = c * mkp - s * mkq;
          at(k, q) = s * mkp + c * mkq;
        }
        for (int k = 0; k < n; ++k) {  // rows p, q
          const double mpk = at(p, k), mqk = at(q, k);
          at(p, k) = c * mpk - s * mqk;
          at(q, k) = s * mpk + c * mqk;
        }
        for (int k = 0; k < n; ++k) {
          const double vkp = v[size_t(k) * n + p], vkq = v[size_t(k) * n + q];
          v[size_t(k) * n + p] = c * vkp - s * vkq;
          v[size_t(k) * n + q] = s * vkp + c * vkq;
        }
      }
    }
  }
  std::vector<int> idx(static_cast<size_t>(n));
  std::iota(idx.begin(), idx.end(), 0);
  std::stable_sort(idx.begin(), idx.end(), [&](int a, int b) { return at(a, a) > at(b, b); });
  values->resize(size_t(n));
  vectors->resize(size_t(n) * n);
  for (int j = 0; j < n; ++j) {
    (*values)[size_t(j)] = at(idx[size_t(j)], idx[size_t(j)]);
    for (int k = 0; k < n; ++k) (*vectors)[size_t(k) * n + j] = v[size_t(k) * n + idx[size_t(j)]];
  }
}

LowRankFactors lowrank_fit(const float* g, int rows, int cols, int rank, uint64_t seed, int iters, int oversample) {
  LowRankFactors f;
  f.rows = rows;
  f.cols = cols;
  const int full = std::min(rows, cols);
  rank = std::clamp(rank, 1, full);
  f.rank = rank;
  const int k = std::min(full, rank + std::max(0, oversample));
  // Random start (fixed seed): q [cols][k].
  SplitMix64 rng(seed);
  std::vector<double> q(size_t(cols) * k), y;
  for (double& x : q) x = rng.normal();
  orthonormalize(q, cols, k);
  for (int it = 0; it < iters; ++it) {  // q <- orth(G^T G q)
    mul_g(g, rows, cols, q, k, y);
    mul_gt(g, rows, cols, y, k, q);
    orthonormalize(q, cols, k);
  }
  // Rayleigh-Ritz: eigen-decomposition of (G q)^T (G q) = W diag(s^2) W^T; right singular vectors V = q W.
  mul_g(g, rows, cols, q, k, y);
  std::vector<double> gram(size_t(k) * k, 0.0);
  for (int i = 0; i < k; ++i)
    for (int j = i; j < k; ++j) {
      double d = 0;
      for (int r = 0; r < rows; ++r) d += y[size_t(r) * k + i] * y[size_t(r) * k + j];
      gram[size_t(i) * k + j] = gram[size_t(j) * k + i] = d;
    }
  std::vector<double> vals, w;
  symmetric_eigen(gram, k, &vals, &w);
  f.sigma.resize(size_t(rank));
  f.b.assign(size_t(rank) * cols, 0.0f);
  f.a.assign(size_t(rows) * rank, 0.0f);
  for (int j = 0; j < rank; ++j) {
    f.sigma[size_t(j)] = std::sqrt(std::max(0.0, vals[size_t(j)]));
    for (int c = 0; c < cols; ++c) {
      double s = 0;
      for (int i = 0; i < k; ++i) s += q[size_t(c) * k + i] * w[size_t(i) * k + j];
      f.b[size_t(j) * cols + c] = float(s);
    }
    // a[:, j] = G v_j = (G q) w_j
    for (int r = 0; r < rows; ++r) {
      double s = 0;
      for (int i = 0; i < k; ++i) s += y[size_t(r) * k + i] * w[size_t(i) * k + j];
      f.a[size_t(r) * rank + j] = float(s);
    }
  }
  return f;
}

void LowRankFactors::predict(const float* x, float* scores, float* tmp) const {
  for (int j = 0; j < rank; ++j) {
    const float* bj = b.data() + size_t(j) * cols;
    float s = 0;
    for (int c = 0; c < cols; ++c) s += bj[c] * x[c];
    tmp[j] = s;
  }
  for (int r = 0; r < rows; ++r) {
    const float* ar = a.data() + size_t(r) * rank;
    float s = 0;
    for (int j = 0; j < rank; ++j) s += ar[j] * tmp[j];
    scores[r] = s;
  }
}

}  // namespace nl
