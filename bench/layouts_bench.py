#!/usr/bin/python3
# Layout benchmark (issue 8): paper-shaped flash images with random weights, held-out synthetic traces replayed through
# nl-run with real O_DIRECT reads for each layout (identity, frequency, greedy, greedy+ls), gap merging off/auto, the
# paper's 5 % cache, the mmap baseline; the same figures for the real models; count + solve time and peak memory for
# the OPT-6.7B shape. Variants are alternated (A B A B ...), each repeated, and medians with min-max are reported.
# Not a test: it prints figures (and writes them as JSON). Stdlib only (Debian /usr/bin/python3).
import argparse
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import time

SRC = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(SRC, "bench"))
from svg_plot import bar_panels, write_csv  # noqa: E402  (the figures' shared SVG writer)

METHODS = ["identity", "frequency", "greedy", "greedy+ls"]


MMAP_CAPPED = "mmap (llama.cpp style, page cache capped)"


def log(msg):
    print(msg, file=sys.stderr, flush=True)


class Runner:
    def __init__(self, build, nice):
        self.bin = os.path.join(build, "cli")
        self.nice = nice

    def run(self, argv, heavy=True, check=True, cgroup=None):
        """Runs one binary (inside cgroup, a MemoryCgroup, when given); returns (stdout, wall seconds, exit code)."""
        exe = [os.path.join(self.bin, argv[0])] + argv[1:]
        if heavy and self.nice:
            exe = ["nice", "-n", str(self.nice)] + exe
        t0 = time.monotonic()
        p = subprocess.Popen(exe, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             preexec_fn=cgroup.enter if cgroup else None)
        out, err = p.communicate()
        wall = time.monotonic() - t0
        if check and p.returncode != 0:
            raise SystemExit("bench: %s failed (exit %d): %s" % (" ".join(exe), p.returncode,
                                                                 err.decode(errors="replace").strip()))
        return out.decode(), wall, p.returncode

    def run_rss(self, argv):
        """Like run, but measures the child's own peak RSS (getrusage through wait4)."""
        exe = [os.path.join(self.bin, argv[0])] + argv[1:]
        if self.nice:
            exe = ["nice", "-n", str(self.nice)] + exe
        t0 = time.monotonic()
        p = subprocess.Popen(exe, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        # nice execs the binary in place, so the pid (and its rusage) is the binary's.
        _, status, ru = os.wait4(p.pid, 0)
        wall = time.monotonic() - t0
        err = p.stderr.read().decode(errors="replace")
        p.returncode = os.waitstatus_to_exitcode(status)
        if p.returncode != 0:
            raise SystemExit("bench: %s failed: %s" % (" ".join(exe), err.strip()))
        return wall, ru.ru_maxrss, ru.ru_utime + ru.ru_stime


class MemoryCgroup:
    """A memory cgroup for one child process: its page cache counts against the limit, so demand paging (the mmap
    baseline) gets the same DRAM as our runtime's cache instead of the whole machine's. cgroup v2 (memory.max) or
    v1 (memory.limit_in_bytes); needs root. path is None when neither is writable (reason says why)."""

    def __init__(self, limit_bytes):
        self.path, self.reason, self.limit = None, "", int(limit_bytes)
        name = "nl-bench-%d" % os.getpid()
        cands = []
        for root in ("/sys/fs/cgroup", "/sys/fs/cgroup/unified"):
            try:
                with open(os.path.join(root, "cgroup.subtree_control")) as f:
                    if "memory" in f.read().split():
                        cands.append((root, "memory.max"))
            except OSError:
                pass
        cands.append(("/sys/fs/cgroup/memory", "memory.limit_in_bytes"))
        errs = []
        for root, knob in cands:
            path = os.path.join(root, name)
            try:
                os.makedirs(path, exist_ok=True)
                with open(os.path.join(path, knob), "w") as f:
                    f.write(str(self.limit))
                self.path = path
                return
            except OSError as e:
                errs.append("%s: %s" % (path, e.strerror))
                try:
                    os.rmdir(path)
                except OSError:
                    pass
        self.reason = "; ".join(errs) or "no memory cgroup controller"

    def enter(self):
        """preexec_fn for the child: moves it into the cgroup before exec."""
        with open(os.path.join(self.path, "cgroup.procs"), "w") as f:
            f.write(str(os.getpid()))

    def close(self):
        if self.path:
            try:
                os.rmdir(self.path)
            except OSError:
                pass


def drop_file_cache(path):
    # posix_fadvise(DONTNEED) on the image only: drops its clean pages without touching other users' page cache.
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def med(xs):
    return statistics.median(xs) if xs else float("nan")


def trunc(v, digits):
    """Ratios are printed cut, not rounded (a ratio is never shown above what was measured)."""
    return math.floor(v * 10 ** digits) / 10 ** digits


def fmt_range(xs, f="%.2f"):
    return (f + " [" + f + "-" + f + "]") % (med(xs), min(xs), max(xs))


def loadavg():
    return "%.1f %.1f %.1f" % os.getloadavg()


# ---------------------------------------------------------------------------------------------------------------------
# Device peak

def probe_device(r, path, out, seconds):
    txt, _, _ = r.run(["nl-run", "probe", "--file", path, "--out", out, "--seconds-per-point", str(seconds),
                       "--name", "bench-probe", "--json", "-q"], heavy=False)
    dev = json.loads(txt)
    return dev


def peak_bandwidth(dev):
    """The device's peak sequential bandwidth, bytes/s: the largest of the fitted B (depth 32 and depth 1) and the best
    throughput any probe point reached. The largest is the conservative choice for an efficiency figure."""
    cands = [dev.get("bandwidth_MBps", 0.0), dev.get("qd1", {}).get("bandwidth_MBps", 0.0)]
    for p in dev.get("measured", {}).get("points", []):
        if p.get("us_per_read", 0) > 0:
            cands.append(p["bytes"] / p["us_per_read"])  # bytes/us = MB/s
    return max(cands) * 1e6


# ---------------------------------------------------------------------------------------------------------------------
# Layouts, evaluation, images

def solve_all(r, profile, outdir, methods, threads):
    layouts, times = {}, {}
    for m in methods:
        out = os.path.join(outdir, "layout.%s.json" % m)
        if not os.path.exists(out):
            wall, rss, cpu = r.run_rss(["nl-layout", "solve", "--trace", profile, "--method", m, "--out", out, "-q",
                                        "--threads", str(threads)])
            times[m] = {"wall_s": wall, "cpu_s": cpu, "maxrss_kib": rss}
            log("  solve %-10s %.1f s wall, %.1f s cpu, %.0f MiB peak" % (m, wall, cpu, rss / 1024))
        layouts[m] = out
    return layouts, times


def simulate(r, test, layouts, device, gap, cache):
    """nl-layout eval on the held-out trace: reads/token and estimated I/O ms/token per layout."""
    argv = ["nl-layout", "eval", "--trace", test, "--gap", gap, "--cache-ratio", str(cache), "--json", "-q"]
    if device:
        argv += ["--device", device]
    for m in layouts:
        argv += ["--layout", layouts[m]]
    txt, _, _ = r.run(argv)
    j = json.loads(txt)
    return {x["name"]: x for x in j["layouts"]}


def replay_argv(image, test, engine, gap, cache, device, max_tokens):
    argv = ["nl-run", "replay", "--image", image, "--trace", test, "--io", engine, "--gap", gap,
            "--cache-ratio", str(cache), "--json", "-q"]
    if gap.startswith("auto"):  # auto and auto-keep-runs price gaps with the probed device
        argv += ["--device", device]
    if max_tokens:
        argv += ["--max-tokens", str(max_tokens)]
    return argv


def replay(r, image, test, engine, gap, cache, device, max_tokens, cgroup=None):
    txt, _, _ = r.run(replay_argv(image, test, engine, gap, cache, device, max_tokens), heavy=False, cgroup=cgroup)
    return json.loads(txt)


def run_variants(r, variants, reps, test, device, max_tokens, peak_Bps, bundle_bytes):
    """variants: list of dicts(name, image, engine, gap, cache). Alternates them rep by rep; returns per-variant samples."""
    samples = {v["name"]: [] for v in variants}
    for rep in range(reps):
        for v in variants:
            drop_file_cache(v["image"])
            j = replay(r, v["image"], test, v["engine"], v["gap"], v["cache"], device, max_tokens, v.get("cgroup"))
            pt = j["per_token_mean"]
            io_s = j["totals"]["io_seconds"]
            reads = j["totals"]["reads"]
            s = {
                "io_ms": pt["io_ms"],
                "reads": pt["reads"],
                "avg_len": (j["totals"]["bytes_read"] / reads / bundle_bytes) if reads else 0.0,
                "bw_MBps": j["effective_bandwidth_MBps"],
                "eff": (j["totals"]["bytes_needed"] / peak_Bps) / io_s if io_s > 0 else 0.0,
                "direct": j["direct"], "engine": j["engine"],
                "bytes_needed": pt["bytes_needed"], "bytes_read": pt["bytes_read"],
            }
            samples[v["name"]].append(s)
        log("  rep %d/%d done (load %s)" % (rep + 1, reps, loadavg()))
    return samples


def summarize(variants, samples, sims):
    rows = []
    for v in variants:
        ss = samples[v["name"]]
        row = dict(v)
        cg = row.pop("cgroup", None)
        if cg:
            row["memory_limit_bytes"] = cg.limit
        for k in ("io_ms", "reads", "avg_len", "bw_MBps", "eff", "bytes_needed", "bytes_read"):
            xs = [s[k] for s in ss]
            row[k] = {"median": med(xs), "min": min(xs), "max": max(xs), "samples": xs}
        row["direct"] = all(s["direct"] for s in ss)
        row["engine_used"] = ss[0]["engine"]
        sim = sims.get((v["layout"], v["gap"], v["cache"]))
        if sim:
            row["sim_ufs40_io_ms"] = sim["io_ms"]
            row["sim_reads"] = sim["reads"]
        rows.append(row)
    # Ratios of median effective bandwidth against identity and greedy with the same engine and gap.
    def find(layout, engine, gap):
        for x in rows:
            if x["layout"] == layout and x["engine"] == engine and x["gap"] == gap and not x.get("baseline"):
                return x
        return None
    for x in rows:
        for ref in ("identity", "greedy"):
            b = find(ref, x["engine"], x["gap"])
            if b and not x.get("baseline"):
                x["bw_vs_" + ref] = x["bw_MBps"]["median"] / b["bw_MBps"]["median"]
    return rows


def print_table(title, rows):
    print("\n### " + title)
    print("| variant | engine | gap | I/O ms/token | reads/token | avg read (bundles) | eff. MB/s | efficiency | "
          "bw x identity | bw x greedy | sim UFS 4.0 ms/token | sim reads/token |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for x in rows:
        def rr(k):
            return ("%.2f" % trunc(x[k], 2)) if k in x else "-"
        print("| %s | %s%s | %s | %s | %s | %.2f | %s | %s | %s | %s | %s | %s |" % (
            x["name"], x["engine_used"], "" if x["direct"] else " (buffered)", x["gap"],
            fmt_range(x["io_ms"]["samples"], "%.3f"), "%.1f" % x["reads"]["median"], x["avg_len"]["median"],
            fmt_range(x["bw_MBps"]["samples"], "%.0f"), "%.0f %%" % (100 * x["eff"]["median"]),
            rr("bw_vs_identity"), rr("bw_vs_greedy"),
            ("%.3f" % x["sim_ufs40_io_ms"]) if "sim_ufs40_io_ms" in x else "-",
            ("%.1f" % x["sim_reads"]) if "sim_reads" in x else "-"))
    sys.stdout.flush()


def bundle_bytes_of(image):
    with open(image + ".json") as f:
        return json.load(f)["bundle"]["bytes"]


def measure_images(r, a, images, test, device_profile, peak_Bps, cache, sims, with_mmap=True):
    """The replay variants over a set of images (one per layout)."""
    variants = []
    for eng in a.engines:
        gaps = a.gaps if eng == "uring" else ["auto"]  # pread is the reference engine: one gap setting keeps it short
        for gap in gaps:
            for m in METHODS:
                if m in images:
                    variants.append({"name": "%s %s gap=%s" % (m, eng, gap), "layout": m, "image": images[m],
                                     "engine": eng, "gap": gap, "cache": cache})
    cg = None
    if with_mmap and "identity" in images:
        # llama.cpp style: demand paging through the page cache (dropped before each run), no runtime cache, no gap.
        # Uncapped, the page cache soon holds the whole image (the machine has far more DRAM than the image), which
        # a phone that needs flash offloading does not have. The fair baseline gets the memory our runtime uses:
        # its own peak RSS without a cache (pread, identity, cache 0) + the cache's share of the image bytes.
        variants.append({"name": "mmap (llama.cpp style, page cache uncapped)", "layout": "identity",
                         "image": images["identity"], "engine": "mmap", "gap": "off", "cache": 0.0, "baseline": True})
        img = images["identity"]
        _, rss_kib, _ = r.run_rss(replay_argv(img, test, "pread", "off", 0.0, device_profile, a.max_tokens))
        limit = rss_kib * 1024 + int(cache * os.path.getsize(img))
        cg = MemoryCgroup(limit)
        if cg.path:
            variants.append({"name": MMAP_CAPPED, "layout": "identity", "image": img, "engine": "mmap", "gap": "off",
                             "cache": 0.0, "baseline": True, "cgroup": cg})
            log("mmap capped: memory cgroup %s, limit %.1f MiB (runtime RSS %.1f MiB + %.0f %% of %.1f MiB image)" % (
                cg.path, limit / 2**20, rss_kib / 1024, 100 * cache, os.path.getsize(img) / 2**20))
        else:
            log("mmap capped: skipped, no memory cgroup (%s)" % cg.reason)
    bb = bundle_bytes_of(next(iter(images.values())))
    try:
        samples = run_variants(r, variants, a.reps, test, device_profile, a.max_tokens, peak_Bps, bb)
    finally:
        if cg:
            cg.close()
    return summarize(variants, samples, sims)


def device_ceiling(r, test, layouts, device, cache):
    """What the probed disk's a + s/B fit allows (nl-layout eval --device, gap auto): the eval lower bound (no order,
    cache or planner can go below it) and each layout's predicted I/O ms/token, to set a measured ratio against the
    most any layout could reach on this disk."""
    argv = ["nl-layout", "eval", "--trace", test, "--gap", "auto", "--cache-ratio", str(cache), "--json", "-q",
            "--device", device]
    for m in layouts:
        argv += ["--layout", layouts[m]]
    txt, _, _ = r.run(argv)
    j = json.loads(txt)
    return {"bound_ms": j["io_ms_lower_bound"], "predicted_ms": {x["name"]: x["io_ms"] for x in j["layouts"]}}


def sims_for(r, test, layouts, cache, gaps):
    sims = {}
    for gap in set(gaps) | {"off"}:
        res = simulate(r, test, layouts, None, gap, cache)  # default device: UFS 4.0
        for m in layouts:
            sims[(m, gap, cache)] = res[m]
    res0 = simulate(r, test, {"identity": layouts["identity"]}, None, "off", 0.0)
    sims[("identity", "off", 0.0)] = res0["identity"]
    return sims


# ---------------------------------------------------------------------------------------------------------------------
# Suites

def synthetic_suite(r, a, shape, work, results):
    d = os.path.join(work, shape)
    os.makedirs(d, exist_ok=True)
    preset = os.path.join(SRC, "configs", "workloads", shape + ".json")
    prof, test = os.path.join(d, "profile.h5"), os.path.join(d, "test.h5")
    if not os.path.exists(test):
        log("%s: synthesizing traces (%d layers, %d test sequences)" % (shape, a.layers, a.test_sequences))
        argv = ["nl-profile", "synth", "--preset", preset, "--profile-out", prof, "--test-out", test, "-q",
                "--layers", str(a.layers), "--test-sequences", str(a.test_sequences)]
        if a.profile_sequences:
            argv += ["--profile-sequences", str(a.profile_sequences)]
        r.run(argv)
    log("%s: solving %s" % (shape, ", ".join(METHODS)))
    layouts, solve_times = solve_all(r, prof, d, METHODS, a.threads)
    images = {}
    for m in METHODS:
        img = os.path.join(d, "img.%s.nlw" % m)
        if not os.path.exists(img + ".json"):
            log("%s: packing %s (random weights)" % (shape, m))
            r.run(["nl-layout", "pack", "--synthetic-shape", shape, "--layers", str(a.layers), "--layout", layouts[m],
                   "--dtype", "f16", "--out", img, "-q"])
        images[m] = img
    log("%s: probing the disk under the identity image" % shape)
    devp = os.path.join(d, "probe.json")
    dev = probe_device(r, images["identity"], devp, a.probe_seconds)
    results["probe_path"] = devp
    peak = peak_bandwidth(dev)
    sims = sims_for(r, test, layouts, a.cache, a.gaps)
    ceiling = device_ceiling(r, test, layouts, devp, a.cache)
    log("%s: replaying (%d reps, load %s)" % (shape, a.reps, loadavg()))
    load0 = os.getloadavg()
    rows = measure_images(r, a, images, test, devp, peak, a.cache, sims)
    load1 = os.getloadavg()
    title = "%s shape, %d layers, %d B bundles, held-out synthetic trace, cache %.0f %%" % (
        shape, a.layers, bundle_bytes_of(images["identity"]), 100 * a.cache)
    print_table(title, rows)
    print("peak bandwidth for efficiency: %.0f MB/s (nl-run probe on this disk in this run: depth-32 fit a = %.2f us, "
          "B = %.0f MB/s; depth-1 fit a = %.1f us, B = %.0f MB/s; largest of fits and measured points); "
          "load average %s at start, %s at end" % (
              peak / 1e6, dev["read_latency_us"], dev["bandwidth_MBps"], dev["qd1"]["read_latency_us"],
              dev["qd1"]["bandwidth_MBps"], "%.1f" % load0[0], "%.1f" % load1[0]))
    results["synthetic"][shape] = {"rows": rows, "device": dev, "peak_MBps": peak / 1e6, "solve": solve_times,
                                   "load_start": load0, "load_end": load1, "layers": a.layers}
    results["synthetic"][shape]["device_ceiling"] = ceiling
    targets(rows, shape, results, ceiling)
    if not a.keep:
        for m in METHODS:
            for f in (images[m], images[m] + ".json"):
                if os.path.exists(f):
                    os.remove(f)


def targets(rows, label, results, ceiling=None):
    def get(name):
        for x in rows:
            if x["name"] == name:
                return x
        return None
    ours, ident, greedy = get("greedy+ls uring gap=auto"), get("identity uring gap=auto"), get("greedy uring gap=auto")
    mm = get(MMAP_CAPPED)
    mm_open = get("mmap (llama.cpp style, page cache uncapped)")
    if not ours:
        return
    bw = ours["bw_MBps"]["median"]
    t = []
    if ident:
        t.append(("bandwidth vs identity (same gap/cache/engine)", bw / ident["bw_MBps"]["median"], 1.8))
    ident_off = get("identity uring gap=off")
    if ident_off:
        # LLM in a flash as published merges no gaps: bundling + the same cache.
        t.append(("bandwidth vs identity gap=off (LLM in a flash)", bw / ident_off["bw_MBps"]["median"], 1.8))
    if greedy:
        t.append(("bandwidth vs greedy", bw / greedy["bw_MBps"]["median"], 1.15))
    if mm:
        t.append(("bandwidth vs mmap (page cache = our memory)", bw / mm["bw_MBps"]["median"], 3.0))
    if mm_open:
        t.append(("bandwidth vs mmap (page cache uncapped)", bw / mm_open["bw_MBps"]["median"], 3.0))
    t.append(("efficiency (greedy+ls, auto gap, uring)", ours["eff"]["median"], 0.60))
    print("targets (%s, greedy+ls uring gap=auto, medians):" % label)
    for name, v, want in t:
        print("  %-48s %6.3f  (target >= %.2f)  %s" % (name, trunc(v, 3), want, "met" if v >= want else "NOT met"))
    results.setdefault("targets", {})[label] = [{"what": n, "value": v, "target": w} for n, v, w in t]
    # Effective bandwidth counts the bytes read for cache misses only, so a layout whose cache serves more neurons
    # shows less of it for the same time: the I/O time per token is the like-for-like speed figure.
    sp = []
    for other, name in ((ident, "identity uring gap=auto"), (ident_off, "identity uring gap=off (LLM in a flash)"),
                        (greedy, "greedy uring gap=auto (the paper)")):
        if other and ours["io_ms"]["median"] > 0:
            sp.append((name, other["io_ms"]["median"] / ours["io_ms"]["median"]))
    if sp:
        print("I/O time per token, greedy+ls uring gap=auto faster than (median ratio, no target):")
        for name, v in sp:
            print("  %-48s %6.3fx" % (name, trunc(v, 3)))
        results.setdefault("io_speedup", {})[label] = [{"vs": n, "ratio": v} for n, v in sp]
    if ceiling and ceiling["bound_ms"] > 0:
        # The fit of this disk (nl-run probe) and the eval lower bound: any order, cache and planner at this cache
        # capacity takes at least bound_ms, so no layout can be more than predicted(X) / bound_ms faster than X here.
        pred = ceiling["predicted_ms"]
        print("this disk's a + s/B fit, gap auto (nl-layout eval --device probe.json; lower bound %.3f ms/token):"
              % ceiling["bound_ms"])
        for m in ("identity", "greedy", "greedy+ls"):
            if m in pred:
                print("  %-10s predicted %8.3f ms/token; no layout or cache can be more than %6.3fx faster than it here"
                      % (m, pred[m], trunc(pred[m] / ceiling["bound_ms"], 3)))


def model_suite(r, a, name, model, tokenizer, work, results):
    d = os.path.join(work, "model-" + name)
    os.makedirs(d, exist_ok=True)
    prof, test = os.path.join(d, "profile.h5"), os.path.join(d, "test.h5")
    if not os.path.exists(test):
        log("%s: profiling %d tokens" % (name, a.model_tokens))
        argv = ["nl-profile", "run", "--model", model, "--text", a.corpus, "--max-tokens", str(a.model_tokens),
                "--out", prof, "--test-out", test, "-q", "--threads", str(a.threads)]
        if tokenizer:
            argv += ["--tokenizer", tokenizer]
        r.run(argv)
    layouts, solve_times = solve_all(r, prof, d, METHODS, a.threads)
    images = {}
    for m in METHODS:
        img = os.path.join(d, "img.%s.nlw" % m)
        if not os.path.exists(img + ".json"):
            r.run(["nl-layout", "pack", "--model", model, "--layout", layouts[m], "--dtype", "f16", "--out", img, "-q"])
        images[m] = img
    # The runtime plans with the image's real bundle size; the simulation must use the same one.
    bb = bundle_bytes_of(images["identity"])
    sims = {}
    for gap in set(a.gaps) | {"off"}:
        argv = ["nl-layout", "eval", "--trace", test, "--gap", gap, "--cache-ratio", str(a.cache), "--json", "-q",
                "--bundle-bytes", str(bb)]
        for m in METHODS:
            argv += ["--layout", layouts[m]]
        j = json.loads(r.run(argv)[0])
        for x in j["layouts"]:
            sims[(x["name"], gap, a.cache)] = x
    # The tiny images are too small to probe under: reuse this run's probe, or probe a scratch file of our own.
    devp = results.get("probe_path")
    if not devp:
        devp = os.path.join(work, "probe.json")
        probe_device(r, os.path.join(work, "probe-scratch.bin"), devp, a.probe_seconds)
        results["probe_path"] = devp
    with open(devp) as f:
        dev = json.load(f)
    peak = peak_bandwidth(dev)
    saved = (a.engines, a.max_tokens)
    a.engines = ["uring"]
    rows = measure_images(r, a, images, test, devp, peak, a.cache, sims, with_mmap=False)
    a.engines, a.max_tokens = saved
    print_table("%s (real model, held-out %s trace, %d B bundles, cache %.0f %%)" % (
        name, os.path.basename(a.corpus), bb, 100 * a.cache), rows)
    results["models"][name] = {"rows": rows, "solve": solve_times, "bundle_bytes": bb}
    if not a.keep:
        shutil.rmtree(d, ignore_errors=True)


def offline_suite(r, a, work, results):
    d = os.path.join(work, "offline")
    os.makedirs(d, exist_ok=True)
    preset = os.path.join(SRC, "configs", "workloads", "opt-6.7b.json")
    prof = os.path.join(d, "profile.h5")
    tokens = a.offline_sequences * 128
    if not os.path.exists(prof):
        log("offline: synthesizing %d layers x 16384 neurons x %d tokens" % (a.offline_layers, tokens))
        r.run(["nl-profile", "synth", "--preset", preset, "--profile-out", prof, "--layers", str(a.offline_layers),
               "--profile-sequences", str(a.offline_sequences), "--test-sequences", "1", "--test-out",
               os.path.join(d, "t.h5"), "-q"])
    out = []
    wall, rss, cpu = r.run_rss(["nl-layout", "graph", "--trace", prof, "--out", os.path.join(d, "graph.h5"), "-q",
                                "--threads", "1"])
    out.append(("count (nl-layout graph)", wall, cpu, rss))
    for m in ("greedy", "greedy+ls"):
        wall, rss, cpu = r.run_rss(["nl-layout", "solve", "--trace", prof, "--method", m, "--out",
                                    os.path.join(d, "l.%s.json" % m), "-q", "--threads", "1"])
        out.append(("count + solve %s (nl-layout solve)" % m, wall, cpu, rss))
    L = a.offline_layers
    full_tokens = 131072
    scale = full_tokens / tokens
    count_cpu = out[0][2]
    print("\n### Offline: OPT-6.7B shape, measured on %d layer(s) x 16,384 neurons x %d tokens, 1 thread "
          "(load %s)" % (L, tokens, loadavg()))
    print("| step | wall s (measured) | CPU s (measured) | peak RSS MiB (measured) | "
          "32 layers x 131,072 tokens, CPU s (extrapolated) |")
    print("|---|---|---|---|---|")
    rows = []
    for i, (name, wall, cpu, rss) in enumerate(out):
        # Counting is linear in tokens; the solve after it is not (it works on the counts): scale only the count.
        solve_part = max(0.0, cpu - count_cpu) if i > 0 else 0.0
        extra = 32 / L * (count_cpu * scale + solve_part)
        print("| %s | %.1f | %.1f | %.0f | %.0f |" % (name, wall, cpu, rss / 1024, extra))
        rows.append({"step": name, "wall_s": wall, "cpu_s": cpu, "maxrss_kib": rss,
                     "cpu_s_32_layers_131072_tokens_extrapolated": extra})
    print("Extrapolation: 32/%d x (counting CPU s x %.0f + the solve's CPU s beyond counting); one thread, layers are "
          "independent, so wall time divides by the cores used. Wall times are inflated by the shared machine "
          "(nice %d under load); CPU seconds are the figure to compare." % (L, scale, a.nice))
    results["offline"] = {"layers_measured": L, "tokens": tokens, "rows": rows}
    if not a.keep:
        shutil.rmtree(d, ignore_errors=True)


def git_commit():
    try:
        return subprocess.run(["git", "-C", SRC, "describe", "--always", "--dirty", "--abbrev=7"],
                              capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def write_figures(results, out_dir, gaps):
    """The measured I/O time per token by layout (uring, O_DIRECT, each gap policy), one panel per workload, as
    layouts_io.svg with the same numbers in layouts_io.csv beside it. Only rows this run measured are drawn."""
    panels, csv_rows = [], []
    series = ["gap=" + g for g in gaps]
    work = [("%s shape (synthetic)" % k, v) for k, v in results["synthetic"].items()]
    work += [("%s (real, %d B bundles)" % (k, v["bundle_bytes"]), v) for k, v in results["models"].items()]
    for title, w in work:
        groups = []
        for m in METHODS:
            d = {}
            for x in w["rows"]:
                if x.get("baseline") or x.get("layout") != m or x.get("engine") != "uring" or x["gap"] not in gaps:
                    continue
                io = x["io_ms"]
                d["gap=" + x["gap"]] = (io["median"], io["min"], io["max"])
                csv_rows.append([title, m, x["engine_used"], x["gap"], "%.6g" % io["median"], "%.6g" % io["min"],
                                 "%.6g" % io["max"], len(io["samples"]), "%.6g" % x["reads"]["median"],
                                 ("%.6g" % x["sim_ufs40_io_ms"]) if "sim_ufs40_io_ms" in x else ""])
            if d:
                groups.append((m, d))
        if groups:
            panels.append((title, groups))
    if not panels:
        return None
    os.makedirs(out_dir, exist_ok=True)
    when, commit = results.get("started", "date not recorded"), results.get("commit", "not recorded")
    la0, la1 = results.get("load_start", [0])[0], results.get("load_end", [0])[0]
    argv, skip = [], False  # the options that shape the run, without its scratch and output paths
    for x in results.get("argv", []):
        if skip or x in ("--build", "--work", "--json-out", "--figures", "--models-dir"):
            skip = not skip and "=" not in x
            continue
        argv.append(x)
    notes = ["Measured by bench/layouts_bench.py %s on %s, build %s," % (" ".join(argv), when, commit),
             "%d cores, load average %.1f at start and %.1f at end: nl-run replay of the held-out trace through each"
             % (results.get("cores", 0), la0, la1),
             "layout's image, real O_DIRECT reads on that machine's disk, %.0f %% cache. Bars: median of the alternated"
             % (100 * results.get("cache", 0.05)),
             "repetitions; whiskers: min-max. The numbers: layouts_io.csv beside this file."]
    svg = os.path.join(out_dir, "layouts_io.svg")
    bar_panels(svg, "I/O time per token by layout (nl-run replay, uring, O_DIRECT)", panels, series, "ms/token", notes)
    write_csv(os.path.join(out_dir, "layouts_io.csv"),
              ["workload", "layout", "engine", "gap", "io_ms_median", "io_ms_min", "io_ms_max", "repetitions",
               "reads_per_token_median", "sim_ufs40_io_ms"], csv_rows)
    return svg


def models_dir_of(build):
    """NL_MODELS_DIR as the build was configured (CMakeCache.txt), else the bundled datasets/."""
    try:
        with open(os.path.join(build, "CMakeCache.txt")) as f:
            for line in f:
                if line.startswith("NL_MODELS_DIR:"):
                    return line.split("=", 1)[1].strip()
    except OSError:
        pass
    return os.path.join(SRC, "datasets")


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--build", default=os.path.join(SRC, "build"))
    ap.add_argument("--work", help="scratch folder for traces, layouts and images (default BUILD/bench-data)")
    ap.add_argument("--quick", action="store_true", help="small run: OPT-6.7B shape only, 2 layers, fewer tokens")
    ap.add_argument("--shapes", default="opt-6.7b,llama2-7b-prosparse")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--methods", default=",".join(METHODS), help="layouts to compare (identity is required)")
    ap.add_argument("--engines", default="uring,pread")
    ap.add_argument("--gaps", default="off,auto")
    ap.add_argument("--cache", type=float, default=0.05)
    ap.add_argument("--test-sequences", type=int, default=2, help="held-out sequences of 128 tokens replayed")
    ap.add_argument("--profile-sequences", type=int, default=0, help="profile sequences (0: the preset's)")
    ap.add_argument("--max-tokens", type=int, default=0)
    ap.add_argument("--probe-seconds", type=float, default=0.3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--nice", type=int, default=10, help="niceness of the heavy offline steps (replays run at 0)")
    ap.add_argument("--suites", default="synthetic,models,offline")
    ap.add_argument("--models-dir", help="pretrained models (default: NL_MODELS_DIR of the build)")
    ap.add_argument("--corpus", default="/usr/share/games/fortunes/fortunes")
    ap.add_argument("--model-tokens", type=int, default=40000)
    ap.add_argument("--offline-layers", type=int, default=1)
    ap.add_argument("--offline-sequences", type=int, default=64, help="x 128 tokens measured (paper: 1024 x 128 = 131,072)")
    ap.add_argument("--keep", action="store_true", help="keep images and traces (default: delete images afterwards)")
    ap.add_argument("--json-out", help="write every figure here")
    ap.add_argument("--figures", help="write layouts_io.svg and layouts_io.csv (its numbers) here (default: "
                    "docs/figures; with --quick: WORK/figures, so a quick run leaves the documented figure alone)")
    ap.add_argument("--figures-from", metavar="JSON", help="only redraw the figures from a run's --json-out file")
    a = ap.parse_args()
    if a.figures_from:
        with open(a.figures_from) as f:
            saved = json.load(f)
        METHODS[:] = [m for m in a.methods.split(",") if m]
        fig = write_figures(saved, a.figures or os.path.join(SRC, "docs", "figures"), a.gaps.split(","))
        print("figure: %s" % fig if fig else "no measured rows to draw in %s" % a.figures_from)
        return
    if a.quick:
        a.shapes, a.layers, a.test_sequences, a.profile_sequences = "opt-6.7b", 2, 1, 32
        a.model_tokens, a.offline_sequences = 20000, 32
        a.engines = "uring"
    METHODS[:] = [m for m in a.methods.split(",") if m]
    a.engines = a.engines.split(",")
    a.gaps = a.gaps.split(",")
    build = os.path.abspath(a.build)
    work = os.path.abspath(a.work or os.path.join(build, "bench-data"))
    os.makedirs(work, exist_ok=True)
    r = Runner(build, a.nice)
    st = shutil.disk_usage(work)
    print("## Layout benchmark (bench/layouts_bench.py%s)" % (" --quick" if a.quick else ""))
    print("machine: %d cores, %s; load average at start %s; free disk %.0f GiB under %s" % (
        os.cpu_count(), os.uname().release, loadavg(), st.free / 2**30, work))
    results = {"synthetic": {}, "models": {}, "argv": sys.argv[1:], "cores": os.cpu_count(), "load_start": os.getloadavg(),
               "started": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "commit": git_commit()}
    suites = a.suites.split(",")
    if "synthetic" in suites:
        for shape in a.shapes.split(","):
            synthetic_suite(r, a, shape, work, results)
    if "models" in suites:
        mdir = a.models_dir or models_dir_of(build)
        cands = [("stories260K", os.path.join(mdir, "llama2c-stories260K", "stories260K.bin"),
                  os.path.join(mdir, "llama2c-stories260K", "tok512.bin")),
                 ("babyllama-tok105", os.path.join(mdir, "babyllama-tok105", "model5000.bin"),
                  os.path.join(mdir, "babyllama-tok105", "tok105.model")),
                 ("tiny-relu", os.path.join(SRC, "datasets", "tiny-relu", "model"),
                  os.path.join(SRC, "datasets", "tiny-relu", "model", "tokenizer.model"))]
        for name, model, tok in cands:
            if not os.path.exists(model):
                print("\n(model %s: %s is absent, skipped)" % (name, model))
                continue
            model_suite(r, a, name, model, tok, work, results)
    if "offline" in suites:
        offline_suite(r, a, work, results)
    results["load_end"] = os.getloadavg()
    results["cache"] = a.cache
    print("\nload average at end %s" % loadavg())
    fig = write_figures(results, a.figures or (os.path.join(work, "figures") if a.quick else
                                               os.path.join(SRC, "docs", "figures")), a.gaps)
    if fig:
        print("figure: %s (numbers beside it: layouts_io.csv)" % fig)
    if a.json_out:
        with open(a.json_out, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
