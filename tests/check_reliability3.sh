#!/bin/bash
# Regression checks for issue 56 (reliability, round three: no silent wrong answers), one block per item, on the real
# binaries: huge numbers, NaN / infinite / subnormal floats, a tiny temperature, budgets that rounded to nothing,
# image.file paths, standard output that cannot be written, partial inputs, the exit-code table (every binary's
# error paths), gguf_from_image.py, impossible work, read verification. Item 5 (every manifest field against the
# image id) is tests/check_manifest_fields.py. Each check prints PASS/FAIL; parts that cannot run here print SKIP
# and are listed in BINARY_DIR/tests/skipped/reliability3.txt.
#   check_reliability3.sh SOURCE_DIR BINARY_DIR
set -u
src=$1 bin=$2
skipfile=$bin/tests/skipped/reliability3.txt
mkdir -p "$(dirname "$skipfile")" && rm -f "$skipfile"  # written only when a part is skipped
# shellcheck source=tests/reliability_lib.sh
source "$(dirname "$0")/reliability_lib.sh"
skip() { echo "SKIP $1"; echo "$1" >>"$skipfile"; }

"$P" synth --preset "$src/configs/workloads/opt-350m.json" --neurons 256 --layers 2 --profile-sequences 8 \
  --test-sequences 4 --tokens-per-sequence 64 --profile-out p.h5 --test-out t.h5 -q || { echo "cannot make traces"; exit 1; }
"$L" solve --trace p.h5 --method frequency --out lay.json -q || { echo "cannot solve"; exit 1; }
"$L" pack --model "$model" --tokenizer "$model/tokenizer.model" --out m.nlw -q || { echo "cannot pack"; exit 1; }
"$P" run --model "$model" --tokenizer "$model/tokenizer.model" --text "$src/README.md" --max-tokens 2048 \
  --activation calibrated:0.3 --out cal.h5 -q || { echo "cannot profile"; exit 1; }
gen=("$R" generate --image m.nlw --prompt-tokens 1,400,35 --steps 6 -q)

# ------------------------------------------------------------------------------------ 1. huge numbers
for a in "--tokens 18446744073709551616:" "--tokens 0:99999999999999999999" "--sequences 0:99999999999999999999" \
  "--slice 0/99999999999999999999" "--layers 0-99999999999999999999999"; do
  # shellcheck disable=SC2086
  expect "1 graph $a" 2 "${a%% *}" "$L" graph --trace p.h5 --out g.h5 -q $a
done
[ ! -e g.h5 ] && pass "1 nothing written" || fail "1 g.h5 written"
expect "1 lowrank rank past int" 2 "--select" "${gen[@]}" --select lowrank:99999999999999999999

# ------------------------------------------------------ 2. NaN, infinities and subnormals in every FLOAT option
# Every option the binaries' --help shows as FLOAT, in every subcommand: found from the help text, so an option added
# later is covered too. Validation comes before the required-option check, so the option alone is enough.
nfloat=0
for b in "$P" "$L" "$R"; do
  for sub in $("$b" --help | sed -n '/^Subcommands:/,$p' | awk 'NR > 1 && NF {print $1}'); do
    for opt in $("$b" "$sub" --help | grep -oE -- '--[a-z0-9-]+ FLOAT' | awk '{print $1}' | sort -u); do
      nfloat=$((nfloat + 1))
      n=$(basename "$b")
      expect "2 $n $sub $opt nan" 2 "$opt: 'nan' is not a number" "$b" "$sub" "$opt" nan
      expect "2 $n $sub $opt inf" 2 "$opt" "$b" "$sub" "$opt" inf
      expect "2 $n $sub $opt -inf" 2 "$opt" "$b" "$sub" "$opt" -inf
      expect "2 $n $sub $opt 1e-320" 2 "$opt" "$b" "$sub" "$opt" 1e-320  # this check or the option's range
    done
  done
done
[ "$nfloat" -ge 20 ] && pass "2 $nfloat FLOAT options checked" || fail "2 only $nfloat FLOAT options found in --help"
# The issue's cases end to end: nothing is written.
expect "2 profile run --test-fraction nan" 2 "test-fraction" "$P" run --model "$model" --tokenizer \
  "$model/tokenizer.model" --text "$src/README.md" --out nan_p.h5 --test-out nan_t.h5 --test-fraction nan -q
