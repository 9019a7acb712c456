#!/usr/bin/env bash
# Checks every tracked C++ file (*.h, *.cpp, *.hpp, *.cc) against the checked-in .clang-format: prints each file
# clang-format would change and exits 1 if there is any (0 when all follow it, 2 when clang-format is missing).
# Fix a file with `clang-format -i FILE`. Registered in the test suite as `clang_format` (tests/CMakeLists.txt).
#   scripts/check_format.sh [FILE...]      default: every tracked C++ file
set -euo pipefail
cd "$(dirname "$0")/.."
CF=${CLANG_FORMAT:-clang-format}
command -v "$CF" >/dev/null || { echo "check_format: $CF not found (apt-get install clang-format)" >&2; exit 2; }
if [ $# -gt 0 ]; then
  files=("$@")
else
  mapfile -t files < <(git ls-files '*.h' '*.cpp' '*.hpp' '*.cc')
fi
bad=0
for f in "${files[@]}"; do
  if ! "$CF" --style=file --dry-run -Werror "$f" >/dev/null 2>&1; then
    echo "not formatted: $f"
    bad=$((bad + 1))
  fi
done
echo "check_format: $bad of ${#files[@]} C++ files differ from .clang-format ($("$CF" --version | head -1))"
[ "$bad" -eq 0 ]
