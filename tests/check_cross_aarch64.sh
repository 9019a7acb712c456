#!/usr/bin/env bash
# The phone build: cross-builds a static aarch64 nl-run (cmake/aarch64-linux-gnu.cmake, runtime only, nl-run target
# only, in its own build folder), packs the bundled tiny ReLU model and stories260K (MODELS_DIR, by default the
# bundled datasets/), and checks that the aarch64 binary under qemu-aarch64-static generates
# exactly the native build's tokens (gate, dense and lowrank selection, f16 and f32 images; the C API's example program
# too; with stories260K also a
# text prompt through the llama2.c tokenizer, which the runtime-only build reads), and that its typed kernels (NEON,
# NEON dotprod) equal the portable reference bit for bit.
# Usage: check_cross_aarch64.sh SRC_DIR NATIVE_BUILD_DIR CROSS_BUILD_DIR MODELS_DIR. Exit 77 = skipped; every skip,
# whole or in part, is printed and written to NATIVE_BUILD_DIR/tests/skipped/cross_aarch64_tokens.txt.
set -euo pipefail
src=$1; native=$2; cross=$3; models=$4
skipfile=$native/tests/skipped/cross_aarch64_tokens.txt
mkdir -p "$(dirname "$skipfile")" && rm -f "$skipfile"
fail() { echo "cross aarch64: $*" >&2; exit 1; }
skip() { echo "cross aarch64: SKIPPED: $*" >&2; echo "$*" >"$skipfile"; exit 77; }
command -v aarch64-linux-gnu-g++ >/dev/null || skip "no aarch64-linux-gnu-g++ (scripts/bootstrap.sh cross)"
command -v qemu-aarch64-static >/dev/null || skip "no qemu-aarch64-static (scripts/bootstrap.sh cross)"
relu=$src/datasets/tiny-relu/model
[ -f "$relu/model.safetensors" ] || fail "$relu/model.safetensors is missing from the repository"

# 1. Cross build: configure once, then only the nl-run target (incremental on later runs).
if [ ! -f "$cross/CMakeCache.txt" ]; then
  gen=()
  command -v ninja >/dev/null && gen=(-G Ninja)
  cmake -S "$src" -B "$cross" "${gen[@]}" -DCMAKE_TOOLCHAIN_FILE="$src/cmake/aarch64-linux-gnu.cmake" \
    -DNL_RUNTIME_ONLY=ON -DNL_STATIC=ON -DNL_BUILD_TESTS=OFF -DCMAKE_BUILD_TYPE=Release >"$cross.configure.log" 2>&1 ||
    { cat "$cross.configure.log"; rm -f "$cross/CMakeCache.txt"; fail "configure failed"; }
fi
cmake --build "$cross" --target nl-run -j "$(nproc)" >"$cross.build.log" 2>&1 || { tail -50 "$cross.build.log"; fail "build failed"; }
arm=$cross/cli/nl-run
file_out=$(file -b "$arm" 2>/dev/null || true)
if [ -n "$file_out" ]; then
  case "$file_out" in
    *aarch64*static*|*ARM\ aarch64*statically*) ;;
    *) fail "$arm is not a static aarch64 executable: $file_out" ;;
  esac
fi
qemu-aarch64-static "$arm" --version

# 2. Pack and compare tokens, native vs qemu: the bundled tiny ReLU model (gate, dense, lowrank predictor; read as
#    fatrelu and drelu too) and stories260K (SiLU; f16 and f32) when installed.
work=$native/tests/cross_aarch64
rm -rf "$work"; mkdir -p "$work"
same_tokens() {  # image, label, nl-run generate options...
  local img=$1 label=$2; shift 2
  local args=(generate --image "$img" "$@") n a
  n=$("$native/cli/nl-run" --quiet "${args[@]}" | grep -E '^(tokens|lowrank):')
  a=$(qemu-aarch64-static "$arm" --quiet "${args[@]}" | grep -E '^(tokens|lowrank):')
  echo "$n" | grep -q '^tokens: [0-9]' || fail "native nl-run printed no tokens ($label)"
  [ "$n" = "$a" ] || fail "tokens differ ($label): native '$n', aarch64 '$a'"
  echo "cross aarch64: $label: same $(echo "$n" | head -1)"
}
"$native/cli/nl-layout" --quiet pack --model "$relu" --dtype f16 --out "$work/relu.nlw"
for sel in gate dense lowrank:32; do
  same_tokens "$work/relu.nlw" "tiny-relu f16 --select $sel" --prompt-tokens 1,100,200 --steps 24 --select "$sel" \
    --gap 2 --cache-ratio 0.1 --calibrate-steps 32
