#!/bin/sh
# CI quality gate for the layout solvers: profiles real models over the repository's own English docs (no package
# needed) — the bundled tiny ReLU model and stories260K (NL_MODELS_DIR, bundled in datasets/) — and a scaled-down
# paper-shaped synthetic trace, solves each with greedy (the paper's pipeline) and greedy+ls (ours), and runs
# nl-layout eval --require on the held-out traces, so that a regression (greedy+ls worse than greedy, or above a
# recorded floor) fails the suite.
# Recorded floors (docs/solvers.md): synthetic greedy+ls/greedy io_ms measured 0.771 -> gate 0.85; stories260K
# measured 0.992 (its 172-neuron layers fit in one read at the default bundle size) -> gate 1.0, i.e. never worse;
# tiny-relu (2026-12-01) measured 0.970-0.980 at its default 512 B bundles and 0.953-0.955 at 16 KiB (the text is
# the repository's docs, so the figures move a little as they are edited) -> gate 1.0.
# Gap-0 reads are a diagnostic, not a goal (issue 20's decision: the objective is the I/O time the runtime pays,
# chosen on held-out tokens; the weight guard is opt-in, --weight-guard). greedy+ls may trade gap-0 reads for I/O
# time (measured +1.1 % synthetic at 16 KiB, +17-22 % on the real tiny models at their own bundle sizes,
# docs/benchmarks.md), so the reads gates below are sanity bounds (1.35x) that catch a broken order, not a target.
# Without stories260K its part is skipped, printed and written to BINARY_DIR/tests/skipped/gate_layout.txt.
#   gate_layout.sh SOURCE_DIR BINARY_DIR MODELS_DIR
set -eu
src=$1 bin=$2 models=$3
work=$bin/tests/gate_layout_tmp
rm -rf "$work" && mkdir -p "$work"
skipfile=$bin/tests/skipped/gate_layout.txt
mkdir -p "$(dirname "$skipfile")" && rm -f "$skipfile"
L="$bin/cli/nl-layout" P="$bin/cli/nl-profile"
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}

# 1. Paper-shaped synthetic trace (OPT-6.7B preset, scaled down to 2,048 neurons and 1 layer).
"$P" synth --preset "$src/configs/workloads/opt-6.7b.json" --neurons 2048 --layers 1 --profile-sequences 48 \
  --test-sequences 16 --profile-out "$work/syn_p.h5" --test-out "$work/syn_t.h5"
for m in greedy greedy+ls; do
  "$L" solve --quiet --trace "$work/syn_p.h5" --method "$m" --bundle-bytes 16384 --out "$work/syn_$m.json"
done
echo "== synthetic opt-6.7b (2,048 neurons): UFS 4.0, auto gap, 5 % cache"
"$L" eval --trace "$work/syn_t.h5" --layout "$work/syn_greedy.json" --layout "$work/syn_greedy+ls.json" \
  --bundle-bytes 16384 --require "greedy+ls.io_ms <= 0.85 * greedy.io_ms"
echo "== synthetic: gap 0, no cache"
"$L" eval --trace "$work/syn_t.h5" --layout "$work/syn_greedy.json" --layout "$work/syn_greedy+ls.json" \
  --bundle-bytes 16384 --gap off --cache-ratio 0 --require "greedy+ls.reads <= 1.35 * greedy.reads"

