#!/bin/sh
# nl-layout solve's estimate (issue 58, layout/solve_cost.h): printed before the run starts, and a run whose peak memory
# cannot fit in MemAvailable refused at once (exit 4, one line naming both figures, nothing written). The refusal runs
# on a real trace: 64 layers of 20,000 neurons (each layer's pair-count matrix about 0.9 GB) with --threads 64, so
# that 64 layers would be in flight (about 58 GB); a machine with more memory than that skips that part.
#   check_solve_estimate.sh SOURCE_DIR BINARY_DIR
set -eu
src=$1 bin=$2
L="$bin/cli/nl-layout" P="$bin/cli/nl-profile"
work=$bin/tests/solve_estimate_tmp
rm -rf "$work" && mkdir -p "$work"
skipfile=$bin/tests/skipped/solve_estimate.txt
mkdir -p "$(dirname "$skipfile")" && rm -f "$skipfile"
fail=0
check() { if [ "$1" = 0 ]; then echo "PASS $2"; else echo "FAIL $2"; fail=1; fi; }

# 1. The estimate line comes before the first layer's progress and names layers, threads, seconds and memory.
"$P" synth -q --preset "$src/configs/workloads/opt-6.7b.json" --neurons 2048 --layers 2 --profile-sequences 16 \
  --test-sequences 1 --profile-out "$work/small_p.h5" --test-out "$work/small_t.h5"
"$L" --threads 2 solve --trace "$work/small_p.h5" --out "$work/small.json" 2>"$work/small.err"
first=$(grep -n "" "$work/small.err" | grep -m1 "solve: estimate" | cut -d: -f1)
layer=$(grep -n "^layer 0:\|^layer 1:" "$work/small.err" | head -1 | cut -d: -f1)
grep -q "solve: estimate for 2 layers on 2 threads: about [0-9.]* s wall (a layer alone [0-9.]* s), peak about [0-9.]* [KMG]iB" "$work/small.err"
check $? "the estimate line is printed: $(grep -m1 'solve: estimate' "$work/small.err" | cut -c1-100)..."
[ -n "$first" ] && [ -n "$layer" ] && [ "$first" -lt "$layer" ]
check $? "it comes before the first layer's line (line $first, layer line $layer)"
"$L" --threads 2 -q solve --trace "$work/small_p.h5" --out "$work/small_q.json" 2>"$work/small_q.err"
[ ! -s "$work/small_q.err" ]
check $? "-q prints nothing"

# 2. The refusal.
avail_kb=$(awk '/^MemAvailable:/ {print $2}' /proc/meminfo)
if [ "${avail_kb:-0}" -gt 50000000 ]; then
  why="refusal part: MemAvailable is ${avail_kb} kB, more than the ~58 GB the 64-layer run would need"
  echo "SKIPPED part: $why"
  echo "part: $why" >"$skipfile"
else
  "$P" synth -q --preset "$src/configs/workloads/opt-6.7b.json" --neurons 20000 --layers 64 \
    --profile-sequences 2 --tokens-per-sequence 64 --test-sequences 1 --profile-out "$work/wide_p.h5" \
    --test-out "$work/wide_t.h5"
  set +e
  "$L" --threads 64 solve --trace "$work/wide_p.h5" --out "$work/wide.json" >"$work/wide.out" 2>"$work/wide.err"
  rc=$?
  set -e
  [ "$rc" = 4 ]
  check $? "refused with exit 4 (got $rc)"
  grep -q "wide_p.h5 (64 layers of up to 20000 neurons, 128 tokens, 64 layers at a time.*needs about [0-9.]* GiB of memory and MemAvailable is" "$work/wide.err"
  check $? "the line names the trace, the shape and both figures: $(tail -1 "$work/wide.err" | cut -c1-160)..."
  [ "$(wc -l <"$work/wide.err")" -le 2 ]
  check $? "only the estimate and the error line on stderr"
  [ ! -e "$work/wide.json" ] && [ -z "$(ls "$work" | grep -v '\.\(h5\|err\|out\|json\)$')" ]
  check $? "nothing written"
fi
rm -rf "$work"
exit $fail
