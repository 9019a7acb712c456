#!/usr/bin/env python3
"""Builds the tiny-relu English corpus from installed Debian packages and splits it deterministically.

Standard library only (any python3), so the demo can run it without PyTorch.
Sources: fortunes + fortunes-min (entries between '%' lines), jargon-text (jargon.txt.gz, paragraphs grouped
into ~2 KB blocks), bible-kjv (`bible -f`, one chapter per document, verse references stripped).
Split: a document goes to valid.txt when the first byte of sha256(source + '\\0' + text) is < 13 (about 5 %),
otherwise to train.txt; documents keep their source order and are separated by one blank line.
Usage: corpus.py OUT_DIR   -> OUT_DIR/train.txt, OUT_DIR/valid.txt, OUT_DIR/manifest.json

--size large (datasets/medium-relu; scripts/bootstrap.sh demo corpus-large) adds the LARGE_SOURCES below after
the default documents, which it leaves as they are (the default corpus is a subset, split alike): Jane Austen's
novels, Perl's POD manuals, the Linux man-pages, the Python, Linux kernel, PostgreSQL, Django, Git and SQLite
manuals (HTML), and the FOLDOC, Devil's and GCIDE (Webster 1913) dictionaries. Those documents are normalised to
ASCII punctuation and exact duplicates are dropped; manifest.json then also records every source's packages,
versions, licence, and documents, bytes and words per split, and the sources' order. The default output (no
--size) is byte-identical to what this script wrote before the option existed.
"""
import argparse
import glob
import gzip
import hashlib
import html.parser
import json
import os
import re
import subprocess
import sys
import time

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


# ---------------------------------------------------------------- the large source set (--size large)
# Each source: (name, Debian packages, licence of the text as its copyright file states it, generator).
# Only text that reads as English prose is kept: code blocks (<pre>, POD verbatim paragraphs), navigation,
# sidebars and footers are dropped; a document is one page, chapter or dictionary entry group, cut into
# ~4 KB blocks at paragraph boundaries where it is longer (like jargon's 2 KB blocks).
BLOCK_BYTES = 4096
HTML_SKIP_TAGS = {"script", "style", "head", "nav", "pre", "svg", "math", "textarea", "select"}
HTML_SKIP_CLASSES = {"sphinxsidebar", "related", "footer", "navheader", "navfooter", "headerlink", "highlight",
                     "toc", "toctree-wrapper", "sphinxsidebarwrapper", "menu", "breadcrumbs", "nav",
                     "fancy-toc1", "fancy-toc2", "fancy-toc3", "mobile-header"}
HTML_VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "param", "source",
             "track", "wbr"}
HTML_BLOCK = {"p", "div", "li", "ul", "ol", "dl", "dt", "dd", "h1", "h2", "h3", "h4", "h5", "h6", "table", "tr",
              "td", "th", "br", "blockquote", "section", "article", "title", "caption", "figcaption", "hr"}