[ ! -e nan_p.h5 ] && [ ! -e nan_t.h5 ] && pass "2 no trace committed" || fail "2 a trace was committed"
expect "2 generate --target-recall nan" 2 "target-recall" "${gen[@]}" --select lowrank:4 --target-recall nan
expect "2 threshold:nan" 2 "--select" "${gen[@]}" --select threshold:nan

# --------------------------------------------------------------------------------- 3. a tiny temperature
"${gen[@]}" >greedy.out 2>err || fail "3 greedy run failed"
for t in 1e-30 1e-5 0.00009; do
  expect "3 --temperature $t runs" 0 "" "${gen[@]}" --temperature "$t" --seed 7
  diff <(grep '^tokens:' out) <(grep '^tokens:' greedy.out) >/dev/null && pass "3 --temperature $t is greedy" ||
    fail "3 --temperature $t: $(grep '^tokens:' out), greedy $(grep '^tokens:' greedy.out)"
done
expect "3 --temperature 1e-320 refused" 2 "too close to zero" "${gen[@]}" --temperature 1e-320

# ---------------------------------------------------------------- 4. budgets that rounded to no budget
for v in 0.5 1e-9% "" 0 0B; do
  expect "4 --memory-budget '$v'" 2 "--memory-budget" "${gen[@]}" --memory-budget "$v"
done
expect "4 --read-batch ''" 2 "--read-batch" "${gen[@]}" --read-batch ""

# ------------------------------------------------------------------------ 6. image.file is a file name
mkdir -p other
for f in "../other/m.nlw" "/etc/passwd" "." ""; do
  $PY - "$f" <<'EOF'
import json, sys
m = json.load(open("m.nlw.json"))
m["image"]["file"] = sys.argv[1]
json.dump(m, open("e.nlw.json", "w"))
EOF
  cp m.nlw e.nlw && cp m.nlw other/m.nlw
  expect "6 image.file '$f'" 3 "image.file" "$R" generate --image e.nlw --prompt-tokens 1 --steps 2 -q
done

# -------------------------------------------------------------------- 7. standard output that cannot be written
if [ -c /dev/full ]; then
  full() {  # full NAME CMD...: stdout to /dev/full is exit 4 with one line naming standard output
    local name=$1
    shift
    timeout "$hang_s" "$@" >/dev/full 2>err
    local rc=$?
    [ "$rc" = 4 ] && [ "$(wc -l <err)" = 1 ] && grep -q "standard output" err && pass "7 $name" ||
      fail "7 $name: exit $rc to /dev/full"
  }
  full "eval --json" "$L" eval --trace t.h5 --layout lay.json --json -q
  full "eval (text)" "$L" eval --trace t.h5 --layout lay.json -q
  full "generate" "${gen[@]}"
  full "generate --json" "${gen[@]}" --json
  full "inspect" "$P" inspect p.h5
  full "decode" "$P" decode --tokenizer "$model/tokenizer.model" --ids "400 35"
  full "--help" "$R" generate --help
  full "pack --list-synthetic-models" "$L" pack --list-synthetic-models
  full "gguf_from_image.py (argparse --help)" "$PY" "$src/scripts/gguf_from_image.py" --help
else
  skip "7 standard output to /dev/full: /dev/full is not a character device here"
fi
# A full file system (tmpfs, root only): the same through a file.
if [ "$(id -u)" = 0 ] && mkdir -p tiny && mount -t tmpfs -o size=8k tmpfs tiny 2>/dev/null; then
  head -c 8192 /dev/zero >tiny/fill 2>/dev/null
  "$L" eval --trace t.h5 --layout lay.json --json -q >tiny/out.json 2>err
  rc=$?
  [ "$rc" = 4 ] && pass "7 eval --json to a full tmpfs" || fail "7 eval --json to a full tmpfs: exit $rc"
  umount tiny
else
  skip "7 a full tmpfs: needs root and mount"
fi

# ------------------------------------------------------------------------------------ 8. partial inputs
"$L" graph --trace p.h5 --layers 0 --out g0.h5 -q || fail "8 graph of layer 0"
expect "8 solve --graph of 1 of 2 layers" 3 "no graph file holds layer 1" "$L" solve --graph g0.h5 --method greedy \
  --out part.json -q
