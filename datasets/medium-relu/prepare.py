#!/usr/bin/python3
"""CPU side, before the GPU run: the large corpus -> token ids, xz-compressed and cut into parts that travel.

  /usr/bin/python3 datasets/medium-relu/prepare.py            # build/medium-relu/{corpus,ship}
Builds the corpus with `corpus.py --size large` (unless --corpus names one already built), tokenizes each split
with the bundled tokenizer (datasets/small-relu/model/tokenizer.model, vocabulary 2048; paragraph by paragraph,
exactly as train.py's encode_file does), counts tokens per source (the corpus manifest's byte ranges), and writes
SHIP/ids.json, SHIP/tokenizer.model and SHIP/{train,valid}.ids.xz.NNN: each split is one xz stream of little-endian
int16 ids cut into parts of at most --part-mib MiB, so that each device call can carry what fits beside the
working tree (64 MiB in all per call). train.py --ids SHIP reads them back and checks every sha256.
Needs python3-sentencepiece (scripts/bootstrap.sh train corpus-large).
"""
import argparse
import array
import hashlib
import json
import lzma
import os
import shutil
import subprocess
import sys
import time

import sentencepiece as spm

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def encode(sp, text):
    ids = []
    for para in text.split("\n\n"):
        ids.extend(sp.encode(para.replace("\n", " ")))
    return ids


def write_ids(out, split, ids, part_bytes, preset=9):
    """OUT/SPLIT.ids.xz.NNN: the ids as little-endian int16, one xz stream cut into parts of part_bytes; returns
    the split's ids.json entry (train.py's load_ids reads it back)."""
    if ids and max(ids) > 32767:
        sys.exit("prepare.py: ids do not fit int16")
    arr = array.array("h", ids)
    if sys.byteorder != "little":
        arr.byteswap()
    raw = arr.tobytes()
    xz = lzma.compress(raw, preset=preset)
    parts = []
    for i in range(0, len(xz), part_bytes):
        name = "%s.ids.xz.%03d" % (split, i // part_bytes)
        chunk = xz[i:i + part_bytes]
        with open(os.path.join(out, name), "wb") as f:
            f.write(chunk)
        parts.append({"file": name, "bytes": len(chunk), "sha256": hashlib.sha256(chunk).hexdigest()})
    return {"tokens": len(ids), "sha256": hashlib.sha256(raw).hexdigest(), "xz_bytes": len(xz), "parts": parts}


def tree_mib():
    """What a device call sends besides carried paths: tracked and untracked-not-ignored files (MiB)."""
    out = subprocess.run(["git", "-C", ROOT, "ls-files", "-z", "-c", "-o", "--exclude-standard"],
                         capture_output=True, check=True).stdout
    total = 0
    for p in out.split(b"\0"):
        path = os.path.join(ROOT, p.decode())
        if p and os.path.isfile(path) and not os.path.islink(path):
            total += os.path.getsize(path)
    return total / 2 ** 20


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", default=os.path.join(ROOT, "build/medium-relu/corpus"),
                    help="corpus folder (built with corpus.py --size large when it has no manifest.json)")
    ap.add_argument("--tokenizer", default=os.path.join(ROOT, "datasets/small-relu/model/tokenizer.model"))
    ap.add_argument("--out", default=os.path.join(ROOT, "build/medium-relu/ship"))
    ap.add_argument("--part-mib", type=float, default=8.0, help="largest part file (MiB)")
    ap.add_argument("--plan-only", action="store_true",
                    help="only recompute the carry plan for the parts in --out (the working tree's size changes)")
    ap.add_argument("--xz-preset", type=int, default=9)
    args = ap.parse_args()
    if args.plan_only:
        with open(os.path.join(args.out, "ids.json")) as f:
            plan(args.out, json.load(f))
        return

    if not os.path.exists(os.path.join(args.corpus, "manifest.json")):
        subprocess.run([sys.executable, os.path.join(ROOT, "datasets/tiny-relu/corpus.py"), "--size", "large",
                        args.corpus], check=True)
    with open(os.path.join(args.corpus, "manifest.json")) as f:
        manifest = json.load(f)
    if manifest.get("size") != "large":
        sys.exit("prepare.py: %s is not a --size large corpus" % args.corpus)
    sp = spm.SentencePieceProcessor(model_file=args.tokenizer)
    os.makedirs(args.out, exist_ok=True)
    for name in os.listdir(args.out):  # parts of an earlier run must not linger
        if ".ids.xz." in name:
            os.remove(os.path.join(args.out, name))
    shutil.copyfile(args.tokenizer, os.path.join(args.out, "tokenizer.model"))
    with open(args.tokenizer, "rb") as f:
        tok_sha = hashlib.sha256(f.read()).hexdigest()
    meta = {"tokenizer": "tokenizer.model", "tokenizer_sha256": tok_sha, "vocab_size": sp.vocab_size(),
            "format": "little-endian int16 token ids, one xz stream per split, cut into parts (cat the parts, "
                      "then xz -d)", "corpus": manifest["files"], "splits": {}, "sources": {}}
    part_bytes = int(args.part_mib * 2 ** 20)
    for split in ("train", "valid"):
        t0 = time.time()
        with open(os.path.join(args.corpus, split + ".txt"), "rb") as f:
            data = f.read()
        if hashlib.sha256(data).hexdigest() != manifest["files"][split + ".txt"]["sha256"]:
            sys.exit("prepare.py: %s.txt does not match its manifest" % split)
        ids, off = [], 0
        # The corpus is the sources' documents in manifest order: cut it at their byte ranges to count tokens
        # per source (the last document of the file ends with one newline instead of a blank line).
        for src in manifest["order"]:
            n = manifest["sources"][src]["bytes"][split]
            piece = data[off:off + n].decode("utf-8")
            off += n
            src_ids = encode(sp, piece)
            ids.extend(src_ids)
            meta["sources"].setdefault(src, {})[split] = len(src_ids)
        if off != len(data) + 1:
            sys.exit("prepare.py: source byte ranges do not add up (%d vs %d)" % (off, len(data) + 1))
        unk = ids.count(sp.unk_id())
        m = write_ids(args.out, split, ids, part_bytes, args.xz_preset)
        meta["splits"][split] = dict(m, unk=unk, text_bytes=len(data))
        xz, parts = m["xz_bytes"], m["parts"]
        print("%s: %d tokens (%.3f bytes/token, unk %.4f %%), xz %.1f MiB (%.3f bytes/token) in %d part(s), %.0f s"
              % (split, len(ids), len(data) / len(ids), 100.0 * unk / len(ids), xz / 2 ** 20,
                 xz / len(ids), len(parts), time.time() - t0), flush=True)
    with open(os.path.join(args.out, "ids.json"), "w") as f:
        json.dump(meta, f, indent=1, sort_keys=True)
        f.write("\n")
    plan(args.out, meta)
    print(table(manifest, meta))


