#!/usr/bin/env python3
"""What the model-family checks (tests/check_opt.py, tests/check_phi.py) share: PASS / FAIL lines and their count,
running the binaries, `nl-run generate --json` with its logits, the relative logit error against a reference, the
one-line refusal check and edited copies of a manifest."""
import json
import os
import shutil
import subprocess

import numpy as np


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
