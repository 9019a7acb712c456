#!/usr/bin/env bash
# The demo (`./run.sh demo`): the whole pipeline on the bundled model (datasets/tiny-relu/model, a ReLU-gated Llama
# trained on Debian's English texts) — text -> profile -> layouts -> held-out evaluation at the model's own bundle
# size and at paper-sized 16 KiB bundles -> pack -> generate from flash — then the OPT-6.7B-shaped synthetic preset,
# and a closing table of what was measured. Every figure printed is computed by this run; the README's results
# table is this closing table.
set -euo pipefail
BUILD=${1:-build}
BIN=$BUILD/cli
OUT=${NL_DEMO_DIR:-demo-out}
MODEL=datasets/tiny-relu/model
PY=python3
[ -x /usr/bin/python3 ] && PY=/usr/bin/python3
mkdir -p "$OUT"
stage() { printf '\n== %s\n' "$1"; shift; for line in "$@"; do printf '   %s\n' "$line"; done; }
run() {  # prints the command as it can be pasted (arguments with spaces quoted), then runs it
  local a s='$'
  for a in "$@"; do [[ $a == *' '* ]] && s+=" '$a'" || s+=" $a"; done
  printf '%s\n' "$s"
  "$@"
}
evaljson() { "$BIN/nl-layout" eval --quiet --json "$@"; }  # the same evaluation, as JSON for the closing table

cat <<'EOF'
A phone cannot hold a large language model in memory, so the feed-forward (FFN) weights stay in flash storage
and only the neurons that fire for the current token are read. Phone flash is limited by the number of read
operations per second, not by bytes: fewer, longer reads are faster. This toolkit learns an order of the neurons
in the file so that neurons that fire together sit next to each other and one read fetches many of them.
EOF

stage "1. device: measure this machine's disk (nl-run probe)" \
  "Fits 'one read of s bytes costs a + s/B' with real O_DIRECT reads; step 8 uses it. The layout figures below use" \
  "the built-in phone profile instead (UFS 4.0 flash: a = 8.14 us per read, B = 4267 MB/s, configs/devices/ufs40.json)."
run "$BIN/nl-run" probe --file "$OUT/probe.bin" --file-mib 256 --seconds-per-point 0.15 --out "$OUT/device.json" --name this-machine

stage "2. corpus: English text from Debian packages, split into training and held-out documents" \
  "Layouts are learned on train.txt and judged on valid.txt, text they never saw."
run "$PY" datasets/tiny-relu/corpus.py "$OUT/corpus" >/dev/null
wc -c "$OUT/corpus/train.txt" "$OUT/corpus/valid.txt"

stage "3. profile: run the bundled model over the text and record which FFN neurons fire (nl-profile run)" \
  "The model has 4 layers of 512 FFN neurons; a neuron fires when its ReLU gate is positive. The trace is one bit" \
  "per neuron and token (HDF5)."
run "$BIN/nl-profile" run --model "$MODEL" --tokenizer "$MODEL/tokenizer.model" --text "$OUT/corpus/train.txt" \
  --seq-len 128 --max-tokens 65536 --out "$OUT/profile.h5"
run "$BIN/nl-profile" run --model "$MODEL" --tokenizer "$MODEL/tokenizer.model" --text "$OUT/corpus/valid.txt" \
  --seq-len 128 --max-tokens 16384 --out "$OUT/test.h5" --quiet

stage "4. layouts: one neuron order per layer, learned from the profile (nl-layout solve)" \
  "identity = the model's own order; frequency = most active first; greedy = the paper's algorithm (chain the" \
  "pairs that fire together most often); greedy+ls = ours (greedy, then a search on the estimated read time, with" \
  "the cache designed along). Solved once for the model's real bundle size and once for 16 KiB bundles."
for m in identity frequency greedy greedy+ls; do
  run "$BIN/nl-layout" solve --trace "$OUT/profile.h5" --method "$m" --bundle-for "$MODEL" --dtype f16 --out "$OUT/layout-$m.json" --quiet
done
for m in greedy greedy+ls; do
  run "$BIN/nl-layout" solve --trace "$OUT/profile.h5" --method "$m" --bundle-bytes 16384 --out "$OUT/layout16-$m.json" --quiet
done

stage "5. evaluate on held-out text at the model's own size: 768-byte bundles (nl-layout eval)" \
  "A bundle is what one neuron needs from flash (its gate row, up row and down column, f16): 768 bytes here, so a" \
  "whole layer is 384 KiB. One read costs as much time as transferring 34 KB, so the read planner merges gaps of up" \
  "to ~45 neurons and a token's active neurons in a layer take only a few reads whatever the order: small bundles" \
  "leave little absolute time to gain (tenths of a millisecond per token). Reads that merge gaps also fetch unneeded bytes, so" \
  "fewer reads is not always faster: compare io_ms/tok, the estimated I/O time per token on the phone profile." \
  "Other columns: reads per token, KiB read, cache hit %, and ratios against identity (idn) and greedy (grd)."
