#!/bin/bash
# Disk-full suite (issue 23): every command that writes is pointed at a full tmpfs and must exit 4 with one line
# on stderr, leave the previous outputs byte-identical and leave no temporary file; with two outputs where only the
# second fails, neither may be committed. Needs root (mount); exits 77 (CTest: skipped) with the reason otherwise.
#   check_disk_full.sh SOURCE_DIR BINARY_DIR
set -u
src=$1 bin=$2
P="$bin/cli/nl-profile" L="$bin/cli/nl-layout" R="$bin/cli/nl-run"
if [ "$(id -u)" != 0 ]; then
  echo "check_disk_full: skipped: mounting a tmpfs needs root"
  exit 77
fi
work=$(mktemp -d "${TMPDIR:-/tmp}/nl-diskfull.XXXXXX")
full=$work/full
mkdir -p "$full"
if ! mount -t tmpfs -o size=1m tmpfs "$full" 2>/dev/null; then
  rmdir "$full"
  rm -rf "$work"
  echo "check_disk_full: skipped: cannot mount a tmpfs here (container without CAP_SYS_ADMIN?)"
  exit 77
fi
trap 'umount "$full"; rm -rf "$work"' EXIT
cd "$work" || exit 1
export OMP_NUM_THREADS=2
fails=0 passes=0
cp -r "$src/datasets/tiny-relu/model" mdl
model=$work/mdl

pass() { passes=$((passes + 1)); echo "PASS $1"; }
fail() { fails=$((fails + 1)); echo "FAIL $1"; [ -s err ] && sed 's/^/     stderr: /' err | head -5; }

# Inputs, on a disk with room.
"$P" synth --preset "$src/configs/workloads/opt-350m.json" --neurons 512 --layers 4 --profile-sequences 16 \
  --test-sequences 4 --tokens-per-sequence 128 --profile-out p.h5 --test-out t.h5 -q || exit 1
"$L" graph --trace p.h5 --full --out g.h5 --tokens 0:1024 -q || exit 1
"$L" graph --trace p.h5 --full --out g2.h5 --tokens 1024:2048 -q || exit 1
"$L" solve --trace p.h5 --method frequency --out lay.json -q || exit 1
"$L" pack --model "$model" --out m.nlw -q || exit 1
printf 'Once upon a time there was a little dog.\n\nIt ran to the park and played all day.\n' >text.txt

# The tmpfs holds the previous outputs and a filler that leaves ROOM bytes free: 0 for the small JSON outputs; for
# the HDF5 and image writers enough that the file is created and the data writes fail (where libhdf5 crashed).
room=0
refill() {
  dd if=/dev/zero of="$full/filler" bs=4096 2>/dev/null
  dd if=/dev/zero of="$full/filler2" bs=1 2>/dev/null  # the last partial page
  if [ "$room" -gt 0 ]; then
    local size
    size=$(stat -c %s "$full/filler")
    rm -f "$full/filler2"
    truncate -s $((size - room)) "$full/filler"
  fi
}
# check NAME OUTPUTS... -- CMD...: previous content at each output, full disk, exit 4, one line, nothing changed.
check() {
  local name=$1
  shift
  local outs=()
  while [ "$1" != "--" ]; do outs+=("$1"); shift; done
  shift
  rm -rf "${full:?}"/*
  for o in "${outs[@]}"; do printf 'previous %s\n' "$o" >"$o"; done
  refill
  timeout 60 "$@" >out 2>err
  local rc=$? ok=1
  [ "$rc" = 139 ] && echo "     (SIGSEGV)"
  [ "$rc" = 4 ] || { fail "$name: exit $rc, expected 4"; ok=0; }
  [ "$(wc -l <err)" = 1 ] || { fail "$name: $(wc -l <err) lines on stderr"; ok=0; }
  for o in "${outs[@]}"; do
    [ "$(head -c 300 "$o" | tr -d '\0')" = "previous $o" ] || { fail "$name: $o changed"; ok=0; }
  done
  if ls "$full"/*.tmp.* "$work"/*.tmp.* >/dev/null 2>&1; then fail "$name: temporary file left"; ok=0; fi
  [ $ok = 1 ] && pass "$name"
}

room=8192
check "profile synth" "$full/sp.h5" "$full/st.h5" -- \
  "$P" synth --preset "$src/configs/workloads/opt-350m.json" --neurons 4096 --layers 2 --profile-sequences 32 \
  --test-sequences 4 --profile-out "$full/sp.h5" --test-out "$full/st.h5" -q
# Only the second output fails: the first (on a disk with room) must not be committed either.
check "profile synth, only --test-out full" "$work/sp2.h5" "$full/st.h5" -- \
  "$P" synth --preset "$src/configs/workloads/opt-350m.json" --neurons 4096 --layers 2 --profile-sequences 32 \
  --test-sequences 4 --profile-out "$work/sp2.h5" --test-out "$full/st.h5" -q
check "profile run" "$full/rp.h5" -- \
  "$P" run --model "$model" --tokenizer "$model/tokenizer.model" --text text.txt --out "$full/rp.h5" -q
check "profile run, only --test-out full" "$work/rp2.h5" "$full/rt.h5" -- \
  "$P" run --model "$model" --tokenizer "$model/tokenizer.model" --text text.txt --test-fraction 0.5 \
  --out "$work/rp2.h5" --test-out "$full/rt.h5" -q
check "layout graph" "$full/g.h5" -- "$L" graph --trace p.h5 --out "$full/g.h5" -q
check "layout graph merge" "$full/gm.h5" -- "$L" graph-merge g.h5 g2.h5 --out "$full/gm.h5" -q
room=0
check "layout solve" "$full/l.json" -- "$L" solve --trace p.h5 --method frequency --out "$full/l.json" -q
room=8192
check "layout pack" "$full/m.nlw" "$full/m.nlw.json" "$full/m.nlw.tokenizer" -- \
  "$L" pack --model "$model" --tokenizer "$model/tokenizer.model" --out "$full/m.nlw" -q
check "layout pack, only the export full" "$work/m2.nlw" "$work/m2.nlw.json" -- \
  "$L" pack --model "$model" --out "$work/m2.nlw" --export-permuted "$full/exp" -q
room=0
check "layout report" "$full/r.html" -- "$L" report --trace t.h5 --layout lay.json --out "$full/r.html" -q
check "run generate --metrics" "$full/met.json" -- \
  "$R" generate --image m.nlw --prompt-tokens 1,2,3 --steps 2 --metrics "$full/met.json" -q
check "run probe (scratch file and --out)" "$full/dev.json" -- \
  "$R" probe --file "$full/probe.bin" --file-mib 64 --seconds-per-point 0.01 --out "$full/dev.json" -q
[ ! -e "$full/probe.bin" ] && pass "probe removed its scratch file" || fail "probe left its scratch file"

echo "check_disk_full: $passes passed, $fails failed"
[ "$fails" = 0 ]