class _HTMLText(html.parser.HTMLParser):
    """Visible text of an HTML page as paragraphs; skips code, navigation and decoration (see HTML_SKIP_*)."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.stack, self.skip, self.paras, self.cur = [], 0, [], []

    def _break(self):
        text = " ".join("".join(self.cur).split())
        if text:
            self.paras.append(text)
        self.cur = []

    def handle_starttag(self, tag, attrs):
        if tag in HTML_BLOCK:
            self._break()
        if tag in HTML_VOID:
            return
        classes = set()
        for k, v in attrs:
            if k == "class" and v:
                classes.update(v.split())
            if k == "role" and v == "navigation":
                classes.add("nav")
        skipping = tag in HTML_SKIP_TAGS or bool(classes & HTML_SKIP_CLASSES)
        self.stack.append((tag, skipping))
        self.skip += skipping

    def handle_endtag(self, tag):
        if tag in HTML_BLOCK:
            self._break()
        if not any(t == tag for t, _ in self.stack):
            return  # a stray end tag
        while self.stack:
            t, s = self.stack.pop()
            self.skip -= s
            if t == tag:
                break

    def handle_data(self, data):
        if not self.skip:
            self.cur.append(data)

    def text(self):
        self._break()
        return self.paras


def html_paragraphs(path):
    with open(path, encoding="utf-8", errors="replace") as f:
        p = _HTMLText()
        p.feed(f.read())
        p.close()
    return p.text()


def blocks(source, paras, limit=BLOCK_BYTES):
    """Groups paragraphs into documents of about `limit` bytes (one document when the text is shorter)."""
    block, size = [], 0
    for para in paras:
        para = clean(para)
        if not para or not re.search(r"[A-Za-z]", para):
            continue
        block.append(para)
        size += len(para)
        if size >= limit:
            yield source, "\n\n".join(block)
            block, size = [], 0
    if block:
        yield source, "\n\n".join(block)


def package_files(pkg, pattern):
    """The files (not links) that Debian package `pkg` installed whose path matches `pattern`, sorted."""
    out = subprocess.run(["dpkg-query", "-L", pkg], check=True, capture_output=True, text=True).stdout
    return sorted(p for p in out.split("\n")
                  if re.search(pattern, p) and os.path.isfile(p) and not os.path.islink(p))


def english(para):
    # Translations (the kernel's zh_CN, ja_JP, ...) and symbol soup: at most 2 % of the characters non-ASCII.
    return sum(ord(c) > 127 for c in para) <= 0.02 * len(para)


def html_source(name, pkg, pattern, exclude=None, min_words=20):
    def gen():
        for path in package_files(pkg, pattern):
            if exclude and re.search(exclude, path):
                continue
            # Index pages and tables of contents are lists of titles, not prose: keep paragraphs that are
            # sentences (at least 6 words) and pages with at least min_words words of them.
            paras = [p for p in html_paragraphs(path) if len(p.split()) >= 6 and english(p)]
            if sum(len(p.split()) for p in paras) < min_words:
                continue
            yield from blocks(name, paras)
    return gen


def austen():
    # The six novels as R character vectors (one line of the Project Gutenberg text each), one chapter a document.
    script = ("library(janeaustenr); for (b in c('sensesensibility','prideprejudice','mansfieldpark','emma',"
              "'northangerabbey','persuasion')) { cat('\\n@@BOOK ', b, '\\n', sep=''); writeLines(get(b)) }")
    out = subprocess.run(["Rscript", "--vanilla", "-e", script], check=True, capture_output=True, text=True,
                         cwd="/", env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}).stdout
    for book in out.split("\n@@BOOK ")[1:]:
        name, text = book.split("\n", 1)
        for chapter in re.split(r"\n(?=CHAPTER [0-9IVXLC]+\.?\s*\n|Chapter [0-9IVXLC]+\.?\s*\n)", text):
            # Paragraphs are blank-line separated; the underscores mark italics in the Gutenberg text.
            paras = [" ".join(p.replace("_", "").split()) for p in re.split(r"\n\s*\n", chapter)]
            yield from blocks("austen/" + name, paras, limit=1 << 30)


def dict_source(name, path, min_words=12):
    """A dictd database (.dict.dz is gzip): each entry is a headword block; entries are grouped into blocks."""
    def gen():
        with gzip.open(path, "rt", encoding="utf-8", errors="replace") as f:
            text = f.read()
        index = os.path.splitext(os.path.splitext(path)[0])[0] + ".index"
        entries = []
        with open(index, encoding="utf-8", errors="replace") as f:
            for line in f:
                parts = line.rstrip("\n").split("\t")
                if len(parts) < 3 or parts[0].startswith("00-database"):
                    continue
                entries.append((b64(parts[1]), b64(parts[2])))
        raw = text.encode("utf-8")  # the index counts bytes
        seen = set()
        paras = []
        for off, ln in sorted(set(entries)):
            if off in seen:
                continue
            seen.add(off)
            entry = raw[off:off + ln].decode("utf-8", errors="replace")
            entry = dict_clean(entry)
            if len(entry.split()) >= min_words:
                paras.append(entry)
        yield from blocks(name, paras)
    return gen


def dict_clean(entry):
    """dictd markup -> plain text: GCIDE's pronunciations (\\Ap"ple\\), accent codes ([e^]), grammar and
    etymology brackets and source tags ([1913 Webster]); FOLDOC's {cross references} and (date) lines."""
    entry = re.sub(r"\\[^\\\n]*\\", "", entry)
    entry = re.sub(r"\[([\'\"`^=~.-]*)([A-Za-z]{1,2})([\'\"`^=~.-]*)\]", r"\2", entry)
    entry = re.sub(r"\([^()\n]*\[[^()\n]*\)", "", entry)
    entry = re.sub(r"\[[^\[\]\n]{0,300}\]?", "", entry)
    entry = re.sub(r"[{}]", "", entry)
    entry = re.sub(r"(?m)^\s*\(\d{4}-\d\d-\d\d\)\s*$", "", entry)
    paras = [" ".join(p.split()) for p in re.split(r"\n\s*\n", entry.strip())]
    return "\n".join(p for p in paras if p)