def table(manifest, meta):
    """The corpus by source as a Markdown table (datasets/medium-relu/README.md)."""
    rows = ["| source | Debian packages | documents train / valid | bytes train / valid | words train / valid | "
            "tokens train / valid | licence |", "|---|---|---|---|---|---|---|"]
    tot = [0] * 8
    for src in manifest["order"]:
        m, t = manifest["sources"][src], meta["sources"][src]
        vals = [m["documents"]["train"], m["documents"]["valid"], m["bytes"]["train"], m["bytes"]["valid"],
                m["words"]["train"], m["words"]["valid"], t["train"], t["valid"]]
        tot = [a + b for a, b in zip(tot, vals)]
        rows.append("| %s | %s | %s | %s |" % (src, ", ".join("%s %s" % kv for kv in sorted(m["packages"].items())),
                                              " | ".join("{:,} / {:,}".format(*vals[i:i + 2]) for i in (0, 2, 4, 6)),
                                              m["licence"]))
    rows.append("| **all** | | %s | |" % " | ".join("**{:,} / {:,}**".format(*tot[i:i + 2]) for i in (0, 2, 4, 6)))
    return "\n".join(rows)


def plan(out, meta):
    files = ["ids.json", "tokenizer.model"] + [p["file"] for s in ("valid", "train") for p in
                                               meta["splits"][s]["parts"]]
    sizes = {n: os.path.getsize(os.path.join(out, n)) / 2 ** 20 for n in files}
    tree = tree_mib()
    print("ship: %d files, %.1f MiB; the working tree sends %.1f MiB per device call, so %.1f MiB can be carried "
          "per call (64 MiB in all)" % (len(files), sum(sizes.values()), tree, 64 - tree), flush=True)
    # A carry plan: consecutive calls, each within what is left of 64 MiB (1 MiB kept spare), 8 paths a call.
    room, calls, cur, used = 64 - tree - 1, [], [], 0.0
    for n in files:
        if cur and (used + sizes[n] > room or len(cur) == 8):
            calls.append(cur)
            cur, used = [], 0.0
        cur.append(n)
        used += sizes[n]
    calls.append(cur)
    rel = os.path.relpath(out, ROOT)
    plan = [[os.path.join(rel, n) for n in c] for c in calls]
    with open(os.path.join(out, "carry-plan.json"), "w") as f:
        json.dump({"tree_mib": tree, "calls": plan}, f, indent=1)
        f.write("\n")
    for i, c in enumerate(plan):
        print("call %d carries %s (%.1f MiB)" % (i + 1, json.dumps(c), sum(sizes[os.path.basename(p)] for p in c)))


if __name__ == "__main__":
    main()
