// Truncated SVD of a gate matrix, for the training-free activation predictor (`nl-run generate --select
// lowrank:R`): score = (G V_R)(V_R^T x), the gate pre-activation through the best rank-R approximation of G.
// Deterministic randomized subspace iteration (fixed seed, double precision, modified Gram-Schmidt) followed by a
// cyclic Jacobi eigen-decomposition of the small projected Gram matrix: no linear-algebra dependency.
#pragma once
#include <cstdint>
#include <vector>

namespace nl {

struct LowRankFactors {
  int rows = 0, cols = 0, rank = 0;
  std::vector<float> a;       // [rows][rank] = G V_R (U_R S_R)
  std::vector<float> b;       // [rank][cols] = V_R^T
  std::vector<double> sigma;  // the R leading singular values, descending

  // scores[r] = sum_k a[r][k] * (b x)[k] for every row; `tmp` is scratch of `rank` floats.
  void predict(const float* x, float* scores, float* tmp) const;
};

// G is [rows][cols] row-major. rank is clamped to min(rows, cols). `iters` power iterations with `oversample`
// extra columns sharpen the subspace; with rank == min(rows, cols) the factors reproduce G up to rounding.
LowRankFactors lowrank_fit(const float* g, int rows, int cols, int rank, uint64_t seed = 1, int iters = 4,
                           int oversample = 8);

// Eigen-decomposition of a symmetric n x n matrix (row-major, overwritten) by cyclic Jacobi rotations:
// eigenvalues descending in `values`, eigenvectors as columns of `vectors` [n][n].
void symmetric_eigen(std::vector<double>& m, int n, std::vector<double>* values, std::vector<double>* vectors);

}  // namespace nl
