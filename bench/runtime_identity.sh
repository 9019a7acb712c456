#!/usr/bin/env bash
# Behaviour identity of nl-run across a refactor: runs `nl-run generate` over every --select x --overlap x dtype on
# the bundled tiny-relu and small-relu models (and 1 vs 2 threads for gate; a replicated image too), and writes each
# run's tokens and its
# --metrics JSON with the timing-dependent fields removed (bench/runtime_identity_norm.py) into OUT_DIR. Two OUT_DIRs
# from two builds are compared with `diff -r`: identical means the same tokens, reads, bytes, cache hits and
# counters for every cell.
# Usage: bench/runtime_identity.sh BUILD_DIR OUT_DIR [models...]   (models: tiny-relu small-relu; default both)
set -euo pipefail
build=$(realpath "$1"); out=$2; shift 2
models=("$@"); [ ${#models[@]} -gt 0 ] || models=(tiny-relu small-relu)
src=$(cd "$(dirname "$0")/.." && pwd)
run=$build/cli/nl-run; layout=$build/cli/nl-layout; profile=$build/cli/nl-profile
mkdir -p "$out"; work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
norm=$src/bench/runtime_identity_norm.py
for m in "${models[@]}"; do
  dir=$src/datasets/$m/model
  # A trace of the model's own activity on a Debian text (the same input every time).
  text=$work/text.txt; head -c 20000 /usr/share/common-licenses/GPL-3 >"$text"
  "$profile" --quiet run --model "$dir" --tokenizer "$dir/tokenizer.model" --text "$text" --max-tokens 600 --seq-len 64 --out "$work/$m.h5" >/dev/null
  for dt in f32 f16 bf16 q8_0 q4_0; do
    img=$work/$m-$dt.nlw
    "$layout" --quiet pack --model "$dir" --dtype "$dt" --out "$img"
    for sel in gate dense lowrank:16 threshold:0.05 trace; do
      s=$sel; [ "$sel" = trace ] && s=trace:$work/$m.h5
      for ov in none layer cross both; do
        [ "$sel" = dense ] && [ "$ov" != none ] && continue  # dense reads nothing per token
        for th in 2 1; do
          [ "$th" = 1 ] && { [ "$sel" = gate ] || continue; }
          tag=$m-$dt-${sel%%:*}-$ov-t$th
          OMP_NUM_THREADS=$th "$run" --quiet --threads "$th" generate --image "$img" --prompt-tokens 1,100,200,300,400 \
            --steps 12 --select "$s" --overlap "$ov" --cache-ratio 0.1 --gap 2 --calibrate-steps 16 \
            --metrics "$work/m.json" >"$work/stdout.txt"
          { grep -E '^tokens:' "$work/stdout.txt"; python3 "$norm" "$work/m.json"; } >"$out/$tag.txt"
        done
      done
    done
  done
  # Flash replication: a layout with second copies (solved with a replication budget), f16; the selections and
  # overlap modes that read replicated images (cross, dense and lowrank refuse them).
  "$layout" --quiet solve --trace "$work/$m.h5" --replicate-budget 10% --bundle-for "$dir" --dtype f16 \
    --out "$work/$m-rep.json" >/dev/null
  "$layout" --quiet pack --model "$dir" --dtype f16 --layout "$work/$m-rep.json" --out "$work/$m-rep.nlw"
  grep -q '"replicas"' "$work/$m-rep.nlw.json" || echo "runtime identity: note: $m's solver kept no replicas" >&2
  for sel in gate threshold:0.05 trace; do
    s=$sel; [ "$sel" = trace ] && s=trace:$work/$m.h5
    for ov in none layer; do
      tag=$m-rep-${sel%%:*}-$ov
      "$run" --quiet generate --image "$work/$m-rep.nlw" --prompt-tokens 1,100,200,300,400 --steps 12 --select "$s" \
        --overlap "$ov" --cache-ratio 0.1 --gap 2 --metrics "$work/m.json" >"$work/stdout.txt"
      { grep -E '^tokens:' "$work/stdout.txt"; python3 "$norm" "$work/m.json"; } >"$out/$tag.txt"
    done
  done
done
echo "runtime identity: $(ls "$out" | wc -l) cells written to $out"
