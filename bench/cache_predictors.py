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
hit share. Tokens are taken as one stream (sequence boundaries are not separated); `all` sums the layers (active/tok:
active neurons per token over all layers). Needs numpy and h5py (Debian: python3-h5py). Example (docs/benchmarks.md,
small-relu):

  bench/cache_predictors.py --profile sr_p.h5 --test sr_t.h5 --cache-ratio 0.05
"""
import argparse
import sys

import numpy as np

from trace_masks import load_masks


def load(path):
    """Per layer, a float32 [neurons][tokens] 0/1 matrix."""
    return load_masks(path, np.float32, "cache_predictors")


COLUMNS = ("static", "markov1", "meancond", "belady", "oracle")
NEEDS_PROFILE = ("static", "markov1", "meancond")


def hits(p, t, cap, columns):
    """Hits per column over tokens 1.. of t (p: the profile, None when no column needs it)."""
    n = t.shape[0]
    out = dict.fromkeys(columns, 0.0)
    if "static" in columns:
        out["static"] = t[np.argsort(-p.mean(1), kind="stable")[:cap], 1:].sum()
    if "markov1" in columns or "meancond" in columns:
        was_on = np.maximum(1.0, p[:, :-1].sum(1))
        was_off = np.maximum(1.0, (1.0 - p[:, :-1]).sum(1))
        p_on = (p[:, 1:] * p[:, :-1]).sum(1) / was_on
        p_off = (p[:, 1:] * (1.0 - p[:, :-1])).sum(1) / was_off
    if "meancond" in columns:
        cond = (p[:, 1:] @ p[:, :-1].T) / was_on[None, :]  # cond[i, j] = P(i on | j was on)
    if "belady" in columns:
        # next_on[:, j]: the first token after j at which each neuron is active (t.shape[1]: never)
        next_on = np.empty(t.shape, np.int64)
        upcoming = np.full(n, t.shape[1], np.int64)
        for j in range(t.shape[1] - 1, -1, -1):
            next_on[:, j] = upcoming
            upcoming = np.where(t[:, j] > 0, j, upcoming)
        held = np.zeros(n, bool)
    for j in range(1, t.shape[1]):
        prev, now = t[:, j - 1], t[:, j]
        if "markov1" in columns:
            out["markov1"] += now[np.argpartition(-np.where(prev > 0, p_on, p_off), cap)[:cap]].sum()
        if "meancond" in columns:
            score = (cond @ prev) / max(1.0, prev.sum())
            out["meancond"] += now[np.argpartition(-score, cap)[:cap]].sum()
        if "oracle" in columns:
            out["oracle"] += min(cap, now.sum())
        if "belady" in columns:
            cand = np.nonzero(held | (prev > 0))[0]
            held[:] = False
            held[cand[np.argsort(next_on[cand, j - 1], kind="stable")[:cap]]] = True
            out["belady"] += now[held].sum()
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--profile", help="profile trace (the statistics of static, markov1 and meancond)")
    ap.add_argument("--test", required=True, help="held-out trace (the hits)")
    ap.add_argument("--cache-ratio", type=float, default=0.05, help="cache size as a share of the layer's neurons")
    ap.add_argument("--columns", default=",".join(COLUMNS),
                    help="which of %s to compute (meancond is slow on wide layers)" % ",".join(COLUMNS))
    a = ap.parse_args()
    columns = [c for c in a.columns.split(",") if c]
    if not columns or any(c not in COLUMNS for c in columns):
        sys.exit("cache_predictors: --columns %s: expected some of %s" % (a.columns, ",".join(COLUMNS)))
    if any(c in NEEDS_PROFILE for c in columns) and not a.profile:
        sys.exit("cache_predictors: --profile is needed for %s" % ",".join(c for c in columns if c in NEEDS_PROFILE))
    test = load(a.test)
    prof = load(a.profile) if any(c in NEEDS_PROFILE for c in columns) else [None] * len(test)
    if len(prof) != len(test) or any(p is not None and p.shape[0] != t.shape[0] for p, t in zip(prof, test)):
        sys.exit("cache_predictors: %s and %s have different layers or widths" % (a.profile, a.test))
    print("layer  width    cap  active/tok  " + "  ".join("%9s" % (c + " %") for c in columns))
    total, total_active, tokens = dict.fromkeys(columns, 0.0), 0.0, 0
    for layer, (p, t) in enumerate(zip(prof, test)):
        n = t.shape[0]
        cap = int(a.cache_ratio * n)
        if cap < 1 or cap >= n or t.shape[1] < 2:
            print("%5d  %5d  %5d  (skipped: cache of %d neurons)" % (layer, n, cap, cap))
            continue
        h = hits(p, t, cap, columns)
        active = t[:, 1:].sum()
        for c in columns:
            total[c] += h[c]
        total_active += active
        tokens = t.shape[1] - 1
        print("%5d  %5d  %5d  %10.1f  " % (layer, n, cap, active / tokens) +
              "  ".join("%9.2f" % (100.0 * h[c] / max(1.0, active)) for c in columns))
    if len(test) > 1 and total_active:
        print("  all               %10.1f  " % (total_active / max(1, tokens)) +
              "  ".join("%9.2f" % (100.0 * total[c] / total_active) for c in columns))


if __name__ == "__main__":
    main()