def b64(s):
    # dictd's index encodes offsets and lengths in its own base64 digits, most significant first.
    digits = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
    v = 0
    for ch in s:
        v = v * 64 + digits.index(ch)
    return v


POD_CODE = re.compile(r"[A-Z]<(?:<+\s.*?\s>+|[^<>]*)>", re.S)


def pod_text(s):
    def fmt(m):
        body = m.group(0)
        code, inner = body[0], body[2:-1]
        if inner.startswith("<"):  # C<< ... >> style
            inner = inner.strip("<>").strip()
        if code == "E":
            return {"lt": "<", "gt": ">", "verbar": "|", "sol": "/"}.get(inner, "")
        if code in "XZ":
            return ""
        if code == "L":
            inner = inner.split("|")[0]
            inner = inner.replace('"', "").replace("/", " ")
        return inner
    for _ in range(4):  # nested formatting codes
        s2 = POD_CODE.sub(fmt, s)
        if s2 == s:
            break
        s = s2
    return s


def perl_pod():
    for path in package_files("perl-doc", r"/pod/.*\.pod$"):
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read()
        paras, in_pod, skip_block = [], True, False
        for para in re.split(r"\n\s*\n", text):
            if not para.strip():
                continue
            if para.startswith("=begin"):
                skip_block = True
            if para.startswith("=end"):
                skip_block = False
                continue
            if skip_block:
                continue
            if para.startswith("=cut"):
                in_pod = False
                continue
            if para.startswith("=pod") or para.startswith("=head") or para.startswith("=item"):
                in_pod = True
            if not in_pod or para[0] in " \t":  # code, or verbatim (code) paragraphs
                continue
            if para.startswith("="):
                cmd, _, rest = para.partition(" ")
                if cmd.startswith("=head") or cmd == "=item":
                    para = rest.lstrip("* ").strip()
                else:
                    continue
            paras.append(" ".join(pod_text(para).split()))
        yield from blocks("perl-doc", [p for p in paras if len(p.split()) >= 6])


def manpages():
    # Rendered by man-db/groff without hyphenation or justification, one line per paragraph (MANWIDTH);
    # the header and footer lines and the SYNOPSIS section (C declarations) are dropped.
    env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "MANWIDTH": "4000", "MAN_KEEP_FORMATTING": ""}
    for pkg in ("manpages", "manpages-dev"):
        for path in package_files(pkg, r"/usr/share/man/man[0-9]/[^/]+\.gz$"):
            with gzip.open(path, "rt", encoding="utf-8", errors="replace") as f:
                if f.read(4) == ".so ":
                    continue  # an alias of another page
            r = subprocess.run(["man", "--nh", "--nj", "-E", "UTF-8", "-l", path], capture_output=True,
                               text=True, env=env, cwd="/usr/share/man")
            lines = r.stdout.split("\n")[1:-2]
            paras, section = [], None
            for line in lines:
                if line and not line[0].isspace():
                    section = line.strip()
                    continue
                line = " ".join(line.split())  # tables are padded to MANWIDTH
                letters = sum(c.isalpha() for c in line)
                # C declarations and tables of flags are not prose: at least 70 % of the visible characters
                # letters, and 6 words.
                if line and section not in ("SYNOPSIS", "SEE ALSO", "COLOPHON") and len(line.split()) >= 6 \
                        and letters >= 0.7 * len(line.replace(" ", "")):
                    paras.append(line.replace("\u2010", "-"))
            yield from blocks("manpages/" + pkg, paras)


