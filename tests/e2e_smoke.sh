#!/bin/sh
# Smoke of the end-to-end benchmark against the real llama.cpp (bench/e2e/run.py --smoke): stories260K packed by
# nl-layout, written to GGUF by scripts/gguf_from_image.py, run by llama.cpp (llama-ids) and nl-run under the
# memory cap. Fails when the two engines' greedy tokens differ (f32 and f16; f16 also teacher-forced: each of
# llama.cpp's steps replayed in nl-run from its prefix), when nl-run --select gate differs from dense, or when a row
# of the harness has no figures (the kernel row only once llama-bench is built). Not a
# benchmark: 1 repetition, 8 tokens, no figures compared.
#   e2e_smoke.sh SOURCE_DIR BINARY_DIR MODELS_DIR   exit 77 (CTest: skipped) when llama.cpp is not built
#   (./run.sh test builds it: scripts/llamacpp.sh) or the model is absent
set -eu
src=$1 bin=$2 models=$3
if ! "$src/scripts/llamacpp.sh" check; then
  echo "e2e_smoke: skipped: llama.cpp is not built (scripts/llamacpp.sh builds it; ./run.sh test does)"
  exit 77
fi
if [ ! -f "$models/llama2c-stories260K/stories260K.bin" ]; then
  echo "e2e_smoke: skipped: $models/llama2c-stories260K/stories260K.bin not found"
  exit 77
fi
work=$bin/tests/e2e_smoke_tmp
rm -rf "$work" && mkdir -p "$work"
run="/usr/bin/python3 $src/bench/e2e/run.py --build $bin --models $models --work $work"
rc=0
$run --smoke --json "$work/smoke.json" || rc=$?
if [ $rc -eq 77 ]; then
  echo "e2e_smoke: skipped: no memory cgroup to cap the runs (root and cgroup v1/v2 memory controller needed)"
  exit 77
fi
[ $rc -eq 0 ] || exit $rc
$run --agreement-only --teacher-forced --shapes stories260k --dtypes f16 --steps 32 --profile-tokens 2048 \
  --json "$work/f16.json"
/usr/bin/python3 - "$work/smoke.json" "$work/f16.json" <<'PY'
import json, sys
smoke, f16 = (json.load(open(p))["shapes"][0] for p in sys.argv[1:3])
bad = []
for res in (smoke, f16):
    if "not_available" in res:
        bad.append("%s %s not available: %s" % (res["shape"], res["dtype"], res["not_available"]))
        continue
    a = res["agreement"]
    if a.get("llama") != a["nl_dense"]:
        bad.append("%s: llama.cpp tokens %s != nl-run dense %s" % (res["dtype"], a.get("llama"), a["nl_dense"]))
    if a.get("nl_gate") != a["nl_dense"]:
        bad.append("%s: nl-run gate tokens differ from dense" % res["dtype"])
    print("%s: %d/%d greedy tokens equal between llama.cpp and nl-run" % (res["dtype"], a.get("agree", 0),
                                                                         a.get("of", 0)))
tf = f16.get("agreement", {}).get("teacher_forced")  # each of llama.cpp's steps replayed in nl-run from its prefix
if not tf or tf["of"] != 32 or len(tf["margins"]) != 32 or tf["agree"] != tf["of"]:
    bad.append("f16 teacher-forced agreement not 32/32: %s" % tf)
rows = smoke.get("rows", {})
want = ["llama.cpp mmap, capped", "llama.cpp mmap, uncapped (warm)", "nl-run --select dense, uncapped (warm)"] + [
    "nl-run %s, overlap %s, capped" % (m, o) for m in ("identity", "greedy", "greedy+ls") for o in ("off", "on")]
for w in want:
    r = rows.get(w)
    if not r or "failed" in r or not r["decode_ms"] or min(r["decode_ms"]) <= 0 or not r["peak_rss_mib"]:
        bad.append("row %r has no figures: %s" % (w, r))
for m in ("identity", "greedy", "greedy+ls"):  # the decode passes' own FFN bytes (nl-run --metrics)
    r = rows.get("nl-run %s, overlap off, capped" % m) or {}
    if not r.get("decode_ffn_read_per_token", 0) > 0 or not r.get("decode_ffn_needed_per_token", 0) > 0:
        bad.append("row nl-run %s has no decode-pass FFN bytes: %s" % (m, r))
if smoke.get("bound", {}).get("needed_from") != "decode passes":
    bad.append("bound not from the decode passes' needed bytes: %s" % smoke.get("bound"))
if smoke.get("cap_bytes", 0) <= 256 << 20:
    bad.append("cap not computed")
if "kernel" in smoke:
    if min(v["tg_tok_s"] for v in smoke["kernel"]["llama"].values()) <= 0:
        bad.append("kernel row without figures")
elif "kernel row" in smoke.get("unavailable", {}):
    print("e2e_smoke: kernel row not checked: %s" % smoke["unavailable"]["kernel row"])
else:
    bad.append("kernel row missing")
for b in bad:
    print("e2e_smoke: FAIL: " + b)
sys.exit(1 if bad else 0)
PY
rm -rf "$work"
