#!/usr/bin/env bash
# Calibration table of the paper-shaped synthetic presets (docs/workloads.md): for each preset, generate a
# profile and a held-out test split with `nl-profile synth`, learn identity / frequency / greedy orders on the
# profile split with `nl-layout solve`, and measure the held-out average read length (gap merging off, no
# cache) with `nl-layout eval`; persistence and active fraction come from `synth --stats`.
# Usage: scripts/calibrate_workloads.sh [BUILD_DIR] [LAYERS] [GREEDY_TOP_K]   (defaults: build 2 256)
# GREEDY_TOP_K: co-activation candidates per neuron for greedy; the paper's Algorithm 1 considers every pair,
# and 256 gives the same read length as every pair on these shapes (docs/workloads.md).
set -euo pipefail
build=${1:-build}
layers=${2:-2}
topk=${3:-256}
root=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/nl-calibrate.XXXXXX")
trap 'rm -rf "$work"' EXIT
py=/usr/bin/python3; [ -x "$py" ] || py=python3
echo "| preset | neurons | active % | persistence % | identity (paper) | frequency (paper) | greedy (paper) |"
echo "|---|---|---|---|---|---|---|"
for name in opt-350m opt-6.7b llama2-7b-prosparse mistral-7b-turbosparse; do
  preset="$root/configs/workloads/$name.json"
  "$build/cli/nl-profile" synth --preset "$preset" --layers "$layers" --profile-out "$work/p.h5" \
      --test-out "$work/t.h5" --stats --json -q > "$work/stats.json"
  for m in identity frequency greedy; do
    "$build/cli/nl-layout" solve --trace "$work/p.h5" --method "$m" --top-k "$topk" --out "$work/$m.json" -q > /dev/null
  done
  "$build/cli/nl-layout" eval --trace "$work/t.h5" --layout "$work/identity.json" --layout "$work/frequency.json" \
      --layout "$work/greedy.json" --gap off --cache-ratio 0 --json -q > "$work/eval.json"
  "$py" - "$preset" "$work/stats.json" "$work/eval.json" <<'PY'
import json, sys
preset, stats, ev = (json.load(open(p)) for p in sys.argv[1:4])
paper = preset.get("paper", {}).get("read_length", {})
test = stats["test"]
lens = {l["name"]: l["avg_len"] for l in ev["layouts"]}
def cell(m):
    return "%.2f (%s)" % (lens[m], "%.2f" % paper[m] if m in paper else "–")
print("| %s | %d | %.2f (%.1f) | %.1f (82–85) | %s | %s | %s |" % (
    preset["name"], preset["shape"]["neurons"], 100 * test["active_fraction"],
    100 * preset["paper"]["active_fraction"], 100 * test["persistence"], cell("identity"), cell("frequency"),
    cell("greedy")))
PY
done
