#!/usr/bin/env python3
"""The results table of the demo and the README: one row per `nl-layout eval --json` output.

Usage: results_table.py [--svg FIGURE.svg] "LABEL=EVAL.json" ...   (each file: layouts identity, greedy, greedy+ls)
Prints a Markdown table: reads/token and estimated I/O ms/token per layout, and the speed-ups of greedy+ls (ours)
over identity (the original order) and over greedy (the paper's pipeline). Figures are cut, never rounded up.
--svg also draws the I/O ms/token as bars, one panel per workload, with the numbers beside it (FIGURE.csv).
"""
import json
import math
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench"))
from svg_plot import bar_panels, write_csv  # noqa: E402  (the bench figures' SVG writer)

SERIES = "estimated I/O ms/token (UFS 4.0, 5 % cache, held out)"
NAMES = (("identity", "identity"), ("greedy", "paper: greedy"), ("greedy+ls", "ours: greedy+ls"))


def cut(x, digits):
    f = 10 ** digits
    return f"{math.floor(x * f) / f:.{digits}f}"


def main(args):
    svg = None
    if args[:1] == ["--svg"] and len(args) > 1:
        svg, args = args[1], args[2:]
    if not args:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    panels, rows = [], []
    print("| workload | reads/token: identity / paper / ours | I/O ms/token: identity / paper / ours"
          " | ours vs identity | ours vs paper |")
    print("|---|---|---|---|---|")
    for arg in args:
        label, _, path = arg.rpartition("=")
        with open(path) as f:
            layouts = {l["name"]: l for l in json.load(f)["layouts"]}
        try:
            i, g, o = layouts["identity"], layouts["greedy"], layouts["greedy+ls"]
        except KeyError as e:
            print(f"results_table: {path}: no layout named {e}", file=sys.stderr)
            return 3
        reads = " / ".join(cut(x["reads"], 2) for x in (i, g, o))
        ms = " / ".join(cut(x["io_ms"], 4) for x in (i, g, o))
        print(f"| {label} | {reads} | {ms} | {cut(i['io_ms'] / o['io_ms'], 3)}x | {cut(g['io_ms'] / o['io_ms'], 3)}x |")
        # Deterministic estimates: one value per bar (no spread to draw).
        panels.append((label, [(shown, {SERIES: (layouts[n]["io_ms"],) * 3}) for n, shown in NAMES]))
        rows += [[label, shown, SERIES, "%.6g" % layouts[n]["io_ms"], "%.6g" % layouts[n]["io_ms"],
                  "%.6g" % layouts[n]["io_ms"], "%.6g" % layouts[n]["reads"]] for n, shown in NAMES]
    if svg:
        bar_panels(svg, "Estimated flash I/O time per token by layout (nl-layout eval, the demo's workloads)", panels,
                   [SERIES], "ms/token",
                   ["Written by scripts/results_table.py from the demo's nl-layout eval --json outputs "
                    "(./run.sh demo);",
                    "deterministic: the same commands give the same figures. The numbers: the .csv beside this file."])
        write_csv(os.path.splitext(svg)[0] + ".csv",
                  ["workload", "layout", "series", "io_ms_median", "io_ms_min", "io_ms_max", "reads_per_token"], rows)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
