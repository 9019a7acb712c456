#!/usr/bin/env bash
# The main job on the bundled default (datasets/tiny-relu/model, a ReLU-gated Llama trained on Debian's English
# texts): text -> profile -> layout -> eval -> pack -> run, then the OPT-6.7B-shaped synthetic preset through
# solve/eval so paper-scale figures show too. Every figure printed here is computed by this run.
set -euo pipefail
BUILD=${1:-build}
BIN=$BUILD/cli
OUT=${NL_DEMO_DIR:-demo-out}
MODEL=datasets/tiny-relu/model
mkdir -p "$OUT"
stage() { printf '\n== %s\n' "$*"; }
run() { printf '$ %s\n' "$*"; "$@"; }

stage "1. device: this machine's disk (nl-run probe, O_DIRECT)"
run "$BIN/nl-run" probe --file "$OUT/probe.bin" --file-mib 256 --seconds-per-point 0.15 --out "$OUT/device.json" --name this-machine

stage "2. corpus: English text from Debian packages, split into training and held-out documents"
run python3 datasets/tiny-relu/corpus.py "$OUT/corpus" >/dev/null
wc -c "$OUT/corpus/train.txt" "$OUT/corpus/valid.txt"

stage "3. profile: run the bundled ReLU model over the text (nl-profile run)"
run "$BIN/nl-profile" run --model "$MODEL" --tokenizer "$MODEL/tokenizer.model" --text "$OUT/corpus/train.txt" \
  --seq-len 128 --max-tokens 65536 --out "$OUT/profile.h5"
run "$BIN/nl-profile" run --model "$MODEL" --tokenizer "$MODEL/tokenizer.model" --text "$OUT/corpus/valid.txt" \
  --seq-len 128 --max-tokens 16384 --out "$OUT/test.h5" --quiet

stage "4. layout: one neuron order per FFN layer (nl-layout solve)"
for m in identity frequency greedy greedy+ls; do
  run "$BIN/nl-layout" solve --trace "$OUT/profile.h5" --method "$m" --out "$OUT/layout-$m.json" --quiet
done

stage "5. evaluate on held-out text (nl-layout eval, UFS 4.0 cost model, auto gap, 5 % cache, 768-byte f16 bundles)"
run "$BIN/nl-layout" eval --trace "$OUT/test.h5" --device configs/devices/ufs40.json --bundle-bytes 768 \
  --layout "$OUT/layout-identity.json" --layout "$OUT/layout-frequency.json" \
  --layout "$OUT/layout-greedy.json" --layout "$OUT/layout-greedy+ls.json"

stage "6. pack the flash image with the greedy+ls order (nl-layout pack)"
run "$BIN/nl-layout" pack --model "$MODEL" --layout "$OUT/layout-greedy+ls.json" --dtype f16 \
  --tokenizer "$MODEL/tokenizer.model" --out "$OUT/model.nlw"

stage "7. generate from flash: only the neurons whose gate fires are read (nl-run generate)"
if "$BIN/nl-run" generate --help | grep -q -- '--prompt '; then
  run "$BIN/nl-run" generate --image "$OUT/model.nlw" --prompt "And God said unto Moses," --steps 40 \
    --io uring --gap auto --device "$OUT/device.json" --cache-ratio 0.05
else
  run "$BIN/nl-run" generate --image "$OUT/model.nlw" --steps 40 --io uring --gap auto --device "$OUT/device.json" \
    --cache-ratio 0.05
fi

stage "8. paper scale: OPT-6.7B-shaped synthetic trace (2 of 32 layers, 16,384 neurons, 3.2 % active)"
run "$BIN/nl-profile" synth --preset configs/workloads/opt-6.7b.json --layers 2 --profile-out "$OUT/opt.profile.h5" \
  --test-out "$OUT/opt.test.h5" --quiet
for m in identity frequency greedy greedy+ls; do
  run "$BIN/nl-layout" solve --trace "$OUT/opt.profile.h5" --method "$m" --out "$OUT/opt-$m.json" --quiet
done
run "$BIN/nl-layout" eval --trace "$OUT/opt.test.h5" --device configs/devices/ufs40.json \
  --layout "$OUT/opt-identity.json" --layout "$OUT/opt-frequency.json" \
  --layout "$OUT/opt-greedy.json" --layout "$OUT/opt-greedy+ls.json"
printf '\nDone. Outputs in %s/\n' "$OUT"
