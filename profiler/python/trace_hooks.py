#!/usr/bin/env python3
"""Record which FFN neurons fire in a PyTorch model with forward hooks, and write trace v1 (docs/formats.md).

For users who profile large models on GPUs: the toolkit's own profiler (nl-profile run) runs on CPUs. Works on
any torch module tree with Llama-style MLPs (a module with `gate_proj` and `act_fn`: the activation is
act_fn(gate_proj(x))) or OPT-style layers (a module with `fc1` and `activation_fn`/`act_fn`: act(fc1(x))), in
module order, so Hugging Face Llama/Mistral/OPT models work as loaded by transformers.

Library use:
    rec = TraceRecorder(model, rule="relu>0")      # or "abs>0.05", or "drelu>0" (TurboSparse: up x > 0 too)
    for ids in sequences:                           # each a list of token ids, one independent sequence
        rec.run(ids)                                # model(input_ids) under the hooks
    rec.run_batch([ids0, ids1, ...])                # or several at once, right-padded; padding is not recorded
    rec.write("trace.h5", model_name="opt-6.7b")

Command line (needs `transformers` for --model unless --loader names your own loader; Debian's python3-torch
and python3-h5py otherwise):
    trace_hooks.py --model HF_DIR (--token-ids FILE... | --tokens-from TRACE.h5) --out trace.h5
                   [--rule relu>0|drelu>0|abs>X] [--seq-len 256] [--max-tokens N] [--no-bos] [--device cuda]
                   [--batch-size 8] [--loader FILE.py:FUNCTION] [--device-map auto [--gpus-per-rank G]]
--token-ids reads token-id files and cuts them into sequences exactly as `nl-profile run --token-ids` does;
--tokens-from replays the sequences stored in an existing trace (e.g. to compare with nl-profile's masks).

Distributed (docs/scale-out.md): under `torchrun --nproc_per_node N trace_hooks.py ...` every rank reads the
same corpus, profiles its own contiguous share of the sequences (split by token count, deterministic: the
same corpus and world size give the same split) and writes its own shard OUT.rankRR-of-NN.h5; torch.distributed
(NCCL on GPUs, gloo on CPUs) checks that every rank cut the same corpus and sums the tokens profiled. Shards
concatenated in rank order (`nl-profile merge OUT.rank*-of-NN.h5 --out trace.h5`) are the single-process
trace; or count each shard with `nl-layout graph --full` and sum with `nl-layout graph-merge`.
--device-map auto loads a model too large for one GPU with Hugging Face's device_map="auto" (pipeline over the
GPUs, needs transformers + accelerate): each rank then spans --gpus-per-rank GPUs (ranks on a node take
consecutive groups), so run --nproc_per_node = GPUs per node / --gpus-per-rank.
"""
import argparse
import hashlib
import os
import sys

import numpy as np
import torch


def find_ffns(model):
    """[(name, projection module, activation callable, FFN module)] in module order: the neurons are the projection's
    outputs."""
    out = []
    for name, m in model.named_modules():
        act = getattr(m, "act_fn", None)
        if act is None:
            act = getattr(m, "activation_fn", None)
        if act is None:
            continue
        if isinstance(getattr(m, "gate_proj", None), torch.nn.Module):
            out.append((name, m.gate_proj, act, m))
        elif isinstance(getattr(m, "fc1", None), torch.nn.Module):
            out.append((name, m.fc1, act, m))
    if not out:
        raise ValueError("no FFN found: expected modules with gate_proj + act_fn (Llama) or fc1 + activation_fn (OPT)")
    return out


def parse_rule(rule):
    """None for the exact zero rules: relu>0 (a > 0: ReLU, and fatrelu, whose act_fn zeroes gate x <= t) and drelu>0
    (a > 0 and up_proj x > 0: TurboSparse's relu(gate x) * relu(up x)); the threshold X for abs>X."""
    if rule in ("relu>0", "drelu>0"):
        return None
    if rule.startswith("abs>"):
        x = float(rule[4:])
        if not x >= 0:
            raise ValueError(f"rule '{rule}': the threshold must be >= 0")
        return x
    raise ValueError(f"unknown rule '{rule}' (relu>0, drelu>0 or abs>X)")


