#!/usr/bin/env python3
"""Every manifest field against the image id's promise (docs/formats.md "What the image id covers"): an edit of any
field either is refused when the image opens (exit 3) or leaves the generated tokens as they were. Issue 56 item 5
found act_threshold outside the id (x20 changed --select threshold's tokens with exit 0).

The test walks the manifest of a real packed image (the bundled tiny-relu model with a solved layout, so planner and
cache_policy are there, and calibrated act_threshold values) and edits each leaf in turn, so fields added later are
covered without touching this file: numbers are multiplied by 20, set to 0 and increased by 1; strings get a suffix;
booleans flip; of a long array (an order, pinned slots) the first and last entries are edited. Each edit runs
`nl-run generate --select threshold` (the mode that reads the most fields: gate rows, thresholds, bundles) and must
exit 3 or print the unedited tokens. Anything else fails: exit 0 with other tokens, exit 1, a crash, a hang.

  check_manifest_fields.py SOURCE_DIR BINARY_DIR
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

src, build = sys.argv[1], sys.argv[2]
P, L, R = (os.path.join(build, "cli", b) for b in ("nl-profile", "nl-layout", "nl-run"))
model = os.path.join(src, "datasets", "tiny-relu", "model")
work = tempfile.mkdtemp(prefix="nl-manifest-fields.")
env = dict(os.environ, OMP_NUM_THREADS="2")


def run(*args, check=True):
    r = subprocess.run(args, cwd=work, env=env, capture_output=True, text=True, timeout=60)
    if check and r.returncode != 0:
        sys.exit("check_manifest_fields: setup failed (exit %d): %s\n%s" % (r.returncode, " ".join(args), r.stderr))
    return r


def tokens(r):
    return [ln for ln in r.stdout.splitlines() if ln.startswith("tokens:")]


def leaves(node, path=()):
    """(path, value) of every scalar; of an array longer than 4, its first and last entries only."""
    if isinstance(node, dict):
        for k in sorted(node):
            yield from leaves(node[k], path + (k,))
    elif isinstance(node, list):
        idx = range(len(node)) if len(node) <= 4 else (0, len(node) - 1)
        for i in idx:
            yield from leaves(node[i], path + (i,))
    else:
        yield path, node


def edits(v):
    if isinstance(v, bool):
        return [not v]
    if isinstance(v, (int, float)):
        out = [v * 20 if v else 1, 0 if v else 2, v + 1]
        return [x for i, x in enumerate(out) if x != v and x not in out[:i]]
    if isinstance(v, str):
        return [v + "x", ""] if v else ["x"]
    return []


def set_at(node, path, value):
    for k in path[:-1]:
        node = node[k]
    node[path[-1]] = value


try:
    text = "/usr/share/common-licenses/GPL-3"
    if not os.path.isfile(text):
        text = os.path.join(src, "README.md")
    run(P, "run", "--model", model, "--tokenizer", os.path.join(model, "tokenizer.model"), "--text", text,
        "--max-tokens", "4096", "--activation", "calibrated:0.3", "--out", "cal.h5", "-q")
    run(L, "solve", "--trace", "cal.h5", "--bundle-bytes", "16384", "--out", "lay.json", "-q")
    run(L, "pack", "--model", model, "--layout", "lay.json", "--act-threshold-from", "cal.h5", "--tokenizer",
        os.path.join(model, "tokenizer.model"), "--out", "m.nlw", "-q")
    mpath = os.path.join(work, "m.nlw.json")
    original = open(mpath).read()
    man = json.loads(original)
    for key in ("act_threshold", "planner", "cache_policy"):
        if key not in man:
            sys.exit("check_manifest_fields: the packed manifest has no '%s' (the test needs it)" % key)
    cmd = (R, "generate", "--image", "m.nlw", "--select", "threshold", "--prompt-tokens", "1,400,35", "--steps", "6",
           "-q")
    base = run(*cmd)
    want = tokens(base)
    if not want:
        sys.exit("check_manifest_fields: no tokens line in\n" + base.stdout)
    passes = fails = 0
    for path, value in list(leaves(man)):
        for new in edits(value):
            edited = json.loads(original)
            set_at(edited, path, new)
            with open(mpath, "w") as f:
                json.dump(edited, f)
            try:
                r = run(*cmd, check=False)
            except subprocess.TimeoutExpired:
                print("FAIL %s = %r: no answer in 60 s" % ("/".join(map(str, path)), new))
                fails += 1
                continue
            name = "%s = %r" % ("/".join(map(str, path)), new)
            if r.returncode == 3 or (r.returncode == 0 and tokens(r) == want):
                passes += 1
            else:
                fails += 1
                print("FAIL %s: exit %d, tokens %s (unedited: %s) %s" % (
                    name, r.returncode, tokens(r), want, r.stderr.strip()[:200]))
    with open(mpath, "w") as f:
        f.write(original)
    print("check_manifest_fields: %d passed, %d failed" % (passes, fails))
    sys.exit(1 if fails else 0)
finally:
    shutil.rmtree(work, ignore_errors=True)
