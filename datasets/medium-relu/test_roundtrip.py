#!/usr/bin/python3
"""Round trip of the medium-relu plumbing on a tiny random model (~5 s, CPU, no corpus, no GPU).

prepare.write_ids -> train.load_ids gives the ids back; train.export(quant="int8") -> returns.py pack (small
chunks, so that the result spans several parts, each within a device call's 8 files / 64 MiB) -> returns.py
reassemble from the part folders gives model.safetensors byte for byte, and a missing part is reported by number.
Needs python3-torch and python3-sentencepiece (scripts/bootstrap.sh train). Prints 'N passed, N failed'.
Usage: /usr/bin/python3 datasets/medium-relu/test_roundtrip.py
"""
import importlib.util
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def main():
    try:
        import sentencepiece  # noqa: F401  (train.py needs both)
        import torch  # noqa: F401
    except ImportError as e:
        print("SKIP: %s (install with scripts/bootstrap.sh train)" % e, flush=True)
        sys.exit(77)
    train = load("train", os.path.join(ROOT, "datasets/tiny-relu/train.py"))
    prepare = load("prepare", os.path.join(HERE, "prepare.py"))
    import torch
    torch.set_num_threads(1)
    tok = os.path.join(ROOT, "datasets/tiny-relu/model/tokenizer.model")
    results = []

    def check(name, ok, detail=""):
        results.append(ok)
        print("%s %s%s" % ("PASS" if ok else "FAIL", name, (": " + detail) if detail else ""), flush=True)

    tmp = tempfile.mkdtemp(prefix="medium-relu-test-")
    try:
        # token ids: several parts, read back through train.py
        ship = os.path.join(tmp, "ship")
        os.makedirs(ship)
        rng = random.Random(1)
        ids = {"train": [rng.randrange(2048) for _ in range(50000)], "valid": [rng.randrange(2048) for _ in range(999)]}
        meta = {"splits": {s: prepare.write_ids(ship, s, v, 16384) for s, v in ids.items()}}
        with open(os.path.join(ship, "ids.json"), "w") as f:
            json.dump(meta, f)
        back = train.load_ids(ship, "train")
        check("ids round trip (%d parts)" % len(meta["splits"]["train"]["parts"]),
              back.tolist() == ids["train"] and train.load_ids(ship, "valid").tolist() == ids["valid"])

        # int8 export -> pack -> reassemble
        cfg = {"hidden_size": 64, "intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4,
               "num_key_value_heads": 2, "vocab_size": 2048, "max_position_embeddings": 64, "rms_norm_eps": 1e-5,
               "rope_theta": 10000.0}
        torch.manual_seed(3)
        model = train.TinyLlama(cfg)
        work, out = os.path.join(tmp, "work"), os.path.join(tmp, "work", "model")
        os.makedirs(work)
        train.export(model, cfg, tok, out, torch.bfloat16, {"steps": "7", "seed": "1234"}, quant="int8")
        sd = model.state_dict()
        q = train.load_exported(out)[0].state_dict()
        err = max((q[k] - sd[k]).abs().max().item() / max(sd[k].abs().max().item(), 1e-12) for k in sd)
        check("int8 rows: the exported model is within 1/127 of each row's range plus bf16 rounding", err < 0.012,
              "max relative error %.4f" % err)
        ref = {"model": "x", "how": "test", "runs": [{"name": "bos", "start": [1], "tokens": [1], "logits": []}]}
        with open(os.path.join(out, "reference-greedy.json"), "w") as f:
            json.dump(ref, f)
        with open(os.path.join(work, "summary.json"), "w") as f:
            json.dump({"model_sha256": train.sha256_file(os.path.join(out, "model.safetensors"))}, f)
        returns = os.path.join(HERE, "returns.py")
        pack = os.path.join(tmp, "pack")
        r = subprocess.run([sys.executable, returns, "pack", out, work, pack, "--chunk-mib", "0.03"],
                           capture_output=True, text=True)
        parts = sorted(os.listdir(pack)) if r.returncode == 0 else []
        sizes_ok = all(len(os.listdir(os.path.join(pack, p))) <= 8 for p in parts)
        check("pack: several parts of at most 8 files", r.returncode == 0 and len(parts) >= 2 and sizes_ok,
              r.stdout.strip().replace("\n", "; ") + r.stderr.strip())
        dest = os.path.join(tmp, "model")
        r = subprocess.run([sys.executable, returns, "reassemble", dest, pack, "--tokenizer", tok],
                           capture_output=True, text=True)
        same = r.returncode == 0 and train.sha256_file(os.path.join(dest, "model.safetensors")) == \
            train.sha256_file(os.path.join(out, "model.safetensors"))
        check("reassemble: model.safetensors byte-identical", same, r.stdout.strip() + r.stderr.strip())
        check("reassemble: the model folder's files", all(os.path.exists(os.path.join(dest, n)) for n in (
            "config.json", "model.safetensors", "reference-greedy.json", "tokenizer.model")))
        shutil.rmtree(os.path.join(pack, parts[-1]))
        r = subprocess.run([sys.executable, returns, "reassemble", os.path.join(tmp, "m2"), pack, "--tokenizer",
                            tok], capture_output=True, text=True)
        check("reassemble: a missing part is named", r.returncode != 0 and "parts [%d]" % len(parts) in r.stderr,
              r.stderr.strip())
    finally:
        shutil.rmtree(tmp)
    print("%d passed, %d failed" % (sum(results), len(results) - sum(results)))
    sys.exit(0 if all(results) else 1)


if __name__ == "__main__":
    main()