class TraceRecorder:
    """Hooks every FFN of `model`; run() records one sequence's masks (batch of one)."""

    def __init__(self, model, rule="relu>0"):
        self.model, self.rule = model, rule
        self.threshold = parse_rule(rule)
        self.ffns = find_ffns(model)
        self.masks = [[] for _ in self.ffns]  # per layer, per sequence: bool [tokens, neurons] on the CPU
        self.sequences, self.tokens = [], []
        self._handles = []
        self._gate_on = [None] * len(self.ffns)  # drelu>0: the gate's half of the mask, until up_proj runs
        for i, (name, proj, act, ffn) in enumerate(self.ffns):
            self._handles.append(proj.register_forward_hook(self._hook(i, act)))
            if rule == "drelu>0":
                up = getattr(ffn, "up_proj", None)
                if not isinstance(up, torch.nn.Module):
                    raise ValueError(f"rule drelu>0 needs an up_proj in FFN {name}")
                self._handles.append(up.register_forward_hook(self._up_hook(i)))

    def _hook(self, i, act):
        def hook(_module, _inputs, output):
            a = act(output.detach())
            on = (a > 0) if self.threshold is None else (a.abs() > self.threshold)
            on = on.reshape(-1, on.shape[-1])
            if self.rule == "drelu>0":
                self._gate_on[i] = on
            else:
                self.masks[i].append(on.cpu())
        return hook

    def _up_hook(self, i):
        def hook(_module, _inputs, output):
            if self._gate_on[i] is None:
                raise RuntimeError(f"FFN {self.ffns[i][0]}: up_proj ran before gate_proj")
            up = output.detach()
            self.masks[i].append((self._gate_on[i] & (up.reshape(-1, up.shape[-1]) > 0)).cpu())
            self._gate_on[i] = None
        return hook

    @torch.no_grad()
    def run(self, ids):
        n_before = [len(m) for m in self.masks]
        self.model(torch.tensor([ids], dtype=torch.long, device=input_device(self.model)))
        for i, m in enumerate(self.masks):  # one forward call per layer per sequence
            if len(m) != n_before[i] + 1:
                raise RuntimeError(f"FFN {self.ffns[i][0]} ran {len(m) - n_before[i]} times for one sequence")
        self.sequences.append(len(self.tokens))
        self.tokens.extend(int(t) for t in ids)

    @torch.no_grad()
    def run_batch(self, seqs, pad_id=0):
        """Several independent sequences in one forward call, right-padded with pad_id. The model is causal, so a
        real token never attends to the padding after it; the padding's activations are not recorded. Models whose
        forward takes an attention_mask (Hugging Face) get one as well."""
        if len(seqs) == 1:
            return self.run(seqs[0])
        n_before = [len(m) for m in self.masks]
        lens = [len(s) for s in seqs]
        width = max(lens)
        ids = torch.full((len(seqs), width), int(pad_id), dtype=torch.long)
        att = torch.zeros((len(seqs), width), dtype=torch.long)
        for b, s in enumerate(seqs):
            ids[b, : len(s)] = torch.tensor(s, dtype=torch.long)
            att[b, : len(s)] = 1
        dev = input_device(self.model)
        if _takes_attention_mask(self.model):
            self.model(input_ids=ids.to(dev), attention_mask=att.to(dev))
        else:
            self.model(ids.to(dev))
        for i, m in enumerate(self.masks):
            if len(m) != n_before[i] + 1:
                raise RuntimeError(f"FFN {self.ffns[i][0]} ran {len(m) - n_before[i]} times for one batch")
            on = m.pop().reshape(len(seqs), width, -1)  # the hook flattened [batch * width, neurons]
            for b, n in enumerate(lens):
                m.append(on[b, :n])
        for s in seqs:
            self.sequences.append(len(self.tokens))
            self.tokens.extend(int(t) for t in s)

    def close(self):
        for h in self._handles:
            h.remove()
        self._handles = []

    def write(self, path, model_name="pytorch", store_tokens=True):
        """Trace v1 via h5py, written to a temporary name and renamed into place."""
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


