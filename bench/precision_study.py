#!/usr/bin/python3
# The paper's precision study (issue 20 item 4): held-out I/O time of identity / frequency / greedy (the paper's
# pipeline) / greedy+ls (ours) at the bundle sizes of f16, q8_0 and q4_0 images (docs/formats.md), on the workload
# presets (synthetic traces) and on real models' traces. Prints a Markdown table (docs/benchmarks.md) and writes JSON.
# Not a test. Stdlib only (Debian /usr/bin/python3).
#   bench/precision_study.py [--build build] [--work DIR] [--only NAME,...] [--json OUT]
import argparse
import json
import math
import os
import struct
import subprocess
import sys
import time

SRC = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODELS = os.environ.get("NL_MODELS_DIR", os.path.join(SRC, "datasets"))  # stories260K, babyllama-tok105: bundled
FORTUNES = "/usr/share/games/fortunes/fortunes"
DTYPES = ["f16", "q8_0", "q4_0"]
CACHE = "0.05"


def image_row_bytes(dtype, dim):
    """Bytes of one bundle part (a row or a column of `dim` weights) in an image; docs/formats.md "Quantized images"
    (32-weight blocks: q8_0 34 bytes, q4_0 18 bytes)."""
    if dtype == "f16":
        return 2 * dim
    if dim % 32:
        raise SystemExit("precision_study: dim %d is not a multiple of 32: no %s image" % (dim, dtype))
    return dim // 32 * {"q8_0": 34, "q4_0": 18}[dtype]


# Presets (synthetic): the model's hidden size and FFN kind (OPT: plain up + down; Llama/Mistral: gated).
PRESETS = [
    ("OPT-6.7B preset", "opt-6.7b", 4096, 2),
    ("Llama-2-7B ProSparse preset", "llama2-7b-prosparse", 4096, 3),
    ("Mistral-7B TurboSparse preset", "mistral-7b-turbosparse", 4096, 3),
    ("OPT-350M preset", "opt-350m", 1024, 2),
]


def llama2c_dim(path):
    return struct.unpack("7i", open(path, "rb").read(28))[0]


def real_models():
    """(label, model, tokenizer, dim, parts) of the real models present; every one is a gated Llama FFN."""
    out = []
    for label in ("tiny-relu", "small-relu"):  # bundled in datasets/
        tr = os.path.join(SRC, "datasets", label, "model")
        with open(os.path.join(tr, "config.json")) as f:
            out.append((label, tr, os.path.join(tr, "tokenizer.model"), json.load(f)["hidden_size"], 3))
    for label, d, bin_, tok in [("stories260K", "llama2c-stories260K", "stories260K.bin", "tok512.bin"),
                                ("babyllama-tok105", "babyllama-tok105", "model5000.bin", "tok105.model")]:
        m = os.path.join(MODELS, d, bin_)
        if os.path.exists(m):
            out.append((label, m, os.path.join(MODELS, d, tok), llama2c_dim(m), 3))
        else:
            print("precision_study: %s not found at %s: skipped" % (label, m), file=sys.stderr)
    return out


def cut(x, digits):
    f = 10 ** digits
    return f"{math.floor(x * f) / f:.{digits}f}"


