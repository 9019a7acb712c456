#!/usr/bin/env python3
"""Record which FFN neurons fire in a PyTorch model with forward hooks, and write trace v1 (docs/formats.md).

For users who profile large models on GPUs: the toolkit's own profiler (nl-profile run) runs on CPUs. Works on
any torch module tree with Llama-style MLPs (a module with `gate_proj` and `act_fn`: the activation is
act_fn(gate_proj(x))) or OPT-style layers (a module with `fc1` and `activation_fn`/`act_fn`: act(fc1(x))), in
module order, so Hugging Face Llama/Mistral/OPT models work as loaded by transformers.

Library use:
    rec = TraceRecorder(model, rule="relu>0")      # or "abs>0.05"
    for ids in sequences:                           # each a list of token ids, one independent sequence
        rec.run(ids)                                # model(input_ids) under the hooks
    rec.write("trace.h5", model_name="opt-6.7b")

Command line (needs `transformers` for --model; Debian's python3-torch and python3-h5py otherwise):
    trace_hooks.py --model HF_DIR (--token-ids FILE... | --tokens-from TRACE.h5) --out trace.h5
                   [--rule relu>0|abs>X] [--seq-len 256] [--max-tokens N] [--no-bos] [--device cuda]
--token-ids reads token-id files and cuts them into sequences exactly as `nl-profile run --token-ids` does;
--tokens-from replays the sequences stored in an existing trace (e.g. to compare with nl-profile's masks).
"""
import argparse
import sys

import numpy as np
import torch


def find_ffns(model):
    """[(name, projection module, activation callable)] in module order: the neurons are the projection's outputs."""
    out = []
    for name, m in model.named_modules():
        act = getattr(m, "act_fn", None)
        if act is None:
            act = getattr(m, "activation_fn", None)
        if act is None:
            continue
        if isinstance(getattr(m, "gate_proj", None), torch.nn.Module):
            out.append((name, m.gate_proj, act))
        elif isinstance(getattr(m, "fc1", None), torch.nn.Module):
            out.append((name, m.fc1, act))
    if not out:
        raise ValueError("no FFN found: expected modules with gate_proj + act_fn (Llama) or fc1 + activation_fn (OPT)")
    return out


def parse_rule(rule):
    if rule == "relu>0":
        return None
    if rule.startswith("abs>"):
        x = float(rule[4:])
        if not x >= 0:
            raise ValueError(f"rule '{rule}': the threshold must be >= 0")
        return x
    raise ValueError(f"unknown rule '{rule}' (relu>0 or abs>X)")


class TraceRecorder:
    """Hooks every FFN of `model`; run() records one sequence's masks (batch of one)."""

    def __init__(self, model, rule="relu>0"):
        self.model, self.rule = model, rule
        self.threshold = parse_rule(rule)
        self.ffns = find_ffns(model)
        self.masks = [[] for _ in self.ffns]  # per layer, per sequence: bool [tokens, neurons] on the CPU
        self.sequences, self.tokens = [], []
        self._handles = []
        for i, (_, proj, act) in enumerate(self.ffns):
            self._handles.append(proj.register_forward_hook(self._hook(i, act)))

    def _hook(self, i, act):
        def hook(_module, _inputs, output):
            a = act(output.detach())
            on = (a > 0) if self.threshold is None else (a.abs() > self.threshold)
            self.masks[i].append(on.reshape(-1, on.shape[-1]).cpu())
        return hook

    @torch.no_grad()
    def run(self, ids):
        n_before = [len(m) for m in self.masks]
        dev = next(self.model.parameters()).device
        self.model(torch.tensor([ids], dtype=torch.long, device=dev))
        for i, m in enumerate(self.masks):  # one forward call per layer per sequence
            if len(m) != n_before[i] + 1:
                raise RuntimeError(f"FFN {self.ffns[i][0]} ran {len(m) - n_before[i]} times for one sequence")
        self.sequences.append(len(self.tokens))
        self.tokens.extend(int(t) for t in ids)

    def close(self):
        for h in self._handles:
            h.remove()
        self._handles = []

    def write(self, path, model_name="pytorch", store_tokens=True):
        """Trace v1 via h5py, written to a temporary name and renamed into place."""
        import os
        import h5py
        n_tokens = len(self.tokens)
        if n_tokens == 0:
            raise ValueError("no tokens recorded")
        tmp = f"{path}.tmp{os.getpid()}"
        try:
            with h5py.File(tmp, "w") as f:
                f.attrs["format"] = "neuralink-trace"
                f.attrs["version"] = np.int64(1)
                f.attrs["model"] = model_name
                f.attrs["activation"] = self.rule
                f.attrs["n_layers"] = np.int64(len(self.ffns))
                f.attrs["n_tokens"] = np.int64(n_tokens)
                for l, parts in enumerate(self.masks):
                    bits = torch.cat(parts).numpy()                      # [tokens, neurons]
                    words = pack_neuron_major(bits)
                    g = f.create_group(f"layers/{l}")
                    g.attrs["n_neurons"] = np.int64(bits.shape[1])
                    g.create_dataset("mask", data=words, chunks=(min(words.shape[0], 64), words.shape[1]),
                                     compression="gzip", compression_opts=4)
                f.create_dataset("sequences", data=np.asarray(self.sequences, dtype=np.int64))
                if store_tokens:
                    f.create_dataset("tokens", data=np.asarray(self.tokens, dtype=np.int32))
                f.flush()
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.remove(tmp)