def input_device(model):
    """Where input ids go: the embedding's device (with device_map="auto" the first GPU of the pipeline)."""
    emb = getattr(model, "get_input_embeddings", None)
    if emb is not None and emb() is not None:
        return emb().weight.device
    return next(model.parameters()).device


def _takes_attention_mask(model):
    import inspect
    try:
        return "attention_mask" in inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return False


def split_for_rank(seqs, rank, world):
    """The contiguous share [a, b) of the sequences rank `rank` of `world` profiles: boundary r at the sequence
    boundary nearest r/world of all tokens (at least one sequence per rank when there are enough), so shares are
    balanced by tokens and concatenating them in rank order gives back the corpus. Deterministic: depends only
    on the sequence lengths."""
    total = sum(len(s) for s in seqs)
    bounds, acc, i = [0], 0, 0
    for r in range(1, world):
        target = total * r // world
        while i < len(seqs) and 2 * acc + len(seqs[i]) <= 2 * target:  # past the middle of sequence i
            acc += len(seqs[i])
            i += 1
        if len(seqs) >= world:  # keep one sequence for this rank and each later one
            while i < bounds[-1] + 1:
                acc += len(seqs[i])
                i += 1
            while i > len(seqs) - (world - r):
                i -= 1
                acc -= len(seqs[i])
        bounds.append(max(i, bounds[-1]))
    bounds.append(len(seqs))
    return bounds[rank], bounds[rank + 1]


def shard_path(out, rank, world):
    """OUT.rankRR-of-NN.h5 (zero-padded, so a shell glob lists the shards in rank order)."""
    base = out[:-3] if out.endswith(".h5") else out
    w = len(str(world - 1))
    return f"{base}.rank{rank:0{w}d}-of-{world:0{w}d}.h5"


def corpus_digest(seqs):
    h = hashlib.sha256()
    for s in seqs:
        h.update(np.asarray(s, dtype="<i8").tobytes())
        h.update(b"|")
    return h.hexdigest()


