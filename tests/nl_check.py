#!/usr/bin/env python3
"""What the model-family checks (tests/check_opt.py, tests/check_phi.py) share: PASS / FAIL lines and their count,
running the binaries, `nl-run generate --json` with its logits, the relative logit error against a reference, the
one-line refusal check and edited copies of a manifest."""
import json
import os
import shutil
import subprocess
import sys

import numpy as np


def llamacpp_dir():
    """Where scripts/llamacpp.sh keeps llama.cpp's binaries (bin/) and its gguf-py (gguf-py/): $NL_LLAMACPP_DIR, else
    ~/.cache/nl-llamacpp/3.22.1."""
    return os.environ.get("NL_LLAMACPP_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "nl-llamacpp",
                                                             "3.22.1")


def torch_ok():
    """Whether this Python has torch and h5py (the trace_hooks.py checks need both)."""
    try:
        import h5py  # noqa: F401
        import torch  # noqa: F401
        return True
    except ImportError:
        return False


def masks_of(path, n_layers):
    """A trace's masks (docs/formats.md, trace v1), per layer bool [tokens][neurons], its tokens and its sequence
    bounds (each sequence's first token, then the token count)."""
    import h5py
    with h5py.File(path, "r") as f:
        toks, n = f["tokens"][...], int(f.attrs["n_tokens"])
        bounds = list(f["sequences"][...]) + [n]
        out = []
        for lay in range(n_layers):
            w = f["layers/%d/mask" % lay][...]
            b = np.unpackbits(w.astype("<u8").view(np.uint8).reshape(w.shape[0], -1), axis=1, bitorder="little")
            out.append(b[:, :n].astype(bool).T)
    return out, toks, bounds