def pack_neuron_major(bits):
    """bool [tokens, neurons] -> uint64 [neurons, ceil(tokens/64)], bit t%64 of word t/64, LSB first."""
    n_tokens, n = bits.shape
    n_words = (n_tokens + 63) // 64
    padded = np.zeros((n, n_words * 64), dtype=bool)
    padded[:, :n_tokens] = bits.T
    return np.packbits(padded, axis=1, bitorder="little").view("<u8").astype(np.uint64)


def corpus_from_token_files(files, seq_len, max_tokens=0, bos=1):
    """Sequences as `nl-profile run --token-ids` cuts them (profiler/profile.cpp build_corpus)."""
    seqs, cur, total = [], [], 0
    start = lambda: [bos] if bos >= 0 else []  # noqa: E731
    cur = start()
    for path in files:
        for line in open(path, encoding="utf-8"):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            for t in (int(x) for x in line.split()):
                cur.append(t)
                at_cap = max_tokens and total + len(cur) >= max_tokens
                if len(cur) == seq_len or at_cap:
                    total += len(cur)
                    seqs.append(cur)
                    cur = start()
                    if at_cap:
                        return seqs
    if len(cur) >= 2:
        seqs.append(cur)
    return seqs


def sequences_from_trace(path):
    import h5py
    with h5py.File(path, "r") as f:
        if "tokens" not in f:
            raise ValueError(f"{path}: has no /tokens")
        toks = f["tokens"][...].tolist()
        starts = f["sequences"][...].tolist() + [len(toks)]
    return [toks[a:b] for a, b in zip(starts[:-1], starts[1:])]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", required=True, help="Hugging Face model folder or hub name (needs transformers)")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--token-ids", nargs="+", help="token-id files (docs/formats.md)")
    src.add_argument("--tokens-from", help="replay the sequences stored in this trace")
    p.add_argument("--out", required=True)
    p.add_argument("--rule", default="relu>0", help="relu>0 or abs>X")
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--max-tokens", type=int, default=0)
    p.add_argument("--no-bos", action="store_true")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"])
    a = p.parse_args(argv)
    try:
        from transformers import AutoModelForCausalLM
    except ImportError:
        sys.exit("trace_hooks: --model needs the transformers package; or use TraceRecorder on your own module")
    model = AutoModelForCausalLM.from_pretrained(a.model, torch_dtype=getattr(torch, a.dtype)).to(a.device).eval()
    if a.tokens_from:
        seqs = sequences_from_trace(a.tokens_from)
    else:
        seqs = corpus_from_token_files(a.token_ids, a.seq_len, a.max_tokens, -1 if a.no_bos else 1)
    rec = TraceRecorder(model, a.rule)
    tty = sys.stderr.isatty()  # as nl::Progress: redrawn on a terminal, a plain line now and then otherwise
    for i, s in enumerate(seqs):
        rec.run(s)
        if tty or (i + 1) % 100 == 0 or i + 1 == len(seqs):
            lead, end = ("\r", "") if tty else ("", "\n")
            print(f"{lead}trace_hooks: {i + 1}/{len(seqs)} sequences", end=end, file=sys.stderr)
    if tty:
        print(file=sys.stderr)
    rec.write(a.out, model_name=a.model)


if __name__ == "__main__":
    main()