[ ! -e part.json ] && pass "8 no partial layout written" || fail "8 a partial layout was written"
"$L" graph --trace p.h5 --full --out gall.h5 -q && "$L" solve --graph gall.h5 --method greedy --out all.json -q &&
  pass "8 solve --graph of every layer works" || fail "8 solve --graph of every layer"
mkdir -p cut && cp "$model/model.safetensors" "$model/tokenizer.model" cut/
$PY - "$model/config.json" <<'EOF'
import json, sys
c = json.load(open(sys.argv[1]))
c["num_hidden_layers"] -= 1
json.dump(c, open("cut/config.json", "w"))
EOF
expect "8 pack: config with fewer layers than the checkpoint" 3 "num_hidden_layers" "$L" pack --model cut --out cut.nlw -q
[ ! -e cut.nlw ] && pass "8 no image written" || fail "8 an image of the cut model was written"
expect "8 profile run: config with fewer layers" 3 "num_hidden_layers" "$P" run --model cut --tokenizer \
  cut/tokenizer.model --text "$src/README.md" --out cut.h5 -q

# ---------------------------------------------------------------------------- 9. the exit-code table
# Thresholds a trace records that are no thresholds: bad input (3) naming the trace.
for v in nan -1; do
  cp cal.h5 "bad$v.h5"
  $PY - "bad$v.h5" "$v" <<'EOF'
import h5py, sys
with h5py.File(sys.argv[1], "r+") as f:
    f["layers/0"].attrs["threshold"] = float(sys.argv[2])
EOF
  expect "9 pack --act-threshold-from a trace with threshold $v" 3 "bad$v.h5" "$L" pack --model "$model" \
    --act-threshold-from "bad$v.h5" --out th.nlw -q
done
# A missing input file is a usage error (2) naming it, whatever option or form names it.
miss=/nonexistent/missing
expect "9 generate --select trace:missing" 2 "$miss.h5" "${gen[@]}" --select trace:$miss.h5
expect "9 generate --image missing" 2 "$miss.nlw" "$R" generate --image $miss.nlw
expect "9 generate --tokenizer missing" 2 "$miss" "${gen[@]}" --tokenizer $miss
expect "9 replay --trace missing" 2 "$miss.h5" "$R" replay --image m.nlw --trace $miss.h5 -q
expect "9 pack --tokenizer missing" 2 "$miss" "$L" pack --model "$model" --tokenizer $miss --out x.nlw -q
expect "9 pack --model missing" 2 "$miss" "$L" pack --model $miss --out x.nlw -q
expect "9 pack --layout missing" 2 "$miss" "$L" pack --model "$model" --layout $miss.json --out x.nlw -q
expect "9 pack --act-threshold-from missing" 2 "$miss" "$L" pack --model "$model" --act-threshold-from $miss.h5 \
  --out x.nlw -q
expect "9 graph --trace missing" 2 "$miss" "$L" graph --trace $miss.h5 --out g.h5 -q
expect "9 solve --trace missing" 2 "$miss" "$L" solve --trace $miss.h5 --out l.json -q
expect "9 solve --graph missing" 2 "$miss" "$L" solve --graph $miss.h5 --method greedy --out l.json -q
expect "9 eval --layout missing" 2 "$miss" "$L" eval --trace t.h5 --layout $miss.json -q
expect "9 report --trace missing" 2 "$miss" "$L" report --trace $miss.h5 --layout lay.json --out r.html -q
expect "9 inspect missing" 2 "$miss" "$P" inspect $miss.h5
expect "9 profile run --text missing" 2 "$miss" "$P" run --model "$model" --tokenizer "$model/tokenizer.model" \
  --text $miss --out x.h5 -q
# An image whose manifest is missing is that case too; a trace given as the image is bad input, said as such.
cp m.nlw lonely.nlw
expect "9 generate --image without its manifest" 2 "lonely.nlw.json does not exist" "$R" generate --image lonely.nlw -q
expect "9 generate --image TRACE.h5" 3 "HDF5 file" "$R" generate --image p.h5 -q
# Bad input in each binary: 3 naming the file; a bad option: 2.
printf 'not hdf5' >junk.h5
expect "9 inspect a file that is not HDF5" 3 "junk.h5" "$P" inspect junk.h5
expect "9 eval a trace that is not HDF5" 3 "junk.h5" "$L" eval --trace junk.h5 --layout lay.json -q
expect "9 replay a trace that is not HDF5" 3 "junk.h5" "$R" replay --image m.nlw --trace junk.h5 -q
for b in "$P" "$L" "$R"; do
  expect "9 $(basename "$b") --no-such-option" 2 "" "$b" --no-such-option
