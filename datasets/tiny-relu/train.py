#!/usr/bin/python3
"""Trains the bundled tiny ReLU Llama (datasets/tiny-relu/model/) on the Debian English corpus of corpus.py.

Llama architecture in Hugging Face conventions (RMSNorm, RoPE with rotate_half, grouped-query attention) with a
ReLU-gated FFN down(relu(gate(x)) * up(x)), so activation sparsity is exact. Seeded: rerunning reproduces a
comparable model (bit-identity across machines is not promised: BLAS reductions differ).
Run with Debian's /usr/bin/python3 (python3-torch, python3-sentencepiece; scripts/bootstrap.sh train demo):
  nice -n 15 /usr/bin/python3 datasets/tiny-relu/train.py --work build/tiny-relu-train --out datasets/tiny-relu/model
Checkpoints go to WORK/ckpt.pt every --ckpt-every steps; rerunning with the same --work resumes.
The larger datasets/small-relu model was trained with this script on one GPU (--device cuda --amp bfloat16
--keep-best; its README gives the command). For the ~100M datasets/medium-relu run (one GPU, one short run):
--ids DIR reads pre-tokenized, xz-compressed token ids (datasets/medium-relu/prepare.py), --max-seconds sizes the
schedule to a wall-clock budget and stops there, --ckpt-seconds checkpoints on a timer, SIGTERM stops training and
exports, --attn sdpa uses torch's fused attention, --export-quant int8 rounds the exported matrices to int8 with
one scale per row and also writes them as model-int8.safetensors (the files a GPU machine sends back).
"""
import argparse
import hashlib
import json
import lzma
import math
import os
import shutil
import signal
import struct
import subprocess
import sys
import time

import sentencepiece as spm
import torch
import torch.nn as nn
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))


# ---------------------------------------------------------------- model (HF LlamaForCausalLM semantics)
class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def rope_cos_sin(seq_len, head_dim, theta):
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    freqs = torch.outer(torch.arange(seq_len, dtype=torch.float32), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


class Attention(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.nh, self.nkv = c["num_attention_heads"], c["num_key_value_heads"]
        self.hd = c["hidden_size"] // self.nh
        d = c["hidden_size"]
        self.q_proj = nn.Linear(d, self.nh * self.hd, bias=False)
        self.k_proj = nn.Linear(d, self.nkv * self.hd, bias=False)
        self.v_proj = nn.Linear(d, self.nkv * self.hd, bias=False)
        self.o_proj = nn.Linear(self.nh * self.hd, d, bias=False)
        self.sdpa = False  # main() sets it with --attn sdpa (same function, torch's fused kernels)

    def forward(self, x, cos, sin, mask):
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.nh, self.hd).transpose(1, 2)
        k = self.k_proj(x).view(b, t, self.nkv, self.hd).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.nkv, self.hd).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        rep = self.nh // self.nkv  # query head h reads kv head h // rep (HF repeat_kv)
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
        if self.sdpa:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            att = (q @ k.transpose(-1, -2)) / math.sqrt(self.hd) + mask
            y = att.softmax(-1) @ v
        return self.o_proj(y.transpose(1, 2).reshape(b, t, self.nh * self.hd))


class MLP(nn.Module):
    def __init__(self, c):
        super().__init__()
        d, f = c["hidden_size"], c["intermediate_size"]
        self.gate_proj = nn.Linear(d, f, bias=False)
        self.up_proj = nn.Linear(d, f, bias=False)
        self.down_proj = nn.Linear(f, d, bias=False)
        self.track_act = False  # main() sets it with --act-l1

    def forward(self, x, record=None):
        a = F.relu(self.gate_proj(x))
        if record is not None:
            record.append(a > 0)
        if self.training and self.track_act:
            self.act_mean = a.float().mean()  # for --act-l1 (ProSparse-style sparsity regularisation)
        return self.down_proj(a * self.up_proj(x))


class Layer(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.self_attn = Attention(c)
        self.mlp = MLP(c)
        self.input_layernorm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])
        self.post_attention_layernorm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])

    def forward(self, x, cos, sin, mask, record=None):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, mask)
        return x + self.mlp(self.post_attention_layernorm(x), record)


