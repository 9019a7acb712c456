#!/usr/bin/env bash
# What paying for a trained activation predictor costs at 7B (issue 54 item 4; synthetic weights and activity): the
# Llama-2-7B shape (nl-layout pack --synthetic-shape llama2-7b) with a random PowerInfer-form predictor of rank R
# stored in the image (pack --predictor random:R), decoded with `--select trace:` (the held-out synthetic trace's sets,
# free) and `--select predictor+trace:` (the same sets and reads, the predictor run on every layer-token and timed),
# alternated, uncapped (O_DIRECT reads, no neuron cache), medians [min-max] of decode ms/token and of its FFN
# compute; and the memory plan's FFN rows in DRAM of each. Not a test (prints figures).
#   bench/predictor_cost.sh [BUILD_DIR] [WORK_DIR] [RANK] [DTYPE] [REPS]
#   defaults: build /tmp/nl-predictor-cost 1024 q8_0 3
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
build=$(realpath "${1:-$src/build}"); work=${2:-/tmp/nl-predictor-cost}; rank=${3:-1024}; dtype=${4:-q8_0}
reps=${5:-3}
py=${NL_PYTHON:-/usr/bin/python3}
mkdir -p "$work"
img=$work/llama2-7b.$dtype.r$rank.nlw
if [ ! -f "$work/test.h5" ]; then
  "$build/cli/nl-profile" --quiet synth --preset "$src/configs/workloads/llama2-7b-prosparse.json" --layers 32 \
    --neurons 11008 --profile-out "$work/profile.h5" --test-out "$work/test.h5"
fi
if [ ! -f "$img.json" ]; then  # the model and its predictor: random weights (no published predictor is here)
  "$build/cli/nl-layout" --quiet pack --synthetic-shape llama2-7b --dtype "$dtype" --predictor "random:$rank" \
    --out "$img"
fi
prompt=1,$(seq -s, 100 114)
for rep in $(seq 1 "$reps"); do
  for sel in trace predictor+trace; do
    "$build/cli/nl-run" generate --image "$img" --select "$sel:$work/test.h5" --prompt-tokens "$prompt" --steps 32 \
      --threads 2 --json -q >"$work/$sel.$rep.json"
  done
done
"$py" - "$work" "$reps" "$rank" "$dtype" <<'EOF'
import json, sys
work, reps, rank, dtype = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
def med(v):
    v = sorted(v)
    return v[len(v) // 2] if len(v) % 2 else (v[len(v) // 2 - 1] + v[len(v) // 2]) / 2
print("Llama-2-7B shape %s (synthetic weights and activity), stored predictor rank %s (random, PowerInfer form), "
      "2 threads, 32 decoded tokens, %d alternated reps" % (dtype, rank, reps))
rows = {}
for sel in ("trace", "predictor+trace"):
    js = [json.load(open("%s/%s.%d.json" % (work, sel, r))) for r in range(1, reps + 1)]
    dec = [1e3 * j["generation"]["decode_seconds"] / j["generation"]["decode_forwards"] for j in js]
    ffn = [1e3 * j["generation"]["decode_ffn_compute_seconds"] / j["generation"]["decode_forwards"] for j in js]
    rows[sel] = med(dec)
    print("  --select %-16s decode %.2f ms/token [%.2f-%.2f], FFN compute %.2f [%.2f-%.2f], FFN rows in DRAM %d "
          "bytes, tokens %s" % (sel + ":", med(dec), min(dec), max(dec), med(ffn), min(ffn), max(ffn),
                                js[0]["memory"]["ffn_resident_bytes"], "equal" if all(
                                    j["generated"] == js[0]["generated"] for j in js) else "differ"))
print("  predictor paid / free: %.3fx decode time" % (rows["predictor+trace"] / rows["trace"]))
EOF
