#!/usr/bin/python3
# Structure sweep (issue 20 item 6): how much does the neuron order gain over identity, and when? Sweeps the synthetic
# generator's co-activation structure (group strength = fire_probability, background share, persistence = stay.group
# and stay.neuron) around the OPT-6.7B and Llama-2 presets, one factor at a time plus a few combined points; per point:
# nl-profile synth -> nl-layout solve greedy (the paper's pipeline) and greedy+ls (ours) -> nl-layout eval held out
# (runtime default planner gap auto, built-in UFS 4.0, 5 % cache, default bundle). Identity gets a good cache: the best
# held-out I/O time of identity under the evaluator's linking-aligned S3-FIFO, plain S3-FIFO, and ours' own chosen
# cache policy (admission, pinned set, small FIFO) - chosen on the held-out tokens, so the gains are if anything low.
# The layout-free trace statistics come from nl-layout eval (layout/trace_stats.h); the predictor
# log(gain) = c0 + c1 * log(M) (M, the modelled gain, layout/trace_stats.h) is fitted per method with leave-one-out errors, and its coefficients are what
# layout/trace_stats.cpp holds. Also places the real tiny models (tiny-relu, stories260K) on the predictor.
# Writes a JSON of all points, a markdown table and an SVG plot. Stdlib only (Debian /usr/bin/python3). Not a test.
import argparse
import json
import math
import os
import struct
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from svg_plot import svg_open, svg_write, write_csv  # noqa: E402  (the figures' shared SVG writer)

SRC = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FORTUNES = "/usr/share/games/fortunes/fortunes"
METHODS = ["greedy", "greedy+ls"]
# The predictor's input (layout/trace_stats.h): M = (r / identity run + 1) / (r (1 − top-2 co-firing) + 1),
# r = a·B / bundle bytes. It fitted ours better than the trace-only headroom (1 / (1 − κ)) / identity run, which
# cannot see the bundle size; it ignores gap merging, so it overshoots at bundles far below a·B (docs/benchmarks.md).
FIT_STAT = "modelled_gain"
STATS = ("active_share", "persistence", "identity_run", "cofire", "cofire_excess", "cofire_tokens", "headroom",
         "modelled_gain")

# (preset, shape args, base knobs, swept points). Knobs: fire = --fire-probability, bg = --background-share,
# stay = --stay-group and --stay-neuron together.
PRESETS = {
    "opt-6.7b": {"shape": ["--layers", "2"], "base": {"fire": 0.95, "bg": 0.1, "stay": 0.82},
                 "fire": [0.5, 0.7, 0.85], "bg": [0.3, 0.5, 0.8], "stay": [0.5, 0.7, 0.95],
                 "combined": [(0.7, 0.3, 0.6), (0.5, 0.5, 0.5), (0.85, 0.3, 0.95)]},
    "llama2-7b-prosparse": {"shape": ["--layers", "1", "--profile-sequences", "32"],
                            "base": {"fire": 0.93, "bg": 0.09, "stay": 0.7},
                            "fire": [0.6, 0.8], "bg": [0.3, 0.6], "stay": [0.5, 0.9],
                            "combined": [(0.7, 0.4, 0.5)]},
    # The other presets: their own point and one weaker-structure point each.
    "opt-350m": {"shape": ["--layers", "2"], "base": {"fire": 0.95, "bg": 0.1, "stay": 0.82},
                 "fire": [], "bg": [], "stay": [], "combined": [(0.7, 0.3, 0.6)]},
    "mistral-7b-turbosparse": {"shape": ["--layers", "1", "--profile-sequences", "32"],
                               "base": {"fire": 0.93, "bg": 0.09, "stay": 0.7},
                               "fire": [], "bg": [], "stay": [], "combined": [(0.7, 0.4, 0.5)]},
}


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def cut(x, digits):
    f = 10 ** digits
    return f"{math.floor(x * f) / f:.{digits}f}"


def sweep_points(only):
    pts = []
    for preset, d in PRESETS.items():
        if only and preset not in only:
            continue
        b = d["base"]
        knobs = [("base", dict(b))]
        for k in ("fire", "bg", "stay"):
            for v in d[k]:
                knobs.append((k, dict(b, **{k: v})))
        for f, g, s in d["combined"]:
            knobs.append(("combined", {"fire": f, "bg": g, "stay": s}))
        for vary, k in knobs:
            name = "%s_f%s_b%s_s%s" % (preset, k["fire"], k["bg"], k["stay"])
            pts.append({"name": name, "preset": preset, "vary": vary, "knobs": k, "shape": d["shape"]})
    return pts