class Inner(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.embed_tokens = nn.Embedding(c["vocab_size"], c["hidden_size"])
        self.layers = nn.ModuleList([Layer(c) for _ in range(c["num_hidden_layers"])])
        self.norm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])


class TinyLlama(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        self.model = Inner(c)
        self.lm_head = nn.Linear(c["hidden_size"], c["vocab_size"], bias=False)
        hd = c["hidden_size"] // c["num_attention_heads"]
        cos, sin = rope_cos_sin(c["max_position_embeddings"], hd, c["rope_theta"])
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)
        for name, p in self.named_parameters():
            if p.dim() == 2:
                std = 0.02
                if name.endswith("o_proj.weight") or name.endswith("down_proj.weight"):
                    std = 0.02 / math.sqrt(2 * c["num_hidden_layers"])  # keep the residual stream's scale flat
                nn.init.normal_(p, 0.0, std)

    def forward(self, ids, record=None):
        t = ids.shape[1]
        mask = torch.full((t, t), float("-inf"), device=ids.device).triu(1)
        cos, sin = self.cos[:t], self.sin[:t]
        x = self.model.embed_tokens(ids)
        for layer in self.model.layers:
            x = layer(x, cos, sin, mask, record)
        return self.lm_head(self.model.norm(x))


# ---------------------------------------------------------------- data
def ensure_corpus(work):
    cdir = os.path.join(work, "corpus")
    if not os.path.exists(os.path.join(cdir, "manifest.json")):
        subprocess.run([sys.executable, os.path.join(HERE, "corpus.py"), cdir], check=True)
    return cdir


def ensure_tokenizer(work, cdir, vocab):
    prefix = os.path.join(work, "tokenizer")
    if not os.path.exists(prefix + ".model"):
        # One thread and a fixed seed: the same corpus gives the same tokenizer.
        subprocess.run(["spm_train", "--input=" + os.path.join(cdir, "train.txt"), "--model_prefix=" + prefix,
                        "--vocab_size=%d" % vocab, "--model_type=bpe", "--character_coverage=1.0",
                        "--unk_id=0", "--bos_id=1", "--eos_id=2", "--pad_id=-1", "--num_threads=1",
                        "--random_seed=1", "--minloglevel=1"], check=True)
    return prefix + ".model"


def encode_file(sp, path, cache):
    if os.path.exists(cache):
        return torch.load(cache)
    with open(path, encoding="utf-8") as f:
        text = f.read()
    ids = []
    # Documents are separated by blank lines; encoding paragraph by paragraph keeps memory small and
    # matches what a streaming profiler sees (SentencePiece normalises newlines to spaces anyway).
    for para in text.split("\n\n"):
        ids.extend(sp.encode(para.replace("\n", " ")))
    t = torch.tensor(ids, dtype=torch.int32)
    torch.save(t, cache)
    return t


def load_ids(ids_dir, split):
    """Token ids shipped by datasets/medium-relu/prepare.py: little-endian int16 ids, one xz stream cut into
    parts (so that each travels within a file budget); ids.json lists the parts and the sha256 of the raw ids."""
    with open(os.path.join(ids_dir, "ids.json")) as f:
        meta = json.load(f)["splits"][split]
    blob = bytearray()
    for part in meta["parts"]:
        path = os.path.join(ids_dir, part["file"])
        if not os.path.exists(path):
            sys.exit("train.py: %s is missing (carry every part of the token ids)" % path)
        with open(path, "rb") as f:
            data = f.read()
        if hashlib.sha256(data).hexdigest() != part["sha256"]:
            sys.exit("train.py: %s does not match ids.json (sha256)" % path)
        blob += data
    raw = lzma.decompress(bytes(blob))
    if hashlib.sha256(raw).hexdigest() != meta["sha256"] or len(raw) != 2 * meta["tokens"]:
        sys.exit("train.py: the %s token ids do not match ids.json" % split)
    return torch.frombuffer(bytearray(raw), dtype=torch.int16).to(torch.int32)


def windows(ids, seq_len, bos):
    """Non-overlapping [BOS] + seq_len-1 token windows (the validation protocol)."""
    n = (len(ids) - 1) // (seq_len - 1)
    out = []
    for i in range(n):
        chunk = ids[i * (seq_len - 1): (i + 1) * (seq_len - 1) + 1].long()
        out.append((torch.cat((torch.tensor([bos]), chunk[:-1])), chunk))
    return out