class Runner:
    def __init__(self, build, nice):
        self.bin = os.path.join(build, "cli")
        self.nice = nice

    def __call__(self, argv):
        exe = ["nice", "-n", str(self.nice)] if self.nice else []
        exe += [os.path.join(self.bin, argv[0])] + argv[1:]
        p = subprocess.run(exe, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        if p.returncode != 0:
            raise SystemExit("precision_study: %s failed (exit %d): %s" % (
                " ".join(exe), p.returncode, p.stderr.decode(errors="replace").strip()[-2000:]))
        return p.stdout.decode()


def once(path, make):
    """Runs make() unless path exists (traces and layouts are reused by a rerun in the same --work)."""
    if not os.path.exists(path):
        make()
    return path


def study(run, label, synthetic, profile, test, dim, parts, work):
    rows = []
    base = {}
    for m in ["identity", "frequency", "greedy"]:
        base[m] = once(os.path.join(work, "%s.json" % m), lambda m=m: run(
            ["nl-layout", "solve", "--trace", profile, "--method", m, "--out", os.path.join(work, "%s.json" % m),
             "--quiet"]))
    for dt in DTYPES:
        bb = str(parts * image_row_bytes(dt, dim))
        ours = os.path.join(work, "greedy+ls-%s.json" % dt)
        t0 = time.monotonic()
        once(ours, lambda: run(["nl-layout", "solve", "--trace", profile, "--bundle-bytes", bb, "--out", ours,
                                "--quiet"]))
        solve_s = time.monotonic() - t0
        common = ["--trace", test, "--cache-ratio", CACHE, "--bundle-bytes", bb, "--json", "--quiet"]
        paper = json.loads(run(["nl-layout", "eval", "--layout", base["identity"], "--layout", base["frequency"],
                                "--layout", base["greedy"], "--gap", "auto-keep-runs"] + common))
        auto = json.loads(run(["nl-layout", "eval", "--layout", base["identity"], "--layout", base["greedy"],
                               "--layout", ours, "--gap", "auto"] + common))
        pl = {l["name"]: l for l in paper["layouts"]}
        al = {l["name"]: l for l in auto["layouts"]}
        r = {"workload": label, "synthetic": synthetic, "dtype": dt, "bundle_bytes": int(bb),
             "tokens": paper["tokens"],
             "identity": pl["identity"]["io_ms"], "frequency": pl["frequency"]["io_ms"],
             "paper": pl["greedy"]["io_ms"], "ours": al["greedy+ls"]["io_ms"],
             "identity_auto": al["identity"]["io_ms"], "greedy_auto": al["greedy"]["io_ms"],
             "bound": auto["io_ms_lower_bound"], "solve_wall_s": solve_s}
        rows.append(r)
        print("precision_study: %s %s (%s B): identity %.4f, paper %.4f, ours %.4f ms/token" % (
            label, dt, bb, r["identity"], r["paper"], r["ours"]), file=sys.stderr, flush=True)
    return rows


def table(rows):
    out = ["| workload | dtype | bundle B | identity | frequency | paper's pipeline | **ours** | paper vs identity |"
           " ours vs identity | **ours vs paper** | identity, `auto` |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        name = r["workload"] + (" (synthetic)" if r["synthetic"] else " (real)")
        out.append("| %s | %s | %d | %s | %s | %s | **%s** | %s× | %s× | **%s×** | %s |" % (
            name, r["dtype"], r["bundle_bytes"], cut(r["identity"], 4), cut(r["frequency"], 4), cut(r["paper"], 4),
            cut(r["ours"], 4), cut(r["identity"] / r["paper"], 3), cut(r["identity"] / r["ours"], 3),
            cut(r["paper"] / r["ours"], 3), cut(r["identity_auto"], 4)))
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--build", default=os.path.join(SRC, "build"))
    ap.add_argument("--work", default="/tmp/nl-precision-study", help="traces and layouts (reused by a rerun)")
    ap.add_argument("--only", default="", help="comma-separated workload labels (default: all)")
    ap.add_argument("--layers", type=int, default=2, help="preset layers to synthesize")
    ap.add_argument("--max-tokens", type=int, default=30000, help="real models: profile + test tokens")
    ap.add_argument("--nice", type=int, default=10)
    ap.add_argument("--json", default="", help="write the rows here")
    a = ap.parse_args()
    run = Runner(os.path.abspath(a.build), a.nice)
    only = set(x for x in a.only.split(",") if x)
    os.makedirs(a.work, exist_ok=True)
    rows = []
    for label, preset, dim, parts in PRESETS:
        if only and label not in only:
            continue
        w = os.path.join(a.work, preset)
        os.makedirs(w, exist_ok=True)
        p, t = os.path.join(w, "p.h5"), os.path.join(w, "t.h5")
        once(t, lambda: run(["nl-profile", "synth", "--preset", os.path.join(SRC, "configs", "workloads",
                                                                             preset + ".json"),
                             "--layers", str(a.layers), "--profile-out", p, "--test-out", t]))
        rows += study(run, label, True, p, t, dim, parts, w)
    for label, model, tok, dim, parts in real_models():
        if only and label not in only:
            continue
        w = os.path.join(a.work, label)
        os.makedirs(w, exist_ok=True)
        p, t = os.path.join(w, "p.h5"), os.path.join(w, "t.h5")
        once(t, lambda: run(["nl-profile", "run", "--model", model, "--tokenizer", tok, "--text", FORTUNES,
                             "--max-tokens", str(a.max_tokens), "--test-fraction", "0.25", "--out", p,
                             "--test-out", t, "--quiet"]))
        rows += study(run, label, False, p, t, dim, parts, w)
    print(table(rows))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"rows": rows, "cache_ratio": float(CACHE), "device": "ufs40"}, f, indent=1)


if __name__ == "__main__":
    main()
