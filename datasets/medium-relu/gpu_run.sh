#!/usr/bin/env bash
# The GPU side of datasets/medium-relu (issue 55): one verb per device call, run from anywhere in the repository.
#   gpu_run.sh check      the GPU, torch, a smoke test of the model (smoke.py), which token-id parts are here
#   gpu_run.sh train      check the parts -> train.py (budget TRAIN_SECONDS) -> int8 export -> pack -> part 1 in $OUT
#   gpu_run.sh export     after a cut-off run: export the last checkpoint -> pack -> part 1 in $OUT
#   gpu_run.sh fetch N    part N (2, ...) of the packed result in $OUT
# Environment: OUT (the device tool's return folder; default build/medium-relu/out), PROFILE=medium (default) or
# tiny (the CPU rehearsal: a 2-layer model on the CPU, small chunks so that the result spans several parts),
# TRAIN_SECONDS (training-loop budget counted from train.py's start; default 420), PYTHON (default python3),
# EXTRA_ARGS (more train.py options). SHIP (token ids, carried) and WORK (checkpoints, the exported model, the
# packed parts: kept on the machine between calls while it stays warm) default to build/medium-relu/{ship,work}.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
VERB=${1:-}
PROFILE=${PROFILE:-medium}
SHIP=${SHIP:-build/medium-relu/ship}
WORK=${WORK:-build/medium-relu/work}
OUT=${OUT:-build/medium-relu/out}
PY=${PYTHON:-python3}
TRAIN_SECONDS=${TRAIN_SECONDS:-420}
export PYTHONUNBUFFERED=1
case $PROFILE in
  medium)  # ~107M parameters: hidden 768, 12 layers, FFN 3072, 12 query / 4 key-value heads, context 256
    ARGS=(--dim 768 --ffn 3072 --layers 12 --heads 12 --kv-heads 4 --seq-len 256 --batch 128 --lr 6e-4
          --warmup 200 --steps 100000 --eval-every 100 --ckpt-every 1000000 --ckpt-seconds 120 --device cuda
          --amp bfloat16 --attn auto --threads 16 --eval-windows 256)
    CHUNK_MIB=${CHUNK_MIB:-15} ;;
  tiny)    # the CPU rehearsal of the same path
    ARGS=(--dim 64 --ffn 256 --layers 2 --heads 4 --kv-heads 2 --seq-len 64 --batch 8 --lr 2e-3 --warmup 5
          --steps 40 --eval-every 10 --ckpt-every 1000 --ckpt-seconds 5 --device cpu --amp none --attn auto
          --threads 2 --eval-windows 16 --probe-steps 8)
    CHUNK_MIB=${CHUNK_MIB:-0.125} ;;
  *) echo "gpu_run.sh: PROFILE must be medium or tiny" >&2; exit 2 ;;
esac
# shellcheck disable=SC2206
COMMON=(--ids "$SHIP" --work "$WORK" --out "$WORK/model" --keep-best --dtype bfloat16 --export-quant int8
        --max-seconds "$TRAIN_SECONDS" ${EXTRA_ARGS:-})
mkdir -p "$OUT" "$WORK"

check() {  # exit 3 when a part is missing or damaged (carry it again)
  "$PY" - "$SHIP" <<'EOF'
import hashlib, json, os, sys
ship = sys.argv[1]
if not os.path.exists(os.path.join(ship, "ids.json")):
    print("check: no ids.json in %s (carry it)" % ship)
    sys.exit(3)
meta = json.load(open(os.path.join(ship, "ids.json")))
bad = []
for split, m in sorted(meta["splits"].items()):
    for p in m["parts"]:
        path = os.path.join(ship, p["file"])
        ok = os.path.exists(path) and hashlib.sha256(open(path, "rb").read()).hexdigest() == p["sha256"]
        print("check: %-22s %s" % (p["file"], "ok" if ok else "MISSING or damaged"))
        bad += [] if ok else [p["file"]]
tok = os.path.join(ship, "tokenizer.model")
if not os.path.exists(tok) or hashlib.sha256(open(tok, "rb").read()).hexdigest() != meta["tokenizer_sha256"]:
    bad.append("tokenizer.model")
print("check: %s" % ("all parts here" if not bad else "carry again: " + " ".join(bad)))
sys.exit(3 if bad else 0)
EOF
}

device_info() {  # the torch line only with an argument (importing torch costs seconds of device time)
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  [ $# -gt 0 ] && "$PY" -c 'import torch; print("torch", torch.__version__, "cuda", torch.cuda.is_available(),
    torch.cuda.get_device_name(0) if torch.cuda.is_available() else "")'
  df -h "$WORK" | tail -1
}

pack_out() {  # pack the exported model and put part 1 in $OUT
  "$PY" datasets/medium-relu/returns.py pack "$WORK/model" "$WORK" "$WORK/pack" --chunk-mib "$CHUNK_MIB" || return 1
  cp "$WORK"/pack/part-1/* "$OUT"/ && ls -l "$OUT"
}

train_py() {
  "$PY" -u datasets/tiny-relu/train.py "${ARGS[@]}" "${COMMON[@]}" "$@"
}

case $VERB in
  check)  # also a smoke test of the run's model on this device (sdpa vs explicit attention, s/step)
    device_info torch
    "$PY" datasets/medium-relu/smoke.py "${ARGS[@]}" --max-seconds "$TRAIN_SECONDS"
    smoke=$?
    check
    rc=$?
    [ $smoke -eq 0 ] || { echo "gpu_run.sh: THE SMOKE TEST FAILED (exit $smoke)"; exit 4; }
    exit $rc ;;
  train)
    device_info
    check || exit 3
    t0=$(date +%s)
    # SIGTERM at the budget's end plus 110 s (export, final evaluation, references) makes train.py stop training
    # and export; a process still alive 20 s later is killed and the last checkpoint is exported instead (all
    # within the device tool's 600 s when TRAIN_SECONDS is 420).
    timeout -s TERM -k 20 $((TRAIN_SECONDS + 110)) "$PY" -u datasets/tiny-relu/train.py "${ARGS[@]}" "${COMMON[@]}" \
      2>&1 | tee "$WORK/train.log"
    rc=${PIPESTATUS[0]}
    echo "gpu_run.sh: train.py exited $rc after $(( $(date +%s) - t0 )) s"
    if [ "$rc" -ne 0 ] || [ ! -f "$WORK/summary.json" ]; then
      [ -f "$WORK/ckpt.pt" ] || { echo "gpu_run.sh: no checkpoint to export" >&2; cp "$WORK/train.log" "$OUT"/; exit 1; }
      echo "gpu_run.sh: exporting the last checkpoint"
      train_py --export-only 2>&1 | tee -a "$WORK/train.log"
    fi
    pack_out ;;
  export)
    [ -f "$WORK/ckpt.pt" ] || { echo "gpu_run.sh: no checkpoint in $WORK" >&2; exit 1; }
    train_py --export-only 2>&1 | tee -a "$WORK/train.log"
    pack_out ;;
  fetch)
    n=${2:?usage: gpu_run.sh fetch N}
    [ -d "$WORK/pack/part-$n" ] || { echo "gpu_run.sh: no part $n in $WORK/pack (machine given back?)" >&2; exit 1; }
    cp "$WORK/pack/part-$n"/* "$OUT"/ && ls -l "$OUT" ;;
  *) sed -n '2,11p' "$0"; exit 2 ;;
esac