@torch.no_grad()
def evaluate(model, wins, batch, record_active=False, amp=None):
    model.eval()
    dev = next(model.parameters()).device
    tot, n = 0.0, 0
    active = None
    counted = 0
    for i in range(0, len(wins), batch):
        x = torch.stack([w[0] for w in wins[i:i + batch]]).to(dev)
        y = torch.stack([w[1] for w in wins[i:i + batch]]).to(dev)
        rec = [] if record_active else None
        with torch.autocast(dev.type, dtype=amp, enabled=amp is not None):
            logits = model(x, rec).float()
        tot += F.cross_entropy(logits.view(-1, logits.shape[-1]), y.view(-1), reduction="sum").item()
        n += y.numel()
        if record_active:
            fr = torch.stack([r.float().mean(dim=(0, 1)) for r in rec]).cpu()  # [layers, neurons], per-token mean
            active = fr * x.numel() if active is None else active + fr * x.numel()
            counted += x.numel()
    model.train()
    return tot / n, (active / counted if record_active else None)


# ---------------------------------------------------------------- export
def write_safetensors(path, tensors, metadata):
    """Writes the safetensors format directly: u64le header length, JSON header, raw little-endian data."""
    header, blobs, off = {"__metadata__": metadata}, [], 0
    names = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16", torch.int8: "I8"}
    for name in sorted(tensors):
        t = tensors[name].contiguous()
        data = t.view(torch.uint8).numpy().tobytes() if t.dtype == torch.bfloat16 else t.numpy().tobytes()
        header[name] = {"dtype": names[t.dtype], "shape": list(t.shape), "data_offsets": [off, off + len(data)]}
        blobs.append(data)
        off += len(data)
    hj = json.dumps(header, separators=(",", ":")).encode()
    hj += b" " * ((8 - len(hj) % 8) % 8)  # align the data section to 8 bytes
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(hj)))
        f.write(hj)
        for b in blobs:
            f.write(b)
    os.replace(tmp, path)


@torch.no_grad()
def greedy(model, prompt_ids, max_positions, stop_ids):
    """Greedy decoding, full recompute each step (slow, obviously correct). Returns (tokens, logits of pos 0..3)."""
    model.eval()
    toks = list(prompt_ids)
    first_logits = None
    while len(toks) < max_positions:
        logits = model(torch.tensor([toks]))[0]
        if first_logits is None and len(toks) >= 4:
            first_logits = logits[:4].tolist()
        nxt = int(logits[-1].argmax())
        if nxt in stop_ids:
            break
        toks.append(nxt)
    if first_logits is None:
        first_logits = model(torch.tensor([toks]))[0][:4].tolist()
    return toks, first_logits


def quantize_int8(w):
    """Symmetric int8 with one float32 scale per row (absmax / 127); dequantized as q.float() * scale."""
    w = w.float()
    scale = (w.abs().amax(dim=1) / 127.0).clamp(min=1e-30)
    q = torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8)
    return q, scale


def dequantize_int8(tensors, dtype):
    """model-int8.safetensors' tensors -> the exported model's tensors (the same arithmetic on every machine)."""
    out = {}
    for name, t in tensors.items():
        if name.endswith(".__scale"):
            continue
        if t.dtype == torch.int8:
            out[name] = (t.float() * tensors[name + ".__scale"][:, None]).to(dtype)
        else:
            out[name] = t.to(dtype)
    return out


