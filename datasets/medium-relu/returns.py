#!/usr/bin/env python3
"""The files a GPU run sends back, and putting the model folder together again from them.

A device call returns at most 8 files of at most 16 MiB, 64 MiB in all. The trained ~100M model is ~214 MB in
bfloat16, so train.py --export-quant int8 makes the model the int8-rounded weights (one float32 scale per row;
vectors stay float32): model-int8.safetensors, ~102 MiB, rebuilds the bfloat16 model.safetensors byte for byte.

  returns.py pack MODEL_DIR WORK_DIR PACK_DIR [--chunk-mib 15]      (GPU machine, standard library only)
      PACK_DIR/part-1/: meta.tar.gz (config.json, reference-greedy.json, summary.json, train.log, return.json)
                        + payload chunks 0-3;  PACK_DIR/part-2/: chunks 4-7; ...  (each part = one device call)
  returns.py reassemble OUT_MODEL_DIR RETURNED_DIR... [--tokenizer T] [--check]       (CPU side, needs torch)
      checks every sha256, rebuilds model.safetensors (its sha256 must equal the GPU side's), copies config.json,
      reference-greedy.json and the tokenizer: the layout of datasets/small-relu/model. --check also reruns the
      PyTorch greedy reference on this CPU and compares the tokens.
"""
import argparse
import glob
import hashlib
import importlib.util
import io
import json
import os
import shutil
import sys
import tarfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
MAX_FILES, MAX_FILE, MAX_CALL = 8, 16 * 2 ** 20, 64 * 2 ** 20


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def pack(args):
    model_int8 = os.path.join(args.model, "model-int8.safetensors")
    with open(os.path.join(args.work, "summary.json")) as f:
        summary = json.load(f)
    chunk = int(args.chunk_mib * 2 ** 20)
    if chunk > MAX_FILE:
        sys.exit("returns.py: --chunk-mib over 16 MiB")
    if os.path.exists(args.pack):
        shutil.rmtree(args.pack)
    os.makedirs(args.pack)
    chunks = []
    with open(model_int8, "rb") as f:
        i = 0
        while True:
            data = f.read(chunk)
            if not data:
                break
            name = "payload.%03d" % i
            chunks.append({"file": name, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()})
            chunks[-1]["data"] = data
            i += 1
    # Part 1 carries the metadata and as many chunks as fit beside it; later parts only chunks.
    ret = {"model_sha256": summary["model_sha256"], "model_int8_sha256": sha256_file(model_int8),
           "model_int8_bytes": os.path.getsize(model_int8), "chunks": [
               {k: v for k, v in c.items() if k != "data"} for c in chunks], "parts": []}
    meta = io.BytesIO()
    with tarfile.open(fileobj=meta, mode="w:gz") as tar:
        def add(name, data):
            ti = tarfile.TarInfo(name)
            ti.size, ti.mtime = len(data), 0
            tar.addfile(ti, io.BytesIO(data))
        for name, folder in (("config.json", args.model), ("reference-greedy.json", args.model),
                             ("summary.json", args.work), ("train.log", args.work)):
            path = os.path.join(folder, name)
            if os.path.exists(path):
                with open(path, "rb") as f:
                    add(name, f.read())
        # return.json lists every chunk and which part carries it (computed below, before it is added)
        parts, cur, used = [], [], 2 * 2 ** 20  # room kept in part 1 for meta.tar.gz
        for c in chunks:
            if cur and (len(cur) == MAX_FILES - (2 if not parts else 1) or used + c["bytes"] > MAX_CALL - 2 ** 20):
                parts.append(cur)
                cur, used = [], 0
            cur.append(c["file"])
            used += c["bytes"]
        parts.append(cur)
        ret["parts"] = parts
        add("return.json", json.dumps(ret, indent=1).encode())
    meta = meta.getvalue()
    if len(meta) > 2 * 2 ** 20:
        sys.exit("returns.py: meta.tar.gz is over 2 MiB")
    by_name = {c["file"]: c["data"] for c in chunks}
    for k, names in enumerate(parts, 1):
        d = os.path.join(args.pack, "part-%d" % k)
        os.makedirs(d)
        if k == 1:
            with open(os.path.join(d, "meta.tar.gz"), "wb") as f:
                f.write(meta)
        for n in names:
            with open(os.path.join(d, n), "wb") as f:
                f.write(by_name[n])
        with open(os.path.join(d, "return.json"), "w") as f:
            json.dump(ret, f, indent=1)
        files = os.listdir(d)
        total = sum(os.path.getsize(os.path.join(d, n)) for n in files)
        assert len(files) <= MAX_FILES and total <= MAX_CALL, (d, len(files), total)
        print("part %d: %d files, %.1f MiB" % (k, len(files), total / 2 ** 20))
    print("model-int8.safetensors %.1f MiB in %d chunk(s), %d part(s) (one device call each)" % (
        ret["model_int8_bytes"] / 2 ** 20, len(chunks), len(parts)))


def load_train():
    spec = importlib.util.spec_from_file_location("train", os.path.join(ROOT, "datasets/tiny-relu/train.py"))
    train = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(train)
    return train