LARGE_SOURCES = [
    # name, packages, licence of the text (from /usr/share/doc/PACKAGE/copyright), generator
    ("austen", ["r-cran-janeaustenr", "r-base-core"],
     "the novels are public domain (Project Gutenberg texts); the R package is MIT", austen),
    ("perl-doc", ["perl-doc"], "GPL-1+ or Artistic (Perl's licence)", perl_pod),
    ("manpages", ["manpages", "manpages-dev", "man-db", "groff-base"],
     "Linux-man-pages-copyleft (the 'verbatim' licence), some pages also GPL-2+ or BSD", manpages),
    ("python-doc", ["python3.11-doc"], "PSF licence (Python documentation)",
     html_source("python-doc", "python3.11-doc", r"^/usr/share/doc/python3\.11/html/.*\.html$")),
    ("linux-doc", ["linux-doc-6.1"], "GPL-2 (Linux kernel documentation)",
     html_source("linux-doc", "linux-doc-6.1", r"^/usr/share/doc/linux-doc-6\.1/html/.*\.html$", r"/translations/")),
    ("postgresql-doc", ["postgresql-doc-15"], "PostgreSQL licence (BSD-like)",
     html_source("postgresql-doc", "postgresql-doc-15", r"/html/.*\.html$")),
    ("django-doc", ["python-django-doc"], "BSD-3-clause (Django documentation)",
     html_source("django-doc", "python-django-doc", r"/html/.*\.html$")),
    ("git-doc", ["git-doc"], "GPL-2 / GPL-2+ (Git documentation)",
     html_source("git-doc", "git-doc", r"^/usr/share/doc/git-doc/.*\.html$")),
    ("sqlite-doc", ["sqlite3-doc"], "public domain (SQLite documentation)",
     html_source("sqlite-doc", "sqlite3-doc", r"\.html$")),
    ("foldoc", ["dict-foldoc"], "GFDL-1.1+ without invariant sections (FOLDOC)",
     dict_source("foldoc", "/usr/share/dictd/foldoc.dict.dz")),
    ("devil", ["dict-devil"], "public domain (Ambrose Bierce, The Devil's Dictionary, 1911)",
     dict_source("devil", "/usr/share/dictd/devil.dict.dz")),
    ("gcide", ["dict-gcide"], "GPL-2+ (GCIDE; its Webster 1913 base text is public domain)",
     dict_source("gcide", "/usr/share/dictd/gcide.dict.dz")),
]
DEFAULT_SOURCES = [("fortunes", ["fortunes", "fortunes-min"], None, None), ("jargon", ["jargon-text"], None, None),
                   ("bible", ["bible-kjv", "bible-kjv-text"], None, None)]
ASCII_MAP = str.maketrans({"\u2018": "'", "\u2019": "'", "\u201c": '"', "\u201d": '"', "\u2013": "-",
                           "\u2014": "--", "\u2026": "...", "\u00a0": " ", "\u2010": "-", "\u2011": "-",
                           "\u2212": "-", "\u00b6": "", "\u200b": ""})


def package_versions(packages=PACKAGES):
    vers = {}
    for p in packages:
        r = subprocess.run(["dpkg-query", "-W", "-f=${Version}", p], capture_output=True, text=True)
        vers[p] = r.stdout if r.returncode == 0 else None
    return vers


