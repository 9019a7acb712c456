#!/usr/bin/env bash
# Proves the layering rule: runtime/ (and nl-run) build with -DNL_RUNTIME_ONLY=ON and no HDF5 or Boost anywhere.
set -euo pipefail
src=$1; build=$2
fail() { echo "runtime layering: $*" >&2; exit 1; }
# 1. No source under runtime/ includes HDF5 or Boost, or an offline module.
if grep -rnE '#include[[:space:]]*[<"](hdf5|H5|boost/|graph/|layout/|profiler/)' "$src/runtime"; then
  fail "runtime/ includes HDF5, Boost or an offline module (lines above)"
fi
# 2. A runtime-only configure + build succeeds.
cmake -S "$src" -B "$build" -DNL_RUNTIME_ONLY=ON -DCMAKE_BUILD_TYPE=Release >"$build.configure.log" 2>&1 ||
  { cat "$build.configure.log"; fail "configure failed"; }
cmake --build "$build" -j "$(nproc)" >"$build.build.log" 2>&1 || { tail -50 "$build.build.log"; fail "build failed"; }
test -x "$build/cli/nl-run" || fail "nl-run was not built"
# 3. Nothing in that build saw HDF5 or Boost: compile commands and link lines.
if grep -iE 'hdf5|boost' "$build/compile_commands.json"; then fail "HDF5/Boost on a compile line"; fi
if grep -rilE 'hdf5|boost' --include=link.txt "$build"; then fail "HDF5/Boost on a link line"; fi
"$build/cli/nl-run" --version
# 4. Runtime-only tests pass there too.
(cd "$build" && ctest --output-on-failure -j "$(nproc)")
echo "runtime layering: OK (nl-run built without HDF5 or Boost)"
