#!/usr/bin/env python3
"""Is there room left in a solved layout's order or pinned set? Two probes on a layout whose cache is a static pinned
set (greedy+ls's `pinned` family with pin share 1, the kept candidate on the real traces at 16 KiB), each written as
a layout JSON that `nl-layout eval` then measures exactly, beside the layout itself:

  tour  the unpinned neurons' order improved as a tour of least Hamming distance between neighbours (distance =
        tokens of the profile where exactly one of the two fires; a zero column closes the tour, so the tour's length
        is twice the gap-0 reads over the profile): 2-opt and Or-opt (segments of 1-3, both orientations) over each
        neuron's K nearest, first improvement, until no move improves. It starts from the layout's own order, so it
        ends in the gap-0 local optimum nearest to it. Pinned neurons stay in a block at the end.
  pins  the pinned set chosen again for the layout's order, greedily, one neuron at a time, by the largest saving of
        the estimate below if it were taken out of the order (its slot removed), on the tokens of --pins-trace (the
        held-out trace itself makes it an oracle: a bound on what any static set could gain for this order).

The estimate (per token: one read, the needed bundles, and between consecutive needed slots the cheaper of reading
the gap and one more read where the planner merges, else one more read) is the pinned-set estimate of
layout/cost_model.h (`link_us`); block alignment is ignored. The figures to trust are eval's. Needs numpy and h5py
(Debian: python3-h5py). Example (docs/benchmarks.md, small-relu at 16 KiB):

  bench/order_headroom.py --profile sr_p.h5 --pins-trace sr_t.h5 --layout ours.json --out-prefix hr
  nl-layout eval --trace sr_t.h5 --layout ours.json --layout hr.tour.json --layout hr.pins.json \\
      --gap auto --cache-ratio 0.05 --bundle-bytes 16384
"""
import argparse
import json
import os
import sys

import numpy as np

from trace_masks import load_masks


def load(path):
    """Per layer, a bool [neurons][tokens] 0/1 matrix."""
    return load_masks(path, bool, "order_headroom")


