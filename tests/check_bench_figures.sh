#!/usr/bin/env bash
# The benchmark figures (issue 57): bench/layouts_bench.py draws layouts_io.svg and writes its numbers to
# layouts_io.csv beside it (bench/svg_plot.py, the SVG writer bench/structure_sweep.py uses too). Checks, without
# running a benchmark:
#   1. on a small results file (--figures-from), the SVG parses as XML, has one bar per measured row with the row's
#      median in its tooltip, leaves out what was not measured (the mmap baseline, another engine), and the CSV
#      holds exactly those rows;
#   2. every figure in docs/figures/ is linked from docs/benchmarks.md, parses, and shows the numbers of the CSV
#      beside it (each bar's median and min-max are a CSV row's); the demo's figure (results.svg, drawn by
#      scripts/results_table.py --svg) holds the figures of the README's results table.
#   check_bench_figures.sh SOURCE_DIR
set -euo pipefail
src=${1:?source dir}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cat >"$work/results.json" <<'EOF'
{"synthetic": {}, "argv": ["--suites", "models"], "cores": 2, "load_start": [1.5], "load_end": [2.5],
 "started": "2026-12-07 06:00 UTC", "commit": "abc1234", "cache": 0.05,
 "models": {"tiny": {"bundle_bytes": 768, "rows": [
  {"name": "identity uring gap=off", "layout": "identity", "engine": "uring", "engine_used": "uring", "gap": "off",
   "io_ms": {"median": 0.5, "min": 0.4, "max": 0.7, "samples": [0.4, 0.5, 0.7]}, "reads": {"median": 6.0}},
  {"name": "identity uring gap=auto", "layout": "identity", "engine": "uring", "engine_used": "uring", "gap": "auto",
   "io_ms": {"median": 0.3, "min": 0.25, "max": 0.35, "samples": [0.25, 0.3, 0.35]}, "reads": {"median": 4.0},
   "sim_ufs40_io_ms": 0.31},
  {"name": "greedy+ls uring gap=auto", "layout": "greedy+ls", "engine": "uring", "engine_used": "uring", "gap": "auto",
   "io_ms": {"median": 0.2, "min": 0.19, "max": 0.26, "samples": [0.19, 0.2, 0.26]}, "reads": {"median": 3.0}},
  {"name": "greedy+ls pread gap=auto", "layout": "greedy+ls", "engine": "pread", "engine_used": "pread", "gap": "auto",
   "io_ms": {"median": 9.0, "min": 9.0, "max": 9.0, "samples": [9.0]}, "reads": {"median": 3.0}},
  {"name": "mmap (llama.cpp style, page cache capped)", "layout": "identity", "engine": "mmap", "engine_used": "mmap",
   "gap": "off", "baseline": true,
   "io_ms": {"median": 70.0, "min": 70.0, "max": 70.0, "samples": [70.0]}, "reads": {"median": 1.0}}]}}}
EOF
/usr/bin/python3 "$src/bench/layouts_bench.py" --figures-from "$work/results.json" --figures "$work/fig" >/dev/null

/usr/bin/python3 - "$src" "$work/fig" <<'EOF'
import csv, os, re, sys
import xml.etree.ElementTree as ET

src, fig = sys.argv[1], sys.argv[2]
NS = "{http://www.w3.org/2000/svg}"
fails = []


def check(ok, what):
    if not ok:
        fails.append(what)


def bars(svg_path):
    """(label, series, median, lo, hi) of every bar, from its tooltip."""
    out = []
    for rect in ET.parse(svg_path).getroot().iter(NS + "rect"):
        t = rect.find(NS + "title")
        if t is None:
            continue
        m = re.fullmatch(r"(.+?), (.+): (\S+) \S+ \[(\S+)-(\S+)\]", t.text)  # label, series: median unit [min-max]
        check(m is not None, "%s: unreadable bar tooltip %r" % (svg_path, t.text))
        if m:
            out.append((m.group(1), m.group(2), float(m.group(3)), float(m.group(4)), float(m.group(5))))
    return out


def rows(csv_path):
    with open(csv_path) as f:
        return list(csv.DictReader(f))


def agree(svg_path, csv_path):
    """Every bar is a CSV row (same layout, gap, median, min, max at the 6 digits both print) and every row a bar."""
    b, r = bars(svg_path), rows(csv_path)
    check(len(b) == len(r), "%s: %d bars, %s: %d rows" % (svg_path, len(b), csv_path, len(r)))
    for label, series, med, lo, hi in b:
        hit = [x for x in r if x["layout"] == label and x.get("series", "gap=" + x.get("gap", "")) == series and
               float(x["io_ms_median"]) == med and float(x["io_ms_min"]) == lo and float(x["io_ms_max"]) == hi]
        check(len(hit) >= 1, "%s: bar %s %s %g [%g-%g] is in no row of %s" % (svg_path, label, series, med, lo, hi,
                                                                           csv_path))
    return b, r


# 1. the fixture: three uring rows drawn, the pread row and the mmap baseline left out
b, r = agree(os.path.join(fig, "layouts_io.svg"), os.path.join(fig, "layouts_io.csv"))
check(sorted((x[0], x[1], x[2]) for x in b) ==
      [("greedy+ls", "gap=auto", 0.2), ("identity", "gap=auto", 0.3), ("identity", "gap=off", 0.5)],
      "fixture: bars %s" % b)
check([x["sim_ufs40_io_ms"] for x in r if x["layout"] == "identity" and x["gap"] == "auto"] == ["0.31"],
      "fixture: the CSV keeps the simulated UFS 4.0 figure")
text = open(os.path.join(fig, "layouts_io.svg")).read()
check("2026-12-07 06:00 UTC" in text and "abc1234" in text, "fixture: the figure names the run's date and build")

# 2. the committed figures
docs = os.path.join(src, "docs", "figures")
bench_md = open(os.path.join(src, "docs", "benchmarks.md")).read()
for name in sorted(os.listdir(docs)) if os.path.isdir(docs) else []:
    if not name.endswith(".svg"):
        continue
    check("figures/" + name in bench_md, "docs/benchmarks.md does not link docs/figures/" + name)
    data = os.path.join(docs, name[:-4] + ".csv")
    check(os.path.exists(data), "docs/figures/%s has no %s beside it" % (name, os.path.basename(data)))
    if os.path.exists(data):
        b, r = agree(os.path.join(docs, name), data)
        check(len(b) > 0, "docs/figures/%s draws no bars" % name)
        check("figures/" + os.path.basename(data) in bench_md, "docs/benchmarks.md does not link the CSV of " + name)

# The demo's figure (scripts/results_table.py --svg) shows the README's results table: each estimate, cut to 4
# decimals as the table prints it, is in the README's row of that workload.
res = os.path.join(docs, "results.csv")
if os.path.exists(res):
    readme = open(os.path.join(src, "README.md")).read().splitlines()
    for x in rows(res):
        line = [ln for ln in readme if ln.startswith("| " + x["workload"] + " |")]
        v = float(x["io_ms_median"])
        shown = "%.4f" % (int(v * 10**4 + 1e-9) / 10**4)
        check(len(line) == 1 and shown in line[0], "README's results row for %s lacks %s (%s, docs/figures/results.csv)"
              % (x["workload"], shown, x["layout"]))

for f in fails:
    print("check_bench_figures: " + f)
print("check_bench_figures: %s" % ("FAILED" if fails else "ok"))
sys.exit(1 if fails else 0)
EOF
