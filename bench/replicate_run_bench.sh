#!/usr/bin/env bash
# Flash replication on the runtime (issue 20 item 3, stage 4): nl-run replay ms/token with real O_DIRECT reads of a
# packed image, greedy+ls at --replicate-budget 0 % against 10 %, on the OPT-6.7B preset (synthetic trace, 2 layers,
# seed 1) and synthetic random f16 FFN weights of its shape (4096 x 16384, plain ReLU bundles of 16 KiB), 5 % cache,
# --gap auto priced with UFS 4.0 (the pack's recorded planner). Runs alternate 0 % / 10 %; prints medians [min-max]
# of replay's I/O ms/token and wall ms/token, its reads/token, and nl-layout eval's prediction for the same tokens (the
# whole held-out trace, 2,048 tokens).
#   bench/replicate_run_bench.sh BUILD WORKDIR [RUNS]
# WORKDIR needs ~1.4 GB (traces and two images); it is the caller's to delete.
set -euo pipefail
BUILD=$(realpath "${1:?build dir}")
WORK=${2:?work dir}
RUNS=${3:-5}
SRC=$(realpath "$(dirname "$0")/..")
P=$BUILD/cli/nl-profile
L=$BUILD/cli/nl-layout
R=$BUILD/cli/nl-run
UFS=$SRC/configs/devices/ufs40.json
PY=/usr/bin/python3
mkdir -p "$WORK"
cd "$WORK"
NICE="nice -n 10"
[ -f opt67_p.h5 ] || $NICE "$P" -q synth --preset "$SRC/configs/workloads/opt-6.7b.json" --layers 2 --seed 1 \
  --profile-out opt67_p.h5 --test-out opt67_t.h5
for pct in 0 10; do
  [ -f "r$pct.json" ] || $NICE "$L" -q solve --trace opt67_p.h5 --replicate-budget "$pct%" --out "r$pct.json"
  [ -f "r$pct.nlw" ] || $NICE "$L" -q pack --synthetic-shape 4096x16384 --layers 2 --dtype f16 --layout "r$pct.json" \
    --device "$UFS" --out "r$pct.nlw"
done
echo "synthetic: OPT-6.7B preset trace (2 layers, seed 1), random f16 FFN weights 4096x16384 (plain ReLU, 16 KiB bundles)"
for pct in 0 10; do
  "$L" -q --json eval --trace opt67_t.h5 --layout "r$pct.json" --gap auto --device "$UFS" --cache-ratio 0.05 \
    --bundle-bytes 16384 >"eval$pct.json"
done
: >runs.txt
for i in $(seq "$RUNS"); do
  for pct in 0 10; do
    "$R" -q --json replay --image "r$pct.nlw" --trace opt67_t.h5 --gap auto --device "$UFS" \
      --cache-ratio 0.05 >"replay$pct.json"
    $PY - "$pct" "replay$pct.json" >>runs.txt <<'EOF'
import json, sys
j = json.load(open(sys.argv[2]))
t, n = j["totals"], j["tokens"]
print(sys.argv[1], t["io_seconds"] * 1e3 / n, j["wall_seconds"] * 1e3 / n, t["reads"] / n, t["bytes_read"] / n / 1024,
      j["direct"], j.get("replication", {}).get("second_copy_reads", 0) / n)
EOF
  done
done
$PY - <<'EOF'
import json, statistics, sys
rows = [l.split() for l in open("runs.txt")]
print("| budget | replay I/O ms/tok, median [min-max] | replay wall ms/tok | replay reads/tok | eval reads/tok | eval io ms/tok (UFS 4.0 model) | second-copy reads/tok | O_DIRECT | runs |")
print("|---|---|---|---|---|---|---|---|---|")
for pct in ("0", "10"):
    r = [x for x in rows if x[0] == pct]
    io = sorted(float(x[1]) for x in r)
    wall = sorted(float(x[2]) for x in r)
    e = json.load(open("eval%s.json" % pct))["layouts"][0]
    print("| %s %% | %.3f [%.3f-%.3f] | %.3f [%.3f-%.3f] | %.2f | %.2f | %.4f | %.2f | %s | %d |" % (
        pct, statistics.median(io), io[0], io[-1], statistics.median(wall), wall[0], wall[-1], float(r[0][3]),
        e["reads"], e["io_ms"], float(r[0][6]), r[0][5], len(r)))
EOF