done
"$native/cli/nl-layout" --quiet pack --model "$relu" --dtype f32 --out "$work/relu32.nlw"
same_tokens "$work/relu32.nlw" "tiny-relu f32 --select gate" --prompt-tokens 1,100,200 --steps 24 --select gate \
  --gap 2 --cache-ratio 0.1
for dt in q8_0 q4_0; do
  "$native/cli/nl-layout" --quiet pack --model "$relu" --dtype "$dt" --out "$work/relu_$dt.nlw"
  for sel in gate dense; do
    same_tokens "$work/relu_$dt.nlw" "tiny-relu $dt --select $sel" --prompt-tokens 1,100,200 --steps 24 --select "$sel" \
      --gap 2 --cache-ratio 0.1
  done
done
# The sparse Llama FFNs on the same weights: ProSparse's fatrelu (threshold 0.1) and TurboSparse's dReLU (its gate
# keeps the up rows in DRAM), f16 and q4_0.
for fam in fatrelu drelu; do
  mkdir -p "$work/$fam"
  cp "$relu/model.safetensors" "$work/$fam/"
  param=$([ "$fam" = fatrelu ] && echo ', "hidden_act_param": 0.1' || true)
  sed -e "s/\"hidden_act\": *\"relu\"/\"hidden_act\": \"$fam\"$param/" "$relu/config.json" >"$work/$fam/config.json"
  grep -q "\"$fam\"" "$work/$fam/config.json" || fail "could not write the $fam config"
  for dt in f16 q4_0; do
    "$native/cli/nl-layout" --quiet pack --model "$work/$fam" --dtype "$dt" --out "$work/${fam}_$dt.nlw"
    for sel in gate dense; do
      same_tokens "$work/${fam}_$dt.nlw" "tiny-relu as $fam $dt --select $sel" --prompt-tokens 1,100,200 --steps 24 \
        --select "$sel" --gap 2 --cache-ratio 0.1
    done
  done
done
# OPT (learned positions, LayerNorm, biases, plain bundles) and Phi (parallel block, partial rotary, GeLU; gate and
# CATS threshold): random-weight checkpoints (tests/make_{opt,phi}_checkpoint.py, numpy), f16 and q4_0.
py=${NL_PYTHON:-/usr/bin/python3}
if "$py" -c 'import numpy' 2>/dev/null; then
  for fam in opt phi; do
    "$py" "$src/tests/make_${fam}_checkpoint.py" "$work/$fam" --max-pos 128
    sels=(gate dense)
    [ "$fam" = phi ] && sels+=(threshold:0.05)
    for dt in f16 q4_0; do
      "$native/cli/nl-layout" --quiet pack --model "$work/$fam" --dtype "$dt" --out "$work/${fam}_$dt.nlw"
      for sel in "${sels[@]}"; do
        same_tokens "$work/${fam}_$dt.nlw" "random $fam $dt --select $sel" --prompt-tokens 2,17,300,5 --steps 24 \
          --select "$sel" --gap 2 --cache-ratio 0.1
      done
    done
  done
else
  echo "cross aarch64: SKIPPED in part: OPT and Phi (no numpy for $py to write their checkpoints)" >&2
  echo "OPT and Phi (no numpy for $py)" >>"$skipfile"
fi
# The C API's example program (examples/nl_run_example.c), static aarch64 under qemu: nl-run's native tokens.
cmake --build "$cross" --target nl_run_example -j "$(nproc)" >>"$cross.build.log" 2>&1 ||
  { tail -50 "$cross.build.log"; fail "nl_run_example build failed"; }