class Runner:
    def __init__(self, build, nice):
        self.bin = os.path.join(build, "cli")
        self.nice = nice

    def __call__(self, argv):
        exe = [os.path.join(self.bin, argv[0])] + argv[1:]
        if self.nice:
            exe = ["nice", "-n", str(self.nice)] + exe
        p = subprocess.run(exe, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        if p.returncode != 0:
            raise SystemExit("structure_sweep: %s failed (exit %d): %s" % (" ".join(exe), p.returncode,
                                                                          p.stderr.decode(errors="replace").strip()))
        return p.stdout.decode()


def once(path, fn):
    if not os.path.exists(path):
        fn()


def identity_variants(ours_path, w):
    """identity.json (no cache policy: the evaluator's) and identity_cache.json (ours' per-layer cache policy)."""
    with open(ours_path) as f:
        j = json.load(f)
    j["method"] = "identity"
    for L in j["layers"]:
        L["order"] = list(range(L["n_neurons"]))
        L.pop("replicas", None)
    cache = os.path.join(w, "identity_cache.json")
    with open(cache, "w") as f:
        json.dump(j, f)
    for L in j["layers"]:
        for k in ("admission", "pinned", "small_fraction"):
            L.pop(k, None)
    plain = os.path.join(w, "identity.json")
    with open(plain, "w") as f:
        json.dump(j, f)
    return plain, cache


def measure(run, profile, test, w, extra):
    """Solves greedy and greedy+ls on `profile`, evaluates them and identity's cache variants on `test`."""
    lay = {m: os.path.join(w, m + ".json") for m in METHODS}
    for m in METHODS:
        once(lay[m], lambda: run(["nl-layout", "solve", "--trace", profile, "--method", m, "--out", lay[m],
                                  "--quiet"] + extra))
    ident, ident_cache = identity_variants(lay["greedy+ls"], w)
    common = ["--trace", test, "--json", "--quiet"] + extra
    e = json.loads(run(["nl-layout", "eval"] + common + ["--layout", ident, "--layout", ident_cache,
                                                        "--layout", lay["greedy"], "--layout", lay["greedy+ls"]]))
    rows = {r["name"]: r["io_ms"] for r in e["layouts"]}
    plain = json.loads(run(["nl-layout", "eval"] + common + ["--layout", ident, "--plain-s3fifo"]))
    io = {"identity_linking": rows["identity"], "identity_ours_cache": rows["identity#2"],
          "identity_plain": plain["layouts"][0]["io_ms"], "greedy": rows["greedy"], "greedy+ls": rows["greedy+ls"]}
    io["identity_good"] = min(io["identity_linking"], io["identity_ours_cache"], io["identity_plain"])
    st = e["trace_structure"]
    return {"io_ms": io, "stats": {k: st[k] for k in STATS},
            "predicted": st["predicted_gain_over_identity"],
            "gain": {m: io["identity_good"] / io[m] for m in METHODS}}


def structure(run, test, layout, extra):
    e = json.loads(run(["nl-layout", "eval", "--trace", test, "--layout", layout, "--json", "--quiet"] + extra))
    return {k: e["trace_structure"][k] for k in STATS}


def cached_result(w):
    """A point's folder: (path of its result.json, the result kept from an earlier run or None, whether that result
    has every statistic of STATS)."""
    os.makedirs(w, exist_ok=True)
    res = os.path.join(w, "result.json")
    if not os.path.exists(res):
        return res, None, False
    with open(res) as f:
        r = json.load(f)
    return res, r, all(x in r["stats"] for x in STATS)


def synthetic_point(run, pt, work):
    w = os.path.join(work, pt["name"])
    res, r, complete = cached_result(w)
    p, t = os.path.join(w, "p.h5"), os.path.join(w, "t.h5")
    if complete:
        return r
    k = pt["knobs"]
    once(t, lambda: run(["nl-profile", "synth", "--preset", os.path.join(SRC, "configs", "workloads",
                                                                         pt["preset"] + ".json"),
                         "--fire-probability", str(k["fire"]), "--background-share", str(k["bg"]),
                         "--stay-group", str(k["stay"]), "--stay-neuron", str(k["stay"]),
                         "--profile-out", p, "--test-out", t, "--quiet"] + pt["shape"]))
    if r:  # a result from before a statistic was added: measure the statistics again
        r["stats"] = structure(run, t, os.path.join(w, "identity.json"), [])
    else:
        r = dict(pt, synthetic=True, **measure(run, p, t, w, []))
    with open(res, "w") as f:
        json.dump(r, f, indent=1)
    for x in (p, t):  # keep the results, not the traces (disk is shared)
        os.remove(x)
    return r


def real_models(models):
    out = []
    tr = os.path.join(SRC, "datasets", "tiny-relu", "model")
    with open(os.path.join(tr, "config.json")) as f:
        out.append(("tiny-relu", tr, os.path.join(tr, "tokenizer.model"), json.load(f)["hidden_size"]))
    m = os.path.join(models, "llama2c-stories260K", "stories260K.bin")
    if os.path.exists(m):
        dim = struct.unpack("7i", open(m, "rb").read(28))[0]
        out.append(("stories260K", m, os.path.join(models, "llama2c-stories260K", "tok512.bin"), dim))
    else:
        log("structure_sweep: stories260K not found at %s: skipped" % m)
    return out


def real_point(run, label, model, tok, dim, work, max_tokens):
    w = os.path.join(work, label)
    res, r, complete = cached_result(w)
    p, t = os.path.join(w, "p.h5"), os.path.join(w, "t.h5")
    if r:
        if not complete:  # from before a statistic was added
            r["stats"] = structure(run, t, os.path.join(w, "identity.json"), ["--bundle-bytes", r["bundle_bytes"]])
        return r
    once(t, lambda: run(["nl-profile", "run", "--model", model, "--tokenizer", tok, "--text", FORTUNES,
                         "--max-tokens", str(max_tokens), "--test-fraction", "0.25", "--out", p, "--test-out", t,
                         "--quiet"]))
    # The image's f16 bundle (gate row, up row, down column of `dim` weights): what a phone would read.
    bb = str(3 * dim * 2)
    r = dict({"name": label, "preset": label, "vary": "real", "knobs": {}, "synthetic": False, "bundle_bytes": bb},
             **measure(run, p, t, w, ["--bundle-bytes", bb]))
    with open(res, "w") as f:
        json.dump(r, f, indent=1)
    return r


def fit(points, method, key=FIT_STAT):
    """Least squares log(gain) = c0 + c1 log(stat); returns (c0, c1)."""
    xs = [math.log(p["stats"][key]) for p in points]
    ys = [math.log(p["gain"][method]) for p in points]
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx > 0 else 0.0
    return my - b * mx, b


def loo(points, method, key=FIT_STAT):
    """Leave-one-out residuals log(measured / predicted), one per point."""
    res = []
    for i, p in enumerate(points):
        a, b = fit(points[:i] + points[i + 1:], method, key)
        res.append(math.log(p["gain"][method]) - (a + b * math.log(p["stats"][key])))
    return res


def table(rows):
    out = ["| point | varied | fire | bg | stay | active % | persist % | identity run | top-2 co-firing | headroom | M |"
           " identity (good cache) | identity (linking / ours' cache / plain) | paper's pipeline | ours |"
           " paper vs identity | ours vs identity | predicted paper (held out) | predicted ours (held out) |",
           "|" + "---|" * 19]
    for r in rows:
        s, io, k = r["stats"], r["io_ms"], r["knobs"]
        pr = r.get("loo_prediction", {})
        pred = lambda m: ("%s× [%s–%s]" % (cut(pr[m][1], 2), cut(pr[m][0], 2), cut(pr[m][2], 2))) if m in pr else "–"
        name = r["preset"] + (" (synthetic)" if r["synthetic"] else " (real, bundle %s B)" % r["bundle_bytes"])
        out.append("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s / %s / %s | %s | %s | %s× | %s× | %s | %s |"
                   % (name, r["vary"], k.get("fire", "–"), k.get("bg", "–"), k.get("stay", "–"),
                      cut(100 * s["active_share"], 2), cut(100 * s["persistence"], 1), cut(s["identity_run"], 3),
                      cut(s["cofire"], 3), cut(s["headroom"], 2), cut(s["modelled_gain"], 3),
                      cut(io["identity_good"], 4),
                      cut(io["identity_linking"], 4), cut(io["identity_ours_cache"], 4), cut(io["identity_plain"], 4),
                      cut(io["greedy"], 4), cut(io["greedy+ls"], 4), cut(r["gain"]["greedy"], 3),
                      cut(r["gain"]["greedy+ls"], 3), pred("greedy"), pred("greedy+ls")))
    return "\n".join(out)


def svg_plot(rows, fits, path):
    """Gain over identity (good cache) against M, log-log, with the fitted lines. Hand-written SVG."""
    W, H, L, R, T, B = 760, 470, 70, 200, 40, 60
    xs = [r["stats"][FIT_STAT] for r in rows]
    ys = [r["gain"][m] for r in rows for m in METHODS]
    x0, x1 = math.log(min(xs) / 1.2), math.log(max(xs) * 1.2)
    y0, y1 = math.log(min(min(ys), 1.0) / 1.1), math.log(max(ys) * 1.1)
    px = lambda x: L + (math.log(x) - x0) / (x1 - x0) * (W - L - R)
    py = lambda y: H - B - (math.log(y) - y0) / (y1 - y0) * (H - T - B)
    col = {"greedy": "#1f77b4", "greedy+ls": "#d62728"}
    o = svg_open(W, H, "Order gain over identity (good cache) vs modelled gain M — SYNTHETIC structure sweep", L)
    o += ['<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="black"/>' % (L, H - B, W - R, H - B),
          '<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="black"/>' % (L, T, L, H - B)]
    for v in [1, 1.25, 1.5, 2, 2.5, 3, 4, 5, 7]:
        if x0 <= math.log(v) <= x1:
            o.append('<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#ddd"/><text x="%.1f" y="%d" '
                     'text-anchor="middle">%g</text>' % (px(v), T, px(v), H - B, px(v), H - B + 16, v))
    for v in [0.8, 0.9, 1, 1.2, 1.5, 2, 2.5, 3, 4]:
        if y0 <= math.log(v) <= y1:
            o.append('<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#ddd"/><text x="%d" y="%.1f" '
                     'text-anchor="end">%g×</text>' % (L, py(v), W - R, py(v), L - 6, py(v) + 4, v))
    o.append('<text x="%d" y="%d" text-anchor="middle">M = (r/identity run + 1) / (r(1−top-2 co-firing) + 1), '
             'r = a·B/bundle (log)</text>' % ((L + W - R) // 2, H - 18))
    o.append('<text x="16" y="%d" transform="rotate(-90 16 %d)" text-anchor="middle">identity (good cache) I/O ÷ '
             'order I/O (log)</text>' % ((T + H - B) // 2, (T + H - B) // 2))
    for m in METHODS:
        a, b = fits[m]
        xa, xb = math.exp(x0), math.exp(x1)
        o.append('<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s" stroke-dasharray="5,4"/>'
                 % (px(xa), py(math.exp(a + b * x0)), px(xb), py(math.exp(a + b * x1)), col[m]))
        for r in rows:
            x, y = px(r["stats"][FIT_STAT]), py(r["gain"][m])
            if r["synthetic"]:
                o.append('<circle cx="%.1f" cy="%.1f" r="4" fill="%s" fill-opacity="0.75"/>' % (x, y, col[m]))
            else:
                o.append('<rect x="%.1f" y="%.1f" width="9" height="9" fill="none" stroke="%s" stroke-width="2"/>'
                         '<text x="%.1f" y="%.1f" font-size="10">%s</text>' % (x - 4.5, y - 4.5, col[m], x + 7, y - 6,
                                                                             r["name"]))
    lx = W - R + 12
    for i, (m, lab) in enumerate([("greedy", "paper's pipeline (greedy)"), ("greedy+ls", "ours (greedy+ls)")]):
        o.append('<circle cx="%d" cy="%d" r="4" fill="%s"/><text x="%d" y="%d">%s</text>'
                 % (lx, T + 20 + 18 * i, col[m], lx + 10, T + 24 + 18 * i, lab))
    o.append('<text x="%d" y="%d">dots: synthetic sweep</text>' % (lx, T + 70))
    o.append('<text x="%d" y="%d">squares: real tiny models</text>' % (lx, T + 88))
    o.append('<text x="%d" y="%d">(not in the fit)</text>' % (lx, T + 104))
    o.append('<text x="%d" y="%d">dashed: log-log fit</text>' % (lx, T + 122))
    o.append('<text x="%d" y="%d">UFS 4.0, gap auto, 5 %% cache</text>' % (lx, T + 140))
    svg_write(path, o)


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--build", default=os.path.join(SRC, "build"))
    ap.add_argument("--work", default="/tmp/nl-structure-sweep", help="per-point results (reused by a rerun)")
    ap.add_argument("--json", help="write all points, fits and leave-one-out errors here")
    ap.add_argument("--svg", default=os.path.join(SRC, "docs", "structure_sweep.svg"),
                    help="the figure; its plotted points go beside it (same name, .csv)")
    ap.add_argument("--only", default="", help="comma-separated presets / real model labels")
    ap.add_argument("--no-real", action="store_true", help="skip the real tiny models")
    ap.add_argument("--max-tokens", type=int, default=30000, help="real models: profile + test tokens")
    ap.add_argument("--nice", type=int, default=10)
    ap.add_argument("--models", default=os.path.join(SRC, "datasets"),
                    help="folder holding llama2c-stories260K/ (default: the bundled datasets/)")
    a = ap.parse_args()
    only = [x for x in a.only.split(",") if x]
    run = Runner(a.build, a.nice)
    os.makedirs(a.work, exist_ok=True)
    points = sweep_points(only)
    if len(points) < 3:  # the fit and its leave-one-out errors need two points left when one is out
        ap.error("--only %s selects %d synthetic point(s); the fits need at least 3 (name a preset too)" %
                 (a.only, len(points)))
    syn = []
    for pt in points:
        log("structure_sweep: %s" % pt["name"])
        syn.append(synthetic_point(run, pt, a.work))
    real = []
    if not a.no_real:
        for label, model, tok, dim in real_models(a.models):
            if only and label not in only:
                continue
            log("structure_sweep: %s (real)" % label)
            real.append(real_point(run, label, model, tok, dim, a.work, a.max_tokens))
    fits, errs = {}, {}
    for m in METHODS:
        fits[m] = fit(syn, m)
        res = loo(syn, m)
        errs[m] = {"loo_log_residuals": res, "min": min(res), "max": max(res),
                   "rms": math.sqrt(sum(x * x for x in res) / len(res)),
                   "max_abs_pct": 100 * (math.exp(max(abs(x) for x in res)) - 1)}
        for p, r in zip(syn, res):
            a_, b_ = fit([q for q in syn if q is not p], m)
            mid = math.exp(a_ + b_ * math.log(p["stats"][FIT_STAT]))
            p.setdefault("loo_prediction", {})[m] = [mid * math.exp(errs[m]["min"]), mid, mid * math.exp(errs[m]["max"])]
        # Other single statistics, for comparison (leave-one-out RMS of the log residual).
        errs[m]["alternatives_rms"] = {k: math.sqrt(sum(x * x for x in loo(syn, m, k)) / len(syn))
                                       for k in ("modelled_gain", "headroom", "cofire", "identity_run", "persistence")}
        a_, b_ = fits[m]
        log("fit %s: log(gain) = %.6f + %.6f log(M); LOO log residual min %.4f max %.4f rms %.4f; "
            "alternatives %s" % (m, a_, b_, errs[m]["min"], errs[m]["max"], errs[m]["rms"],
                                 {k: round(v, 4) for k, v in errs[m]["alternatives_rms"].items()}))
    for r in real:  # the full fit's prediction, with the synthetic LOO range
        r["loo_prediction"] = {}
        for m in METHODS:
            mid = math.exp(fits[m][0] + fits[m][1] * math.log(r["stats"][FIT_STAT]))
            r["loo_prediction"][m] = [mid * math.exp(errs[m]["min"]), mid, mid * math.exp(errs[m]["max"])]
    print(table(syn + real))
    for m in METHODS:
        print("%s: log(gain) = %.6f + %.6f * log(M); leave-one-out over %d synthetic points: log residual "
              "[%.4f, %.4f], rms %.4f (worst %.1f %%)" % (m, fits[m][0], fits[m][1], len(syn), errs[m]["min"],
                                                          errs[m]["max"], errs[m]["rms"], errs[m]["max_abs_pct"]))
        print("  layout/trace_stats.cpp: {%.6f, %.6f, %.6f, %.6f}" % (fits[m][0], fits[m][1], errs[m]["min"],
                                                                       errs[m]["max"]))
    if a.svg:
        svg_plot(syn + real, fits, a.svg)
        # The plotted points beside the figure (same name, .csv); the fitted lines are in --json's "fits".
        write_csv(os.path.splitext(a.svg)[0] + ".csv",
                  ["point", "synthetic", FIT_STAT] + ["gain_" + m for m in METHODS],
                  [[r["name"], int(r["synthetic"]), "%.6g" % r["stats"][FIT_STAT]] +
                   ["%.6g" % r["gain"][m] for m in METHODS] for r in syn + real])
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"synthetic": syn, "real": real, "fits": fits, "errors": errs}, f, indent=1)


if __name__ == "__main__":
    main()
