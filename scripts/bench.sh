#!/usr/bin/env bash
# Benchmarks (not tests): each prints its figures and the ratios against baselines measured in the same run.
set -euo pipefail
BUILD=${1:-build}
found=0
for b in "$BUILD"/bench/*_bench; do
  [ -x "$b" ] || continue
  found=1
  printf '\n== %s\n' "$(basename "$b")"
  nice -n 5 "$b"
done
[ $found -eq 1 ] || echo "no benchmarks built yet"