def improve_tour(cols, k_near):
    """2-opt + Or-opt on the Hamming tour of the columns (packed rows), node len(cols) the zero column. Returns the
    path (node ids, the zero column removed, rotated to start after it) and the tour length before and after."""
    n = cols.shape[0] + 1
    packed = np.vstack([np.packbits(cols, axis=1), np.zeros((1, (cols.shape[1] + 7) // 8), np.uint8)])
    lut = np.array([bin(i).count("1") for i in range(256)], np.int32)
    d = np.empty((n, n), np.int32)
    for i in range(n):
        d[i] = lut[np.bitwise_xor(packed, packed[i])].sum(1)
    near = np.argsort(d + np.diag(np.full(n, np.iinfo(np.int32).max // 2, np.int32)), axis=1, kind="stable")
    near = near[:, :k_near].tolist()
    dl = d.tolist()
    tour = [n - 1] + list(range(n - 1))
    pos = [0] * n

    def index():
        for i, v in enumerate(tour):
            pos[v] = i

    def length():
        return sum(dl[tour[i]][tour[(i + 1) % n]] for i in range(n))

    index()
    before = length()
    improved = True
    while improved:
        improved = False
        for i in range(n):  # 2-opt: edges (a, b) and (c, e) become (a, c) and (b, e)
            a, b = tour[i], tour[(i + 1) % n]
            for c in near[a]:
                j = pos[c]
                e = tour[(j + 1) % n]
                if c == b or e == a:
                    continue
                if dl[a][c] + dl[b][e] < dl[a][b] + dl[c][e]:
                    x, y = (i + 1) % n, j
                    span = (y - x) % n + 1
                    for s in range(span // 2):
                        p, q = (x + s) % n, (y - s) % n
                        tour[p], tour[q] = tour[q], tour[p]
                        pos[tour[p]], pos[tour[q]] = p, q
                    improved = True
                    break
        for seg in (1, 2, 3):  # Or-opt: a segment of seg nodes moved next to a near node, either orientation
            i = 0
            while i < n:
                segment = [tour[(i + s) % n] for s in range(seg)]
                s0, s1 = segment[0], segment[-1]
                pr, nx = tour[(i - 1) % n], tour[(i + seg) % n]
                removed = dl[pr][s0] + dl[s1][nx] - dl[pr][nx]
                moved = False
                for c in near[s0]:
                    if c in segment:
                        continue
                    j = pos[c]
                    for u, v, first, last in ((c, tour[(j + 1) % n], s0, s1), (tour[(j - 1) % n], c, s1, s0)):
                        if u in segment or v in segment:
                            continue
                        if dl[u][first] + dl[last][v] - dl[u][v] < removed:
                            ins = segment if first == s0 else segment[::-1]
                            rest = [tour[(i + seg + q) % n] for q in range(n - seg)]
                            k = rest.index(u)
                            tour[:] = rest[: k + 1] + ins + rest[k + 1:]
                            index()
                            moved = improved = True
                            break
                    if moved:
                        break
                i += 1
    after = length()
    z = pos[n - 1]
    return [tour[(z + s) % n] for s in range(1, n)], before, after


def estimate_us(slots_by_token, read_us, bundle_us, merge_gap):
    """The estimate summed over tokens (us), from each token's ascending needed slots."""
    total = 0.0
    for s in slots_by_token:
        if len(s) == 0:
            continue
        gaps = np.diff(s) - 1
        g = gaps[gaps > 0]
        total += read_us + len(s) * bundle_us + np.where(g <= merge_gap, np.minimum(g * bundle_us, read_us),
                                                         read_us).sum()
    return total


def choose_pins(order, mask, count, read_us, bundle_us, merge_gap):
    """Take count neurons out of the order, one at a time, each the largest saving of the estimate on mask."""
    order = list(order)

    def link(g):
        return np.where(g <= 0, 0.0, np.where(g <= merge_gap, np.minimum(g * bundle_us, read_us), read_us))

    taken = []
    for _ in range(count):
        m = mask[np.array(order)]  # [slot][token]
        tok, slot = np.nonzero(m.T)  # token-major: sorted by token, then slot
        L = len(order)
        gain = np.zeros(L)
        first = np.r_[True, tok[1:] != tok[:-1]]
        last = np.r_[tok[1:] != tok[:-1], True]
        gl = np.where(first, -1, np.r_[0, np.diff(slot)] - 1)  # gap to the previous needed slot (-1: none)
        gr = np.where(last, -1, np.r_[np.diff(slot), 0] - 1)
        # removing a needed slot: its bundle and both links go, the two neighbours' link spans both gaps
        merged = np.where(first | last, 0.0, link(gl + gr))
        save = bundle_us + np.where(first, 0.0, link(gl)) + np.where(last, 0.0, link(gr)) - merged
        save = save + np.where(first & last, read_us, 0.0)
        np.add.at(gain, slot, save)
        # a slot inside a gap of g > 0 slots between needed slots: the gap shrinks by one
        inner = ~last & (gr > 0)
        sv = link(gr[inner]) - link(gr[inner] - 1)
        diff = np.zeros(L + 1)
        np.add.at(diff, slot[inner] + 1, sv)
        np.add.at(diff, slot[inner] + 1 + gr[inner], -sv)
        gain += np.cumsum(diff)[:L]
        b = int(np.argmax(gain))
        taken.append(order.pop(b))
    return order, taken


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--profile", required=True, help="profile trace (the tour's distances)")
    ap.add_argument("--pins-trace", required=True, help="trace whose tokens choose the pins (the held-out one: oracle)")
    ap.add_argument("--layout", required=True, help="layout JSON to probe (pinned sets, as greedy+ls writes)")
    ap.add_argument("--out-prefix", required=True, help="writes PREFIX.tour.json and PREFIX.pins.json")
    ap.add_argument("--neighbours", type=int, default=16, help="tour moves next to each neuron's K nearest")
    ap.add_argument("--read-us", type=float, default=8.14, help="a: one more read (us; UFS 4.0)")
    ap.add_argument("--bandwidth-mbps", type=float, default=4267, help="B (MB/s; UFS 4.0)")
    ap.add_argument("--bundle-bytes", type=int, default=16384)
    ap.add_argument("--merge-gap", type=int, default=2, help="widest gap (bundles) the planner reads through")
    a = ap.parse_args()
    try:
        with open(a.layout) as f:
            lay = json.load(f)
        layers = lay["layers"]
    except (OSError, ValueError, KeyError) as e:
        sys.exit("order_headroom: %s: not a readable layout (%s)" % (a.layout, e))
    prof, pt = load(a.profile), load(a.pins_trace)
    if len(prof) != len(layers) or len(pt) != len(layers):
        sys.exit("order_headroom: %s, %s and %s have different layer counts" % (a.profile, a.pins_trace, a.layout))
    bundle_us = a.bundle_bytes / a.bandwidth_mbps
    tour_lay, pins_lay = json.loads(json.dumps(lay)), json.loads(json.dumps(lay))
    print("layer  tour before  after  change   pins kept  estimate (pins-trace, us/token) layout / pins")
    for li, (p, t, L) in enumerate(zip(prof, pt, layers)):
        order, pinned = L["order"], L.get("pinned", [])
        ps = set(pinned)
        cold = [v for v in order if v not in ps]
        path, before, after = improve_tour(p[np.array(cold)], a.neighbours)
        tour_lay["layers"][li]["order"] = [cold[i] for i in path] + [v for v in order if v in ps]
        rest, taken = choose_pins(cold + [v for v in order if v in ps], t, len(pinned), a.read_us, bundle_us,
                                  a.merge_gap)
        pins_lay["layers"][li]["order"] = rest + taken
        pins_lay["layers"][li]["pinned"] = taken

        def est(o, pin):
            slot_of = np.full(t.shape[0], -1)
            slot_of[np.array(o)] = np.arange(len(o))
            keep = np.ones(t.shape[0], bool)
            keep[np.array(pin, dtype=int)] = False
            return estimate_us([np.sort(slot_of[np.nonzero(t[:, k] & keep)[0]]) for k in range(t.shape[1])],
                               a.read_us, bundle_us, a.merge_gap) / t.shape[1]

        print("%5d  %11d  %5d  %6.2f%%  %9d  %.2f / %.2f" % (
            li, before, after, 100.0 * (after - before) / max(1, before), len(ps & set(taken)),
            est(cold, pinned), est(rest, taken)))
    for name, obj in (("tour", tour_lay), ("pins", pins_lay)):
        path = "%s.%s.json" % (a.out_prefix, name)
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(obj, f)
        os.replace(tmp, path)
        print("wrote", path)


if __name__ == "__main__":
    main()
