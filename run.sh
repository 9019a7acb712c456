#!/usr/bin/env bash
# The set-up commands of the README, on a fresh Debian 12 machine (as root, or with the packages installed):
#   ./run.sh build  the three binaries only (nl-profile, nl-layout, nl-run)
#   ./run.sh demo   text -> profile -> layout -> pack -> run on the bundled default (builds the binaries)
#   ./run.sh test   builds the tests too (CMake target nl-tests) and runs every test
#   ./run.sh bench [--suite all|micro|layouts|e2e] [--quick]  builds the benchmarks (nl-benches); not part of the tests
set -euo pipefail
cd "$(dirname "$0")"
BUILD=${NL_BUILD_DIR:-build}

BINARIES="nl-profile nl-layout nl-run"  # what the README's example and the demo need

# build "TARGETS" [-- BOOTSTRAP_GROUPS...]: installs what is missing, configures once, builds only the CMake TARGETS.
build() {
  local targets=$1
  shift
  [ "${1:-}" = -- ] && shift
  scripts/bootstrap.sh build "$@"
  local gen=()
  command -v ninja >/dev/null && gen=(-G Ninja)
  if [ ! -f "$BUILD/CMakeCache.txt" ]; then
    cmake -S . -B "$BUILD" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release >/dev/null
  fi
  cmake --build "$BUILD" -j "$(nproc)" --target $targets
}

case "${1:-}" in
  build)
    build "$BINARIES"
    ;;
  test)
    build nl-tests -- cross fuzz report train  # aarch64 under qemu, libFuzzer smoke, Chromium screenshot, PyTorch hooks
    scripts/llamacpp.sh            # the real llama.cpp for the e2e smoke (built once, cached outside the repo)
    rm -rf "$BUILD/tests/skipped"   # each test writes why it skipped (all or part) here; listed at the end
    rc=0
    (cd "$BUILD" && ctest --output-on-failure -j "$(nproc)") || rc=$?
    scripts/skip_summary.sh "$BUILD"
    exit $rc
    ;;
  demo)
    build "$BINARIES" -- demo
    exec scripts/demo.sh "$BUILD"
    ;;
  bench)
    build nl-benches
    shift
    exec scripts/bench.sh "$BUILD" "$@"
    ;;
  *)
    echo "usage: ./run.sh demo|test|build|bench" >&2
    exit 2
    ;;
esac