for sel in gate dense lowrank:32; do
  opts=(--prompt-tokens 1,100,200 --steps 24 --select "$sel" --gap 2 --cache-ratio 0.1)
  n=$("$native/cli/nl-run" --quiet generate --image "$work/relu.nlw" "${opts[@]}" | grep -E '^tokens:')
  a=$(qemu-aarch64-static "$cross/examples/nl_run_example" "$work/relu.nlw" "${opts[@]}" 2>/dev/null | grep -E '^tokens:')
  [ "$n" = "$a" ] || fail "C API example, tiny-relu f16 --select $sel: native nl-run '$n', aarch64 example '$a'"
  echo "cross aarch64: C API example, tiny-relu f16 --select $sel: same $n"
done
model=$models/llama2c-stories260K/stories260K.bin
if [ ! -f "$model" ]; then
  why="stories260K part (SiLU model, text prompt through the llama2.c tokenizer): $model is absent"
  why="$why (MODELS_DIR points elsewhere; datasets/ bundles it)"
  echo "cross aarch64: SKIPPED part: $why" >&2
  echo "part: $why" >"$skipfile"
else
  for dt in f16 f32 q8_0; do
    "$native/cli/nl-layout" --quiet pack --model "$model" --dtype "$dt" --out "$work/m_$dt.nlw" \
      --tokenizer "$models/llama2c-stories260K/tok512.bin"
    for sel in gate dense; do
      same_tokens "$work/m_$dt.nlw" "stories260K $dt --select $sel" --prompt-tokens 1,403,407 --steps 24 --select "$sel" \
        --gap 2 --cache-ratio 0.1
    done
  done
  # Text prompt through the runtime's llama2.c tokenizer (the manifest's reference): same tokens and text.
  args=(generate --image "$work/m_f16.nlw" --prompt "Once upon a time, a little" --steps 20)
  n=$("$native/cli/nl-run" --quiet "${args[@]}" | grep -E '^(tokens|text):')
  a=$(qemu-aarch64-static "$arm" --quiet "${args[@]}" | grep -E '^(tokens|text):')
  echo "$n" | grep -q '^text: Once upon a time, a little' || fail "native nl-run printed no text: $n"
  [ "$n" = "$a" ] || fail "text prompt: native '$n', aarch64 '$a'"
  echo "cross aarch64: text prompt: same $(echo "$n" | tail -1)"
fi

# 3. The typed kernels on aarch64: every NEON path bitwise equal to the portable reference (test_runtime_kernels,
#    linked against the cross build's runtime; the x86 paths are checked the same way natively), so x86 = aarch64.
if [ -f /usr/include/doctest/doctest.h ]; then
  inc=$cross/doctest-include
  mkdir -p "$inc" && ln -sfn /usr/include/doctest "$inc/doctest"
  cmake --build "$cross" --target nl_runtime -j "$(nproc)" >>"$cross.build.log" 2>&1 || fail "nl_runtime build failed"
  aarch64-linux-gnu-g++ -std=gnu++20 -O2 -static -fopenmp -ffp-contract=off -I"$src" -I"$inc" -DNL_MODELS_DIR='""' \
    -DNL_SOURCE_DIR='""' -DNL_BINARY_DIR='""' -DNL_PYTHON='""' "$src/tests/doctest_main.cpp" \
    "$src/tests/test_runtime_kernels.cpp" "$cross/runtime/libnl_runtime.a" "$cross/formats/libnl_formats_core.a" \
    -o "$cross/test_runtime_kernels" >"$cross.kernels.log" 2>&1 || { tail -20 "$cross.kernels.log"; fail "kernel test build failed"; }
  qemu-aarch64-static "$cross/test_runtime_kernels" >"$cross.kernels.out" 2>&1 || { tail -30 "$cross.kernels.out"; fail "kernel paths differ on aarch64"; }
  echo "cross aarch64: typed kernels: $(grep -o 'kernel paths here: .*' "$cross.kernels.out") bitwise equal to portable"
else
  echo "cross aarch64: no doctest header: the aarch64 kernel test is not run"
fi
echo "cross aarch64: OK (static aarch64 nl-run under qemu generates the native tokens)"