# 2. The bundled tiny ReLU model's held-out trace (in the repository: always runs).
relu="$src/datasets/tiny-relu/model"
"$P" run --quiet --model "$relu" --tokenizer "$relu/tokenizer.model" \
  --text "$src"/docs/*.md "$src/README.md" --seq-len 128 --max-tokens 12000 --test-fraction 0.25 \
  --out "$work/relu_p.h5" --test-out "$work/relu_t.h5"
for m in greedy greedy+ls; do
  "$L" solve --quiet --trace "$work/relu_p.h5" --method "$m" --out "$work/relu_$m.json"
  "$L" solve --quiet --trace "$work/relu_p.h5" --method "$m" --bundle-bytes 16384 --out "$work/relu16_$m.json"
done
echo "== tiny-relu (bundled): UFS 4.0, auto gap, 5 % cache"
"$L" eval --trace "$work/relu_t.h5" --layout "$work/relu_greedy.json" --layout "$work/relu_greedy+ls.json" \
  --require "greedy+ls.io_ms <= 1.0 * greedy.io_ms"
echo "== tiny-relu with 16 KiB bundles (paper-sized reads): UFS 4.0, auto gap, 5 % cache"
"$L" eval --trace "$work/relu_t.h5" --layout "$work/relu16_greedy.json" --layout "$work/relu16_greedy+ls.json" \
  --bundle-bytes 16384 --require "greedy+ls.io_ms <= 1.0 * greedy.io_ms"
# The lean candidate set (default) against the full one (--candidates full, about 4x the validation passes): on the
# real traces measured (docs/solvers.md) it kept every winner; held out it may not be worse by more than 0.5 %.
"$L" solve --quiet --trace "$work/relu_p.h5" --candidates full --out "$work/relu_full.json"
"$L" solve --quiet --trace "$work/relu_p.h5" --candidates full --bundle-bytes 16384 --out "$work/relu16_full.json"
echo "== tiny-relu: lean candidate set (greedy+ls) against the full one (greedy+ls#2), own and 16 KiB bundles"
"$L" eval --trace "$work/relu_t.h5" --layout "$work/relu_greedy+ls.json" --layout "$work/relu_full.json" \
  --require "greedy+ls.io_ms <= 1.005 * greedy+ls#2.io_ms"
"$L" eval --trace "$work/relu_t.h5" --layout "$work/relu16_greedy+ls.json" --layout "$work/relu16_full.json" \
  --bundle-bytes 16384 --require "greedy+ls.io_ms <= 1.005 * greedy+ls#2.io_ms"
echo "== tiny-relu: gap 0, no cache"
"$L" eval --trace "$work/relu_t.h5" --layout "$work/relu_greedy.json" --layout "$work/relu_greedy+ls.json" \
  --gap off --cache-ratio 0 --require "greedy+ls.reads <= 1.35 * greedy.reads"

# 3. stories260K's held-out trace (a SiLU model, calibrated activations), bundled in datasets/ (NL_MODELS_DIR).
model="$models/llama2c-stories260K/stories260K.bin"
if [ ! -f "$model" ]; then
  why="stories260K part: $model is absent (NL_MODELS_DIR points elsewhere; datasets/ bundles it);"
  why="$why the synthetic and tiny-relu gates above passed"
  echo "SKIPPED part: $why"
  echo "part: $why" >"$skipfile"
  rm -rf "$work"
  exit 0
fi
"$P" run --quiet --model "$model" --tokenizer "$models/llama2c-stories260K/tok512.bin" \
  --text "$src"/docs/*.md "$src/README.md" --seq-len 256 --max-tokens 12000 --test-fraction 0.25 \
  --out "$work/real_p.h5" --test-out "$work/real_t.h5"
for m in greedy greedy+ls; do
  "$L" solve --quiet --trace "$work/real_p.h5" --method "$m" --out "$work/real_$m.json"
done
echo "== stories260K: UFS 4.0, auto gap, 5 % cache"
"$L" eval --trace "$work/real_t.h5" --layout "$work/real_greedy.json" --layout "$work/real_greedy+ls.json" \
  --require "greedy+ls.io_ms <= 1.0 * greedy.io_ms"
for m in greedy greedy+ls; do
  "$L" solve --quiet --trace "$work/real_p.h5" --method "$m" --bundle-bytes 16384 --out "$work/real16_$m.json"
done
echo "== stories260K with 16 KiB bundles (paper-sized reads): UFS 4.0, auto gap, 5 % cache"
"$L" eval --trace "$work/real_t.h5" --layout "$work/real16_greedy.json" --layout "$work/real16_greedy+ls.json" \
  --bundle-bytes 16384 --require "greedy+ls.io_ms <= 1.0 * greedy.io_ms"
echo "== stories260K: gap 0, no cache"
"$L" eval --trace "$work/real_t.h5" --layout "$work/real_greedy.json" --layout "$work/real_greedy+ls.json" \
  --gap off --cache-ratio 0 --require "greedy+ls.reads <= 1.35 * greedy.reads"
rm -rf "$work"
