# Shared by the reliability scripts (check_reliability.sh: issue 23; check_reliability3.sh: issue 56): a scratch
# folder with a copy of the bundled model, and the checks' helpers. Source it with `src` (the repository) and `bin`
# (the build folder) set; it cd's into the scratch folder, removed at exit.
P="$bin/cli/nl-profile" L="$bin/cli/nl-layout" R="$bin/cli/nl-run"
PY=/usr/bin/python3
work=$(mktemp -d "${TMPDIR:-/tmp}/nl-reliability.XXXXXX")
trap 'rm -rf "$work"' EXIT
cd "$work" || exit 1
export OMP_NUM_THREADS=2
fails=0 passes=0
# A copy: a check that fails writes over its inputs, and the repository's model must never be one of them.
cp -r "$src/datasets/tiny-relu/model" mdl || exit 1
model=$work/mdl

pass() { passes=$((passes + 1)); echo "PASS $1"; }
fail() { fails=$((fails + 1)); echo "FAIL $1"; [ -s err ] && sed 's/^/     stderr: /' err | head -5; }

# expect NAME CODE PATTERN CMD...: exit CODE (never a signal, never a hang), stderr one line matching PATTERN.
expect() {
  local name=$1 code=$2 pat=$3
  shift 3
  timeout "$hang_s" "$@" >out 2>err
  local rc=$?
  local lines
  lines=$(wc -l <err)
  if [ "$rc" != "$code" ]; then
    fail "$name: exit $rc, expected $code ($*)"
  elif [ "$code" != 0 ] && [ "$lines" != 1 ]; then
    fail "$name: $lines lines on stderr, expected 1"
  elif [ -n "$pat" ] && ! grep -q -- "$pat" err; then
    fail "$name: stderr does not match '$pat'"
  else
    pass "$name"
  fi
}
same() { cmp -s "$1" "$2"; }  # byte-identical
# capped KB NAME CODE PATTERN CMD...: expect, under an address-space cap of KB (ulimit -v). An ASan build reserves
# terabytes of address space and cannot start under a cap: there the check runs uncapped and its name says so.
asan=0
ldd "$R" 2>/dev/null | grep -q libasan && asan=1
# A hang is a check that does not finish in hang_s; an instrumented build runs several times slower.
hang_s=15
[ "$asan" = 1 ] && hang_s=120
capped() {
  local kb=$1 name=$2
  shift 2
  if [ "$asan" = 1 ]; then expect "$name (ASan build: uncapped)" "$@"; return; fi
  local code=$1 pat=$2
  shift 2
  expect "$name" "$code" "$pat" bash -c "ulimit -v $kb; exec \"\$@\"" capped "$@"
}

