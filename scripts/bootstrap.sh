#!/usr/bin/env bash
# Installs the Debian 12 packages the toolkit needs, only those that are missing (idempotent).
# Usage: scripts/bootstrap.sh [build|demo|cross|report|train|corpus-large]...   (default: build)
#   build  compilers, CMake, libraries, Python h5py for the format tests, squashfs-tools for the EIO test
#   demo   + English text corpora (fortunes, jargon-text, bible-kjv) for the bundled default run
#   cross  + aarch64 cross compiler and qemu-user for the phone build test
#   report + headless Chromium for the HTML report test
#   train  + PyTorch (CPU) for datasets/tiny-relu/train.py and the trace-hook test (profiler/python)
#   fuzz   + clang and libFuzzer for fuzz/ (the fuzz smoke is part of ./run.sh test)
#   llamacpp + git, CMake, g++, ccache for scripts/llamacpp.sh (the real llama.cpp baseline of bench/e2e); npm: + npm
#   corpus-large + the Debian text packages of `corpus.py --size large` (datasets/medium-relu: ~100 MB of English)
set -euo pipefail

declare -A GROUP
GROUP[build]="build-essential cmake ninja-build pkg-config git libboost-graph-dev libhdf5-dev libcli11-dev nlohmann-json3-dev doctest-dev liburing-dev libxxhash-dev libsentencepiece-dev sentencepiece libstb-dev libdeflate-dev python3 python3-h5py python3-numpy clang-format squashfs-tools"
GROUP[demo]="fortunes fortunes-min jargon-text bible-kjv"
GROUP[cross]="g++-aarch64-linux-gnu qemu-user-static"
GROUP[report]="chromium"
GROUP[train]="python3-torch libopenblas0-pthread python3-sentencepiece"
GROUP[fuzz]="clang libclang-rt-14-dev"
GROUP[llamacpp]="git cmake g++ ninja-build ccache"
GROUP[npm]="npm"  # only when no npm is on PATH (scripts/llamacpp.sh asks; NodeSource installs ship their own)
GROUP[corpus-large]="r-cran-janeaustenr perl-doc manpages manpages-dev man-db groff-base python3.11-doc linux-doc-6.1 postgresql-doc-15 python-django-doc git-doc sqlite3-doc dict-foldoc dict-devil dict-gcide"

groups=("$@")
[ ${#groups[@]} -eq 0 ] && groups=(build)
want=()
for g in "${groups[@]}"; do
  [ -n "${GROUP[$g]+x}" ] || { echo "bootstrap: unknown group '$g' (build, demo, cross, report, train, fuzz, llamacpp, npm, corpus-large)" >&2; exit 2; }
  # shellcheck disable=SC2206
  want+=(${GROUP[$g]})
done

missing=()
for p in "${want[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then missing+=("$p"); fi
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "bootstrap: missing Debian packages: ${missing[*]}" >&2
  echo "bootstrap: run as root, or: sudo apt-get install -y ${missing[*]}" >&2
  exit 1
fi
echo "bootstrap: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