run "$BIN/nl-layout" eval --trace "$OUT/test.h5" --bundle-for "$MODEL" --dtype f16 \
  --layout "$OUT/layout-identity.json" --layout "$OUT/layout-frequency.json" \
  --layout "$OUT/layout-greedy.json" --layout "$OUT/layout-greedy+ls.json"
evaljson --trace "$OUT/test.h5" --bundle-for "$MODEL" --dtype f16 --layout "$OUT/layout-identity.json" \
  --layout "$OUT/layout-greedy.json" --layout "$OUT/layout-greedy+ls.json" >"$OUT/eval-768.json"

stage "6. the same held-out tokens with paper-sized 16 KiB bundles (OPT-6.7B's neurons are 16 KiB)" \
  "Now a read of neighbouring neurons saves a whole operation, as on a phone running a 7B model: the order matters."
run "$BIN/nl-layout" eval --trace "$OUT/test.h5" --bundle-bytes 16384 \
  --layout "$OUT/layout-identity.json" --layout "$OUT/layout-frequency.json" \
  --layout "$OUT/layout16-greedy.json" --layout "$OUT/layout16-greedy+ls.json"
evaljson --trace "$OUT/test.h5" --bundle-bytes 16384 --layout "$OUT/layout-identity.json" \
  --layout "$OUT/layout16-greedy.json" --layout "$OUT/layout16-greedy+ls.json" >"$OUT/eval-16k.json"

stage "7. pack the flash image with the greedy+ls order (nl-layout pack)" \
  "model.nlw holds each layer's neuron bundles in the learned order; model.nlw.json (the manifest) says where."
run "$BIN/nl-layout" pack --model "$MODEL" --layout "$OUT/layout-greedy+ls.json" --dtype f16 \
  --tokenizer "$MODEL/tokenizer.model" --out "$OUT/model.nlw"

stage "8. generate text from flash (nl-run generate)" \
  "Dense weights are in memory; for each token and layer only the neurons whose gate fires are read from the file" \
  "(real O_DIRECT reads on this machine's disk), giving exactly the dense model's tokens. The table counts the reads."
if "$BIN/nl-run" generate --help | grep -q -- '--prompt '; then
  run "$BIN/nl-run" generate --image "$OUT/model.nlw" --prompt "And God said unto Moses," --steps 40 \
    --io uring --gap auto --device "$OUT/device.json" --cache-ratio 0.05
else
  run "$BIN/nl-run" generate --image "$OUT/model.nlw" --steps 40 --io uring --gap auto --device "$OUT/device.json" \
    --cache-ratio 0.05
fi

stage "9. paper scale: an OPT-6.7B-shaped synthetic trace (2 of 32 layers, 16,384 neurons, 3.2 % active)" \
  "SYNTHETIC: random activations shaped and calibrated like the paper's OPT-6.7B (docs/workloads.md), no model run."
run "$BIN/nl-profile" synth --preset configs/workloads/opt-6.7b.json --layers 2 --profile-out "$OUT/opt.profile.h5" \
  --test-out "$OUT/opt.test.h5" --quiet
for m in identity frequency greedy greedy+ls; do
  run "$BIN/nl-layout" solve --trace "$OUT/opt.profile.h5" --method "$m" --out "$OUT/opt-$m.json" --quiet
done
run "$BIN/nl-layout" eval --trace "$OUT/opt.test.h5" \
  --layout "$OUT/opt-identity.json" --layout "$OUT/opt-frequency.json" \
  --layout "$OUT/opt-greedy.json" --layout "$OUT/opt-greedy+ls.json"
evaljson --trace "$OUT/opt.test.h5" --layout "$OUT/opt-identity.json" --layout "$OUT/opt-greedy.json" \
  --layout "$OUT/opt-greedy+ls.json" >"$OUT/eval-opt.json"

stage "What you just measured" \
  "Estimated flash I/O time per token on the UFS 4.0 phone profile, held-out tokens, 5 % cache (lower is faster);" \
  "'x' columns are speed-ups of ours (greedy+ls) over the original order and over the paper's pipeline (greedy)."
"$PY" scripts/results_table.py --svg "$OUT/results.svg" "tiny-relu (real), 768 B bundles=$OUT/eval-768.json" \
  "tiny-relu (real), 16 KiB bundles=$OUT/eval-16k.json" "OPT-6.7B shape (synthetic), 16 KiB=$OUT/eval-opt.json"
printf '\nThe same as a figure: %s/results.svg (numbers: results.csv).\n' "$OUT"
printf '\nDone. Outputs in %s/ (docs/benchmarks.md has the larger benchmarks).\n' "$OUT"
