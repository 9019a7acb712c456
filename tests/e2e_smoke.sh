#!/bin/sh
# Smoke of the end-to-end benchmark against the real llama.cpp (bench/e2e/run.py --smoke): the bundled gated-ReLU
# model tiny-relu (always; llama.cpp runs it as its "smallthinker" arch with one expert) and stories260K (SiLU, when
# MODELS_DIR has it) packed by nl-layout, written to GGUF by scripts/gguf_from_image.py, run by llama.cpp
# (llama-ids) and nl-run under the memory cap. Fails when the two engines' greedy tokens differ (f32 and f16; f16
# also teacher-forced: each of llama.cpp's steps replayed in nl-run from its prefix), when nl-run --select gate
# differs from dense, or when a row of the harness has no figures (the kernel row only once llama-bench is built).
# Not a benchmark: 1 repetition, 8 tokens, no figures compared.
#   e2e_smoke.sh SOURCE_DIR BINARY_DIR MODELS_DIR   exit 77 (CTest: skipped) when llama.cpp is not built
#   (./run.sh test builds it: scripts/llamacpp.sh); without stories260K its part is skipped, printed and written to
#   BINARY_DIR/tests/skipped/e2e_smoke.txt
set -eu
src=$1 bin=$2 models=$3
skipfile=$bin/tests/skipped/e2e_smoke.txt
mkdir -p "$(dirname "$skipfile")" && rm -f "$skipfile"
if ! "$src/scripts/llamacpp.sh" check; then
  echo "e2e_smoke: skipped: llama.cpp is not built (scripts/llamacpp.sh builds it; ./run.sh test does)"
  exit 77
fi
shapes=tiny-relu
if [ -f "$models/llama2c-stories260K/stories260K.bin" ]; then
  shapes=tiny-relu,stories260k
else
  echo "stories260K part: $models/llama2c-stories260K/stories260K.bin is absent" \
    "(NL_MODELS_DIR points elsewhere; datasets/ bundles it);" \
    "the tiny-relu part ran" | tee "$skipfile"
fi
work=$bin/tests/e2e_smoke_tmp
rm -rf "$work" && mkdir -p "$work"
run="/usr/bin/python3 $src/bench/e2e/run.py --build $bin --models $models --work $work"
rc=0
$run --smoke --shapes "$shapes" --json "$work/smoke.json" || rc=$?
if [ $rc -eq 77 ]; then
  echo "e2e_smoke: skipped: no memory cgroup to cap the runs (root and cgroup v1/v2 memory controller needed)"
  exit 77
fi
[ $rc -eq 0 ] || exit $rc
$run --agreement-only --teacher-forced --shapes "$shapes" --dtypes f16 --steps 32 --profile-tokens 2048 \
  --json "$work/f16.json"
/usr/bin/python3 - "$work/smoke.json" "$work/f16.json" "$shapes" <<'PY'
import json, sys
smoke_all, f16_all = (json.load(open(p))["shapes"] for p in sys.argv[1:3])
want_shapes = sys.argv[3].split(",")
bad = []
for name, shapes in (("smoke", smoke_all), ("f16", f16_all)):
    got = [s["shape"] for s in shapes]
    if got != want_shapes:
        bad.append("%s run: shapes %s, expected %s" % (name, got, want_shapes))
for smoke, f16 in zip(smoke_all, f16_all):
    shape = smoke["shape"]
    for res in (smoke, f16):
        if "not_available" in res:
            bad.append("%s %s not available: %s" % (res["shape"], res["dtype"], res["not_available"]))
            continue
        a = res["agreement"]
        if a.get("llama") != a["nl_dense"]:
            bad.append("%s %s: llama.cpp tokens %s != nl-run dense %s" % (shape, res["dtype"], a.get("llama"),
                                                                        a["nl_dense"]))
        if a.get("nl_gate") != a["nl_dense"]:
            bad.append("%s %s: nl-run gate tokens differ from dense" % (shape, res["dtype"]))
        print("%s %s: %d/%d greedy tokens equal between llama.cpp and nl-run" % (shape, res["dtype"],
                                                                               a.get("agree", 0), a.get("of", 0)))
    tf = f16.get("agreement", {}).get("teacher_forced")  # each of llama.cpp's steps replayed in nl-run from its prefix
    if not tf or tf["of"] != 32 or len(tf["margins"]) != 32 or tf["agree"] != tf["of"]:
        bad.append("%s f16 teacher-forced agreement not 32/32: %s" % (shape, tf))
    rows = smoke.get("rows", {})
    want = ["llama.cpp mmap, capped", "llama.cpp mmap, uncapped (warm)", "nl-run --select dense, uncapped (in DRAM)"] + [
        "nl-run %s, overlap %s, capped" % (m, o) for m in ("identity", "greedy", "greedy+ls") for o in ("off", "on")]
    for w in want:
        r = rows.get(w)
        if not r or "failed" in r or not r["decode_ms"] or min(r["decode_ms"]) <= 0 or not r["peak_rss_mib"]:
            bad.append("%s: row %r has no figures: %s" % (shape, w, r))
    for m in ("identity", "greedy", "greedy+ls"):  # what nl-run ran: none, and its default (auto) resolved to both
        for o, mode in (("off", "none"), ("on", "both")):
            r = rows.get("nl-run %s, overlap %s, capped" % (m, o)) or {}
            if r.get("overlap_mode") != mode:
                bad.append("%s: row nl-run %s, overlap %s ran --overlap %s, not %s" % (shape, m, o,
                                                                                    r.get("overlap_mode"), mode))
    for m in ("identity", "greedy", "greedy+ls"):  # the decode passes' own FFN bytes (nl-run --metrics)
        r = rows.get("nl-run %s, overlap off, capped" % m) or {}
        if not r.get("decode_ffn_read_per_token", 0) > 0 or not r.get("decode_ffn_needed_per_token", 0) > 0:
            bad.append("%s: row nl-run %s has no decode-pass FFN bytes: %s" % (shape, m, r))
    if smoke.get("bound", {}).get("needed_from") != "decode passes":
        bad.append("%s: bound not from the decode passes' needed bytes: %s" % (shape, smoke.get("bound")))
    if smoke.get("cap_bytes", 0) <= 256 << 20:
        bad.append("%s: cap not computed" % shape)
    if smoke.get("select") != "gate":
        bad.append("%s: nl-run's rows do not read the model's real gate (--select %s)" % (shape, smoke.get("select")))
    if "kernel" in smoke:
        if min(v["tg_tok_s"] for v in smoke["kernel"]["llama"].values()) <= 0:
            bad.append("%s: kernel row without figures" % shape)
        if shape.endswith("-relu"):  # gated ReLU: llama.cpp's dense timing twin is timed beside the one-expert GGUF
            cells = smoke.get("kernel_alt", {}).get("threads", {}).values()
            if not cells or not all(c.get("llama_twin", {}).get("tg") and min(c["llama_twin"]["tg"]) > 0
                                    for c in cells):
                bad.append("%s: kernel row without the dense twin's figures" % shape)
    elif "kernel row" in smoke.get("unavailable", {}):
        print("e2e_smoke: %s: kernel row not checked: %s" % (shape, smoke["unavailable"]["kernel row"]))
    else:
        bad.append("%s: kernel row missing" % shape)
for b in bad:
    print("e2e_smoke: FAIL: " + b)
sys.exit(1 if bad else 0)
PY
rm -rf "$work"
