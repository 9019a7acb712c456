// fp32 kernels of the forward pass. Every dot product uses one fixed summation order (8 lane-wise partial sums,
// a fixed reduction tree, then the scalar tail), whatever the tile shape or SIMD width, so the single-token and
// the sequence paths, x86 and aarch64, give bitwise identical results (this file is built with
// -ffp-contract=off: no FMA contraction). matmul_acc64 keeps the same order with double accumulators (its x86
// AVX2+FMA path fuses exact products, which rounds exactly as the separate add does).
#include <cmath>
#include <cstring>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "runtime/model/model.h"

// The 8-lane helpers below are always inlined into their (possibly AVX) callers; no ABI crosses a call.
#pragma GCC diagnostic ignored "-Wpsabi"

namespace nl::kernels {
namespace {

typedef float v8f __attribute__((vector_size(32)));

__attribute__((always_inline)) inline v8f load8(const float* p) {
  v8f v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

__attribute__((always_inline)) inline float reduce8(v8f a) {
  float s0 = a[0] + a[4], s1 = a[1] + a[5], s2 = a[2] + a[6], s3 = a[3] + a[7];
  return (s0 + s2) + (s1 + s3);
}

// A TB x OB tile of y = x w^T: TB tokens against OB weight rows, all accumulators in registers.
template <int TB, int OB>
__attribute__((always_inline)) inline void tile(float* y, const float* x, const float* w, int in, int out, int t0,
                                                int o0) {
  v8f acc[TB][OB];
  for (int t = 0; t < TB; ++t)
    for (int o = 0; o < OB; ++o) acc[t][o] = v8f{0, 0, 0, 0, 0, 0, 0, 0};
  int i = 0;
  for (; i + 8 <= in; i += 8) {
    v8f xv[TB], wv[OB];
    for (int t = 0; t < TB; ++t) xv[t] = load8(x + size_t(t0 + t) * in + i);
    for (int o = 0; o < OB; ++o) wv[o] = load8(w + size_t(o0 + o) * in + i);
    for (int t = 0; t < TB; ++t)
      for (int o = 0; o < OB; ++o) acc[t][o] += xv[t] * wv[o];
  }
  for (int t = 0; t < TB; ++t)
    for (int o = 0; o < OB; ++o) {
      const float* xr = x + size_t(t0 + t) * in;
      const float* wr = w + size_t(o0 + o) * in;
      float tail = 0.0f;
      for (int j = i; j < in; ++j) tail += xr[j] * wr[j];
      y[size_t(t0 + t) * out + o0 + o] = reduce8(acc[t][o]) + tail;
    }
}

typedef float v4f __attribute__((vector_size(16)));
typedef double v4d __attribute__((vector_size(32)));

// 4 floats widened to double (exact).
__attribute__((always_inline)) inline v4d load4d(const float* p) {
  v4f v;
  std::memcpy(&v, p, sizeof v);
  return __builtin_convertvector(v, v4d);
}

// tile() with double accumulators: the 8 lanes are held as two 4-lane halves (lanes 0-3, 4-7; GCC spills 8-lane
// double vectors), each fp32 product is exact in double, only the sums round, and y is rounded to fp32 once.
template <int TB, int OB>
__attribute__((always_inline)) inline void tile64(float* y, const float* x, const float* w, int in, int out, int t0,
                                                  int o0) {
  v4d lo[TB][OB], hi[TB][OB];
  for (int t = 0; t < TB; ++t)
    for (int o = 0; o < OB; ++o) lo[t][o] = hi[t][o] = v4d{0, 0, 0, 0};
  int i = 0;
  for (; i + 8 <= in; i += 8) {
    v4d xl[TB], xh[TB], wl[OB], wh[OB];
    for (int t = 0; t < TB; ++t) {
      xl[t] = load4d(x + size_t(t0 + t) * in + i);
      xh[t] = load4d(x + size_t(t0 + t) * in + i + 4);
    }
    for (int o = 0; o < OB; ++o) {
      wl[o] = load4d(w + size_t(o0 + o) * in + i);
      wh[o] = load4d(w + size_t(o0 + o) * in + i + 4);
    }
    for (int t = 0; t < TB; ++t)
      for (int o = 0; o < OB; ++o) {
        lo[t][o] += xl[t] * wl[o];
        hi[t][o] += xh[t] * wh[o];
      }
  }
  for (int t = 0; t < TB; ++t)
    for (int o = 0; o < OB; ++o) {
      const float* xr = x + size_t(t0 + t) * in;
      const float* wr = w + size_t(o0 + o) * in;
      double tail = 0.0;
      for (int j = i; j < in; ++j) tail += double(xr[j]) * double(wr[j]);
      const v4d a = lo[t][o], b = hi[t][o];
      const double s0 = a[0] + b[0], s1 = a[1] + b[1], s2 = a[2] + b[2], s3 = a[3] + b[3];  // as reduce8
      y[size_t(t0 + t) * out + o0 + o] = float(((s0 + s2) + (s1 + s3)) + tail);
    }
}

constexpr int kTB = 4;  // tokens per tile
constexpr int kOB = 2;  // weight rows per tile (4 x 2 accumulators + 6 operands fit in 16 vector registers)

#if defined(__x86_64__)
#define NL_KERNEL_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define NL_KERNEL_CLONES
#endif

// Fewer tokens than a tile (decode): kOBRow rows per tile, token by token, so that each row's add chain overlaps the
// others' (one row at a time waits on its one chain's add latency).
constexpr int kOBRow = 4;

NL_KERNEL_CLONES
void matmul_impl(float* y, const float* x, const float* w, int n, int in, int out) {
  const long work = long(n) * in * out;
  if (n < kTB) {
    const int ob = (out + kOBRow - 1) / kOBRow;
#pragma omp parallel for schedule(static) if (work > (1L << 21))
    for (int bo = 0; bo < ob; ++bo) {
      const int o0 = bo * kOBRow;
      for (int t = 0; t < n; ++t) {
        if (o0 + kOBRow <= out) {
          tile<1, kOBRow>(y, x, w, in, out, t, o0);
        } else {
          for (int o = o0; o < out; ++o) tile<1, 1>(y, x, w, in, out, t, o);
        }
      }
    }
    return;
  }
  const int tb = (n + kTB - 1) / kTB, ob = (out + kOB - 1) / kOB;
  // Below ~2M multiply-adds (tiny layers) waking the team costs more than it saves, badly so on a loaded machine.
#pragma omp parallel for collapse(2) schedule(static) if (work > (1L << 21))
  for (int bo = 0; bo < ob; ++bo)
    for (int bt = 0; bt < tb; ++bt) {
      const int t0 = bt * kTB, o0 = bo * kOB;
      const bool full_t = t0 + kTB <= n, full_o = o0 + kOB <= out;
      if (full_t && full_o) {
        tile<kTB, kOB>(y, x, w, in, out, t0, o0);
      } else {
        for (int t = t0; t < n && t < t0 + kTB; ++t)
          for (int o = o0; o < out && o < o0 + kOB; ++o) tile<1, 1>(y, x, w, in, out, t, o);
      }
    }
}

// Double tiles: 2 tokens x 2 rows (8 accumulators + 8 operands in 16 vector registers); a single token (the
// generation path) runs 1 x 4 tiles instead.
constexpr int kTB64 = 2, kOB64 = 2, kOB64Row = 4;

NL_KERNEL_CLONES
void matmul_acc64_impl(float* y, const float* x, const float* w, int n, int in, int out) {
  const long work = long(n) * in * out;
  if (n < kTB64) {
    const int ob = (out + kOB64Row - 1) / kOB64Row;
#pragma omp parallel for schedule(static) if (work > (1L << 21))
    for (int bo = 0; bo < ob; ++bo) {
      const int o0 = bo * kOB64Row;
      if (o0 + kOB64Row <= out) {
        tile64<1, kOB64Row>(y, x, w, in, out, 0, o0);
      } else {
        for (int o = o0; o < out; ++o) tile64<1, 1>(y, x, w, in, out, 0, o);
      }
    }
    return;
  }
  const int tb = (n + kTB64 - 1) / kTB64, ob = (out + kOB64 - 1) / kOB64;
#pragma omp parallel for collapse(2) schedule(static) if (work > (1L << 21))
  for (int bo = 0; bo < ob; ++bo)
    for (int bt = 0; bt < tb; ++bt) {
      const int t0 = bt * kTB64, o0 = bo * kOB64;
      if (t0 + kTB64 <= n && o0 + kOB64 <= out) {
        tile64<kTB64, kOB64>(y, x, w, in, out, t0, o0);
      } else {
        for (int t = t0; t < n && t < t0 + kTB64; ++t)
          for (int o = o0; o < out && o < o0 + kOB64; ++o) tile64<1, 1>(y, x, w, in, out, t, o);
      }
    }
}

#if defined(__x86_64__)
// AVX2 + FMA (x86-64-v3 CPUs): bitwise the same sums as tile64, since a fused multiply-add of an exact double
// product rounds once, exactly like the separate add. x is widened once per call, so the loop converts only weights.
template <int TB, int OB>
__attribute__((target("avx2,fma"), always_inline)) inline void tile64_fma(float* y, const double* x, const float* w,
                                                                          int in, int out, int t0, int o0) {
  __m256d lo[TB][OB], hi[TB][OB];
  for (int t = 0; t < TB; ++t)
    for (int o = 0; o < OB; ++o) lo[t][o] = hi[t][o] = _mm256_setzero_pd();
  int i = 0;
  for (; i + 8 <= in; i += 8) {
    __m256d wl[OB], wh[OB];
    for (int o = 0; o < OB; ++o) {
      wl[o] = _mm256_cvtps_pd(_mm_loadu_ps(w + size_t(o0 + o) * in + i));
      wh[o] = _mm256_cvtps_pd(_mm_loadu_ps(w + size_t(o0 + o) * in + i + 4));
    }
    for (int t = 0; t < TB; ++t) {
      const __m256d xl = _mm256_loadu_pd(x + size_t(t0 + t) * in + i),
                    xh = _mm256_loadu_pd(x + size_t(t0 + t) * in + i + 4);
      for (int o = 0; o < OB; ++o) {
        lo[t][o] = _mm256_fmadd_pd(xl, wl[o], lo[t][o]);
        hi[t][o] = _mm256_fmadd_pd(xh, wh[o], hi[t][o]);
      }
    }
  }
  for (int t = 0; t < TB; ++t)
    for (int o = 0; o < OB; ++o) {
      const double* xr = x + size_t(t0 + t) * in;
      const float* wr = w + size_t(o0 + o) * in;
      double tail = 0.0;
      for (int j = i; j < in; ++j) tail += xr[j] * double(wr[j]);
      alignas(32) double a[4], b[4];
      _mm256_store_pd(a, lo[t][o]);
      _mm256_store_pd(b, hi[t][o]);
      const double s0 = a[0] + b[0], s1 = a[1] + b[1], s2 = a[2] + b[2], s3 = a[3] + b[3];  // as reduce8
      y[size_t(t0 + t) * out + o0 + o] = float(((s0 + s2) + (s1 + s3)) + tail);
    }
}

constexpr int kTBFma = 2, kOBFma = 2;  // 8 accumulators + 4 weight operands; x is read from memory

__attribute__((target("avx2,fma"))) void matmul_acc64_fma(float* y, const double* x, const float* w, int n, int in,
                                                          int out) {
  const long work = long(n) * in * out;
  if (n < kTBFma) {
    const int ob = (out + kOB64Row - 1) / kOB64Row;
#pragma omp parallel for schedule(static) if (work > (1L << 21))
    for (int bo = 0; bo < ob; ++bo) {
      const int o0 = bo * kOB64Row;
      for (int t = 0; t < n; ++t) {
        if (o0 + kOB64Row <= out) {
          tile64_fma<1, kOB64Row>(y, x, w, in, out, t, o0);
        } else {
          for (int o = o0; o < out; ++o) tile64_fma<1, 1>(y, x, w, in, out, t, o);
        }
      }
    }
    return;
  }
  const int tb = (n + kTBFma - 1) / kTBFma, ob = (out + kOBFma - 1) / kOBFma;
#pragma omp parallel for collapse(2) schedule(static) if (work > (1L << 21))
  for (int bo = 0; bo < ob; ++bo)
    for (int bt = 0; bt < tb; ++bt) {
      const int t0 = bt * kTBFma, o0 = bo * kOBFma;
      if (t0 + kTBFma <= n && o0 + kOBFma <= out) {
        tile64_fma<kTBFma, kOBFma>(y, x, w, in, out, t0, o0);
      } else {
        for (int t = t0; t < n && t < t0 + kTBFma; ++t)
          for (int o = o0; o < out && o < o0 + kOBFma; ++o) tile64_fma<1, 1>(y, x, w, in, out, t, o);
      }
    }
}
#endif

}  // namespace

void matmul(float* y, const float* x, const float* w, int n, int in, int out) { matmul_impl(y, x, w, n, in, out); }

void matmul_acc64(float* y, const float* x, const float* w, int n, int in, int out) {
#if defined(__x86_64__)
  static const bool fma = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  if (fma) {
    thread_local std::vector<double> xd;
    xd.resize(size_t(n) * size_t(in));
    for (size_t i = 0; i < xd.size(); ++i) xd[i] = double(x[i]);
    matmul_acc64_fma(y, xd.data(), w, n, in, out);
    return;
  }
#endif
  matmul_acc64_impl(y, x, w, n, in, out);
}

void matmul_acc64_portable(float* y, const float* x, const float* w, int n, int in, int out) {
  matmul_acc64_impl(y, x, w, n, in, out);
}

NL_KERNEL_CLONES
float dot(const float* a, const float* b, int n) {
  float y;
  tile<1, 1>(&y, a, b, n, 1, 0, 0);
  return y;
}

namespace {
// Scores of positions p0 .. p0+P-1 against one query: P independent 8-lane chains side by side (each in dot()'s
// order), so the adds of different positions overlap instead of waiting on one chain.
template <int P>
__attribute__((always_inline)) inline void scores(float* att, const float* q, const float* k, size_t stride, int p0,
                                                  int hd, float scale) {
  v8f acc[P];
  for (int j = 0; j < P; ++j) acc[j] = v8f{0, 0, 0, 0, 0, 0, 0, 0};
  int i = 0;
  for (; i + 8 <= hd; i += 8) {
    const v8f qv = load8(q + i);
    for (int j = 0; j < P; ++j) acc[j] += qv * load8(k + size_t(p0 + j) * stride + i);
  }
  for (int j = 0; j < P; ++j) {
    const float* kr = k + size_t(p0 + j) * stride;
    float tail = 0.0f;
    for (int l = i; l < hd; ++l) tail += q[l] * kr[l];
    att[p0 + j] = (reduce8(acc[j]) + tail) * scale;
  }
}

// o[0 .. 8V) = sum_p att[p] * v[p][0 .. 8V), position by position from zero: V independent 8-lane chains, one add
// each per position. Two chains per pass (4 passes over the positions at head dim 64) waited on the add latency: a
// head of 130 positions took 2.10 us against 1.52 us with 8 chains and 8 scores at a time (hot caches, AMD EPYC).
template <int V>
__attribute__((always_inline)) inline void weighted(float* o, const float* att, const float* v, size_t stride,
                                                    int n_pos) {
  v8f a[V];
  for (int c = 0; c < V; ++c) a[c] = v8f{0, 0, 0, 0, 0, 0, 0, 0};
  for (int j = 0; j < n_pos; ++j) {
    const float* vr = v + size_t(j) * stride;
    const float w = att[j];
    for (int c = 0; c < V; ++c) a[c] += w * load8(vr + 8 * c);
  }
  for (int c = 0; c < V; ++c) std::memcpy(o + 8 * c, &a[c], sizeof a[c]);
}
}  // namespace

NL_KERNEL_CLONES
void attend(float* o, const float* q, const float* k, const float* v, size_t stride, int n_pos, int hd, float scale,
            float* att) {
  int p = 0;
  for (; p + 8 <= n_pos; p += 8) scores<8>(att, q, k, stride, p, hd, scale);
  for (; p + 4 <= n_pos; p += 4) scores<4>(att, q, k, stride, p, hd, scale);
  for (; p < n_pos; ++p) scores<1>(att, q, k, stride, p, hd, scale);
  softmax(att, n_pos);
  // o = sum_p att[p] * v[p], element-wise: any split of the elements and any vector width give these bits.
  int i = 0;
  for (; i + 64 <= hd; i += 64) weighted<8>(o + i, att, v + i, stride, n_pos);
  for (; i + 16 <= hd; i += 16) weighted<2>(o + i, att, v + i, stride, n_pos);
  for (; i < hd; ++i) {
    float a = 0.0f;
    for (int j = 0; j < n_pos; ++j) a += att[j] * v[size_t(j) * stride + i];
    o[i] = a;
  }
}

void rmsnorm(float* out, const float* x, const float* g, int n, float eps) {
  float ss = 0.0f;
  for (int i = 0; i < n; ++i) ss += x[i] * x[i];
  const float scale = 1.0f / std::sqrt(ss / float(n) + eps);
  for (int i = 0; i < n; ++i) out[i] = g[i] * (scale * x[i]);
}

void layernorm(float* out, const float* x, const float* g, const float* b, int n, float eps) {
  float sum = 0.0f;
  for (int i = 0; i < n; ++i) sum += x[i];
  const float mean = sum / float(n);
  float ss = 0.0f;
  for (int i = 0; i < n; ++i) ss += (x[i] - mean) * (x[i] - mean);
  const float scale = 1.0f / std::sqrt(ss / float(n) + eps);
  for (int i = 0; i < n; ++i) out[i] = g[i] * (scale * (x[i] - mean)) + b[i];
}

void softmax(float* x, int n) {
  float mx = x[0];
  for (int i = 1; i < n; ++i) mx = x[i] > mx ? x[i] : mx;
  float sum = 0.0f;
  for (int i = 0; i < n; ++i) {
    x[i] = std::exp(x[i] - mx);
    sum += x[i];
  }
  const float inv = 1.0f / sum;
  for (int i = 0; i < n; ++i) x[i] *= inv;
}

}  // namespace nl::kernels