def main():
    ap = argparse.ArgumentParser(description="Builds and splits the English corpus (see the module docstring).")
    ap.add_argument("out_dir")
    ap.add_argument("--size", choices=["default", "large"], default="default",
                    help="default: fortunes, jargon, bible (tiny-relu, small-relu; byte-identical output); "
                         "large: those plus the LARGE_SOURCES (scripts/bootstrap.sh demo corpus-large)")
    ap.add_argument("--only", default="", help="large: build only these comma-separated LARGE_SOURCES (testing)")
    args = ap.parse_args()
    out_dir = args.out_dir
    unknown = set(args.only.split(",")) - {s[0] for s in LARGE_SOURCES} if args.only else set()
    if unknown:
        sys.exit("corpus.py: no such source %s (LARGE_SOURCES: %s)" % (
            " ".join(sorted(unknown)), " ".join(s[0] for s in LARGE_SOURCES)))
    large = [s for s in LARGE_SOURCES if not args.only or s[0] in args.only.split(",")] \
        if args.size == "large" else []
    os.makedirs(out_dir, exist_ok=True)
    missing = [p for p, v in package_versions().items() if not v]
    if missing or not os.path.exists(JARGON):
        sys.exit("corpus.py: missing Debian packages %s (run scripts/bootstrap.sh demo)" % " ".join(missing))
    large_pkgs = sorted({p for s in large for p in s[1]})
    missing = [p for p, v in package_versions(large_pkgs).items() if not v]
    if missing:
        sys.exit("corpus.py: missing Debian packages %s (run scripts/bootstrap.sh corpus-large)" % " ".join(missing))
    parts = {"train": [], "valid": []}
    counts = {"train": {}, "valid": {}}
    sizes = {}  # large: source -> split -> [documents, bytes, words]
    seen = set()
    gens = [(name, gen, False) for name, gen in (("fortunes", fortunes), ("jargon", jargon), ("bible", bible))]
    gens += [(name, gen, True) for name, _, _, gen in large]
    for name, gen, dedup in gens:
        t0 = time.time()
        for source, doc in gen():
            if dedup:
                doc = clean(doc.translate(ASCII_MAP))
                key = hashlib.sha256(doc.encode("utf-8")).digest()
                if key in seen:  # exact duplicates (the same page in two places) are kept once
                    continue
                seen.add(key)
            h = hashlib.sha256((source + "\0" + doc).encode("utf-8")).digest()
            split = "valid" if h[0] < VALID_BYTE_LIMIT else "train"
            parts[split].append(doc)
            src = source.split("/")[0]
            counts[split][src] = counts[split].get(src, 0) + 1
            if large:
                st = sizes.setdefault(name, {"train": [0, 0, 0], "valid": [0, 0, 0]})[split]
                st[0] += 1
                st[1] += len(doc.encode("utf-8")) + 2  # + the blank line that separates documents
                st[2] += len(doc.split())
        if large:
            print("corpus.py: %s done in %.1f s" % (name, time.time() - t0), file=sys.stderr, flush=True)
    manifest = {"packages": package_versions(), "rule": "sha256(source+NUL+doc)[0] < %d -> valid" % VALID_BYTE_LIMIT,
                "documents": counts, "files": {}}
    if large:
        manifest["size"] = args.size
        manifest["order"] = [name for name, _, _ in gens]  # the documents' order in train.txt and valid.txt
        manifest["sources"] = {}
        for name, pkgs, licence, _ in DEFAULT_SOURCES + large:
            st = sizes.get(name, {"train": [0, 0, 0], "valid": [0, 0, 0]})
            manifest["sources"][name] = {
                "packages": package_versions(pkgs), "licence": licence or "see datasets/tiny-relu/README.md",
                **{k: {sp: st[sp][i] for sp in ("train", "valid")} for i, k in enumerate(("documents", "bytes",
                                                                                          "words"))}}
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