def find(dirs, name):
    for d in dirs:
        for path in [os.path.join(d, name)] + sorted(glob.glob(os.path.join(d, "*", name))):
            if os.path.exists(path):
                return path
    return None


def reassemble(args):
    meta_path = find(args.returned, "meta.tar.gz")
    if not meta_path:
        sys.exit("returns.py: no meta.tar.gz in %s (part 1 is needed)" % " ".join(args.returned))
    os.makedirs(args.out, exist_ok=True)
    with tarfile.open(meta_path, "r:gz") as tar:
        members = {m.name: tar.extractfile(m).read() for m in tar.getmembers()}
    ret = json.loads(members["return.json"])
    blob = bytearray()
    missing = []
    for c in ret["chunks"]:
        path = find(args.returned, c["file"])
        if not path:
            missing.append(c["file"])
            continue
        with open(path, "rb") as f:
            data = f.read()
        if hashlib.sha256(data).hexdigest() != c["sha256"]:
            sys.exit("returns.py: %s does not match return.json" % path)
        blob += data
    if missing:
        part_of = {n: k for k, names in enumerate(ret["parts"], 1) for n in names}
        sys.exit("returns.py: missing %s (parts %s: gpu_run.sh fetch N)" % (
            " ".join(missing), sorted({part_of[n] for n in missing})))
    if hashlib.sha256(blob).hexdigest() != ret["model_int8_sha256"]:
        sys.exit("returns.py: the reassembled model-int8.safetensors does not match")
    int8_path = os.path.join(args.out, "model-int8.safetensors")
    with open(int8_path, "wb") as f:
        f.write(blob)
    train = load_train()
    import struct
    import torch
    n = struct.unpack("<Q", bytes(blob[:8]))[0]
    header = json.loads(bytes(blob[8:8 + n]))
    data = memoryview(blob)[8 + n:]
    dt = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16, "I8": torch.int8}
    q = {}
    for name, h in header.items():
        if name == "__metadata__":
            continue
        a, b = h["data_offsets"]
        q[name] = torch.frombuffer(bytearray(data[a:b]), dtype=dt[h["dtype"]]).view(h["shape"])
    m = header["__metadata__"]
    dtype = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}[m["dtype"]]
    tensors = train.dequantize_int8(q, dtype)
    model_path = os.path.join(args.out, "model.safetensors")
    train.write_safetensors(model_path, tensors, {"format": "pt", "steps": m["steps"], "seed": m["seed"]})
    got = sha256_file(model_path)
    if got != ret["model_sha256"]:
        sys.exit("returns.py: model.safetensors %s differs from the GPU side's %s" % (got, ret["model_sha256"]))
    if not args.keep_int8:
        os.remove(int8_path)
    with open(os.path.join(args.out, "config.json"), "wb") as f:
        f.write(members["config.json"])
    ref = json.loads(members["reference-greedy.json"])
    rel = os.path.relpath(os.path.abspath(args.out), ROOT)
    ref["model"] = rel if not rel.startswith("..") else os.path.basename(os.path.abspath(args.out))
    with open(os.path.join(args.out, "reference-greedy.json"), "w") as f:  # as train.py writes it
        json.dump(ref, f, indent=1)
        f.write("\n")
    shutil.copyfile(args.tokenizer, os.path.join(args.out, "tokenizer.model"))
    if args.work:
        os.makedirs(args.work, exist_ok=True)
        for name in ("summary.json", "train.log", "return.json"):
            if name in members:
                with open(os.path.join(args.work, name), "wb") as f:
                    f.write(members[name])
    print("model.safetensors: %d bytes, sha256 %s (matches the GPU side)" % (os.path.getsize(model_path), got))
    if args.check:
        import sentencepiece  # noqa: F401 (train.py needs it; fail early with a clear name)
        torch.set_num_threads(args.threads)
        model, _ = train.load_exported(args.out)
        with open(os.path.join(args.out, "reference-greedy.json")) as f:
            ref = json.load(f)
        for run in ref["runs"]:
            toks, logits = train.greedy(model, run["start"], 64, {1, 2})
            diff = max(abs(a - b) for ra, rb in zip(logits, run["logits"]) for a, b in zip(ra, rb))
            print("check %s: tokens %s, first logits max |diff| %.2e" % (
                run["name"], "identical" if toks == run["tokens"] else "DIFFER", diff))
            if toks != run["tokens"]:
                sys.exit("returns.py: the CPU greedy tokens differ from the reference")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("pack")
    p.add_argument("model")
    p.add_argument("work")
    p.add_argument("pack")
    p.add_argument("--chunk-mib", type=float, default=15.0)
    r = sub.add_parser("reassemble")
    r.add_argument("out")
    r.add_argument("returned", nargs="+", help="folders holding the returned files (searched one level down)")
    r.add_argument("--tokenizer", default=os.path.join(ROOT, "datasets/small-relu/model/tokenizer.model"))
    r.add_argument("--work", default="", help="also write summary.json, train.log and return.json here")
    r.add_argument("--keep-int8", action="store_true")
    r.add_argument("--check", action="store_true")
    r.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    pack(args) if args.cmd == "pack" else reassemble(args)


if __name__ == "__main__":
    main()
