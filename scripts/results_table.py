#!/usr/bin/env python3
"""The results table of the demo and the README: one row per `nl-layout eval --json` output.

Usage: results_table.py "LABEL=EVAL.json" ...   (each file holds layouts named identity, greedy and greedy+ls)
Prints a Markdown table: reads/token and estimated I/O ms/token per layout, and the speed-ups of greedy+ls (ours)
over identity (the original order) and over greedy (the paper's pipeline). Figures are cut, never rounded up.
"""
import json
import math
import sys


def cut(x, digits):
    f = 10 ** digits
    return f"{math.floor(x * f) / f:.{digits}f}"


def main(args):
    if not args:
        print(__doc__.strip(), file=sys.stderr)
        return 2
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
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
