#!/usr/bin/env bash
# Builds the whole toolkit with AddressSanitizer + UndefinedBehaviorSanitizer (gcc, -O1) in BUILD (default
# build-asan) and runs the unit tests there (docs/robustness.md). Too slow for CI's 25 minutes on 2 cores
# together with the rest, so it is a documented script, not a CTest test. Usage: scripts/sanitize.sh [BUILD] [ctest args]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build-asan}; shift $(( $# > 0 ? 1 : 0 ))
gen=(); command -v ninja >/dev/null && gen=(-G Ninja)
san="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer"
cmake -S . -B "$build" "${gen[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g" \
  -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O1 -g" -DCMAKE_CXX_FLAGS="$san" -DCMAKE_C_FLAGS="$san" \
  -DCMAKE_EXE_LINKER_FLAGS="$san" ${NL_MODELS_DIR:+-DNL_MODELS_DIR=$NL_MODELS_DIR} >/dev/null
cmake --build "$build" -j "$(nproc)"
# Leaks of libhdf5 / SentencePiece at exit are theirs (fuzz/lsan.supp); Python helpers the tests call are not
# instrumented, so ASan must not be preloaded into them (it is linked statically into our binaries only).
export LSAN_OPTIONS="suppressions=$PWD/fuzz/lsan.supp:print_suppressions=0"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1"
cd "$build" && ctest --output-on-failure -j "$(nproc)" -E 'runtime_only_build|fuzz_smoke' "$@"
