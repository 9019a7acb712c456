#!/usr/bin/env python3
"""How much could a smarter cache policy hit? Per FFN layer of a held-out trace, the share of active neurons that a
cache of C neurons (C = floor(cache_ratio x layer width)) holds when, before each token, it keeps:

  static   the C neurons most often active on the profile trace (what greedy+ls's pinned family does);
  markov1  the C neurons most likely active given each neuron's own state at the previous token
           (P(on | was on) and P(on | was off), both from the profile);
  meancond the C neurons with the highest mean over the previous token's active neurons j of P(i on | j was on);
  belady   of the neurons it held and those the previous token read, the C whose next activation comes soonest
           (Belady's MIN, which sees the future: no cache that keeps only what was read does better);
  oracle   min(C, active) of this token's active neurons (no policy does better, even one that reads ahead).

Hits only: where a hit sits inside a merged read it saves no read and no bytes, so the I/O time gains less than the
hit share. Tokens are taken as one stream (sequence boundaries are not separated). Needs numpy and h5py (Debian:
python3-h5py). Example (docs/benchmarks.md, small-relu):

  bench/cache_predictors.py --profile sr_p.h5 --test sr_t.h5 --cache-ratio 0.05
"""
import argparse
import sys

import h5py
import numpy as np


def load(path):
    """Per layer, a float32 [neurons][tokens] 0/1 matrix (trace v1: neuron-major bitmaps, docs/formats.md)."""
    try:
        with h5py.File(path, "r") as f:
            nt = int(f.attrs["n_tokens"])
            layers = []
            for k in sorted(f["layers"].keys(), key=int):
                m = f["layers"][k]["mask"][()]
                bits = np.unpackbits(m.view(np.uint8).reshape(m.shape[0], -1), axis=1, bitorder="little")[:, :nt]
                layers.append(bits.astype(np.float32))
            return layers
    except (OSError, KeyError, ValueError) as e:
        sys.exit("cache_predictors: %s: not a readable trace v1 (%s)" % (path, e))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--profile", required=True, help="profile trace (the policies' statistics)")
    ap.add_argument("--test", required=True, help="held-out trace (the hits)")
    ap.add_argument("--cache-ratio", type=float, default=0.05, help="cache size as a share of the layer's neurons")
    a = ap.parse_args()
    prof, test = load(a.profile), load(a.test)
    if len(prof) != len(test) or any(p.shape[0] != t.shape[0] for p, t in zip(prof, test)):
        sys.exit("cache_predictors: %s and %s have different layers or widths" % (a.profile, a.test))
    print("layer  width  cap  active/tok  static %  markov1 %  meancond %  belady %  oracle %")
    for layer, (p, t) in enumerate(zip(prof, test)):
        n = p.shape[0]
        cap = int(a.cache_ratio * n)
        if cap < 1 or cap >= n or t.shape[1] < 2:
            print("%5d  %5d  %3d  (skipped: cache of %d neurons)" % (layer, n, cap, cap))
            continue
        freq = p.mean(1)
        was_on = np.maximum(1.0, p[:, :-1].sum(1))
        was_off = np.maximum(1.0, (1.0 - p[:, :-1]).sum(1))
        p_on = (p[:, 1:] * p[:, :-1]).sum(1) / was_on
        p_off = (p[:, 1:] * (1.0 - p[:, :-1])).sum(1) / was_off
        cond = (p[:, 1:] @ p[:, :-1].T) / was_on[None, :]  # cond[i, j] = P(i on | j was on)
        active = t[:, 1:].sum()
        static = t[np.argsort(-freq, kind="stable")[:cap], 1:].sum()
        markov = meanc = oracle = belady = 0.0
        # next_on[:, j]: the first token after j at which each neuron is active (t.shape[1]: never)
        next_on = np.empty(t.shape, np.int64)
        upcoming = np.full(n, t.shape[1], np.int64)
        for j in range(t.shape[1] - 1, -1, -1):
            next_on[:, j] = upcoming
            upcoming = np.where(t[:, j] > 0, j, upcoming)
        held = np.zeros(n, bool)
        for j in range(1, t.shape[1]):
            prev, now = t[:, j - 1], t[:, j]
            markov += now[np.argpartition(-np.where(prev > 0, p_on, p_off), cap)[:cap]].sum()
            score = (cond @ prev) / max(1.0, prev.sum())
            meanc += now[np.argpartition(-score, cap)[:cap]].sum()
            oracle += min(cap, now.sum())
            cand = np.nonzero(held | (prev > 0))[0]
            held[:] = False
            held[cand[np.argsort(next_on[cand, j - 1], kind="stable")[:cap]]] = True
            belady += now[held].sum()
        pct = lambda h: 100.0 * h / max(1.0, active)
        print("%5d  %5d  %3d  %10.1f  %8.2f  %9.2f  %10.2f  %8.2f  %8.2f" % (layer, n, cap, active / (t.shape[1] - 1),
              pct(static), pct(markov), pct(meanc), pct(belady), pct(oracle)))


if __name__ == "__main__":
    main()
