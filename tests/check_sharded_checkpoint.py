#!/usr/bin/env python3
"""Sharded Hugging Face checkpoints (model.safetensors.index.json + shards, as transformers' save_pretrained writes
a model larger than its shard size): the bundled tiny-relu checkpoint split into three shards by this script's own
safetensors writer (standard library only), with F32, BF16 and F16 tensors, must read as the same model as one
model.safetensors holding the same tensors: `nl-layout pack` writes a byte-identical image, `nl-profile run` the same trace masks and
`nl-profile generate` the same tokens. An index that does not describe its shards is refused (exit 3) naming the
file: a missing shard, a tensor in another shard than the index says, a tensor no index entry lists, a path as a
shard name, a tensor the index places in a shard that lacks it.

  check_sharded_checkpoint.py SOURCE_DIR BINARY_DIR
"""
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile

src, build = sys.argv[1], sys.argv[2]
P, L = (os.path.join(build, "cli", b) for b in ("nl-profile", "nl-layout"))
model = os.path.join(src, "datasets", "tiny-relu", "model")
work = tempfile.mkdtemp(prefix="nl-sharded.")
fails = passes = 0


def check(name, ok, detail=""):
    global fails, passes
    if ok:
        passes += 1
        print("PASS " + name)
    else:
        fails += 1
        print("FAIL %s %s" % (name, detail))


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    header.pop("__metadata__", None)
    return {k: (v["dtype"], v["shape"], data[v["data_offsets"][0]:v["data_offsets"][1]]) for k, v in header.items()}


def write_safetensors(path, tensors):
    header, blobs, off = {}, [], 0
    for name, (dtype, shape, raw) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def to_half(dtype, raw):
    """F32 bytes as BF16 (the upper half of each value) or F16 (IEEE half, rounded)."""
    vals = struct.unpack("<%df" % (len(raw) // 4), raw)
    if dtype == "BF16":
        return b"".join(raw[i + 2:i + 4] for i in range(0, len(raw), 4))
    return struct.pack("<%de" % len(vals), *vals)


def run(*args):
    return subprocess.run(args, cwd=work, capture_output=True, text=True, timeout=120)


def shard_folder(name, edit=None):
    """The tiny model as three shards (+ index) in WORK/name, and the same tensors as one model.safetensors in
    WORK/name-single; edit(index, shards) may break the sharded one. Shard 2 stores its vectors as BF16 and shard 3
    its vectors as F16 (in both folders), so one checkpoint mixes dtypes across shards."""
    d, single = os.path.join(work, name), os.path.join(work, name + "-single")
    for f in (d, single):
        os.makedirs(f)
        shutil.copy(os.path.join(model, "config.json"), f)
    tensors = read_safetensors(os.path.join(model, "model.safetensors"))
    names = sorted(tensors)
    shards = {}
    for i in range(3):
        fname = "model-%05d-of-00003.safetensors" % (i + 1)
        shards[fname] = {}
        for n in names[i::3]:
            dtype, shape, raw = tensors[n]
            if i > 0 and dtype == "F32" and len(shape) == 1:
                dtype = "BF16" if i == 1 else "F16"
                raw = to_half(dtype, raw)
            shards[fname][n] = tensors[n] = (dtype, shape, raw)
    write_safetensors(os.path.join(single, "model.safetensors"), tensors)
    index = {"metadata": {"total_size": sum(len(t[2]) for s in shards.values() for t in s.values())},
             "weight_map": {n: f for f, s in shards.items() for n in s}}
    if edit:
        edit(index, shards)
    for f, s in shards.items():
        write_safetensors(os.path.join(d, f), s)
    with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
        json.dump(index, f)
    return d


try:
    d = shard_folder("sharded")
    dtypes = {v["dtype"] for f in os.listdir(d) if f.endswith(".safetensors")
              for k, v in json.loads(open(os.path.join(d, f), "rb").read()[8:8 + struct.unpack(
                  "<Q", open(os.path.join(d, f), "rb").read(8))[0]]).items() if k != "__metadata__"}
    check("the shards mix dtypes (%s)" % ", ".join(sorted(dtypes)), len(dtypes) >= 2)
    r1 = run(L, "pack", "--model", d + "-single", "--out", "single.nlw", "-q")
    r2 = run(L, "pack", "--model", d, "--out", "sharded.nlw", "-q")
    check("pack reads the sharded checkpoint", r2.returncode == 0, r2.stderr.strip())
    same = r1.returncode == 0 and r2.returncode == 0 and open(os.path.join(work, "single.nlw"), "rb").read() == \
        open(os.path.join(work, "sharded.nlw"), "rb").read()
    check("the sharded checkpoint packs to a byte-identical image", same)
    r3 = run(L, "pack", "--model", os.path.join(d, "model.safetensors.index.json"), "--out", "idx.nlw", "-q")
    check("pack --model INDEX.json works too", r3.returncode == 0, r3.stderr.strip())
    text = os.path.join(src, "README.md")
    for name, m in (("single", d + "-single"), ("sharded", d)):
        r = run(P, "run", "--model", m, "--tokenizer", os.path.join(model, "tokenizer.model"), "--text", text,
                "--max-tokens", "1024", "--model-name", "tiny", "--out", name + ".h5", "-q")
        check("profile run on the %s checkpoint" % name, r.returncode == 0, r.stderr.strip())
    h1, h2 = (open(os.path.join(work, n + ".h5"), "rb").read() for n in ("single", "sharded"))
    check("the sharded checkpoint profiles to a byte-identical trace", h1 == h2)
    g1, g2 = (run(P, "generate", "--model", m, "--tokenizer", os.path.join(model, "tokenizer.model"), "--prompt",
                  "Once upon a time", "--steps", "12", "-q").stdout for m in (d + "-single", d))
    check("the same generated text", g1 == g2 and g1.strip() != "", "%r vs %r" % (g1, g2))

    def bad(name, edit, pattern):
        dd = shard_folder(name, edit)
        r = run(L, "pack", "--model", dd, "--out", name + ".nlw", "-q")
        lines = r.stderr.strip().splitlines()
        ok = r.returncode == 3 and len(lines) == 1 and pattern in r.stderr and not os.path.exists(
            os.path.join(work, name + ".nlw"))
        check("refused: " + name, ok, "exit %d: %s" % (r.returncode, r.stderr.strip()))

    def drop_shard(index, shards):
        del shards["model-00002-of-00003.safetensors"]

    def move_entry(index, shards):
        n = next(iter(shards["model-00001-of-00003.safetensors"]))
        index["weight_map"][n] = "model-00002-of-00003.safetensors"

    def unlisted(index, shards):
        del index["weight_map"][next(iter(shards["model-00003-of-00003.safetensors"]))]

    def path_name(index, shards):
        n = next(iter(index["weight_map"]))
        index["weight_map"][n] = "../" + index["weight_map"][n]

    def lacking(index, shards):
        n = next(iter(shards["model-00003-of-00003.safetensors"]))
        del shards["model-00003-of-00003.safetensors"][n]

    bad("missing-shard", drop_shard, "which is missing")
    bad("wrong-shard", move_entry, "places in")
    bad("unlisted-tensor", unlisted, "does not list")
    bad("path-as-shard", path_name, "not a path")
    bad("tensor-not-in-shard", lacking, "which does not hold it")
    print("check_sharded_checkpoint: %d passed, %d failed" % (passes, fails))
    sys.exit(1 if fails else 0)
finally:
    shutil.rmtree(work, ignore_errors=True)
