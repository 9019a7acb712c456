#!/usr/bin/env bash
# The closing lines of `./run.sh test`: every test case or part of a test that did not run, by name, with why.
# Tests write their reasons to BUILD/tests/skipped/<test>.txt (tests/doctest_main.cpp, tests/skip_util.h and the
# shell tests); a whole CTest test skipped (exit 77) is also listed by CTest itself as "Skipped".
set -euo pipefail
dir=${1:-build}/tests/skipped
shopt -s nullglob
files=("$dir"/*.txt)
n=0
for f in "${files[@]}"; do n=$((n + $(grep -c . "$f" || true))); done  # grep -c exits 1 on an empty file
if [ "$n" -eq 0 ]; then
  echo "skipped: nothing (every test case ran in full)"
  exit 0
fi
echo "skipped: $n test case(s) or part(s) did not run here:"
for f in "${files[@]}"; do
  t=$(basename "$f" .txt)
  while IFS= read -r line; do
    [ -n "$line" ] && echo "  $t: $line"
  done <"$f"
done
