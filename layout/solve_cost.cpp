#include "layout/solve_cost.h"

#include <algorithm>
#include <cstdio>
#include <functional>
#include <queue>
#include <vector>

#include "formats/core/atomic_file.h"
#include "layout/cost_model.h"

namespace nl {

namespace {

// Fitted by bench/solve_cost_fit.py on bench/solve_cost_curve.csv (bench/solve_cost_curve.sh: one synthetic layer
// per point; the OPT-6.7B preset, active fraction 0.032, at 4,096 / 11,008 / 16,384 / 28,672 neurons x 32k / 131k /
// 524k profile tokens, and the Llama-2 ProSparse preset, 0.24, at 4,096 / 11,008 / 16,384 neurons x 131k;
// `nl-layout --threads 1`; AMD EPYC Zen 4, quiet, 2026-12-07; every point within 13.2 %, docs/benchmarks.md). A layer
// alone (its buffers faulted in), with V = min(0.2 T, 16384) validation tokens:
//   seconds = c0 + c1 n^2 T d + c2 n^2 (full matrix) or c3 n^2 (top-k lists) + c4 n T + c5 n d V + c6 n d V (ends-in)
struct Fit {
  double c0, c1, c2, c3, c4, c5, c6;
  double at(double n, double t, double d, bool full, bool ends_in) const {
    const double v = std::min(0.2 * t, 16384.0);
    return c0 + c1 * n * n * t * d + (full ? c2 : c3) * n * n + c4 * n * t + (c5 + (ends_in ? c6 : 0)) * n * d * v;
  }
};
constexpr Fit kLayerAlone = {1.07374, 1.59332e-12, 3.45657e-09, 3.83893e-09, 7.26021e-10, 1.72233e-07, 3.35632e-07};
// A later layer of a many-layer run reuses its thread's buffers (nl-layout never trims the heap): 0.72 of a layer
// alone, from the 32-layer OPT-6.7B shape (16 rounds of 2 layers, median 80.54 s; the model's layer alone 6.83 s).
constexpr double kSteady = 0.72;
// Peak bytes: m0 + m1 (n T / 8) + m2 n^2 (full matrix) per layer in flight.
constexpr double kMem0 = 1.49481e8, kMemMask = 1.81621, kMemPairs = 2.26587;

bool counts_pairs(const SolveOptions& opt) { return opt.method == "greedy" || opt.method == "greedy+ls"; }
// A layer alone on one thread (0 for the methods that count no pairs).
double alone_seconds(uint32_t n, uint64_t tokens, double density, const SolveOptions& opt) {
  if (!counts_pairs(opt)) return 0;
  const bool ends_in = opt.method == "greedy+ls" && runs_ends_in(n, cost_model(opt.eval, n).merge_gap, opt);
  return kLayerAlone.at(double(n), double(tokens), density, keeps_full_matrix(n, opt), ends_in);
}

}  // namespace

double solve_layer_seconds(uint32_t neurons, uint64_t tokens, double density, const SolveOptions& opt) {
  return kSteady * alone_seconds(neurons, tokens, density, opt);
}

uint64_t solve_layer_bytes(uint32_t neurons, uint64_t tokens, const SolveOptions& opt) {
  const double n = double(neurons);
  double b = kMemMask * n * double(tokens) / 8;
  if (keeps_full_matrix(neurons, opt)) b += kMemPairs * n * n;
  return uint64_t(b);
}

SolveCostEstimate estimate_solve_cost(const std::vector<uint32_t>& neurons, uint64_t tokens, double density,
                                      uint32_t threads, const SolveOptions& opt) {
  SolveCostEstimate e;
  if (neurons.empty()) return e;
  threads = std::max<uint32_t>(1, std::min<uint32_t>(threads, uint32_t(neurons.size())));
  const uint32_t widest = *std::max_element(neurons.begin(), neurons.end());
  e.layer_seconds = alone_seconds(widest, tokens, density, opt);
  e.full_matrix = keeps_full_matrix(widest, opt);
  // Layers handed out in order to the first free thread; each thread's first layer is cold.
  std::priority_queue<double, std::vector<double>, std::greater<double>> free_at;
  for (uint32_t t = 0; t < threads; ++t) free_at.push(0);
  double end = 0;
  for (size_t l = 0; l < neurons.size(); ++l) {
    const double start = free_at.top();
    free_at.pop();
    const double alone = alone_seconds(neurons[l], tokens, density, opt);
    const double cost = l < threads ? alone : kSteady * alone;
    free_at.push(start + cost);
    end = std::max(end, start + cost);
  }
  e.wall_seconds = end;
  e.peak_bytes = uint64_t(kMem0) + uint64_t(threads) * solve_layer_bytes(widest, tokens, opt);
  return e;
}

std::string describe(const SolveCostEstimate& e, uint32_t layers, uint32_t threads) {
  char buf[320];
  std::snprintf(
      buf, sizeof buf,
      "solve: estimate for %u layer%s on %u thread%s: about %.*f s wall (a layer alone %.1f s), peak about %s "
      "(a model fitted on one 2-core AMD EPYC machine, docs/benchmarks.md)",
      layers, layers == 1 ? "" : "s", threads, threads == 1 ? "" : "s", e.wall_seconds < 100 ? 1 : 0, e.wall_seconds,
      e.layer_seconds, format_bytes(e.peak_bytes).c_str());
  return buf;
}

}  // namespace nl
