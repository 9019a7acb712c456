#!/usr/bin/env bash
# Builds the toolkit with AddressSanitizer + UndefinedBehaviorSanitizer (gcc, -O1) in its own build folder and
# runs the unit tests there (docs/robustness.md). A second full, instrumented build does not fit CI's budget next
# to the rest, so this is a documented script, not a CTest test.
# Usage: scripts/sanitize.sh [--runtime-only] [BUILD] [ctest args...]
#   --runtime-only  only the runtime and its tests (-DNL_RUNTIME_ONLY=ON): a few minutes instead of a full build
set -euo pipefail
cd "$(dirname "$0")/.."
extra=()
if [ "${1:-}" = --runtime-only ]; then extra=(-DNL_RUNTIME_ONLY=ON); shift; fi
build=${1:-build-asan}; shift $(( $# > 0 ? 1 : 0 ))
gen=(); command -v ninja >/dev/null && gen=(-G Ninja)
san="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer"
cmake -S . -B "$build" "${gen[@]}" "${extra[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g" -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O1 -g" \
  -DCMAKE_CXX_FLAGS="$san" -DCMAKE_C_FLAGS="$san" -DCMAKE_EXE_LINKER_FLAGS="$san" \
  ${NL_MODELS_DIR:+-DNL_MODELS_DIR=$NL_MODELS_DIR} >/dev/null
cmake --build "$build" -j "$(nproc)"
# Leaks of libhdf5 / SentencePiece / protobuf at exit are theirs (fuzz/lsan.supp).
export LSAN_OPTIONS="suppressions=$PWD/fuzz/lsan.supp:print_suppressions=0"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
# libhdf5 (not instrumented) mallocs sizes read from corrupt metadata and handles a NULL return, which the malformed-
# trace tests exercise: let ASan return NULL there as glibc does (our own allocations use new, which still throws).
export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1:allocator_may_return_null=1"
cd "$build" && ctest --output-on-failure -j "$(nproc)" -E 'runtime_only_build|fuzz_smoke' "$@"
