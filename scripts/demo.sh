#!/usr/bin/env bash
# The main job on the bundled default: text -> profile -> layout -> pack -> run.
# Stages that do not exist yet are named as such; nothing here fakes a result.
set -euo pipefail
BUILD=${1:-build}
BIN=$BUILD/cli
OUT=${NL_DEMO_DIR:-demo-out}
mkdir -p "$OUT"
stage() { printf '\n== %s\n' "$*"; }
missing() { printf '   (not implemented yet: %s)\n' "$*"; }

stage "device: this machine's disk (nl-run probe)"
"$BIN/nl-run" probe --file "$OUT/probe.bin" --file-mib 256 --seconds-per-point 0.2 --out "$OUT/device.json" --name this-machine

stage "profile: run the bundled model over text (nl-profile)"
missing "nl-profile run (issue 3) and the bundled tiny ReLU model (issue 6)"
stage "layout: co-activation graph and neuron order (nl-layout graph/solve)"
missing "nl-layout graph (issue 4), nl-layout solve (issue 5)"
stage "evaluate on held-out text (nl-layout eval)"
missing "nl-layout eval (issue 5)"
stage "pack the flash image (nl-layout pack)"
missing "nl-layout pack (issue 11)"
stage "generate text from flash (nl-run generate)"
missing "nl-run generate / replay (issue 7)"
