#!/usr/bin/env bash
# Issue 18's two 7B acceptance points on the whole synthetic Llama-2-7B shape at q8_0 (synthetic random weights and a
# synthetic ProSparse-shaped trace: timing only, the text is meaningless):
#   memory  - peak RSS against dense bytes + KV cache + neuron cache + 300 MiB (10 % cache, 512-token context);
#   overlap - decode seconds per token with --overlap none|layer|cross|both (alternated, REPS rounds) against
#             max(compute, I/O) of the non-overlapped runs' phases; medians [min-max].
# FFN reads use O_DIRECT (io_uring), so they never come from the page cache. The image (~7.2 GB) and the trace are
# made in SCRATCH unless present and deleted at the end unless KEEP=1.
# Usage: bench/overlap_7b.sh BUILD_DIR SCRATCH_DIR [REPS=3] [STEPS=8]     (THREADS defaults to nproc)
# VARIANTS (default "none layer cross both"): the --overlap modes run, alternated; MODE@BYTES also passes
# --read-ahead BYTES (e.g. "none layer both@8MiB"). "none" must be one of them (the non-overlapped phases).
set -euo pipefail
BUILD=${1:?usage: bench/overlap_7b.sh BUILD_DIR SCRATCH_DIR [REPS] [STEPS]}
S=${2:?scratch directory}
REPS=${3:-3}
STEPS=${4:-8}
THREADS=${THREADS:-$(nproc)}
VARIANTS=${VARIANTS:-none layer cross both}
case " $VARIANTS " in *" none "*) ;; *) echo "VARIANTS must include none" >&2; exit 2 ;; esac
SRC=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$S"
IMG=$S/l7b.q8_0.nlw
TR=$S/l7b.trace.h5
made=()
if [ ! -f "$IMG" ]; then
  "$BUILD/cli/nl-layout" -q pack --synthetic-shape llama2-7b --dtype q8_0 --out "$IMG"
  made+=("$IMG" "$IMG.json")
fi
if [ ! -f "$TR" ]; then
  "$BUILD/cli/nl-profile" -q synth --preset "$SRC/configs/workloads/llama2-7b-prosparse.json" --layers 32 \
    --tokens-per-sequence 128 --profile-sequences 1 --test-sequences 1 --seed 1 --profile-out "$TR"
  made+=("$TR")
fi
echo "synthetic: Llama-2-7B shape, random weights, synthetic trace; $REPS rounds x variants ($VARIANTS), $STEPS tokens each," \
  "$THREADS threads; load average at start: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
for r in $(seq 1 "$REPS"); do
  for ov in $VARIANTS; do
    extra=()
    case $ov in *@*) extra=(--read-ahead "${ov#*@}") ;; esac
    "$BUILD/cli/nl-run" -q --json --threads "$THREADS" generate --image "$IMG" --select "trace:$TR" --prompt-tokens 1 \
      --steps "$STEPS" --context 512 --cache-ratio 0.1 --io uring --overlap "${ov%@*}" "${extra[@]}" \
      >"$S/run_${ov}_$r.json"
    echo "round $r $ov done; load average $(cut -d' ' -f1-3 /proc/loadavg)" >&2
  done
done
/usr/bin/python3 - "$S" "$REPS" $VARIANTS <<'PY'
import json, statistics, sys
S, reps, variants = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
def load(ov, r): return json.load(open(f"{S}/run_{ov}_{r}.json"))
def fmt(v): return f"{statistics.median(v):.3f} [{min(v):.3f}-{max(v):.3f}]"
MiB = 1 << 20
print("SYNTHETIC (random weights, synthetic trace: timing only, text meaningless)")
print("memory (every run): peak RSS = dense + KV + cache + other; acceptance: other <= 300 MiB")
for ov in variants:
    for r in range(1, reps + 1):
        m = load(ov, r)["memory"]
        other = m["peak_rss_bytes"] - m["dense_bytes"] - m["kv_cache_bytes"] - m["cache_bytes"]
        print(f"  {ov:5} {r}: peak {m['peak_rss_bytes']:,} = dense {m['dense_bytes']:,} + KV {m['kv_cache_bytes']:,}"
              f" + cache {m['cache_bytes']:,} + other {other:,} ({other / MiB:.1f} MiB) -> "
              f"{'met' if other <= 300 * MiB else 'MISSED'}")
base = {}
for r in range(1, reps + 1):
    g = load("none", r)["generation"]
    n = g["decode_forwards"]
    base[r] = ((g["decode_seconds"] - g["decode_io_seconds"]) / n, g["decode_io_seconds"] / n)
print("non-overlapped phases per decode token (none runs): compute", fmt([b[0] for b in base.values()]),
      "s, I/O", fmt([b[1] for b in base.values()]), "s")
print("variant  decode s/token        I/O busy s/token      I/O waited s/token    hidden share   "
      "ratio to max(compute, I/O) of the same round's none run   ratio to its own max(compute, I/O busy)")
for ov in variants:
    d, busy, wait, share, ratio, own = [], [], [], [], [], []
    for r in range(1, reps + 1):
        j = load(ov, r)
        g = j["generation"]
        n = g["decode_forwards"]
        d.append(g["decode_seconds"] / n)
        busy.append(g["decode_io_busy_seconds"] / n)
        wait.append(g["decode_io_seconds"] / n)
        share.append(1 - wait[-1] / busy[-1] if busy[-1] > 0 else 0)
        ratio.append(d[-1] / max(base[r]))
        own.append(d[-1] / max(d[-1] - wait[-1], busy[-1]))
    print(f"{ov:11}   {fmt(d):21} {fmt(busy):21} {fmt(wait):21} {fmt(share):14} {fmt(ratio)}   {fmt(own)}")
    o = load(ov, 1)["overlap"]
    if o["prefetches"]:
        print(f"         read-ahead (round 1): predicted {o['predicted_bundles']:,} bundles, needed {o['needed_bundles']:,},"
              f" both {o['predicted_and_needed_bundles']:,}; read ahead {o['prefetch_bytes']:,} B, of them used "
              f"{o['prefetch_used_bytes']:,} B, extra {int(o['extra_bytes']):,} B, late {o['late_bytes']:,} B")
print("acceptance: decode s/token <= 1.15 x max(compute, I/O) of the non-overlapped phases")
PY
if [ "${KEEP:-0}" != 1 ]; then rm -f "${made[@]}" "$S"/run_*.json; fi
