#!/usr/bin/env bash
# Builds the real llama.cpp baseline for the end-to-end benchmark (issue 19), cached outside the repo.
# The source is the git bundle inside the npm package node-llama-cpp (llama.cpp of 2026-09, MIT, ggml 0.25.1).
#   scripts/llamacpp.sh [build]   fetch + build once; a second call only checks the binaries (instant)
#                                 also builds bin/llama-ids (bench/e2e/llama_ids.cpp: token ids in and out)
#   scripts/llamacpp.sh dir       print the install directory (bin/ and gguf-py/ below it)
#   scripts/llamacpp.sh check     exit 0 when built, 77 with the reason when not (for tests)
# Cache: $NL_LLAMACPP_DIR, default ~/.cache/nl-llamacpp/<version>/ (source, build, bin/, gguf-py/).
# GGML_NATIVE=ON builds for this CPU: right for a baseline measured on this machine, not a portable binary.
# On a CPU with AMX (Sapphire Rapids and later) the build leaves AMX out (-mno-amx-*): this llama.cpp's AMX matmul
# faults on its first prompt batch (general protection fault at ldtilecfg in ggml_backend_amx_mul_mat: the tile
# config is built on the stack and optimized away, llama.cpp issue 20824 / pull request 26954, open), so llama-bench
# -p dies with SIGSEGV. Without AMX it runs its AVX-512 (VNNI) kernels, as on any AVX-512 CPU. The flags used are
# kept in build-flags; a cache built with other flags is rebuilt.
set -euo pipefail

VERSION=3.22.1 # node-llama-cpp release whose bundle holds the llama.cpp source
DIR=${NL_LLAMACPP_DIR:-${HOME:-/root}/.cache/nl-llamacpp/$VERSION}
TARGETS=(llama-bench llama-completion llama-convert-llama2c-to-ggml)
IDS_SRC=$(cd "$(dirname "$0")/.." && pwd)/bench/e2e/llama_ids.cpp
CPU_FLAGS=""
grep -qw amx_tile /proc/cpuinfo 2>/dev/null && CPU_FLAGS="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"

built() {
  local t
  for t in "${TARGETS[@]}"; do [ -x "$DIR/bin/$t" ] || return 1; done
  [ -f "$DIR/gguf-py/gguf/__init__.py" ] && [ -x "$DIR/bin/llama-ids" ] && [ ! "$IDS_SRC" -nt "$DIR/bin/llama-ids" ] &&
    same_flags
}

# The build in the cache was made with this CPU's flags (a cache from before build-flags existed counts as none).
same_flags() { [ -f "$DIR/build-flags" ] && [ "$(cat "$DIR/build-flags")" = "$CPU_FLAGS" ]; }

# The token-id driver, linked against the static libraries of the cached build (OpenMP as in GGML_OPENMP=ON).
build_ids() {
  local b=$DIR/build
  # shellcheck disable=SC2086
  g++ -O2 -std=c++17 -march=native $CPU_FLAGS -I"$DIR/src/include" -I"$DIR/src/ggml/include" "$IDS_SRC" \
    -o "$DIR/bin/llama-ids.tmp" \
    "$b/src/libllama.a" "$b/ggml/src/libggml.a" "$b/ggml/src/libggml-cpu.a" "$b/ggml/src/libggml-base.a" \
    -fopenmp -lpthread -ldl -lm
  mv "$DIR/bin/llama-ids.tmp" "$DIR/bin/llama-ids"
}

case "${1:-build}" in
  dir)
    echo "$DIR"
    exit 0
    ;;
  check) # what the e2e smoke needs: the token-id driver and gguf-py (llama-bench only for the kernel row)
    if [ -x "$DIR/bin/llama-ids" ] && [ -f "$DIR/gguf-py/gguf/__init__.py" ] && same_flags &&
      [ ! "$IDS_SRC" -nt "$DIR/bin/llama-ids" ]; then exit 0; fi
    echo "llama.cpp is not built in $DIR for this CPU's flags, or llama-ids is older than its source (run" \
      "scripts/llamacpp.sh)" >&2
    exit 77
    ;;
  build) ;;
  *)
    echo "usage: scripts/llamacpp.sh [build|dir|check]" >&2
    exit 2
    ;;
esac

if built; then
  exit 0
fi
if [ -x "$DIR/bin/llama-bench" ] && [ -f "$DIR/gguf-py/gguf/__init__.py" ] && same_flags; then
  build_ids # only the driver is missing or older than its source
  exit 0
fi
boot=$(dirname "$0")/bootstrap.sh
"$boot" llamacpp
command -v npm >/dev/null || "$boot" npm
mkdir -p "$DIR"
cd "$DIR"
if [ ! -d src/.git ]; then
  rm -rf pkg src.tmp
  mkdir pkg
  (cd pkg && npm pack --silent "node-llama-cpp@$VERSION" >/dev/null && tar xzf "node-llama-cpp-$VERSION.tgz" package/llama)
  git -c advice.detachedHead=false clone -q pkg/package/llama/gitRelease.bundle src.tmp
  mv src.tmp src # renamed into place: a half-cloned tree is never taken for a source
  rm -rf pkg
fi
launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
gen=()
command -v ninja >/dev/null && gen=(-G Ninja)
rm -f build-flags
cmake -S src -B build "${gen[@]}" "${launcher[@]}" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DGGML_OPENMP=ON \
  "-DCMAKE_C_FLAGS=$CPU_FLAGS" "-DCMAKE_CXX_FLAGS=$CPU_FLAGS" \
  -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=ON -DLLAMA_BUILD_SERVER=OFF -DBUILD_SHARED_LIBS=OFF \
  >build.log
# libllama and the token-id driver first: an interrupted build already serves the agreement check and the rows.
nice -n 5 cmake --build build -j "$(nproc)" --target llama >>build.log
mkdir -p bin
rm -rf gguf-py.tmp && cp -r src/gguf-py gguf-py.tmp && rm -rf gguf-py && mv gguf-py.tmp gguf-py
build_ids
nice -n 5 cmake --build build -j "$(nproc)" --target "${TARGETS[@]}" >>build.log
for t in "${TARGETS[@]}"; do
  cp "build/bin/$t" "bin/$t.tmp" && mv "bin/$t.tmp" "bin/$t"
done
echo "$CPU_FLAGS" >build-flags.tmp && mv build-flags.tmp build-flags
echo "llamacpp: built ${TARGETS[*]} llama-ids in $DIR/bin" >&2