def export(model, cfg, sp_path, out_dir, dtype, meta, quant="none"):
    os.makedirs(out_dir, exist_ok=True)
    hf = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "relu",
          "hidden_size": cfg["hidden_size"], "intermediate_size": cfg["intermediate_size"],
          "num_hidden_layers": cfg["num_hidden_layers"], "num_attention_heads": cfg["num_attention_heads"],
          "num_key_value_heads": cfg["num_key_value_heads"], "vocab_size": cfg["vocab_size"],
          "max_position_embeddings": cfg["max_position_embeddings"], "rms_norm_eps": cfg["rms_norm_eps"],
          "rope_theta": cfg["rope_theta"], "tie_word_embeddings": False, "bos_token_id": 1, "eos_token_id": 2,
          "attention_bias": False, "torch_dtype": {torch.float32: "float32", torch.float16: "float16",
                                                   torch.bfloat16: "bfloat16"}[dtype]}
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(hf, f, indent=2)
        f.write("\n")
    sd = model if isinstance(model, dict) else model.state_dict()
    if quant == "int8":
        # The model IS the int8-rounded weights: model-int8.safetensors (int8 matrices + float32 row scales,
        # float32 vectors) rebuilds model.safetensors byte for byte (datasets/medium-relu/returns.py).
        q = {}
        for k, v in sd.items():
            v = v.detach().cpu().float()
            if v.dim() == 2:
                q[k], q[k + ".__scale"] = quantize_int8(v)
            else:
                q[k] = v
        write_safetensors(os.path.join(out_dir, "model-int8.safetensors"), q,
                          {"format": "int8-rows", "dtype": str(dtype).replace("torch.", ""), **meta})
        tensors = dequantize_int8(q, dtype)
    else:
        tensors = {k: v.detach().cpu().to(dtype) for k, v in sd.items()}
    write_safetensors(os.path.join(out_dir, "model.safetensors"), tensors, {"format": "pt", **meta})
    shutil.copyfile(sp_path, os.path.join(out_dir, "tokenizer.model"))


