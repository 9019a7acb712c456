#!/usr/bin/env python3
"""Fits the count + solve cost curve (bench/solve_cost_curve.sh's CSV) to the model layout/solve_cost.cpp uses, and
prints the coefficients, each point's fit error, and predictions for whole models.

Model, per layer of n neurons, T profile tokens, active fraction d (the preset's, the CSV's `density`):
  seconds = c0 + c1 n^2 T d + c2 n^2 full + c3 n^2 (1 - full) + c4 n T + c5 n d V + c6 n d V ends
                                                               (non-negative least squares on the relative error)
where V = min(0.2 T, 16384) are the validation tokens the candidates are measured on (--validation-share,
--guard-tokens), ends = 1 where the ends-in family runs (the planner's merge gap, in bundles of the default size for
the width, is wider than the search's 4-slot windows: 4 KiB bundles here) and
where full = 1 when the layer's pair counts fit in --full-matrix-mib (1 GiB: up to 23,170 neurons) and greedy runs
over every pair, else 0 (top-k lists).
fitted to `wall_s` of a single layer alone (cold: its buffers faulted in). A later layer of a many-layer run reuses
the buffers (no heap trimming) and costs STEADY times that: 0.72, from the 32-layer OPT-6.7B run (16 rounds of 2
layers, median 80.54 s, where the model gives a layer alone 6.83 s). Peak memory: bytes = m0 + m1 * (n*T/8) + m2 * n^2.
Peak memory: bytes = m0 + m1 * (n*T/8) + m2 * n^2 * full. A whole model on P threads: the first P layers cold, the rest steady:
  wall = wall_1 * (1 + (ceil(L / P) - 1) * STEADY).
  bench/solve_cost_fit.py CURVE.csv
(The opt-6.7b rows' solve_phases_s counted the "search: ..." parts of "build search" twice; nothing is fitted to it.)
"""
import csv
import math
import sys

import itertools


def lstsq(a, b):
    """Least squares by the normal equations (a few columns), Gaussian elimination with partial pivoting."""
    k = len(a[0])
    m = [[sum(r[i] * r[j] for r in a) for j in range(k)] + [sum(r[i] * y for r, y in zip(a, b))] for i in range(k)]
    for c in range(k):
        p = max(range(c, k), key=lambda r: abs(m[r][c]))
        m[c], m[p] = m[p], m[c]
        if abs(m[c][c]) < 1e-300:
            return None
        for r in range(k):
            if r != c:
                f = m[r][c] / m[c][c]
                m[r] = [x - f * y for x, y in zip(m[r], m[c])]
    return [m[i][k] / m[i][i] for i in range(k)]


def nnls(a, b):
    """Non-negative least squares for a handful of columns: the best unconstrained fit over every subset of them
    whose coefficients are all non-negative."""
    k = len(a[0])
    best, best_err = [0.0] * k, sum(y * y for y in b)
    for size in range(1, k + 1):
        for cols in itertools.combinations(range(k), size):
            x = lstsq([[r[c] for c in cols] for r in a], b)
            if x is None or min(x) < 0:
                continue
            full_x = [0.0] * k
            for c, v in zip(cols, x):
                full_x[c] = v
            err = sum((sum(r[i] * full_x[i] for i in range(k)) - y) ** 2 for r, y in zip(a, b))
            if err < best_err:
                best, best_err = full_x, err
    return best


def dot(r, c):
    return sum(x * y for x, y in zip(r, c))


FULL_MATRIX_BYTES = 1 << 30
STEADY = 0.72


def full(n):
    return 1.0 if n * (n - 1) // 2 * 4 <= FULL_MATRIX_BYTES else 0.0


