#!/usr/bin/env python3
"""Fits the count + solve cost curve (bench/solve_cost_curve.sh's CSV) to the model layout/solve_cost.cpp uses, and
prints the coefficients, each point's fit error, and predictions for whole models.

Model, per layer of n neurons, T profile tokens, active fraction d (the preset's 0.032 in the curve):
  seconds = c0 + c1 n^2 T d + c2 n^2 full + c3 n^2 (1 - full) + c4 n T   (non-negative least squares, relative error)
where full = 1 when the layer's pair counts fit in --full-matrix-mib (1 GiB: up to 23,170 neurons) and greedy runs
over every pair, else 0 (top-k lists).
fitted to `wall_s` of a single layer alone (cold: its buffers faulted in). A later layer of a many-layer run reuses
the buffers (no heap trimming) and costs STEADY times that: 0.75, from the 32-layer OPT-6.7B run (16 rounds of 2
layers in 79.15-80.64 s where a layer alone takes 7.50 s). Peak memory: bytes = m0 + m1 * (n*T/8) + m2 * n^2.
Peak memory: bytes = m0 + m1 * (n*T/8) + m2 * n^2 * full. A whole model on P threads: the first P layers cold, the rest steady:
  wall = wall_1 * (1 + (ceil(L / P) - 1) * STEADY).
  bench/solve_cost_fit.py CURVE.csv [DENSITY]
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
STEADY = 0.75


def full(n):
    return 1.0 if n * (n - 1) // 2 * 4 <= FULL_MATRIX_BYTES else 0.0


def features(n, t, d):
    return [1.0, n * n * t * d, n * n * full(n), n * n * (1 - full(n)), n * t]


def main():
    rows = list(csv.DictReader(open(sys.argv[1])))
    d = float(sys.argv[2]) if len(sys.argv) > 2 else 0.032
    X = [features(float(r["neurons"]), float(r["tokens"]), d) for r in rows]
    out = {}
    for col in ("wall_s",):
        y = [float(r[col]) for r in rows]
        c = nnls([[v / yi for v in x] for x, yi in zip(X, y)], [1.0] * len(y))  # relative error
        out[col] = c
        print(f"{col}: " + "  ".join(f"c{i} {v:.6g}" for i, v in enumerate(c)))
        for r, yi, fi in zip(rows, y, [dot(x, c) for x in X]):
            print(f"  n {r['neurons']:>6} T {r['tokens']:>7}: measured {yi:7.2f} s, model {fi:7.2f} s, "
                  f"error {100 * (fi - yi) / yi:+6.1f} %")
    # The growth as one power law, wall = a n^alpha T^beta (log-linear least squares), for the exponents.
    import math as _m
    L = [[1.0, _m.log(float(r["neurons"])), _m.log(float(r["tokens"]))] for r in rows]
    ab = lstsq(L, [_m.log(float(r["wall_s"])) for r in rows])
    print(f"power law: wall = {_m.exp(ab[0]):.4g} * n^{ab[1]:.3f} * T^{ab[2]:.3f}")
    # Peak memory (one layer, one thread).
    M = [[1.0, float(r["neurons"]) * float(r["tokens"]) / 8, float(r["neurons"]) ** 2 * full(int(r["neurons"]))]
         for r in rows]
    y = [float(r["peak_kib"]) * 1024 for r in rows]
    m = nnls([[v / yi for v in x] for x, yi in zip(M, y)], [1.0] * len(y))
    print(f"peak bytes: m0 {m[0]:.6g}  m1 {m[1]:.6g}  m2 {m[2]:.6g}")
    for r, yi, fi in zip(rows, y, [dot(x, m) for x in M]):
        print(f"  n {r['neurons']:>6} T {r['tokens']:>7}: measured {yi / 2**30:6.2f} GiB, model {fi / 2**30:6.2f} GiB, "
              f"error {100 * (fi - yi) / yi:+6.1f} %")
    print("whole models (131,072 profile tokens, d = %.3f), count + solve wall:" % d)
    for name, n, layers in (("OPT-6.7B", 16384, 32), ("Llama-2-13B", 13824, 40), ("Llama-2-70B", 28672, 80)):
        f = features(n, 131072, d)
        w1 = dot(f, out["wall_s"])
        u1 = STEADY * w1
        per_thread_bytes = m[1] * n * 131072 / 8 + m[2] * n * n * full(n)
        for p in (2, 64):
            wall = w1 + (math.ceil(layers / p) - 1) * u1
            peak = m[0] + min(p, layers) * per_thread_bytes
            print(f"  {name:12s} {layers} x {n}: {p:2d} threads {wall:8.1f} s, peak {peak / 2**30:6.1f} GiB")


if __name__ == "__main__":
    main()
