#!/usr/bin/python3
# End-to-end benchmark against the real llama.cpp (issue 19): the same weights in a GGUF (scripts/gguf_from_image.py)
# and in our flash images, greedy tokens from the same prompt ids, a phone-like memory cap (a memory cgroup), cold
# page cache for the model files before each run, alternated repetitions, medians [min-max].
#   bench/e2e/run.py --build build [--shapes stories260k,tiny-relu,small-relu,187m,1b,llama2-7b,mistral-7b]
#                    [--dtypes f32,f16,q8_0]
#                    [--reps 3] [--prompt 16] [--steps 32] [--threads 2] [--work DIR] [--smoke] [--json OUT]
# Rows per shape and dtype: llama.cpp mmap capped / uncapped (warm), nl-run identity / greedy / greedy+ls (capped),
# the bound; kernel row: nl-run --select dense vs llama-bench tg, everything in DRAM. Agreement: greedy tokens of
# nl-run (dense and gate) against llama.cpp. Figures of random-weight shapes are labelled synthetic.
# Real models: stories260K (llama2.c, SiLU; --models, default the bundled datasets/) and the gated-ReLU models
# tiny-relu and small-relu (datasets/; llama.cpp runs them as its "smallthinker" arch with one expert,
# scripts/gguf_from_image.py), profiled over real text, nl-run reading their real gate's active neurons (--select gate).
# Not a test (prints figures); tests/e2e_smoke.sh runs --smoke (tiny-relu and stories260K, 1 rep, a few tokens) and
# checks its JSON.
# Stdlib only; helpers shared with the layouts bench (cgroup, page-cache dropping, medians) are imported from it.
import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.dirname(HERE))
from layouts_bench import MemoryCgroup, drop_file_cache, med, trunc  # noqa: E402  (one copy of each helper)

LAYOUTS = ["identity", "greedy", "greedy+ls"]
DENSE_ROW = "nl-run --select dense, uncapped (in DRAM)"
# The sparse compute floor (issue 54 item 5): the greedy+ls image with the same selection as the capped rows, uncapped,
# --cache-ratio 1 (every bundle pinned in DRAM at load, so decode reads nothing): what a sparse engine pays with no
# I/O at all. The true bound is max(this row, needed bytes at the device's bandwidth); dense compute is no floor.
FLOOR_ROW = "nl-run greedy+ls, every bundle in DRAM, uncapped (floor)"
# The predictor paid (issue 54 item 4): the whole synthetic shapes' greedy+ls image carries a random predictor
# (nl-layout pack --predictor random:R), and this row runs it on every layer-token (nl-run --select predictor+trace:)
# beside the trace's sets, under the cap with the overlap-on row's options: the I/O of the trace rows, the
# predictor's compute and DRAM paid.
PRED_ROW = "nl-run greedy+ls, overlap on, predictor paid, capped"
MIB = 1 << 20
CACHE_RATIO = 0.1  # nl-run's neuron cache in the capped rows, as the cap's "10 % of the FFN bytes"

# Random-weight Llama shapes and the synthetic workload preset whose calibrated activity gives their traces. The
# whole models are packed by `nl-layout pack --synthetic-shape NAME`, and their shapes are read from the binary
# (`nl-layout pack --list-synthetic-models`; one definition, formats/core/synthetic_models.h). "187m" exists only
# here, as a random llama2.c file (config in llama2.c order: dim, hidden, layers, heads, kv heads, vocab, seq_len).
SYNTH = {
    "187m": {"config": (1024, 2816, 12, 16, 16, 32000, 512), "preset": "llama2-7b-prosparse"},
    "1b": {"pack_shape": "llama-1b", "preset": "llama2-7b-prosparse"},
    "llama2-7b": {"pack_shape": "llama2-7b", "preset": "llama2-7b-prosparse"},
    "mistral-7b": {"pack_shape": "mistral-7b", "preset": "mistral-7b-turbosparse"},
    # OPT packed as OPT (issue 53): learned positions, LayerNorm, biases, two-vector bundles. llama.cpp has no OPT
    # architecture, so these cells have nl-run's rows only (identity / greedy / greedy+ls, the floor, the dense row).
    "opt-1.3b": {"pack_shape": "opt-1.3b-model", "preset": "opt-6.7b", "no_llama": "llama.cpp has no OPT architecture"},
    "opt-6.7b": {"pack_shape": "opt-6.7b-model", "preset": "opt-6.7b", "no_llama": "llama.cpp has no OPT architecture"},
}
LLAMA2C_ORDER = ("dim", "hidden_dim", "n_layers", "n_heads", "n_kv_heads", "vocab_size", "seq_len")
# Real models: (model, tokenizer) relative to --models (default datasets/) or to the repository (bundled), and the
# text their layouts are profiled over (Debian's GPL-3, present on every Debian system).
REAL = {
    "stories260k": {"models": "llama2c-stories260K", "model": "stories260K.bin", "tokenizer": "tok512.bin"},
    "tiny-relu": {"bundled": "datasets/tiny-relu/model", "tokenizer": "tokenizer.model"},
    "small-relu": {"bundled": "datasets/small-relu/model", "tokenizer": "tokenizer.model"},
}
PROFILE_TEXT = "/usr/share/common-licenses/GPL-3"

def img_path(d, method, dtype):
    return os.path.join(d, "%s.%s.nlw" % (method, dtype))


def log(msg):
    print(msg, file=sys.stderr, flush=True)


class Unavailable(Exception):
    """A row or shape this checkout cannot run, with the reason (reported, never dropped silently)."""


def run(argv, check=True, cgroup=None, capture=True):
    """Runs argv (in cgroup when given); returns dict(out, err, rc, wall_s, maxrss_kib, read_bytes)."""
    t0 = time.monotonic()
    p = subprocess.Popen(argv, stdout=subprocess.PIPE if capture else subprocess.DEVNULL, stderr=subprocess.PIPE,
                         preexec_fn=cgroup.enter if cgroup else None)
    out, err = p.communicate() if capture else (b"", p.stderr.read())
    # communicate() reaped the child; its rusage comes from RUSAGE_CHILDREN deltas, so wait4 is used instead below.
    wall = time.monotonic() - t0
    r = {"out": out.decode(errors="replace"), "err": err.decode(errors="replace"), "rc": p.returncode, "wall_s": wall}
    if check and p.returncode != 0:
        raise SystemExit("e2e: %s failed (exit %d): %s" % (" ".join(argv), p.returncode, r["err"].strip()[-2000:]))
    return r


def decode_ffn_bytes(per_pass, prompt_len):
    """Mean FFN flash bytes needed and read per decode pass (the passes after the prompt's), or None."""
    dec = per_pass[prompt_len:]
    if not dec or not all("bytes_needed" in t and "bytes_read" in t for t in dec):
        return None
    return {"needed": sum(t["bytes_needed"] for t in dec) / len(dec),
            "read": sum(t["bytes_read"] for t in dec) / len(dec)}


def run_measured(argv, cgroup=None):
    """Runs argv and measures the child itself: wall, peak RSS (ru_maxrss), bytes read from storage (ru_inblock,
    512-byte units: block-layer reads, page faults of mmap and O_DIRECT alike), and the cgroup's peak usage."""
    t0 = time.monotonic()
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         preexec_fn=cgroup.enter if cgroup else None)
    out = p.stdout.read()
    err = p.stderr.read()
    _, status, ru = os.wait4(p.pid, 0)
    wall = time.monotonic() - t0
    rc = os.waitstatus_to_exitcode(status)
    peak = None
    if cgroup and cgroup.path:
        for knob in ("memory.peak", "memory.max_usage_in_bytes"):
            try:
                peak = int(open(os.path.join(cgroup.path, knob)).read())
                break
            except OSError:
                pass
    return {"out": out.decode(errors="replace"), "err": err.decode(errors="replace"), "rc": rc, "wall_s": wall,
            "maxrss_kib": ru.ru_maxrss, "read_bytes": ru.ru_inblock * 512, "cgroup_peak": peak}


