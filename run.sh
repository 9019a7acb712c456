#!/usr/bin/env bash
# The two set-up commands of the README, on a fresh Debian 12 machine (as root, or with the packages installed):
#   ./run.sh demo   text -> profile -> layout -> pack -> run on the bundled default
#   ./run.sh test   build everything and run every test
# Other verbs: build (just build), bench [--suite all|micro|layouts|e2e] [--quick] (benchmarks, not part of the tests).
set -euo pipefail
cd "$(dirname "$0")"
BUILD=${NL_BUILD_DIR:-build}

build() {
  scripts/bootstrap.sh build "$@"
  local gen=()
  command -v ninja >/dev/null && gen=(-G Ninja)
  if [ ! -f "$BUILD/CMakeCache.txt" ]; then
    cmake -S . -B "$BUILD" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release >/dev/null
  fi
  cmake --build "$BUILD" -j "$(nproc)"
}

case "${1:-}" in
  build)
    build
    ;;
  test)
    build cross fuzz report train  # tests: aarch64 under qemu, libFuzzer smoke, Chromium screenshot, PyTorch hooks
    scripts/llamacpp.sh            # the real llama.cpp for the e2e smoke (built once, cached outside the repo)
    rm -rf "$BUILD/tests/skipped"   # each test writes why it skipped (all or part) here; listed at the end
    rc=0
    (cd "$BUILD" && ctest --output-on-failure -j "$(nproc)") || rc=$?
    scripts/skip_summary.sh "$BUILD"
    exit $rc
    ;;
  demo)
    build demo
    exec scripts/demo.sh "$BUILD"
    ;;
  bench)
    build
    shift
    exec scripts/bench.sh "$BUILD" "$@"
    ;;
  *)
    echo "usage: ./run.sh demo|test|build|bench" >&2
    exit 2
    ;;
esac
