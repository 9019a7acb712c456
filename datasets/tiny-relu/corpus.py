#!/usr/bin/env python3
"""Builds the tiny-relu English corpus from installed Debian packages and splits it deterministically.

Standard library only (any python3), so the demo can run it without PyTorch.
Sources: fortunes + fortunes-min (entries between '%' lines), jargon-text (jargon.txt.gz, paragraphs grouped
into ~2 KB blocks), bible-kjv (`bible -f`, one chapter per document, verse references stripped).
Split: a document goes to valid.txt when the first byte of sha256(source + '\\0' + text) is < 13 (about 5 %),
otherwise to train.txt; documents keep their source order and are separated by one blank line.
Usage: corpus.py OUT_DIR   -> OUT_DIR/train.txt, OUT_DIR/valid.txt, OUT_DIR/manifest.json
"""
import glob
import gzip
import hashlib
import json
import os
import re
import subprocess
import sys

FORTUNE_DIR = "/usr/share/games/fortunes"
JARGON = "/usr/share/doc/jargon-text/jargon.txt.gz"
VALID_BYTE_LIMIT = 13  # 13/256 = 5.1 % of documents held out
PACKAGES = ["fortunes", "fortunes-min", "jargon-text", "bible-kjv", "bible-kjv-text"]


def clean(text):
    # Tabs and trailing blanks carry no language; runs of blank lines would only teach the model to print them.
    lines = [ln.replace("\t", "    ").rstrip() for ln in text.split("\n")]
    out = "\n".join(lines).strip("\n")
    return re.sub(r"\n{3,}", "\n\n", out)


def fortunes():
    for path in sorted(glob.glob(os.path.join(FORTUNE_DIR, "*"))):
        name = os.path.basename(path)
        if "." in name or not os.path.isfile(path):  # skip .dat indexes and .u8 duplicates
            continue
        with open(path, encoding="utf-8", errors="replace") as f:
            for entry in re.split(r"\n%\n", f.read()):
                entry = clean(entry)
                if entry and entry != "%":
                    yield "fortunes/" + name, entry


def jargon():
    with gzip.open(JARGON, "rt", encoding="utf-8", errors="replace") as f:
        text = f.read()
    block, size = [], 0
    for para in re.split(r"\n\s*\n", text):
        para = clean(para)
        # Box-drawing rules and other decoration are not English text.
        if not para or not re.search(r"[A-Za-z]", para):
            continue
        block.append(para)
        size += len(para)
        if size >= 2048:
            yield "jargon", "\n\n".join(block)
            block, size = [], 0
    if block:
        yield "jargon", "\n\n".join(block)


def bible():
    out = subprocess.run(["bible", "-f", "gen1:1-rev22:21"], check=True, capture_output=True, text=True,
                         cwd="/").stdout
    chapter, verses = None, []
    for line in out.split("\n"):
        m = re.match(r"^(\w+?)(\d+):(\d+) (.*)$", line)
        if not m:
            continue
        key = m.group(1) + m.group(2)
        if key != chapter and verses:
            yield "bible", "\n".join(verses)
            verses = []
        chapter = key
        verses.append(m.group(4).strip())
    if verses:
        yield "bible", "\n".join(verses)


def package_versions():
    vers = {}
    for p in PACKAGES:
        r = subprocess.run(["dpkg-query", "-W", "-f=${Version}", p], capture_output=True, text=True)
        vers[p] = r.stdout if r.returncode == 0 else None
    return vers


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: corpus.py OUT_DIR")
    out_dir = sys.argv[1]
    os.makedirs(out_dir, exist_ok=True)
    missing = [p for p, v in package_versions().items() if not v]
    if missing or not os.path.exists(JARGON):
        sys.exit("corpus.py: missing Debian packages %s (run scripts/bootstrap.sh demo)" % " ".join(missing))
    parts = {"train": [], "valid": []}
    counts = {"train": {}, "valid": {}}
    for gen in (fortunes, jargon, bible):
        for source, doc in gen():
            h = hashlib.sha256((source + "\0" + doc).encode("utf-8")).digest()
            split = "valid" if h[0] < VALID_BYTE_LIMIT else "train"
            parts[split].append(doc)
            src = source.split("/")[0]
            counts[split][src] = counts[split].get(src, 0) + 1
    manifest = {"packages": package_versions(), "rule": "sha256(source+NUL+doc)[0] < %d -> valid" % VALID_BYTE_LIMIT,
                "documents": counts, "files": {}}
    for split, docs in parts.items():
        data = ("\n\n".join(docs) + "\n").encode("utf-8")
        path = os.path.join(out_dir, split + ".txt")
        tmp = path + ".tmp"
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
        manifest["files"][split + ".txt"] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    with open(os.path.join(out_dir, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=2, sort_keys=True)
        f.write("\n")
    print(json.dumps(manifest["files"]))


if __name__ == "__main__":
    main()