def load_exported(out_dir):
    """Reads config.json + model.safetensors back (independent of training state) into a TinyLlama."""
    with open(os.path.join(out_dir, "config.json")) as f:
        cfg = json.load(f)
    with open(os.path.join(out_dir, "model.safetensors"), "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    dt = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16, "I8": torch.int8}
    sd = {}
    for name, h in header.items():
        if name == "__metadata__":
            continue
        a, b = h["data_offsets"]
        sd[name] = torch.frombuffer(bytearray(data[a:b]), dtype=dt[h["dtype"]]).view(h["shape"]).float()
    model = TinyLlama(cfg)
    model.load_state_dict(sd)
    return model, cfg


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


# ---------------------------------------------------------------- main
def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", default="build/tiny-relu-train", help="corpus, tokenizer, checkpoints, logs")
    ap.add_argument("--out", default=os.path.join(HERE, "model"), help="Hugging Face model folder to write")
    ap.add_argument("--vocab", type=int, default=2048)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--ffn", type=int, default=512)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--warmup", type=int, default=60)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--eval-every", type=int, default=100)
    ap.add_argument("--ckpt-every", type=int, default=50)
    ap.add_argument("--dtype", choices=["float32", "float16", "bfloat16"], default="float32")
    ap.add_argument("--bench", type=int, default=0, help="time N steps and exit (no checkpoint, no export)")
    ap.add_argument("--export-only", action="store_true", help="export the last checkpoint and stop")
    ap.add_argument("--device", default="cpu", help="cpu or cuda (the larger model was trained on one GPU)")
    ap.add_argument("--amp", choices=["none", "bfloat16"], default="none",
                    help="autocast the forward and backward to this dtype (float32 master weights and optimizer)")
    ap.add_argument("--act-l1", type=float, default=0.0,
                    help="add this x the mean ReLU activation (gate branch, all layers) to the loss, ramped up "
                         "linearly over the first half of the steps (ProSparse-style L1 sparsity regularisation)")
    ap.add_argument("--keep-best", action="store_true",
                    help="export the weights of the periodic evaluation with the lowest validation-probe loss "
                         "instead of the last step's (the probe is 32 validation windows)")
    ap.add_argument("--eval-windows", type=int, default=256,
                    help="final losses on this many evenly spaced windows per split (0 = all)")
    ap.add_argument("--ids", default="",
                    help="folder of pre-tokenized ids (ids.json, *.xz parts, tokenizer.model) from "
                         "datasets/medium-relu/prepare.py: no corpus or tokenizer is built")
    ap.add_argument("--max-seconds", type=float, default=0,
                    help="wall-clock budget of the training loop, counted from the start of this process: after "
                         "--probe-steps steps the schedule's step count is cut to what fits (kept in the "
                         "checkpoint), and training stops at the budget in any case; then the usual export")
    ap.add_argument("--probe-steps", type=int, default=20, help="steps timed for --max-seconds (the first 3 "
                    "are not counted: warm-up)")
    ap.add_argument("--ckpt-seconds", type=float, default=0, help="also checkpoint when this many seconds "
                    "passed since the last checkpoint")
    ap.add_argument("--attn", choices=["manual", "sdpa", "auto"], default="manual",
                    help="attention: the explicit softmax (default), torch's scaled_dot_product_attention, or "
                         "auto (sdpa on CUDA where torch has it)")
    ap.add_argument("--export-quant", choices=["none", "int8"], default="none",
                    help="int8: the exported matrices are rounded to int8 with one float32 scale per row (the "
                         "model is then those weights, in --dtype), and model-int8.safetensors is written too")
    args = ap.parse_args()

    t_start = time.time()
    stop = {"signal": None}

    def on_term(signum, frame):  # a cut-off run still exports: stop at the next step, then the usual end
        stop["signal"] = signum
    signal.signal(signal.SIGTERM, on_term)
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    os.makedirs(args.work, exist_ok=True)
    if args.ids:
        cdir = args.ids
        sp_path = os.path.join(args.ids, "tokenizer.model")
        sp = spm.SentencePieceProcessor(model_file=sp_path)
        train_ids, valid_ids = load_ids(args.ids, "train"), load_ids(args.ids, "valid")
    else:
        cdir = ensure_corpus(args.work)
        sp_path = ensure_tokenizer(args.work, cdir, args.vocab)
        sp = spm.SentencePieceProcessor(model_file=sp_path)
        train_ids = encode_file(sp, os.path.join(cdir, "train.txt"), os.path.join(args.work, "train.ids.pt"))
        valid_ids = encode_file(sp, os.path.join(cdir, "valid.txt"), os.path.join(args.work, "valid.ids.pt"))
    train_txt = os.path.join(cdir, "train.txt")  # absent where only the cached token ids were carried
    print("tokens: train %d valid %d%s" % (len(train_ids), len(valid_ids), " (%.2f bytes/token)" % (
          os.path.getsize(train_txt) / len(train_ids)) if os.path.exists(train_txt) else ""), flush=True)

    cfg = {"hidden_size": args.dim, "intermediate_size": args.ffn, "num_hidden_layers": args.layers,
           "num_attention_heads": args.heads, "num_key_value_heads": args.kv_heads, "vocab_size": sp.vocab_size(),
           "max_position_embeddings": args.seq_len, "rms_norm_eps": 1e-5, "rope_theta": 10000.0}
    dev = torch.device(args.device)
    amp = None if args.amp == "none" else torch.bfloat16
    has_sdpa = hasattr(F, "scaled_dot_product_attention")
    if args.attn == "sdpa" and not has_sdpa:
        sys.exit("train.py: --attn sdpa needs torch >= 2.0 (this is %s)" % torch.__version__)
    sdpa = args.attn == "sdpa" or (args.attn == "auto" and has_sdpa and dev.type == "cuda")
    if dev.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True  # the float32 parts outside autocast
    model = TinyLlama(cfg).to(dev)
    for layer in model.model.layers:
        layer.mlp.track_act = args.act_l1 > 0
        layer.self_attn.sdpa = sdpa
    print("attention: %s (torch %s, %s)" % ("sdpa" if sdpa else "manual", torch.__version__, dev), flush=True)
    nparams = sum(p.numel() for p in model.parameters())
    print("params %d (%.1f MB f32)" % (nparams, nparams * 4 / 1e6), flush=True)
    decay = [p for p in model.parameters() if p.dim() == 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), eps=1e-8)
    gen = torch.Generator().manual_seed(args.seed)
    step, history, best = 0, [], None
    sched_steps = args.steps  # the schedule's length: --steps, or what --max-seconds lets fit
    sched_fixed = False  # a resumed run keeps a schedule that --max-seconds sized
    budget_applied = False
    ckpt = os.path.join(args.work, "ckpt.pt")
    if os.path.exists(ckpt) and not args.bench:
        st = torch.load(ckpt, weights_only=False)  # torch >= 2.6 defaults to weights_only=True
        if st["cfg"] != cfg:
            sys.exit("train.py: %s was made with another configuration; use another --work" % ckpt)
        model.load_state_dict(st["model"])
        best = st.get("best")
        opt.load_state_dict(st["opt"])
        gen.set_state(st["gen"])
        step, history = st["step"], st["history"]
        if st.get("budget_steps"):  # a schedule sized by --max-seconds is kept; otherwise --steps rules
            sched_steps, sched_fixed = st["budget_steps"], True
        print("resumed at step %d" % step, flush=True)

    valid_wins = windows(valid_ids, args.seq_len, 1)
    probe = valid_wins[:: max(1, len(valid_wins) // 32)][:32]  # fixed subset for cheap periodic evaluation

    def lr_at(s):
        if s < args.warmup:
            return args.lr * (s + 1) / args.warmup
        p = (s - args.warmup) / max(1, sched_steps - args.warmup)
        return args.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, p))))

    def evaluate_probe():
        """The probe's validation loss now: into history, the best model so far (--keep-best), the log."""
        nonlocal best
        vl, _ = evaluate(model, probe, args.batch, amp=amp)
        if args.keep_best and (best is None or vl < best["valid_probe_loss"]):
            best = {"step": step, "valid_probe_loss": vl,
                    "model": {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}}
        history.append({"step": step, "train_loss_ema": train_loss_ema, "valid_probe_loss": vl,
                        "elapsed_s": time.time() - t0})
        print("eval step %d valid(probe) %.4f" % (step, vl), flush=True)

    def save_ckpt():
        torch.save({"cfg": cfg, "model": model.state_dict(), "opt": opt.state_dict(), "gen": gen.get_state(),
                    "step": step, "history": history, "best": best,
                    "budget_steps": sched_steps if budget_applied or sched_fixed else None}, ckpt + ".tmp")
        os.replace(ckpt + ".tmp", ckpt)

    t0, tokens_done, train_loss_ema = time.time(), 0, None
    t_ckpt, run_steps, t_probe, stopped = time.time(), 0, None, None
    while step < (args.bench if args.bench else sched_steps) and not args.export_only:
        if stop["signal"] is not None:
            stopped = "signal %d" % stop["signal"]
            break
        if args.max_seconds and time.time() - t_start >= args.max_seconds:
            stopped = "--max-seconds"
            break
        starts = torch.randint(0, len(train_ids) - args.seq_len, (args.batch,), generator=gen)
        chunk = torch.stack([train_ids[s:s + args.seq_len].long() for s in starts])
        x = torch.cat((torch.ones(args.batch, 1, dtype=torch.long), chunk[:, :-1]), dim=1).to(dev)  # BOS + text
        y = chunk.to(dev)
        for g in opt.param_groups:
            g["lr"] = lr_at(step)
        with torch.autocast(dev.type, dtype=amp, enabled=amp is not None):
            logits = model(x)
        loss = F.cross_entropy(logits.float().view(-1, logits.shape[-1]), y.reshape(-1))
        total_loss = loss
        if args.act_l1 > 0:
            ramp = min(1.0, step / max(1, args.steps // 2))
            act = torch.stack([layer.mlp.act_mean for layer in model.model.layers]).mean()
            total_loss = loss + args.act_l1 * ramp * act
        opt.zero_grad(set_to_none=True)
        total_loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        run_steps += 1
        tokens_done += x.numel()
        if args.max_seconds and not args.bench:
            if run_steps == 3:
                if dev.type == "cuda":
                    torch.cuda.synchronize()
                t_probe = time.time()
            elif run_steps == max(4, args.probe_steps):
                if dev.type == "cuda":
                    torch.cuda.synchronize()
                per_step = (time.time() - t_probe) / (run_steps - 3)
                # 4 % of the time is kept for evaluations and checkpoints (they are not in the probe).
                fit = step + int((args.max_seconds - (time.time() - t_start)) * 0.96 / per_step)
                if fit < sched_steps and not sched_fixed:
                    sched_steps, budget_applied = max(step + 1, fit), True
                print("budget: %.3f s/step, %d steps fit in --max-seconds %.0f; schedule %d steps" % (
                      per_step, fit, args.max_seconds, sched_steps), flush=True)
        train_loss_ema = loss.item() if train_loss_ema is None else 0.95 * train_loss_ema + 0.05 * loss.item()
        if step % 10 == 0 or args.bench:
            el = time.time() - t0
            print("step %d loss %.4f ema %.4f lr %.2e %.0f tok/s %.0fs" % (step, loss.item(), train_loss_ema,
                  lr_at(step - 1), tokens_done / el, el), flush=True)
        if args.bench:
            continue
        if step % args.eval_every == 0 or step == sched_steps:
            evaluate_probe()
        if step % args.ckpt_every == 0 or step == sched_steps or (
                args.ckpt_seconds and time.time() - t_ckpt >= args.ckpt_seconds):
            save_ckpt()
            t_ckpt = time.time()
            print("checkpoint step %d (%.0f s)" % (step, time.time() - t_start), flush=True)
    if args.bench:
        return
    if stopped:
        # Cut off before the schedule's end: the last step is evaluated and checkpointed like a scheduled end.
        print("stopped at step %d of %d (%s, %.0f s)" % (step, sched_steps, stopped, time.time() - t_start),
              flush=True)
        if step and (not history or history[-1]["step"] != step):
            evaluate_probe()
        save_ckpt()

    # Final figures on everything: full validation split, and the same number of training windows.
    dtype = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}[args.dtype]
    kept = best if args.keep_best else None
    exported_step = kept["step"] if kept else step
    if kept:
        print("exporting the weights of step %d (validation probe %.4f)" % (kept["step"], kept["valid_probe_loss"]),
              flush=True)
    export(kept["model"] if kept else model, cfg, sp_path, args.out, dtype,
           {"steps": str(exported_step), "seed": str(args.seed)}, quant=args.export_quant)
    model, _ = load_exported(args.out)  # measure what was written, not the training copy
    model = model.to(dev)
    torch.set_num_threads(args.threads)
    if args.eval_windows and args.eval_windows < len(valid_wins):
        valid_wins = valid_wins[:: len(valid_wins) // args.eval_windows][: args.eval_windows]
    vl, active = evaluate(model, valid_wins, args.batch, record_active=True)  # float32, no autocast
    train_wins = windows(train_ids, args.seq_len, 1)
    train_wins = train_wins[:: len(train_wins) // len(valid_wins)][: len(valid_wins)]
    tl, _ = evaluate(model, train_wins, args.batch)
    per_layer = active.mean(dim=1).tolist()
    never = (active == 0).sum(dim=1).tolist()
    model = model.cpu()
    prompts = {"bos": [1], "prompt": [1] + sp.encode("And God said unto Moses,")}
    rel = os.path.relpath(os.path.abspath(args.out), os.path.dirname(os.path.dirname(HERE)))
    ref = {"model": rel if not rel.startswith("..") else os.path.basename(os.path.abspath(args.out)),
           "how": "greedy from the listed start tokens with the PyTorch "
           "reference (datasets/tiny-relu/train.py); 'tokens' are the tokens fed at positions 0..; generation stops "
           "at 64 positions or when token 1 or 2 is the argmax; 'logits' are float32 logits at positions 0..3",
           "runs": []}
    for name, start in prompts.items():
        toks, lg = greedy(model, start, 64, {1, 2})
        ref["runs"].append({"name": name, "start": start, "tokens": toks, "text": sp.decode(toks[1:]),
                            "logits": lg})
    with open(os.path.join(args.out, "reference-greedy.json"), "w") as f:
        json.dump(ref, f, indent=1)
        f.write("\n")
    summary = {"steps": step, "schedule_steps": sched_steps, "stopped_early": stopped,
               "exported_step": exported_step, "tokens_seen": step * args.batch * args.seq_len,
               "wall_s": time.time() - t_start, "attention": "sdpa" if sdpa else "manual",
               "model_sha256": sha256_file(os.path.join(args.out, "model.safetensors")),
               "params": nparams,
               "train_tokens": len(train_ids), "valid_tokens": len(valid_ids),
               "final_train_loss": tl, "final_valid_loss": vl, "train_eval_windows": len(train_wins),
               "valid_eval_windows": len(valid_wins), "active_fraction_per_layer": per_layer,
               "never_active_neurons_per_layer": never, "history": history, "args": vars(args),
               "greedy": [{"name": r["name"], "tokens": r["tokens"], "text": r["text"]} for r in ref["runs"]]}
    with open(os.path.join(args.work, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    print(json.dumps({k: v for k, v in summary.items() if k != "history"}, indent=1), flush=True)


if __name__ == "__main__":
    main()
