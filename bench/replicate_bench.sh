#!/usr/bin/env bash
# Flash replication benchmark (issue 20 item 3): held-out I/O time of greedy+ls at --replicate-budget 0, 5, 10, 20 %
# against the paper's pipeline (greedy under --gap auto-keep-runs with its linking-aligned S3-FIFO), UFS 4.0, 5 %
# cache, on the synthetic presets and the real traces. Prints one markdown row per (trace, bundle size, budget).
#   bench/replicate_bench.sh BUILD WORKDIR [MODELS_DIR] [--only NAME ...]
# Traces are made in WORKDIR when missing (presets: 2 layers, seed 1, 8,192 profile + 2,048 held-out tokens;
# real models over Debian fortunes as in docs/benchmarks.md "Layout solver"). Synthetic rows say so.
set -euo pipefail
BUILD=$(realpath "${1:?build dir}")
WORK=${2:?work dir}
MODELS=$(realpath "${3:-$(dirname "$0")/../datasets}")  # stories260K is bundled in datasets/ (datasets/SOURCES.md)
shift $(($# < 3 ? $# : 3))
ONLY=("$@")
SRC=$(realpath "$(dirname "$0")/..")
P=$BUILD/cli/nl-profile
L=$BUILD/cli/nl-layout
FORT=/usr/share/games/fortunes/fortunes
mkdir -p "$WORK"
cd "$WORK"
want() { [ ${#ONLY[@]} -eq 0 ] && return 0; for o in "${ONLY[@]}"; do [ "$o" = "$1" ] && return 0; done; return 1; }
NICE="nice -n 10"

make_traces() {  # name -> name_p.h5 name_t.h5
  local name=$1
  [ -f "${name}_p.h5" ] && [ -f "${name}_t.h5" ] && return 0
  case $name in
    llama2) $NICE "$P" -q synth --preset "$SRC/configs/workloads/llama2-7b-prosparse.json" --layers 2 \
              --profile-out llama2_p.h5 --test-out llama2_t.h5 >&2 ;;
    opt67) $NICE "$P" -q synth --preset "$SRC/configs/workloads/opt-6.7b.json" --layers 2 \
              --profile-out opt67_p.h5 --test-out opt67_t.h5 >&2 ;;
    tinyrelu) $NICE "$P" -q run --model "$SRC/datasets/tiny-relu/model" \
              --tokenizer "$SRC/datasets/tiny-relu/model/tokenizer.model" --text "$FORT" --max-tokens 30000 \
              --test-fraction 0.25 --out tinyrelu_p.h5 --test-out tinyrelu_t.h5 >&2 ;;
    stories) $NICE "$P" -q run --model "$MODELS/llama2c-stories260K/stories260K.bin" \
              --tokenizer "$MODELS/llama2c-stories260K/tok512.bin" --text "$FORT" --max-tokens 30000 \
              --test-fraction 0.25 --out stories_p.h5 --test-out stories_t.h5 >&2 ;;
  esac
}

io_ms() {  # trace gap layout [bundle args] -> held-out io ms/tok at 5 % cache
  local t=$1 gap=$2 lay=$3
  shift 3
  "$L" -q --json eval --trace "$t" --layout "$lay" --gap "$gap" --cache-ratio 0.05 "$@" |
    /usr/bin/python3 -c 'import json,sys; print("%.4f" % json.load(sys.stdin)["layouts"][0]["io_ms"])'
}

extra() {  # layout -> "replicas / neurons (x.xx %)" over all layers
  /usr/bin/python3 -c '
import json,sys
j=json.load(open(sys.argv[1]))
r=sum(L.get("replicas",0) for L in j["layers"]); n=sum(L["n_neurons"] for L in j["layers"])
print("%d / %d (%.2f %%)" % (r, n, 100.0*r/n))' "$1"
}

echo "| trace | bundle | budget | paper's pipeline io ms/tok | ours io ms/tok | ours vs paper | replicas kept (extra flash) | solve s |"
echo "|---|---|---|---|---|---|---|---|"
for name in tinyrelu stories llama2 opt67; do
  want "$name" || continue
  if [ "$name" = stories ] && [ ! -f "$MODELS/llama2c-stories260K/stories260K.bin" ]; then
    echo "stories260K not under $MODELS (datasets/ bundles it): skipped" >&2
    continue
  fi
  make_traces "$name"
  label=$name
  case $name in llama2 | opt67) label="$name (synthetic)" ;; esac
  bundles=(own)
  case $name in tinyrelu | stories) bundles=(own 16384) ;; esac
  for b in "${bundles[@]}"; do
    bargs=()
    [ "$b" = own ] || bargs=(--bundle-bytes "$b")
    $NICE "$L" -q solve --trace "${name}_p.h5" --method greedy --out "${name}_${b}_g.json" >&2
    paper=$(io_ms "${name}_t.h5" auto-keep-runs "${name}_${b}_g.json" ${bargs[@]+"${bargs[@]}"})
    for pct in 0 5 10 20; do
      out="${name}_${b}_r${pct}.json"
      s0=$(date +%s.%N)
      $NICE "$L" -q solve --trace "${name}_p.h5" --replicate-budget "${pct}%" ${bargs[@]+"${bargs[@]}"} --out "$out" >&2
      s1=$(date +%s.%N)
      ours=$(io_ms "${name}_t.h5" auto "$out" ${bargs[@]+"${bargs[@]}"})
      ratio=$(/usr/bin/python3 -c "print('%.3f' % ($paper / $ours))")
      secs=$(/usr/bin/python3 -c "print('%.1f' % ($s1 - $s0))")
      echo "| $label | $b | ${pct} % | $paper | $ours | ${ratio}x | $(extra "$out") | $secs |"
    done
  done
done