def llamacpp_dir():
    return subprocess.run([os.path.join(SRC, "scripts", "llamacpp.sh"), "dir"], capture_output=True,
                          text=True, check=True).stdout.strip()


def write_random_llama2c(path, cfg, seed):
    """A random Llama model as a llama2.c .bin (f32, shared classifier), uniform in +-1/sqrt(fan-in), norms 1.
    Streams tensor by tensor (a 1B model never sits in DRAM)."""
    import numpy as np
    dim, hidden, layers, heads, kv, vocab, seq = cfg
    kv_dim = dim // heads * kv
    rng = np.random.default_rng(seed)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        np.asarray(cfg, dtype="<i4").tofile(f)

        def mat(rows, cols):
            a = 1.0 / np.sqrt(cols)
            for r0 in range(0, rows, 4096):
                rng.uniform(-a, a, size=(min(4096, rows - r0), cols)).astype("<f4").tofile(f)

        mat(vocab, dim)
        for name, rows, cols in (("rms_att", 0, 0), ("wq", dim, dim), ("wk", kv_dim, dim), ("wv", kv_dim, dim),
                                 ("wo", dim, dim), ("rms_ffn", 0, 0), ("w1", hidden, dim), ("w2", dim, hidden),
                                 ("w3", hidden, dim)):
            for _ in range(layers):
                if rows == 0:
                    np.ones(dim, dtype="<f4").tofile(f)
                else:
                    mat(rows, cols)
        np.ones(dim, dtype="<f4").tofile(f)  # rms_final
        np.zeros(seq * (dim // heads), dtype="<f4").tofile(f)  # freq_cis_real + imag (ignored by the readers)
    os.replace(tmp, path)


class Bench:
    def __init__(self, a):
        self.a = a
        self.budget_rows = [m for m in a.budget_rows.split(",") if m]
        self.verify_rows = [m for m in a.verify_rows.split(",") if m]
        for opt, ms in (("--budget-rows", self.budget_rows), ("--verify-rows", self.verify_rows)):
            for m in ms:
                if m not in LAYOUTS:
                    raise SystemExit("e2e: %s: unknown layout '%s' (one of %s)" % (opt, m, ", ".join(LAYOUTS)))
        self.cli = os.path.join(os.path.abspath(a.build), "cli")
        self.work = a.work
        os.makedirs(self.work, exist_ok=True)
        self.ldir = llamacpp_dir()
        # llama-ids and gguf-py are what the rows need; llama-bench only the kernel row.
        self.gguf_py = next((g for g in (os.path.join(self.ldir, "gguf-py"), os.path.join(self.ldir, "src", "gguf-py"))
                             if os.path.isfile(os.path.join(g, "gguf", "__init__.py"))), None)
        self.llama_ok = os.access(os.path.join(self.ldir, "bin", "llama-ids"), os.X_OK) and self.gguf_py is not None
        self.llama_bench = os.path.join(self.ldir, "bin", "llama-bench")
        help_gen = run([self.tool("nl-run"), "generate", "--help"])["out"]
        help_run = run([self.tool("nl-run"), "--help"])["out"]  # --threads is a global option of nl-run
        help_pack = run([self.tool("nl-layout"), "pack", "--help"])["out"]
        listed = run([self.tool("nl-layout"), "pack", "--list-synthetic-models"], check=False)
        self.pack_models = json.loads(listed["out"]) if listed["rc"] == 0 else {}
        self.has_threads = "--threads" in help_gen or "--threads" in help_run
        self.has_trace_select = "trace:" in help_gen
        self.pack_dtypes = [d for d in ("f32", "f16", "bf16", "q8_0", "q4_0") if d in help_pack]
        self.has_synthetic_act = "--synthetic-act" in help_pack
        self.has_overlap = "--overlap" in help_gen
        self.has_metrics = "--metrics" in help_gen
        self.has_predictor_row = "predictor+trace" in help_gen and "random:R" in help_pack
        with open(a.device, "rb") as f:
            device_bytes = f.read()
        self.device = json.loads(device_bytes)
        # The profile's content names the layouts solved for it (a re-probe differs).
        self.device_tag = "%s-%s" % (self.device.get("name", "device"), hashlib.sha256(device_bytes).hexdigest()[:8])
        self.pack_cmds = {}  # layout image -> the nl-layout pack command that writes it
        self.bundle_bytes = {}  # layout image -> the bundle bytes its layout was solved for
        self.image_layout = {}  # layout image -> the layout file it is packed from
        self.results = {"shapes": [], "settings": vars(a).copy(), "llamacpp_dir": self.ldir,
                        "loadavg_start": os.getloadavg(),
                        "nl_run_threads_option": self.has_threads, "nl_run_trace_select": self.has_trace_select}

    def tool(self, name):
        return os.path.join(self.cli, name)

    def nice(self):
        return ["nice", "-n", str(self.a.nice)] if self.a.nice else []

    # -----------------------------------------------------------------------------------------------------------
    # Preparation: source model, trace, layouts, images, GGUF

    def prepare(self, shape, dtype, d):
        """Returns dict(images={method: path}, gguf, tokenizer, synthetic, trace, notes)."""
        os.makedirs(d, exist_ok=True)
        notes = []
        if dtype not in self.pack_dtypes:
            raise Unavailable("nl-layout pack on this checkout has no --dtype %s (issue 18)" % dtype)
        if shape in REAL:
            spec = REAL[shape]
            if "bundled" in spec:
                model = os.path.join(SRC, spec["bundled"])
                tok = os.path.join(model, spec["tokenizer"])
            else:
                folder = os.path.join(self.a.models, spec["models"])
                model, tok = os.path.join(folder, spec["model"]), os.path.join(folder, spec["tokenizer"])
            if not os.path.exists(model):
                raise Unavailable("%s not found (--models)" % model)
            trace = os.path.join(d, "profile.h5")
            if not os.path.exists(trace):
                run(self.nice() + [self.tool("nl-profile"), "run", "--model", model, "--tokenizer", tok, "--text",
                                   PROFILE_TEXT, "--seq-len", "128", "--max-tokens",
                                   str(self.a.profile_tokens), "--out", trace, "-q"])
            if tok.endswith(".model") and subprocess.run(["/usr/bin/python3", "-c", "import sentencepiece"],
                                                         capture_output=True).returncode != 0:
                notes.append("GGUF vocabulary: synthetic (Python's sentencepiece is missing); both engines are "
                             "driven with token ids")
                tok = None
            synthetic = False
        else:
            spec = SYNTH[shape]
            whole = "pack_shape" in spec
            if whole:
                if spec["pack_shape"] not in self.pack_models:
                    raise Unavailable("needs nl-layout pack --synthetic-shape %s (not listed by pack "
                                      "--list-synthetic-models in this build)" % spec["pack_shape"])
                cfg = tuple(self.pack_models[spec["pack_shape"]][k] for k in LLAMA2C_ORDER)
            else:
                cfg = spec["config"]
            model = os.path.join(d, "random.bin")
            if not whole and params(cfg) * 4 > self.a.max_random_gb * 1e9:
                raise Unavailable("needs nl-layout pack --synthetic-shape %s (issue 18); a random llama2.c file of "
                                  "this shape is %.1f GB f32 (over --max-random-gb %g)" %
                                  (spec.get("pack_shape", shape), params(cfg) * 4 / 1e9, self.a.max_random_gb))
            if not whole and not os.path.exists(model):
                log("  writing random weights (synthetic, %.1f GB f32) %s" % (params(cfg) * 4 / 1e9, model))
                write_random_llama2c(model, cfg, 1)
            if whole:
                model = None
            tok = None
            trace = os.path.join(d, "profile.h5")
            held_out = os.path.join(d, "test.h5")
            if not (os.path.exists(trace) and os.path.exists(held_out)):
                # The layouts are solved on the profile split; nl-run's --select trace: replays the test split's
                # sequences, which no layout was built from (the layout objective's held-out rule).
                run(self.nice() + [self.tool("nl-profile"), "synth", "--preset",
                                   os.path.join(SRC, "configs", "workloads", spec["preset"] + ".json"), "--layers",
                                   str(cfg[2]), "--neurons", str(cfg[1]), "--profile-out", trace, "--test-out",
                                   held_out, "-q"])
            synthetic = True
        images = {}
        staged = self.a.one_image_at_a_time and not self.a.kernel_row_only
        for m in (["identity"] if self.a.kernel_row_only else LAYOUTS):  # the kernel row runs the identity image
            # Every layout is solved for what the rows run: this machine's device profile (--device), the rows'
            # cache ratio and the image's bundle bytes in this dtype, and pack records that device for nl-run's gap
            # rule (the layout objective: the I/O time the runtime pays). The file names carry all three (the
            # profile by its content's digest), so a layout solved for other settings is never reused.
            # The bundle bytes come from nl-layout itself (--bundle-for the model or shape pack writes, --dtype):
            # one formula, formats/core/image.h.
            lay = os.path.join(d, "layout.%s.%s-%s-c%g.json" % (m, self.device_tag, dtype, CACHE_RATIO))
            if not os.path.exists(lay):
                run(self.nice() + [self.tool("nl-layout"), "solve", "--trace", trace, "--method", m, "--device",
                                   self.a.device, "--cache-ratio", str(CACHE_RATIO), "--bundle-for",
                                   model or SYNTH[shape]["pack_shape"], "--dtype", dtype, "--out", lay, "-q"])
            img = img_path(d, m, dtype)
            # greedy+ls records the bundle bytes its objective priced; the image's manifest must have the same
            solved_for = json.load(open(lay)).get("parameters", {}).get("bundle_bytes")
            if solved_for:
                self.bundle_bytes[img] = solved_for
            self.image_layout[img] = lay
            src = ["--model", model] if model else ["--synthetic-shape", SYNTH[shape]["pack_shape"]]
            if m == "greedy+ls" and model is None and self.has_predictor_row and self.a.predictor_rank > 0:
                src += ["--predictor", "random:%d" % self.a.predictor_rank]  # PRED_ROW's predictor
            # No --tokenizer: both engines are driven with ids (nl-run --json with a tokenizer throws on
            # continuations that decode to invalid UTF-8).
            self.pack_cmds[img] = self.nice() + [self.tool("nl-layout"), "pack"] + src + [
                "--layout", lay, "--device", self.a.device, "--dtype", dtype, "--out", img, "-q"]
            if not staged:  # staged: shape() packs each layout's image just before its rows and deletes it after
                self.ensure_image(img)
            images[m] = img
        llama_here = self.llama_ok and not SYNTH.get(shape, {}).get("no_llama")
        if synthetic and model is None and self.has_synthetic_act and llama_here:
            # The whole synthetic shapes are gated ReLU, which llama.cpp's LLaMA arch cannot compute (SiLU only):
            # llama.cpp and the kernel row run the same weights as a SiLU model (identity order), timing-equivalent
            # for a dense forward; its tokens are compared with nl-run on this image, not on the ReLU ones.
            img = os.path.join(d, "silu.%s.nlw" % dtype)
            if not (os.path.exists(img) and os.path.exists(img + ".json")):
                run(self.nice() + [self.tool("nl-layout"), "pack", "--synthetic-shape", SYNTH[shape]["pack_shape"],
                                   "--synthetic-act", "silu", "--dtype", dtype, "--out", img, "-q"])
            images["silu"] = img
            notes.append("llama.cpp and the kernel row run the SiLU variant of the same random weights "
                         "(nl-layout pack --synthetic-act silu; llama.cpp has no gated-ReLU LLaMA): timing-equivalent "
                         "dense forward, different tokens from the ReLU images")
        gg = os.path.join(d, "model.%s.gguf" % dtype)
        if llama_here and not os.path.exists(gg):
            if "silu" not in images:
                self.ensure_image(images["identity"])  # staged: the GGUF is written from it
            argv = ["/usr/bin/python3", os.path.join(SRC, "scripts", "gguf_from_image.py"), "--image",
                    images.get("silu", images["identity"]), "--out", gg, "--gguf-py", self.gguf_py]
            if tok:
                argv += ["--tokenizer", tok]
            run(self.nice() + argv)
        twin = None
        kernel_row = not (self.a.no_kernel_row or self.a.agreement_only) and os.access(self.llama_bench, os.X_OK)
        if self.llama_ok and kernel_row and shape in REAL and json.load(open(images["identity"] + ".json"))[
                "model"].get("ffn_act") == "relu":
            # llama.cpp runs a gated-ReLU model through its one-expert MoE route (arch smallthinker), which costs it
            # decode speed against its dense path; the kernel row also times the same tensors as a SiLU Llama
            # (--arch llama: a timing twin, not the model's function), so nl-run is compared with the faster one.
            twin = os.path.join(d, "model.%s.llama-twin.gguf" % dtype)
            if not os.path.exists(twin):
                run(self.nice() + ["/usr/bin/python3", os.path.join(SRC, "scripts", "gguf_from_image.py"), "--image",
                                   images["identity"], "--out", twin, "--gguf-py", self.gguf_py, "--arch", "llama"])
        return {"images": images, "gguf": gg, "gguf_twin": twin, "synthetic": synthetic, "trace": trace, "notes": notes,
                "model": model, "held_out": held_out if synthetic else None, "staged": staged}

    def kernel_image(self, p):
        """The image the kernel row runs: the SiLU twin (what llama.cpp runs) or the identity image (packed again
        when a staged run deleted it)."""
        if "silu" in p["images"]:
            return p["images"]["silu"]
        self.ensure_image(p["images"]["identity"])
        return p["images"]["identity"]

    def ensure_image(self, img):
        """Packs a layout's image unless it and its manifest exist, packed from that layout file (a run without --keep
        deletes images)."""
        man = json.load(open(img + ".json")) if os.path.exists(img) and os.path.exists(img + ".json") else None
        if man and img in self.image_layout:  # an image kept from a run with another layout file is packed again
            packed_from = man.get("layout", {}).get("path") or ""
            if os.path.realpath(packed_from) != os.path.realpath(self.image_layout[img]):
                man = None
        if man is None:
            run(self.pack_cmds[img])
            man = json.load(open(img + ".json"))
        got = man["bundle"]["bytes"]
        if img in self.bundle_bytes and got != self.bundle_bytes[img]:
            raise SystemExit("e2e: %s.json: bundle of %d bytes, its layout was solved for %d" %
                             (img, got, self.bundle_bytes[img]))

    # -----------------------------------------------------------------------------------------------------------
    # Runs

    def prompt(self, vocab):
        """The fixed prompt: BOS + a deterministic id sequence (the same for both engines)."""
        ids, x = [1], 12345
        while len(ids) < self.a.prompt:
            x = (x * 1103515245 + 12345) % (1 << 31)
            ids.append(3 + x % (vocab - 3))
        return ids

    def nl_generate(self, image, select, prompt, steps, cgroup=None, extra=(), threads=None):
        glob = ["--threads", str(threads or self.a.threads)] if self.has_threads else []
        argv = self.nice() + [self.tool("nl-run")] + glob + ["generate", "--image", image, "--select", select,
                              "--prompt-tokens", ",".join(map(str, prompt)), "--steps", str(steps), "--json", "-q"] + list(extra)
        # Per-pass metrics: the decode passes' own FFN bytes (per_token_mean averages the prompt's passes in too).
        tmp = tempfile.mkdtemp(prefix="nl-e2e-metrics-", dir=self.a.work) if self.has_metrics else None
        metrics = os.path.join(tmp, "metrics.json") if tmp else None
        if metrics:
            argv += ["--metrics", metrics]
        try:
            r = run_measured(argv, cgroup)
            per_pass = []
            if metrics and r["rc"] == 0 and os.path.exists(metrics):
                with open(metrics) as f:
                    per_pass = json.load(f).get("per_token", [])
        finally:
            if tmp:
                shutil.rmtree(tmp)
        if r["rc"] != 0:
            return None, r
        j = json.loads(r["out"])
        total = len(prompt) + steps
        passes = total - 1
        loop = j["wall_seconds"]
        # nl-run on main has no batched prefill and no per-token clock: every pass (prompt or decode) is one token's
        # forward, so the loop's wall time is split evenly. A runtime that reports ttft / decode figures is used as is.
        ttft = j.get("ttft_ms", j.get("time_to_first_token_ms"))
        dec = j.get("decode_ms_per_token")
        gen = j.get("generation", {})  # the runtime's own clock (batched prefill, per-token decode), when it has one
        if ttft is None and "time_to_first_token_seconds" in gen:
            ttft = (r["wall_s"] - loop + gen["time_to_first_token_seconds"]) * 1e3  # start-up + prefill + first token
        if dec is None and gen.get("decode_tokens_per_second"):
            dec = 1e3 / gen["decode_tokens_per_second"]
        if ttft is None:
            ttft = (r["wall_s"] - loop + loop * len(prompt) / passes) * 1e3
        if dec is None:
            dec = loop / passes * 1e3
        return {"tokens": j["generated"], "ttft_ms": ttft, "decode_ms": dec, "read_bytes": r["read_bytes"],
                "maxrss_kib": r["maxrss_kib"], "cgroup_peak": r["cgroup_peak"], "wall_s": r["wall_s"],
                "bytes_needed_per_token": j["per_token_mean"]["bytes_needed"],
                "bytes_read_ffn_per_token": j["per_token_mean"]["bytes_read"],
                "decode_ffn": decode_ffn_bytes(per_pass, len(prompt)),
                "overlap_mode": j.get("overlap", {}).get("mode")}, r

    def llama_generate(self, gguf, prompt, steps, cgroup=None, margins=False):
        argv = self.nice() + [os.path.join(self.ldir, "bin", "llama-ids"), "-m", gguf, "--prompt-tokens",
                              ",".join(map(str, prompt)), "-n", str(steps), "-t", str(self.a.threads)] + (
                                  ["--margins"] if margins else [])
        r = run_measured(argv, cgroup)
        if r["rc"] != 0:
            return None, r
        j = json.loads(r["out"].strip().splitlines()[-1])
        return {"tokens": j["tokens"], "ttft_ms": j["ttft_ms"], "decode_ms": j["decode_ms_per_token"],
                "read_bytes": r["read_bytes"], "maxrss_kib": r["maxrss_kib"], "cgroup_peak": r["cgroup_peak"],
                "wall_s": r["wall_s"], "margins": j.get("margins")}, r

    def teacher_forced(self, image, prompt, tokens, margins):
        """Where free-running greedy tokens part, every later token differs for that reason alone. So each of
        llama.cpp's steps is replayed in nl-run from llama.cpp's own prefix (prompt + its first k tokens, one step),
        and each differing step is listed with llama.cpp's top-2 logit margin there: differences only at near-ties
        are rounding-order effects; a difference at a wide margin is a real disagreement."""
        if not margins or len(margins) != len(tokens):
            raise SystemExit("e2e: llama-ids printed no margins (rebuild it: scripts/llamacpp.sh)")
        nl = []
        for k in range(len(tokens)):
            t, rr = self.nl_generate(image, "dense", prompt + tokens[:k], 1)
            if t is None:
                raise SystemExit("e2e: nl-run dense (teacher-forced step %d) failed: %s" % (k, rr["err"].strip()[-500:]))
            nl.append(t["tokens"][0])
        diff = [k for k in range(len(tokens)) if nl[k] != tokens[k]]
        same = [k for k in range(len(tokens)) if nl[k] == tokens[k]]
        tf = {"nl": nl, "margins": margins, "agree": len(same), "of": len(tokens), "differ_at": diff,
              "max_margin_differing": max((margins[k] for k in diff), default=None),
              "min_margin_agreeing": min((margins[k] for k in same), default=None)}
        log("  " + teacher_forced_line(tf))
        return tf

    def kernel_row(self, p, vocab):
        """The kernel row: everything in DRAM, same dtype and threads. Per repetition and thread count, alternated:
        llama-bench (pp of --kernel-prompt tokens; tg of --steps at that depth, -d, as nl-run decodes after its prompt;
        one run each), nl-run --select dense (its own prefill and decode clocks) and, with --base-build, the same
        nl-run command of that build. Medians [min-max]."""
        prompt_ids = self.prompt_n(vocab, self.a.kernel_prompt)
        k = {"threads": {}, "prompt": self.a.kernel_prompt, "steps": self.a.steps}
        engines = [("nl", self.cli)] + ([("base", os.path.join(os.path.abspath(self.a.base_build), "cli"))]
                                        if self.a.base_build else [])
        ts = sorted({1, self.a.threads}) if self.has_threads else [1]
        for t in ts:
            k["threads"][str(t)] = {e: {"tg": [], "pp": []} for e in ["llama"] + (
                ["llama_twin"] if p.get("gguf_twin") else []) + [n for n, _ in engines]}
        for _ in range(self.a.reps):
            for t in ts:
                cell = k["threads"][str(t)]
                # pp from an empty cache; tg at the prompt's depth (-d), where nl-run's decode runs (after its
                # prompt): attention over the same number of cached positions on both sides.
                for key, gg in (("llama", p["gguf"]), ("llama_twin", p.get("gguf_twin"))):
                    if not gg:
                        continue
                    base = self.nice() + [self.llama_bench, "-m", gg, "-t", str(t), "-r", "1", "-o", "json"]
                    for e in json.loads(run(base + ["-p", str(self.a.kernel_prompt), "-n", "0"])["out"]):
                        cell[key]["pp"].append(e["avg_ts"])
                    for e in json.loads(run(base + ["-p", "0", "-n", str(self.a.steps), "-d",
                                                    str(self.a.kernel_prompt)])["out"]):
                        cell[key]["tg"].append(e["avg_ts"])
                for name, cli in engines:
                    argv = self.nice() + [os.path.join(cli, "nl-run"), "--threads", str(t), "generate", "--image",
                                          self.kernel_image(p), "--select", "dense",
                                          "--prompt-tokens",
                                          ",".join(map(str, prompt_ids)), "--steps", str(self.a.steps), "--json", "-q"]
                    r = run(argv, check=False)
                    if r["rc"] != 0:
                        continue
                    gen = json.loads(r["out"]).get("generation", {})
                    if gen.get("decode_tokens_per_second"):
                        cell[name]["tg"].append(gen["decode_tokens_per_second"])
                    if gen.get("prompt_tokens_per_second"):
                        cell[name]["pp"].append(gen["prompt_tokens_per_second"])
        k["loadavg_end"] = os.getloadavg()
        return k

    def prompt_n(self, vocab, n):
        saved = self.a.prompt
        self.a.prompt = n
        try:
            return self.prompt(vocab)
        finally:
            self.a.prompt = saved

    def llama_bench_tg(self, gguf, threads):
        argv = self.nice() + [self.llama_bench, "-m", gguf, "-p", "0", "-n",
                              str(self.a.steps), "-t", str(threads), "-r", str(max(2, self.a.reps)), "-o", "json"]
        r = run(argv)
        j = json.loads(r["out"])
        return j[0]["avg_ts"], j[0].get("stddev_ts", 0.0)

    # -----------------------------------------------------------------------------------------------------------

    def shape(self, shape, dtype):
        no_llama = SYNTH.get(shape, {}).get("no_llama")
        if not no_llama:
            return self.shape_cell(shape, dtype)
        saved, self.llama_ok = self.llama_ok, False  # this architecture has no llama.cpp counterpart
        try:
            res = self.shape_cell(shape, dtype)
        finally:
            self.llama_ok = saved
        res.setdefault("unavailable", {})["llama.cpp"] = no_llama
        return res

    def shape_cell(self, shape, dtype):
        d = os.path.join(self.work, shape)
        res = {"shape": shape, "dtype": dtype, "rows": {}, "unavailable": {}}
        log("== %s %s" % (shape, dtype))
        try:
            p = self.prepare(shape, dtype, d)
        except Unavailable as e:
            res["not_available"] = str(e)
            log("  not available: %s" % e)
            return res
        res["synthetic"] = p["synthetic"]
        staged = p["staged"]
        # Staged with a SiLU twin, the identity image is packed only for its own stage: the twin's manifest stands in
        # for it (same shape, dtype and region sizes) and its dense / gate agreement waits for that stage. Otherwise
        # (not staged, or no twin) the identity image is there from the start.
        defer = staged and "silu" in p["images"]
        if not defer:
            self.ensure_image(p["images"]["identity"])
        man = json.load(open(p["images"]["silu" if defer else "identity"] + ".json"))
        cfg = man["model"]
        prompt = self.prompt(cfg["vocab_size"])
        steps = self.a.steps
        if self.a.kernel_row_only:
            if not (self.llama_ok and os.access(self.llama_bench, os.X_OK)):
                res["unavailable"]["kernel row"] = "llama-bench not built (scripts/llamacpp.sh)"
            else:
                res["kernel_alt"] = self.kernel_row(p, cfg["vocab_size"])
            return res
        res["prompt"] = prompt
        # The cap: non-FFN bytes + 10 % of the FFN bytes + KV cache (f16 K and V, prompt + steps positions) + 256 MiB.
        ffn_bytes = sum(r["bytes"] for r in man["regions"][1:])
        dense_bytes = man["regions"][0]["bytes"]
        kv_bytes = 2 * cfg["n_layers"] * (len(prompt) + steps) * (cfg["dim"] // cfg["n_heads"] * cfg["n_kv_heads"]) * 2
        cap = dense_bytes + int(ffn_bytes * CACHE_RATIO) + kv_bytes + 256 * MIB
        res.update({"ffn_bytes": ffn_bytes, "non_ffn_bytes": dense_bytes, "kv_bytes": kv_bytes, "cap_bytes": cap})
        log("  cap %.1f MiB = non-FFN %.1f + %g%% of FFN %.1f + KV %.2f + 256 MiB" %
            (cap / MIB, dense_bytes / MIB, 100 * CACHE_RATIO, ffn_bytes * CACHE_RATIO / MIB, kv_bytes / MIB))
        files = [p["images"][m] for m in LAYOUTS] + ([p["gguf"]] if self.llama_ok else [])

        # Agreement (warm, uncapped): nl-run dense and gate vs llama.cpp.
        agree = {}
        res["agreement"] = agree

        def agree_identity():  # nl-run dense and gate on the identity image
            dense, r = self.nl_generate(p["images"]["identity"], "dense", prompt, steps)
            if dense is None:
                raise SystemExit("e2e: nl-run dense failed: %s" % r["err"].strip()[-1000:])
            agree["nl_dense"] = dense["tokens"]
            gate, _ = self.nl_generate(p["images"]["identity"], "gate", prompt, steps)
            if gate:
                agree["nl_gate"] = gate["tokens"]
            return dense

        vs_llama = None
        if "silu" in p["images"]:  # llama.cpp runs the SiLU variant: compare it with nl-run on that image
            vs_llama, r = self.nl_generate(p["images"]["silu"], "dense", prompt, steps)
            if vs_llama is None:
                raise SystemExit("e2e: nl-run dense (SiLU variant) failed: %s" % r["err"].strip()[-1000:])
            agree["nl_dense_silu"] = vs_llama["tokens"]
        if not defer:
            dense = agree_identity()
            vs_llama = vs_llama or dense
        if self.llama_ok:
            ll, r = self.llama_generate(p["gguf"], prompt, steps, margins=self.a.teacher_forced)
            if ll is None:
                raise SystemExit("e2e: llama-ids failed: %s" % r["err"].strip()[-1000:])
            agree["llama"] = ll["tokens"]
            same = sum(1 for x, y in zip(ll["tokens"], vs_llama["tokens"]) if x == y)
            prefix = 0
            while prefix < len(ll["tokens"]) and ll["tokens"][prefix] == vs_llama["tokens"][prefix]:
                prefix += 1
            agree.update({"agree": same, "of": len(ll["tokens"]), "prefix": prefix})
            log("  agreement nl-run dense vs llama.cpp: %d/%d tokens, first %d identical" % (same, len(ll["tokens"]),
                                                                                          prefix))
            if self.a.teacher_forced:
                agree["teacher_forced"] = self.teacher_forced(p["images"].get("silu", p["images"]["identity"]),
                                                              prompt, ll["tokens"], ll["margins"])
        else:
            res["unavailable"]["llama.cpp"] = "not built (scripts/llamacpp.sh)"
        if self.a.agreement_only:
            if defer:
                self.ensure_image(p["images"]["identity"])
                agree_identity()
            return res

        # Timed rows, alternated: for each rep, every variant once.
        variants = []
        if self.llama_ok:
            variants += [("llama.cpp mmap, capped", "llama", True, []),
                         ("llama.cpp mmap, uncapped (warm)", "llama", False, [])]
        if self.has_trace_select and p["held_out"]:
            sel = "trace:" + p["held_out"]
        elif p["synthetic"]:
            sel = "gate"
            res["unavailable"]["nl-run --select trace:"] = ("not on this checkout (issue 18): random SiLU weights "
                                                           "fire every neuron, so --select gate reads the whole FFN")
        else:
            sel = "gate"
        res["select"] = sel
        ratio = ["--cache-ratio", str(CACHE_RATIO)]
        for m in LAYOUTS:
            if self.has_overlap:  # io_uring either way: "on" is --overlap-on (nl-run's default), "off" is none
                variants.append((nl_row(m, False), m, True, ratio + ["--io", "uring", "--overlap", "none"]))
                on = self.a.overlap_on.split("@")
                variants.append((nl_row(m, True), m, True, ratio + ["--io", "uring", "--overlap", on[0]] +
                                 (["--read-ahead", on[1]] if len(on) > 1 else [])))
            else:
                variants.append((nl_row(m, None), m, True, ratio))
            if m in self.verify_rows:  # the overlap-on row again with every bundle read checked (--verify-reads)
                on_row = variants[-1]
                variants.append((nl_verify_row(m), m, True, list(on_row[3]) + ["--verify-reads"]))
            if m in self.budget_rows:  # the user's way: the cap as nl-run's --memory-budget, which sizes the cache
                variants.append((nl_budget_row(m), m, True, (["--io", "uring"] if self.has_overlap else []) +
                                 ["--memory-budget", str(cap)]))
        packed_with = self.pack_cmds.get(p["images"].get("greedy+ls"), [])
        if "--predictor" in packed_with and sel.startswith("trace:") and self.has_overlap:
            on_row = [v for v in variants if v[0] == nl_row("greedy+ls", True)][0]
            variants.append((PRED_ROW, "greedy+ls", True, list(on_row[3])))
            res["predictor"] = {"rank": self.a.predictor_rank, "source": "random (nl-layout pack --predictor random:R)",
                                "note": "synthetic random predictor weights: its cost is real, its choice discarded"}
        variants.append((DENSE_ROW, "dense", False, []))
        variants.append((FLOOR_ROW, "greedy+ls", False, ["--cache-ratio", "1"] +
                         (["--io", "uring", "--overlap", "none"] if self.has_overlap else [])))
        if not self.has_overlap:
            res["unavailable"]["nl-run overlap on/off"] = "no I/O-compute overlap switch on this checkout (issue 18)"
        # Stages: all variants alternated together, or (--one-image-at-a-time, for disks that cannot hold every
        # image at once) llama.cpp's rows, then per layout its image packed, its rows alternated, the image deleted.
        if staged:
            stages = [(None, [v for v in variants if v[1] == "llama"])]
            for m in LAYOUTS:
                stages.append((m, [v for v in variants if v[1] == m or (m == "identity" and v[1] == "dense")]))
            res["staged"] = ("one layout image on disk at a time: repetitions alternate within llama.cpp's rows and "
                             "within each layout's rows, not across layouts")
        else:
            stages = [(None, variants)]
        samples = {v[0]: [] for v in variants}
        failures = {}
        for layout, stage in stages:
            if layout:
                self.ensure_image(p["images"][layout])
                if layout == "identity" and "nl_dense" not in agree:
                    agree_identity()
            for rep in range(self.a.reps):
                for name, kind, capped, extra in stage:
                    if name in failures:
                        continue
                    if capped:
                        for f in files:
                            if os.path.exists(f):
                                drop_file_cache(f)
                    elif kind == "dense" or name == FLOOR_ROW:
                        # nl-run --select dense reads the image with O_DIRECT into its own huge-page buffers: a page
                        # cache full of this shape's files would only crowd them out (a 7B f16 image warmed beside
                        # its 13 GB copy left 2.2 GB of the copy in 4 KiB pages, 412 against 375-382 ms/token), so
                        # they are dropped instead.
                        for f in files + [p["images"].get("silu")]:
                            if f and os.path.exists(f):
                                drop_file_cache(f)
                    else:
                        warm = p["gguf"] if kind == "llama" else p["images"]["identity"]
                        with open(warm, "rb") as fh:  # warm: the whole file in page cache
                            while fh.read(1 << 24):
                                pass
                    cg = MemoryCgroup(cap) if capped else None
                    if capped and not cg.path:  # 77: the smoke test reports it as skipped, with this reason
                        print("e2e: cannot cap memory (needs root and a memory cgroup): %s" % cg.reason,
                              file=sys.stderr)
                        sys.exit(77)
                    try:
                        if kind == "llama":
                            s, r = self.llama_generate(p["gguf"], prompt, steps, cg)
                        elif kind == "dense":
                            s, r = self.nl_generate(p["images"]["identity"], "dense", prompt, steps)
                        else:
                            s, r = self.nl_generate(p["images"][kind], "predictor+" + sel if name == PRED_ROW else sel,
                                                    prompt, steps, cg, extra)
                    finally:
                        if cg:
                            cg.close()
                    if s is None:
                        failures[name] = "exit %d%s: %s" % (r["rc"], " (killed: over the memory cap?)" if r["rc"] < 0
                                                            or r["rc"] == 137 else "", r["err"].strip()[-300:])
                        log("  %s failed: %s" % (name, failures[name]))
                        continue
                    samples[name].append(s)
                    log("  rep %d %-40s ttft %8.1f ms  decode %8.2f ms/token  read %6.1f MiB  peak RSS %6.1f MiB" %
                        (rep, name, s["ttft_ms"], s["decode_ms"], s["read_bytes"] / MIB, s["maxrss_kib"] / 1024))
            if layout:  # even with --keep: staging is for a disk that cannot hold the next image beside this one
                os.unlink(p["images"][layout])  # the manifest (small) stays: the run's record of the layout
        n_tok = len(prompt) + steps - 1  # forward passes: the prompt, then every generated token but the last
        rows = {}
        for name, kind, capped, _extra in variants:
            ss = samples[name]
            if not ss:
                rows[name] = {"failed": failures.get(name, "no samples")}
                continue
            rows[name] = {
                "ttft_ms": [s["ttft_ms"] for s in ss], "decode_ms": [s["decode_ms"] for s in ss],
                "tok_s": [1e3 / s["decode_ms"] for s in ss if s["decode_ms"] > 0],
                "read_bytes_per_token": [s["read_bytes"] / n_tok for s in ss],
                "peak_rss_mib": [s["maxrss_kib"] / 1024 for s in ss],
                "cgroup_peak_mib": [s["cgroup_peak"] / MIB for s in ss if s["cgroup_peak"]],
                "tokens_equal_agreement_run": all(s["tokens"] == ss[0]["tokens"] for s in ss)}
            if kind != "llama":
                rows[name]["bytes_needed_per_token"] = med([s["bytes_needed_per_token"] for s in ss])
                dec = [s["decode_ffn"] for s in ss if s.get("decode_ffn")]
                if dec and len(dec) == len(ss):
                    rows[name]["decode_ffn_needed_per_token"] = med([d["needed"] for d in dec])
                    rows[name]["decode_ffn_read_per_token"] = med([d["read"] for d in dec])
                modes = sorted({s["overlap_mode"] for s in ss if s.get("overlap_mode")})
                if modes:  # what nl-run ran (--overlap auto resolved by nl-run itself)
                    rows[name]["overlap_mode"] = ",".join(modes)
        # The bound: max(compute with everything in DRAM, needed bytes at the device's bandwidth). Needed bytes: the
        # decode passes' own (the prompt's passes read the union of a block once per layer: fewer bytes per pass).
        comp = med(rows[DENSE_ROW]["decode_ms"]) if "decode_ms" in rows.get(DENSE_ROW, {}) else None
        bw = self.device["bandwidth_MBps"] * 1e6
        ident = [rows[n] for n in (nl_row("identity", True), nl_row("identity", None)) if n in rows]
        need_key, need = next(((k, r[k]) for k in ("decode_ffn_needed_per_token", "bytes_needed_per_token")
                               for r in ident if k in r), (None, None))
        if need is not None and comp is not None:
            io_ms = need / bw * 1e3
            res["bound"] = {"compute_ms": comp, "io_ms": io_ms, "bound_ms": max(comp, io_ms),
                            "device": self.device.get("name"), "bandwidth_MBps": self.device["bandwidth_MBps"],
                            "needed_bytes_per_token": need,
                            "needed_from": "decode passes" if need_key.startswith("decode") else "all passes"}
            if "decode_ms" in rows.get(FLOOR_ROW, {}):  # the true floor: sparse compute, not dense
                floor = med(rows[FLOOR_ROW]["decode_ms"])
                res["bound"].update({"floor_compute_ms": floor, "true_bound_ms": max(floor, io_ms)})
        # Kernel row: everything in DRAM, same dtype; llama-bench tg at 1 and the bench's threads.
        if self.a.no_kernel_row:
            res["unavailable"]["kernel row"] = "skipped (--no-kernel-row)"
        elif self.llama_ok and comp is not None and not os.access(self.llama_bench, os.X_OK):
            res["unavailable"]["kernel row"] = "llama-bench not built (scripts/llamacpp.sh)"
        elif self.llama_ok and comp is not None:
            # Both engines at the same thread counts: nl-run --select dense (median of the reps) and llama-bench tg.
            res["kernel_alt"] = self.kernel_row(p, cfg["vocab_size"])
            k = {"nl_dense_tok_s": 1e3 / comp, "nl_threads": self.a.threads if self.has_threads else 1, "llama": {},
                 "nl": {}}
            for t in sorted({1, self.a.threads}):
                ts, sd = self.llama_bench_tg(p["gguf"], t)
                k["llama"][str(t)] = {"tg_tok_s": ts, "stddev": sd}
                if t == k["nl_threads"]:
                    k["nl"][str(t)] = {"tok_s": 1e3 / comp}
                elif self.has_threads:
                    ms = []
                    for _ in range(self.a.reps):
                        g, _r = self.nl_generate(self.kernel_image(p), "dense", prompt, steps, threads=t)
                        if g:
                            ms.append(g["decode_ms"])
                    if ms:
                        k["nl"][str(t)] = {"tok_s": 1e3 / med(ms)}
            res["kernel"] = k
        res["rows"] = rows
        res["loadavg_end"] = os.getloadavg()  # a time-shared CPU slows OpenMP barriers most: say what it was
        return res

    def main(self):
        for shape in self.a.shapes.split(","):
            if shape not in SYNTH and shape not in REAL:
                raise SystemExit("e2e: unknown shape %s (%s)" % (shape, ", ".join(list(REAL) + list(SYNTH))))
            d = os.path.join(self.work, shape)
            for dtype in self.a.dtypes.split(","):
                if self.a.prepare_only:  # images, layouts, traces and GGUF only (kept), e.g. while the machine is busy
                    log("== %s %s: prepare only" % (shape, dtype))
                    self.prepare(shape, dtype, d)
                    continue
                res = self.shape(shape, dtype)
                self.results["shapes"].append(res)
                print_shape(res)
                sys.stdout.flush()
                self.write_json()  # after every shape: a cut-off run keeps what it measured
                self.clean(d, shape, (".nlw", ".gguf", ".nlw.json"))  # disk: one shape and dtype at a time
            if not self.a.prepare_only:
                self.clean(d, shape, (".bin",))

    def clean(self, d, shape, suffixes):
        if self.a.keep or shape in REAL or not os.path.isdir(d):
            return
        for f in os.listdir(d):
            if f.endswith(suffixes):
                os.unlink(os.path.join(d, f))

    def write_json(self):
        if self.a.json:
            tmp = self.a.json + ".tmp"
            with open(tmp, "w") as f:
                json.dump(self.results, f, indent=1)
            os.replace(tmp, self.a.json)


def nl_row(method, overlap):
    """The row name of nl-run with a layout: overlap True (on), False (off) or None (no overlap switch)."""
    return "nl-run %s%s, capped" % (method, {True: ", overlap on", False: ", overlap off", None: ""}[overlap])


def nl_verify_row(method):
    """The row name of nl-run with a layout, overlap on, every bundle read checked (--verify-reads)."""
    return "nl-run %s, overlap on, --verify-reads, capped" % method


def nl_budget_row(method):
    """The row name of nl-run with a layout under --memory-budget = the cap (default overlap; the cache it sizes)."""
    return "nl-run %s, --memory-budget = cap, capped" % method


def identity_row(rows, name):
    """The identity row a row is compared with: the same overlap setting (overlap on for llama.cpp and dense), or
    identity's own budget row for a budget row."""
    if "--memory-budget" in name and nl_budget_row("identity") in rows:
        return rows[nl_budget_row("identity")]
    for on in ((False,) if "overlap off" in name else (True,)) + (None,):
        if nl_row("identity", on) in rows:
            return rows[nl_row("identity", on)]
    return {}


def params(cfg):
    dim, hidden, layers, heads, kv, vocab, _ = cfg
    return vocab * dim + layers * (2 * dim * dim + 2 * dim * dim // heads * kv + 3 * dim * hidden)


def fr(xs, f="%.2f"):
    if not xs:
        return "-"
    return (f + " [" + f + "-" + f + "]") % (med(xs), min(xs), max(xs))


def print_kernel_alt(res):
    ka = res.get("kernel_alt")
    if ka:
        print("kernel row (all in DRAM, alternated per repetition; load average at the end %.1f %.1f %.1f): tok/s "
              "median [min-max] over %d reps, prompt %d tokens, %d decoded" % (
                  tuple(ka["loadavg_end"]) + (len(next(iter(ka["threads"].values()))["llama"]["tg"]), ka["prompt"],
                                              ka["steps"])))
        for t, cell in sorted(ka["threads"].items()):
            for what, label in (("tg", "decode"), ("pp", "prefill")):
                for ref, ref_tag in (("llama", "llama.cpp"), ("llama_twin", "llama.cpp dense twin")):
                    lv = cell.get(ref, {}).get(what)
                    if not lv:
                        continue
                    line = "  %s thread%s %-7s %s %-24s" % (t, "s" if t != "1" else " ", label, ref_tag,
                                                          fr(lv, "%.1f"))
                    for name in [n for n in cell if n not in ("llama", "llama_twin")]:
                        v = cell[name][what]
                        tag = "nl-run" if name == "nl" else "nl-run (--base-build)"
                        if v:
                            line += "  %s %-24s %.3fx" % (tag, fr(v, "%.1f"), trunc(med(v) / med(lv), 3))
                        else:
                            line += "  %s failed" % tag
                    print(line)


def teacher_forced_line(tf):
    s = "teacher-forced (nl-run fed llama.cpp's prefix, one step each): %d/%d next tokens equal" % (tf["agree"],
                                                                                                  tf["of"])
    if tf["differ_at"]:
        s += "; the others at steps %s, where llama.cpp's top-2 logit margin was %s (largest %.4g; smallest margin " \
             "among the equal steps %s)" % (",".join(map(str, tf["differ_at"])),
                                             ", ".join("%.4g" % tf["margins"][k] for k in tf["differ_at"]),
                                             tf["max_margin_differing"],
                                             "%.4g" % tf["min_margin_agreeing"] if tf["min_margin_agreeing"]
                                             is not None else "-")
    return s


def print_shape(res):
    tag = " (SYNTHETIC: random weights, meaningless text, real timing)" if res.get("synthetic") else ""
    print("\n== %s %s%s" % (res["shape"], res["dtype"], tag))
    if "not_available" in res:
        print("not available: %s" % res["not_available"])
        return
    ag = res.get("agreement", {})
    if "agree" in ag:
        print("greedy tokens, nl-run --select dense vs llama.cpp: %d/%d equal, first %d identical" %
              (ag["agree"], ag["of"], ag["prefix"]))
        if "teacher_forced" in ag:
            print(teacher_forced_line(ag["teacher_forced"]))
        if "nl_gate" in ag:
            print("nl-run --select gate vs dense: %s" % ("identical" if ag["nl_gate"] == ag["nl_dense"] else "DIFFER"))
    if "cap_bytes" in res:
        print("cap %.1f MiB = non-FFN %.1f MiB + %g%% of FFN %.1f MiB + KV %.2f MiB + 256 MiB" %
              (res["cap_bytes"] / MIB, res["non_ffn_bytes"] / MIB, 100 * CACHE_RATIO,
               res["ffn_bytes"] * CACHE_RATIO / MIB, res["kv_bytes"] / MIB))
    for k, v in res.get("unavailable", {}).items():
        print("not available: %s: %s" % (k, v))
    rows = res.get("rows", {})
    if not rows:
        print_kernel_alt(res)
        return
    print("nl-run selection: --select %s; load average at the end %s" % (
        res.get("select", "?"), " ".join("%.1f" % x for x in res.get("loadavg_end", ()))))
    ran = sorted({r["overlap_mode"] for n, r in rows.items() if "overlap on" in n and r.get("overlap_mode")})
    if ran:
        print("nl-run's overlap-on rows ran --overlap %s" % ", ".join(ran))
    base = rows.get("llama.cpp mmap, capped", {})
    bound = res.get("bound")
    print("%-40s %-26s %-26s %-22s %-14s %-14s %-9s %-9s %-7s %-7s" % (
        "row", "TTFT ms", "decode ms/token", "tok/s", "read B/token", "peak RSS MiB", "x llama", "x ident",
        "bound%", "floor%"))
    for name, r in rows.items():
        if "failed" in r:
            print("%-40s failed: %s" % (name, r["failed"]))
            continue
        dm = med(r["decode_ms"])
        vs_l = "%.3f" % trunc(med(base["decode_ms"]) / dm, 3) if base.get("decode_ms") else "-"
        ident = identity_row(rows, name)
        vs_i = "%.3f" % trunc(med(ident["decode_ms"]) / dm, 3) if ident.get("decode_ms") else "-"
        share = "%.3f" % trunc(bound["bound_ms"] / dm, 3) if bound else "-"
        tshare = "%.3f" % trunc(bound["true_bound_ms"] / dm, 3) if bound and "true_bound_ms" in bound else "-"
        print("%-40s %-26s %-26s %-22s %-14.0f %-14.1f %-9s %-9s %-7s %-7s" % (
            name, fr(r["ttft_ms"], "%.1f"), fr(r["decode_ms"]), fr(r["tok_s"], "%.1f"),
            med(r["read_bytes_per_token"]), med(r["peak_rss_mib"]), vs_l, vs_i, share, tshare))
    for name, r in rows.items():  # --verify-rows: what checking every bundle read costs, against the same row without
        plain = name.replace(", --verify-reads", "")
        if name != plain and "decode_ms" in r and "decode_ms" in rows.get(plain, {}):
            v, b = med(r["decode_ms"]), med(rows[plain]["decode_ms"])
            print("--verify-reads: %s decode %.2f against %.2f ms/token without: %+.1f %% (medians; TTFT %.1f against "
                  "%.1f ms)" % (name.split(",")[0], v, b, 100 * (v / b - 1), med(r["ttft_ms"]),
                                                   med(rows[plain]["ttft_ms"])))
    dec = [(n, r) for n, r in rows.items() if "decode_ffn_read_per_token" in r]
    if dec:
        print("FFN flash bytes per decode pass (nl-run --metrics, the passes after the prompt), needed / read:")
        for name, r in dec:
            print("  %-40s %.0f / %.0f" % (name, r["decode_ffn_needed_per_token"], r["decode_ffn_read_per_token"]))
    if bound:
        print("bound: %.3f ms/token = max(compute in DRAM %.3f, needed bytes (%s, %.0f B) at %s %.0f MB/s %.3f)" % (
            bound["bound_ms"], bound["compute_ms"], bound.get("needed_from", "all passes"),
            bound.get("needed_bytes_per_token", float("nan")), bound["device"], bound["bandwidth_MBps"],
            bound["io_ms"]))
        if "true_bound_ms" in bound:
            print("true bound (floor%%): %.3f ms/token = max(sparse compute with every bundle in DRAM %.3f, needed "
                  "bytes at the device's bandwidth %.3f); bound%% above uses dense compute, which is no floor" % (
                      bound["true_bound_ms"], bound["floor_compute_ms"], bound["io_ms"]))
    print_kernel_alt(res)
    k = res.get("kernel")
    if k:
        for t, v in sorted(k["llama"].items()):
            nl = k.get("nl", {}).get(t)
            if not nl:
                print("kernel row (all in DRAM), %s thread%s: llama-bench tg %.1f tok/s; nl-run not measured at this "
                      "thread count" % (t, "s" if t != "1" else "", v["tg_tok_s"]))
                continue
            print("kernel row (all in DRAM), %s thread%s: nl-run --select dense %.1f tok/s, llama-bench tg %.1f tok/s "
                  "(+-%.1f): %.3fx" % (t, "s" if t != "1" else "", nl["tok_s"], v["tg_tok_s"], v["stddev"],
                                       trunc(nl["tok_s"] / v["tg_tok_s"], 3)))


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--build", default=os.path.join(SRC, "build"))
    ap.add_argument("--shapes", help="comma-separated (default: stories260k,tiny-relu,small-relu,187m,1b,llama2-7b,"
                    "mistral-7b; --smoke: tiny-relu,stories260k; also opt-1.3b, opt-6.7b: OPT, nl-run's rows only)")
    ap.add_argument("--dtypes", default="f32,f16,q8_0")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--prompt", type=int, default=16, help="prompt tokens (BOS + fixed ids)")
    ap.add_argument("--steps", type=int, default=32, help="decoded tokens")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--profile-tokens", type=int, default=16384, help="real models: tokens profiled for the layouts")
    ap.add_argument("--device", default=os.path.join(SRC, "configs", "devices", "devbox.json"),
                    help="device profile for the bound's bandwidth (nl-run probe writes one)")
    ap.add_argument("--models", default=os.environ.get("NL_MODELS_DIR", os.path.join(SRC, "datasets")),
                    help="folder holding llama2c-stories260K/ (as the tests' NL_MODELS_DIR)")
    ap.add_argument("--work", default="/tmp/nl-e2e")
    ap.add_argument("--nice", type=int, default=0)
    ap.add_argument("--predictor-rank", type=int, default=1024,
                    help="whole synthetic shapes: the rank of the random predictor the 'predictor paid' row runs "
                         "(0: no such row)")
    ap.add_argument("--max-random-gb", type=float, default=6.0,
                    help="write random llama2.c models up to this size (f32) when pack has no whole-model shape")
    ap.add_argument("--keep", action="store_true", help="keep the synthetic shapes' images and GGUF files")
    ap.add_argument("--agreement-only", action="store_true", help="only the greedy-token agreement, no timing")
    ap.add_argument("--teacher-forced", action="store_true",
                    help="also replay each of llama.cpp's greedy steps in nl-run from llama.cpp's own prefix (one "
                         "nl-run run per step) and list llama.cpp's top-2 logit margin at each step that differs")
    ap.add_argument("--smoke", action="store_true",
                    help="f32, 1 rep, 8 tokens, 2,048 profile tokens (the test suite's run)")
    ap.add_argument("--json", help="write all figures here")
    ap.add_argument("--kernel-row-only", action="store_true",
                    help="only the kernel row (everything in DRAM: nl-run --select dense vs llama-bench, alternated)")
    ap.add_argument("--kernel-prompt", type=int, default=64, help="kernel row: prompt tokens (llama-bench pp)")
    ap.add_argument("--base-build", help="kernel row: also run this build's nl-run, alternated (before/after)")
    ap.add_argument("--overlap-on", default="auto",
                    help="the overlap rows' nl-run --overlap mode, MODE or MODE@READ_AHEAD (e.g. cross@8MiB); "
                         "default auto, nl-run's own default (both)")
    ap.add_argument("--budget-rows", default="",
                    help="comma-separated layouts (identity,greedy,greedy+ls) that also get a row with nl-run's "
                         "--memory-budget set to the cap (the cache sized from it) instead of --cache-ratio 0.1")
    ap.add_argument("--verify-rows", default="",
                    help="comma-separated layouts whose overlap-on row is also run with nl-run --verify-reads, "
                         "alternated with it (the cost of checking every bundle read; docs/robustness.md)")
    ap.add_argument("--no-kernel-row", action="store_true",
                    help="skip the kernel row (llama-bench and nl-run --select dense, all in DRAM) after the rows")
    ap.add_argument("--one-image-at-a-time", action="store_true",
                    help="keep one layout image on disk at a time (pack it before its rows, delete it after; for a "
                         "7B f16 shape whose images and GGUF do not fit the disk at once)")
    ap.add_argument("--prepare-only", action="store_true",
                    help="write the traces, layouts, images and GGUF files (kept for a later run) and stop")
    a = ap.parse_args()
    if a.smoke:
        a.shapes = a.shapes or "tiny-relu,stories260k"
        a.dtypes, a.reps, a.steps, a.profile_tokens = "f32", 1, 8, 2048
    a.shapes = a.shapes or "stories260k,tiny-relu,small-relu,187m,1b,llama2-7b,mistral-7b"
    if a.threads < 1 or a.reps < 1 or a.prompt < 1 or a.steps < 2:
        ap.error("--threads, --reps, --prompt must be >= 1 and --steps >= 2")
    Bench(a).main()


if __name__ == "__main__":
    main()
