#!/usr/bin/env python3
"""Checks profiler/python/trace_hooks.py against nl-profile run on the same tokens (run by test_trace_hooks.cpp).

Usage: trace_hooks_check.py SOURCE_DIR HF_SILU HF_RELU IDS_FILE SEQ_LEN THRESHOLD CPP_SILU.h5 CPP_RELU.h5 OUT_PREFIX
Writes OUT_PREFIX{silu,relu}.h5 with the hooks on the tiny torch Llama (tests/torch_llama.py), then compares:
  - /sequences and /tokens equal (trace_hooks cuts token-id files as nl-profile does);
  - ReLU model, relu>0: every mask bit equal;
  - SiLU model, abs>THRESHOLD: every differing bit has | |a| - THRESHOLD | < 1e-4 (a: torch's activation), and
    at most 1e-4 of all bits differ (float32 rounding in two implementations of the same forward).
Prints one JSON line of figures; exits 1 with a message on the first failed check.
"""
import json
import sys

import h5py
import numpy as np
import torch

src, hf_silu, hf_relu, ids, seq_len, thr, cpp_silu, cpp_relu, prefix = sys.argv[1:10]
sys.path.insert(0, f"{src}/tests")
sys.path.insert(0, f"{src}/profiler/python")
import trace_hooks  # noqa: E402
from torch_llama import load_llama  # noqa: E402

seq_len, thr = int(seq_len), float(thr)
seqs = trace_hooks.corpus_from_token_files([ids], seq_len)


def fail(msg):
    print(f"FAIL: {msg}")
    sys.exit(1)


def read(path):
    with h5py.File(path, "r") as f:
        n_tokens = int(f.attrs["n_tokens"])
        masks = []
        for l in range(int(f.attrs["n_layers"])):
            w = f[f"layers/{l}/mask"][...]
            b = np.unpackbits(w.astype("<u8").view(np.uint8).reshape(w.shape[0], -1), axis=1, bitorder="little")
            masks.append(b[:, :n_tokens].T.astype(bool))
        return masks, f["sequences"][...].tolist(), f["tokens"][...].tolist(), f.attrs["activation"]


figures = {}
for name, folder, rule, cpp in (("relu", hf_relu, "relu>0", cpp_relu), ("silu", hf_silu, f"abs>{thr}", cpp_silu)):
    model = load_llama(folder)
    rec = trace_hooks.TraceRecorder(model, rule)
    # Record the activation values too, to say where disagreements sit.
    values = [[] for _ in rec.ffns]
    for i, (_, proj, act, _ffn) in enumerate(rec.ffns):
        proj.register_forward_hook(lambda _m, _i, out, i=i, act=act: values[i].append(act(out.detach())[0]))
    for s in seqs:
        rec.run(s)
    out = f"{prefix}{name}.h5"
    rec.write(out, model_name="torch_llama")
    py_masks, py_seq, py_tok, _ = read(out)
    c_masks, c_seq, c_tok, c_rule = read(cpp)
    if py_seq != c_seq or py_tok != c_tok:
        fail(f"{name}: sequences/tokens differ from {cpp}")
    total = diff = 0
    worst = 0.0
    for l, (p, c) in enumerate(zip(py_masks, c_masks)):
        if p.shape != c.shape:
            fail(f"{name}: layer {l} shape {p.shape} vs {c.shape}")
        a = torch.cat(values[l]).numpy()
        d = p != c
        total += d.size
        diff += int(d.sum())
        if d.any():
            worst = max(worst, float(np.abs(np.abs(a[d]) - (0.0 if name == "relu" else thr)).max()))
    figures[name] = {"bits": total, "differ": diff, "active": float(np.mean([m.mean() for m in py_masks])),
                     "worst_distance_to_threshold": worst}
    if name == "relu" and diff:
        fail(f"relu: {diff} of {total} bits differ (worst |a| {worst:.3g})")
    if name == "silu" and (diff > total * 1e-4 or worst >= 1e-4):
        fail(f"silu: {diff} of {total} bits differ, worst distance to the threshold {worst:.3g}")
print(json.dumps(figures))
