#!/usr/bin/env bash
# The C API (runtime/include/nl_run.h) through its example program (examples/nl_run_example.c, plain C): the same
# image, options and prompt give nl-run generate's tokens (gate, dense, lowrank, threshold; 1 and 2 threads; f16,
# q8_0 and q4_0; stories260K's text prompt through the llama2.c tokenizer), the stop flag ends generation at the
# token asked, and failures come back as the documented status with one line naming what is wrong.
# Usage: check_c_api.sh SRC_DIR BUILD_DIR MODELS_DIR. Exit 77 = skipped (printed, and written to
# BUILD_DIR/tests/skipped/c_api.txt).
set -euo pipefail
src=$1; build=$2; models=$3
skipfile=$build/tests/skipped/c_api.txt
mkdir -p "$(dirname "$skipfile")" && rm -f "$skipfile"
fail() { echo "c api: $*" >&2; exit 1; }
ex=$build/examples/nl_run_example; run=$build/cli/nl-run; layout=$build/cli/nl-layout
[ -x "$ex" ] || fail "$ex was not built (examples/CMakeLists.txt)"
work=$build/tests/c_api
rm -rf "$work"; mkdir -p "$work"
relu=$src/datasets/tiny-relu/model
same() {  # image, label, then options both take (the example's subset)
  local img=$1 label=$2; shift 2
  local threads=$1; shift
  local n e
  n=$("$run" --quiet --threads "$threads" generate --image "$img" "$@" | grep -E '^(tokens|text):')
  e=$("$ex" "$img" --threads "$threads" "$@" 2>"$work/ex.err" | grep -E '^(tokens|text):') ||
    { cat "$work/ex.err"; fail "the example failed ($label)"; }
  echo "$n" | grep -q '^tokens: [0-9]' || fail "nl-run printed no tokens ($label)"
  [ "$n" = "$e" ] || fail "tokens differ ($label): nl-run '$n', C API '$e'"
  grep -q '^nl_run_example: .* reads, .* bytes read' "$work/ex.err" || fail "no counters line ($label)"
  echo "c api: $label: same $(echo "$n" | tail -1)"
}
for dt in f16 q8_0 q4_0; do
  "$layout" --quiet pack --model "$relu" --dtype "$dt" --out "$work/relu_$dt.nlw"
done
for sel in gate dense lowrank:16 threshold:0.05; do
  for th in 1 2; do
    same "$work/relu_f16.nlw" "tiny-relu f16 --select $sel, $th threads" "$th" --prompt-tokens 1,100,200 --steps 24 \
      --select "$sel" --gap 2 --cache-ratio 0.1
  done
done
for dt in q8_0 q4_0; do
  same "$work/relu_$dt.nlw" "tiny-relu $dt --select gate" 2 --prompt-tokens 1,100,200 --steps 24 --select gate \
    --gap 2 --cache-ratio 0.1
done

# libnl_run.so (every build but a static one): only nl_run_* exported, and the example linked against it gives the same tokens.
shared=$build/examples/nl_run_example_shared
if [ -x "$shared" ]; then
  so=$build/examples/libnl_run.so
  others=$(nm -D --defined-only "$so" | awk '{print $3}' | grep -v '^nl_run_' || true)
  [ -z "$others" ] || fail "libnl_run.so exports more than nl_run_*: $(echo "$others" | head -5 | tr '\n' ' ')"
  echo "c api: libnl_run.so exports $(nm -D --defined-only "$so" | grep -c ' nl_run_') functions, all nl_run_*"
  for sel in gate lowrank:16; do
    opts=(--prompt-tokens 1,100,200 --steps 24 --select "$sel" --gap 2 --cache-ratio 0.1)
    n=$("$run" --quiet generate --image "$work/relu_f16.nlw" "${opts[@]}" | grep '^tokens:')
    e=$("$shared" "$work/relu_f16.nlw" "${opts[@]}" 2>/dev/null | grep '^tokens:')
    [ "$n" = "$e" ] || fail "libnl_run.so example, --select $sel: nl-run '$n', shared '$e'"
    echo "c api: libnl_run.so, --select $sel: same $n"
  done
elif grep -q '^NL_STATIC:BOOL=ON' "$build/CMakeCache.txt"; then
  echo "c api: a static build: no libnl_run.so to check"
else
  fail "$shared was not built (examples/CMakeLists.txt)"
fi

# The stop flag (nl_run_request_stop from the callback once 3 tokens came): exactly the first 3 tokens.
full=$("$ex" "$work/relu_f16.nlw" --prompt-tokens 1,100,200 --steps 24 2>/dev/null | grep '^tokens:')
three=$("$ex" "$work/relu_f16.nlw" --prompt-tokens 1,100,200 --steps 24 --stop-after 3 2>/dev/null | grep '^tokens:')
[ "$three" = "$(echo "$full" | cut -d' ' -f1-4)" ] || fail "stop after 3: '$three' (full run '$full')"
echo "c api: stop flag: $three"

# Failures: status = nl-run's exit code, one line naming what is wrong.
expect() {  # label, status, message pattern, example arguments...
  local label=$1 want=$2 pat=$3; shift 3
  local rc=0
  "$ex" "$@" >"$work/out" 2>"$work/err" || rc=$?
  [ "$rc" = "$want" ] || { cat "$work/err"; fail "$label: status $rc, expected $want"; }
  [ "$(wc -l <"$work/err")" = 1 ] || { cat "$work/err"; fail "$label: not one line"; }
  grep -qE "$pat" "$work/err" || { cat "$work/err"; fail "$label: message does not match '$pat'"; }
  echo "c api: $label: status $rc: $(cat "$work/err")"
}
expect "missing image" 2 "missing.nlw.json does not exist" "$work/missing.nlw"
"$run" --version >/dev/null
printf '\x89HDF\r\n\x1a\n' >"$work/trace.h5"
expect "an HDF5 file as image" 3 "trace.h5: is an HDF5 file" "$work/trace.h5"
expect "budget below the fixed part" 3 "more than --memory-budget 100000 .*nothing was loaded" "$work/relu_f16.nlw" \
  --budget 100000
expect "unknown selection" 2 "expected gate, dense" "$work/relu_f16.nlw" --select nope
expect "prompt longer than the context" 2 "exceeds the context" "$work/relu_f16.nlw" --steps 100000

# stories260K (SiLU, llama2.c tokenizer in the runtime): a text prompt gives nl-run's text and tokens.
model=$models/llama2c-stories260K/stories260K.bin
if [ ! -f "$model" ]; then
  why="stories260K part (text prompt through the C API's tokenizer): $model is absent"
  echo "c api: SKIPPED part: $why" >&2
  echo "part: $why" >"$skipfile"
else
  "$layout" --quiet pack --model "$model" --dtype f16 --out "$work/m.nlw" \
    --tokenizer "$models/llama2c-stories260K/tok512.bin"
  same "$work/m.nlw" "stories260K text prompt" 2 --prompt "Once upon a time, a little" --steps 20 --gap 2 \
    --cache-ratio 0.1
fi
echo "c api: OK (the C example generates nl-run's tokens)"
