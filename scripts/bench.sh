#!/usr/bin/env bash
# Benchmarks (not tests): each prints its figures and the ratios against baselines measured in the same run.
#   scripts/bench.sh [BUILD] [--suite all|micro|layouts|e2e] [layouts options, e.g. --quick]
#   micro:   every BUILD/bench/*_bench executable (graph, layout, profiler micro-benchmarks)
#   layouts: bench/layouts_bench.py, layouts x engines x baselines on real disk reads (docs/benchmarks.md); redraws
#            docs/figures/layouts_io.svg and its numbers, layouts_io.csv (not with --quick)
#   e2e:     bench/e2e/run.py, end to end against the real llama.cpp under a memory cap (not in "all": builds
#            llama.cpp and writes GB-sized images; options such as --shapes, --dtypes, --reps pass through)
set -euo pipefail
BUILD=build
if [ $# -gt 0 ] && [ "${1#-}" = "$1" ]; then BUILD=$1; shift; fi
SUITE=all
args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --suite) SUITE=${2:?--suite needs all, micro or layouts}; shift 2 ;;
    --suite=*) SUITE=${1#--suite=}; shift ;;
    *) args+=("$1"); shift ;;
  esac
done
case "$SUITE" in all|micro|layouts|e2e) ;; *) echo "bench.sh: unknown suite '$SUITE' (all, micro, layouts, e2e)" >&2; exit 2 ;; esac
if [ "$SUITE" = e2e ]; then
  "$(dirname "$0")/llamacpp.sh"
  exec /usr/bin/python3 "$(dirname "$0")/../bench/e2e/run.py" --build "$BUILD" ${args[@]+"${args[@]}"}
fi

if [ "$SUITE" != layouts ]; then
  found=0
  for b in "$BUILD"/bench/*_bench; do
    [ -x "$b" ] || continue
    found=1
    printf '\n== %s\n' "$(basename "$b")"
    nice -n 5 "$b"
  done
  [ $found -eq 1 ] || echo "no benchmarks built yet"
fi
if [ "$SUITE" != micro ]; then
  printf '\n== layouts_bench\n'
  exec /usr/bin/python3 "$(dirname "$0")/../bench/layouts_bench.py" --build "$BUILD" ${args[@]+"${args[@]}"}
fi
