#!/bin/bash
# What nl-run --verify-reads costs (issue 56 item 12): the same generation with and without the option, alternated,
# page cache dropped before each run (root), and the hashing time nl-run counts itself (decode_verify_seconds).
#   bench/verify_reads_cost.sh NL_RUN IMAGE.nlw TRACE.h5 [REPS=3] [EXTRA nl-run generate options...]
# The 7B protocol's cell: IMAGE and TRACE from `bench/e2e/run.py --shapes llama2-7b --dtypes q8_0 --keep`
# (WORK/llama2-7b/greedy+ls.q8_0.nlw and test.h5); the prompt is the harness's 16 ids, 32 tokens decoded.
set -euo pipefail
R=$1 IMG=$2 TRACE=$3 REPS=${4:-3}
shift $(($# < 4 ? $# : 4))
VOCAB=$(/usr/bin/python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['model']['vocab_size'])" "$IMG.json")
P=$(/usr/bin/python3 -c "
import sys
ids, x, vocab = [1], 12345, int(sys.argv[1])
while len(ids) < 16:
    x = (x * 1103515245 + 12345) % (1 << 31)
    ids.append(3 + x % (vocab - 3))
print(','.join(map(str, ids)))" "$VOCAB")
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
for rep in $(seq "$REPS"); do
  for v in plain verify; do
    [ "$(id -u)" = 0 ] && { sync; echo 3 >/proc/sys/vm/drop_caches; }
    flag=()
    [ $v = verify ] && flag=(--verify-reads)
    "$R" --threads 2 generate --image "$IMG" --select "trace:$TRACE" --prompt-tokens "$P" --steps 32 \
      --cache-ratio 0.1 --io uring --json -q "${flag[@]}" "$@" >"$out/r.json"
    /usr/bin/python3 - "$out/r.json" "$rep" "$v" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))["generation"]
n = j["decode_forwards"]
print("rep %s %-6s decode %8.2f ms/token  hashing %6.2f ms/token (%4.1f %% of decode)  load %s" % (
    sys.argv[2], sys.argv[3], 1e3 * j["decode_seconds"] / n, 1e3 * j["decode_verify_seconds"] / n,
    100 * j["decode_verify_seconds"] / j["decode_seconds"], open("/proc/loadavg").read().split()[0]))
PY
  done
done
