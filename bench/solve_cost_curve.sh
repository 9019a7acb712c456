#!/bin/sh
# Cost curve of count + solve (issue 58): one synthetic layer per point, neurons per layer x profile tokens,
# `nl-layout --threads 1 -q --json solve` (one layer keeps one thread busy), wall and user seconds and peak RSS from
# /usr/bin/time. Writes CSV rows to stdout (with a header unless NOHEADER=1); bench/solve_cost_fit.py fits them.
#   bench/solve_cost_curve.sh BUILD_DIR WORK_DIR [NEURONS...]   (default neurons: 4096 11008 16384 28672)
# Environment: PRESET (configs/workloads/<name>.json, default opt-6.7b), SEQS (profile sequences of 128 tokens per
# point, default "256 1024 4096" = 32k, 131k, 524k tokens).
# The committed curve (bench/solve_cost_curve.csv): the defaults, then
#   PRESET=llama2-7b-prosparse SEQS=1024 NOHEADER=1 bench/solve_cost_curve.sh build /tmp/curve 4096 11008 16384
set -eu
bin=$1 work=$2
shift 2
neurons=${*:-"4096 11008 16384 28672"}
preset=${PRESET:-opt-6.7b}
seqs_list=${SEQS:-"256 1024 4096"}
src=$(cd "$(dirname "$0")/.." && pwd)
pjson="$src/configs/workloads/$preset.json"
density=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['activity']['active_fraction'])" "$pjson")
mkdir -p "$work"
[ "${NOHEADER:-0}" = 1 ] || echo "neurons,tokens,wall_s,user_s,sys_s,peak_kib,count_s,select_s,solve_phases_s,density,preset"
for n in $neurons; do
  for seqs in $seqs_list; do
    tok=$((seqs * 128))
    p="$work/curve_${n}_${tok}.h5"
    "$bin/cli/nl-profile" synth -q --preset "$pjson" --neurons "$n" --layers 1 \
      --profile-sequences "$seqs" --tokens-per-sequence 128 --test-sequences 2 --profile-out "$p" \
      --test-out "$work/curve_t.h5" >/dev/null
    /usr/bin/time -f "%e %U %S %M" -o "$work/time.txt" "$bin/cli/nl-layout" --threads 1 -q --json solve \
      --trace "$p" --out "$work/curve.json" >"$work/phases.json"
    python3 - "$n" "$tok" "$work/time.txt" "$work/phases.json" "$density" "$preset" <<'PY'
import json, sys
n, tok, tf, pf, d, preset = sys.argv[1:7]
wall, user, sys_s, rss = open(tf).read().split()[-4:]
ph = json.load(open(pf))["phase_seconds"]
sel = sum(v for k, v in ph.items() if k.startswith("select"))
top = sum(v for k, v in ph.items() if not k.startswith("search:"))  # "search: ..." are parts of "build search"
print(f"{n},{tok},{wall},{user},{sys_s},{rss},{ph.get('count', 0):.3f},{sel:.3f},{top:.3f},{d},{preset}")
PY
    rm -f "$p" "$work/curve_t.h5"
  done
done