done

# ---------------------------------------------------------------------------- 10. gguf_from_image.py
G="$src/scripts/gguf_from_image.py"
mkfifo fifo.nlw.json && cp m.nlw fifo.nlw
expect "10 a FIFO manifest is refused, not waited on" 3 "FIFO" "$PY" "$G" --image fifo.nlw --out f.gguf
gguf_py=""
if dir=$("$src/scripts/llamacpp.sh" dir 2>/dev/null) && [ -f "$dir/gguf-py/gguf/__init__.py" ]; then
  gguf_py=$dir/gguf-py
fi
if [ -n "$gguf_py" ] && $PY -c 'import sentencepiece' 2>/dev/null; then
  # m.nlw was packed with the SentencePiece tokenizer.model (copied as m.nlw.tokenizer): its pieces, not a misread
  # llama2.c file, must be the GGUF's vocabulary.
  expect "10 an image packed with a SentencePiece tokenizer converts" 0 "" "$PY" "$G" --image m.nlw --out m.gguf \
    --gguf-py "$gguf_py"
  $PY - "$gguf_py" "$model/tokenizer.model" <<'EOF' >err 2>&1 && pass "10 the GGUF holds the SentencePiece pieces" ||
import sys
sys.path.insert(0, sys.argv[1])
import gguf, sentencepiece
sp = sentencepiece.SentencePieceProcessor(model_file=sys.argv[2])
r = gguf.GGUFReader("m.gguf")
f = r.fields["tokenizer.ggml.tokens"]
toks = [bytes(f.parts[i]).decode("utf-8") for i in f.data]
want = [sp.IdToPiece(i) for i in range(sp.vocab_size())]
sys.exit(0 if toks == want else "tokens differ: %r vs %r" % (toks[:8], want[:8]))
EOF
    fail "10 the GGUF's vocabulary is not the SentencePiece model's"
  "$PY" "$G" --image m.nlw --out m2.gguf --gguf-py "$gguf_py" >/dev/full 2>err
  rc=$?
  [ "$rc" = 4 ] && pass "10 stdout to /dev/full is exit 4" || fail "10 stdout to /dev/full: exit $rc"
else
  skip "10 gguf_from_image.py conversion: llama.cpp's gguf-py (scripts/llamacpp.sh) or python3-sentencepiece missing"
fi

# ------------------------------------------------------------------------------------- 11. impossible work
expect "11 synth of 2^32 tokens refused at once" 2 "cannot be counted" "$P" synth --preset \
  "$src/configs/workloads/opt-6.7b.json" --tokens-per-sequence 65536 --profile-sequences 65536 --profile-out big.h5 -q
expect "11 synth of 1024 x 1M neurons refused at once" 4 "MemAvailable" "$P" synth --preset \
  "$src/configs/workloads/opt-6.7b.json" --layers 1024 --neurons 1048576 --profile-out big.h5 -q
expect "11 pack of a 1M x 1M shape refused at once" 4 "MemAvailable" "$L" pack --synthetic-shape 1048576x1048576 \
  --out big.nlw -q
[ ! -e big.h5 ] && [ ! -e big.nlw ] && [ -z "$(ls -A | grep -E '^\.?big\.')" ] && pass "11 nothing written" ||
  fail "11 files left: $(ls -A | grep big)"
# An image larger than its file system's free room: refused before writing, with the figure (tmpfs, root only).
if [ "$(id -u)" = 0 ] && mkdir -p small && mount -t tmpfs -o size=1m tmpfs small 2>/dev/null; then
  expect "11 pack onto a file system too small" 4 "free: refused before writing" "$L" pack --model "$model" \
    --out small/m.nlw -q
  [ -z "$(ls -A small)" ] && pass "11 nothing left on the small file system" || fail "11 left: $(ls -A small)"
  umount small
else
  skip "11 pack onto a small tmpfs: needs root and mount"
fi

echo "check_reliability3: $passes passed, $fails failed"
[ "$fails" = 0 ]