def load_model(a):
    """The model as the options say: --loader FILE.py:FUNCTION(folder) for your own module tree, else
    transformers' AutoModelForCausalLM (device_map="auto" over this rank's GPUs with --device-map auto)."""
    if a.loader:
        import importlib.util
        path, _, fn = a.loader.rpartition(":")
        if not path or not fn:
            sys.exit(f"trace_hooks: --loader '{a.loader}': expected FILE.py:FUNCTION")
        sys.path.insert(0, os.path.dirname(os.path.abspath(path)))
        spec = importlib.util.spec_from_file_location("nl_trace_loader", path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        model = getattr(mod, fn)(a.model)
        return model.to(dtype=getattr(torch, a.dtype)).to(a.device).eval()
    try:
        from transformers import AutoModelForCausalLM
    except ImportError:
        sys.exit("trace_hooks: --model needs the transformers package; or pass --loader FILE.py:FUNCTION, or use "
                 "TraceRecorder on your own module")
    dtype = getattr(torch, a.dtype)
    if a.device_map == "auto":
        # This rank's GPUs only: ranks on one node take consecutive groups of --gpus-per-rank devices.
        local = int(os.environ.get("LOCAL_RANK", "0"))
        gpus = range(local * a.gpus_per_rank, (local + 1) * a.gpus_per_rank)
        if torch.cuda.device_count() < gpus.stop:
            sys.exit(f"trace_hooks: local rank {local} needs GPUs {gpus.start}..{gpus.stop - 1} but "
                     f"{torch.cuda.device_count()} are visible")
        max_memory = {i: torch.cuda.get_device_properties(i).total_memory for i in gpus}
        return AutoModelForCausalLM.from_pretrained(a.model, torch_dtype=dtype, device_map="auto",
                                                    max_memory=max_memory).eval()
    return AutoModelForCausalLM.from_pretrained(a.model, torch_dtype=dtype).to(a.device).eval()


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
    p.add_argument("--out", required=True, help="trace to write; under torchrun each rank writes OUT.rankRR-of-NN.h5")
    p.add_argument("--rule", default="relu>0", help="relu>0 (also fatrelu models), drelu>0 or abs>X")
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--max-tokens", type=int, default=0)
    p.add_argument("--no-bos", action="store_true")
    p.add_argument("--device", default=None, help="cpu, cuda (default: this rank's GPU when there is one)")
    p.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"])
    p.add_argument("--batch-size", type=int, default=1, help="sequences per forward call (right-padded)")
    p.add_argument("--pad-id", type=int, default=0, help="token id the padding uses (never recorded)")
    p.add_argument("--loader", help="FILE.py:FUNCTION returning a torch module for --model (instead of transformers)")
    p.add_argument("--device-map", choices=["auto"], help="Hugging Face device_map='auto' over this rank's GPUs")
    p.add_argument("--gpus-per-rank", type=int, default=1, help="GPUs each rank's --device-map auto pipeline spans")
    p.add_argument("--model-name", help="the trace's model attribute (default: --model)")
    a = p.parse_args(argv)
    if a.batch_size < 1:
        p.error("--batch-size must be >= 1")

    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    dist = None
    if world > 1:
        import torch.distributed as dist
        use_nccl = torch.cuda.is_available() and a.device != "cpu" and dist.is_nccl_available()
        if use_nccl and a.device_map is None:
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group(backend="nccl" if use_nccl else "gloo")
    if a.device is None:
        a.device = "cuda" if torch.cuda.is_available() else "cpu"
        if a.device == "cuda" and world > 1 and a.device_map is None:
            a.device = f"cuda:{torch.cuda.current_device()}"

    if a.tokens_from:
        seqs = sequences_from_trace(a.tokens_from)
    else:
        seqs = corpus_from_token_files(a.token_ids, a.seq_len, a.max_tokens, -1 if a.no_bos else 1)
    if dist is not None:
        # Every rank must cut the same corpus, or the shards would not tile it: compare digests (gloo runs on the
        # CPU, so the check goes through a CPU group even when profiling uses NCCL).
        group = dist.new_group(backend="gloo")
        digests = [None] * world
        dist.all_gather_object(digests, corpus_digest(seqs), group=group)
        if len(set(digests)) != 1:
            sys.exit(f"trace_hooks: rank {rank}: the ranks read different corpora (digests {sorted(set(digests))})")
    # Every rank computes every share, so all stop together (none left waiting in a collective) when one is empty.
    shares = [split_for_rank(seqs, r, world) for r in range(world)]
    if any(b <= a_ for a_, b in shares):
        sys.exit(f"trace_hooks: {len(seqs)} sequences cannot give each of {world} ranks a share; use fewer ranks")
    lo, hi = shares[rank]
    mine = seqs[lo:hi]
    out = a.out if world == 1 else shard_path(a.out, rank, world)

    model = load_model(a)
    rec = TraceRecorder(model, a.rule)
    tty = sys.stderr.isatty()  # as nl::Progress: redrawn on a terminal, a plain line now and then otherwise
    who = f"trace_hooks[{rank}/{world}]" if world > 1 else "trace_hooks"
    done = 0
    for b in range(0, len(mine), a.batch_size):
        batch = mine[b : b + a.batch_size]
        rec.run_batch(batch, a.pad_id)
        done += len(batch)
        if tty or done // 100 != (done - len(batch)) // 100 or done == len(mine):
            lead, end = ("\r", "") if tty else ("", "\n")
            print(f"{lead}{who}: {done}/{len(mine)} sequences", end=end, file=sys.stderr)
    if tty:
        print(file=sys.stderr)
    rec.write(out, model_name=a.model_name or a.model)
    if dist is not None:
        n = torch.tensor([len(rec.tokens)], dtype=torch.long)
        dist.all_reduce(n, group=group)  # every shard written before rank 0 reports
        if rank == 0:
            print(f"{who}: {world} shards, {int(n.item())} tokens: {shard_path(a.out, 0, world)} ... "
                  f"{shard_path(a.out, world - 1, world)}", file=sys.stderr)
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