class Checks:
    def __init__(self, build, work, prompt, steps):
        self.L, self.R, self.P = (os.path.join(build, "cli", b) for b in ("nl-layout", "nl-run", "nl-profile"))
        self.work, self.prompt, self.steps = work, prompt, steps
        self.passes = self.fails = 0

    def check(self, name, ok, detail=""):
        self.passes += bool(ok)
        self.fails += not ok
        print(("PASS " if ok else "FAIL ") + name + ("" if ok else " " + str(detail)))

    @staticmethod
    def run(*args):
        return subprocess.run([str(a) for a in args], capture_output=True, text=True)

    def make_checkpoint(self, script, name, *args):
        """tests/SCRIPT (a random checkpoint writer) into the work folder's NAME; exits on failure."""
        d = os.path.join(self.work, name)
        r = self.run(sys.executable, os.path.join(os.path.dirname(os.path.abspath(__file__)), script), d, *args)
        if r.returncode:
            sys.exit("%s failed: %s" % (script, r.stderr))
        return d

    def generate(self, img, *extra, npy=None):
        """nl-run generate --json on the prompt: (parsed JSON, logits [steps][vocab] or None), or ({"error": ...},
        None) when it fails."""
        args = [self.R, "generate", "--image", img, "--prompt-tokens", ",".join(map(str, self.prompt)), "--steps",
                str(self.steps), "--json", "-q"] + list(extra)
        if npy:
            args += ["--logits", npy]
        r = self.run(*args)
        if r.returncode:
            return {"error": r.stderr.strip()}, None
        return json.loads(r.stdout), (np.load(npy) if npy else None)

    @staticmethod
    def rel_err(got, want):
        """The largest |got - want| of any step relative to that step's largest |want|."""
        return max(float(np.max(np.abs(got[i] - want[i])) / np.max(np.abs(want[i]))) for i in range(len(want)))

    def refused(self, label, args, file_part, words=()):
        """`args` must exit 3 with one line naming `file_part` and every word of `words`."""
        r = self.run(*args)
        self.check("%s: refused (exit 3, one line naming %s)" % (label, file_part),
                   r.returncode == 3 and file_part in r.stderr and all(w in r.stderr for w in words)
                   and r.stderr.count("\n") == 1, "exit %d: %s" % (r.returncode, r.stderr.strip()))

    def edited_manifest(self, img, edit):
        """A copy of img (bad.nlw in the work folder) whose manifest `edit` changed."""
        bad = json.load(open(img + ".json"))
        edit(bad)
        shutil.copy(img, os.path.join(self.work, "bad.nlw"))
        bad["image"]["file"] = "bad.nlw"
        json.dump(bad, open(os.path.join(self.work, "bad.nlw.json"), "w"))
        return os.path.join(self.work, "bad.nlw")

    def summary(self, name):
        print("%s: %d passed, %d failed" % (name, self.passes, self.fails))
        return 1 if self.fails else 0

    # The paths every model family runs: dense, and gate under each overlap, on 1 and 2 threads.
    PATHS = [("dense", "none", 1), ("gate", "none", 1), ("gate", "layer", 1), ("gate", "cross", 1),
             ("gate", "both", 1), ("gate", "none", 2), ("gate", "both", 2)]

    def paths_agree(self, images, forward):
        """For each dtype's image (images: dtype -> path): every path of PATHS gives the same tokens; at f32 / f16 the
        logits of every path are within 1e-4 / 2e-2 of forward(tokens) (the reference's logits [n][vocab]), and at
        f32 the tokens are its greedy ones and more than one distinct; every dtype's agreement with the reference is
        printed, teacher-forced (its argmax on the dtype's own tokens) and free-running (against the f32 tokens).
        Returns {(dtype, select, overlap, threads): (tokens, logits, active neurons)}."""
        runs = {}
        n = len(self.prompt)
        base = None  # the f32 tokens (the reference's greedy ones when its check passes)
        for dtype, img in images.items():
            for select, overlap, threads in self.PATHS:
                j, lg = self.generate(img, "--select", select, "--overlap", overlap, "--threads", str(threads),
                                      npy=os.path.join(self.work, "l.npy"))
                if "error" in j:
                    self.check("%s --select %s --overlap %s --threads %d runs" % (dtype, select, overlap, threads),
                               False, j["error"])
                    continue
                runs[(dtype, select, overlap, threads)] = (j["generated"], lg, j["totals"]["active"])
            got = {k[1:]: v[0] for k, v in runs.items() if k[0] == dtype}
            gen = got.get(("gate", "none", 1))
            self.check("%s: dense and gate under every overlap and 1 / 2 threads give the same tokens" % dtype,
                       gen is not None and len(got) == len(self.PATHS) and all(g == gen for g in got.values()),
                       str(got))
            if gen is None:
                continue
            want = forward(self.prompt + gen[:-1])[n - 1:]
            base = base or (gen if dtype == "f32" else None)
            tf = sum(int(w.argmax()) == g for w, g in zip(want, gen))
            fr = sum(a == b for a, b in zip(gen, base)) if base else None
            prefix = next((i for i, (a, b) in enumerate(zip(gen, base)) if a != b), len(gen)) if base else None
            print("  %s: agreement with the reference: teacher-forced %d/%d, free-running %s" % (
                dtype, tf, len(gen), "%d/%d (first %d identical)" % (fr, len(gen), prefix) if base else "-"))
            if dtype not in ("f32", "f16"):
                continue
            tol = 1e-4 if dtype == "f32" else 2e-2
            err = max(self.rel_err(v[1], want) for k, v in runs.items() if k[0] == dtype)
            self.check("%s: logits of every path within %g of the reference (max relative error %.2e)" %
                       (dtype, tol, err), err <= tol)
            if dtype == "f32":
                greedy = [int(v) for v in want.argmax(1)]
                self.check("f32: greedy tokens equal the reference's %s (%d distinct)" % (greedy, len(set(greedy))),
                           gen == greedy and len(set(gen)) > 1, str(gen))
        return runs

    def engines_agree(self, img, tokens):
        """--select gate with every I/O engine (and a neuron cache) generates `tokens`."""
        got = {io: self.generate(img, "--select", "gate", "--io", io, "--cache-ratio", "0.2")[0].get("generated")
               for io in ("pread", "preadv", "uring", "mmap")}
        self.check("every I/O engine (pread, preadv, uring, mmap; cache ratio 0.2) gives the same tokens",
                   all(g == tokens for g in got.values()), str(got))

    def configs_refused(self, checkpoint, cases):
        """pack refuses a copy of `checkpoint` with each config.json edit of `cases` ([(label, {key: value}, words)]):
        exit 3, one line naming config.json and the words."""
        for label, edit, words in cases:
            bdir = os.path.join(self.work, "bad_cfg")
            shutil.rmtree(bdir, ignore_errors=True)
            shutil.copytree(checkpoint, bdir)
            json.dump(dict(json.load(open(os.path.join(checkpoint, "config.json"))), **edit),
                      open(os.path.join(bdir, "config.json"), "w"))
            self.refused("pack, " + label, [self.L, "pack", "--model", bdir, "--out",
                                            os.path.join(self.work, "bad_out.nlw"), "-q"], "config.json", words)