def ends_in(n):
    """Whether solve's ends-in family runs at this width: the default bundle size (layout/evaluate.cpp
    default_bundle_bytes) and the auto merge gap on the built-in UFS 4.0 device (configs/devices/ufs40.json, a x B
    bytes break even; runtime/plan/read_plan.cpp auto_gap_bundles) against the search's 4-slot windows."""
    bundle = 24576 if n in (11008, 14336) else max(n, 64)
    gap = max(0, math.ceil(8.14e-6 * 4267e6 / bundle) - 1)
    return 1.0 if gap > 4 and n >= 4 else 0.0


def features(n, t, d):
    v = min(0.2 * t, 16384.0)
    return [1.0, n * n * t * d, n * n * full(n), n * n * (1 - full(n)), n * t, n * d * v, n * d * v * ends_in(n)]


def main():
    rows = list(csv.DictReader(open(sys.argv[1])))
    X = [features(float(r["neurons"]), float(r["tokens"]), float(r["density"])) for r in rows]
    out = {}
    for col in ("wall_s",):
        y = [float(r[col]) for r in rows]
        c = nnls([[v / yi for v in x] for x, yi in zip(X, y)], [1.0] * len(y))  # relative error
        out[col] = c
        print(f"{col}: " + "  ".join(f"c{i} {v:.6g}" for i, v in enumerate(c)))
        for r, yi, fi in zip(rows, y, [dot(x, c) for x in X]):
            print(f"  n {r['neurons']:>6} T {r['tokens']:>7} d {r['density']:>5}: measured {yi:7.2f} s, model {fi:7.2f} s, "
                  f"error {100 * (fi - yi) / yi:+6.1f} %")
    # The growth as one power law, wall = a n^alpha T^beta (log-linear least squares), for the exponents.
    import math as _m
    pr = [r for r in rows if float(r["density"]) == 0.032]
    L = [[1.0, _m.log(float(r["neurons"])), _m.log(float(r["tokens"]))] for r in pr]
    ab = lstsq(L, [_m.log(float(r["wall_s"])) for r in pr])
    print(f"power law (d = 0.032 rows): wall = {_m.exp(ab[0]):.4g} * n^{ab[1]:.3f} * T^{ab[2]:.3f}")
    # Peak memory (one layer, one thread).
    M = [[1.0, float(r["neurons"]) * float(r["tokens"]) / 8, float(r["neurons"]) ** 2 * full(int(r["neurons"]))]
         for r in rows]
    y = [float(r["peak_kib"]) * 1024 for r in rows]
    m = nnls([[v / yi for v in x] for x, yi in zip(M, y)], [1.0] * len(y))
    print(f"peak bytes: m0 {m[0]:.6g}  m1 {m[1]:.6g}  m2 {m[2]:.6g}")
    for r, yi, fi in zip(rows, y, [dot(x, m) for x in M]):
        print(f"  n {r['neurons']:>6} T {r['tokens']:>7}: measured {yi / 2**30:6.2f} GiB, model {fi / 2**30:6.2f} GiB, "
              f"error {100 * (fi - yi) / yi:+6.1f} %")
    print("whole models, 131,072 profile tokens, count + solve wall (predicted):")
    for name, n, layers, dd in (("OPT-6.7B", 16384, 32, 0.032), ("Llama-2-13B", 13824, 40, 0.032),
                                ("Llama-2-13B", 13824, 40, 0.24), ("Llama-2-70B", 28672, 80, 0.032),
                                ("Llama-2-70B", 28672, 80, 0.24)):
        f = features(n, 131072, dd)
        w1 = dot(f, out["wall_s"])
        per_thread_bytes = m[1] * n * 131072 / 8 + m[2] * n * n * full(n)
        for p in (2, 64):
            wall = w1 * (1 + (math.ceil(layers / p) - 1) * STEADY)
            peak = m[0] + min(p, layers) * per_thread_bytes
            print(f"  {name:12s} {layers} x {n}, d {dd}: {p:2d} threads {wall:8.1f} s, peak {peak / 2**30:6.1f} GiB"
                  f" (a layer alone {w1:.1f} s)")

if __name__ == "__main__":
    main()
