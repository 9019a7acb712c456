#!/usr/bin/python3
"""Trains the bundled tiny ReLU Llama (datasets/tiny-relu/model/) on the Debian English corpus of corpus.py.

Llama architecture in Hugging Face conventions (RMSNorm, RoPE with rotate_half, grouped-query attention) with a
ReLU-gated FFN down(relu(gate(x)) * up(x)), so activation sparsity is exact. Seeded: rerunning reproduces a
comparable model (bit-identity across machines is not promised: BLAS reductions differ).
Run with Debian's /usr/bin/python3 (python3-torch, python3-sentencepiece; scripts/bootstrap.sh train demo):
  nice -n 15 /usr/bin/python3 datasets/tiny-relu/train.py --work build/tiny-relu-train --out datasets/tiny-relu/model
Checkpoints go to WORK/ckpt.pt every --ckpt-every steps; rerunning with the same --work resumes.
The larger datasets/small-relu model was trained with this script on one GPU (--device cuda --amp bfloat16
--keep-best; its README gives the command).
"""
import argparse
import json
import math
import os
import shutil
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
    names = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16"}
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


def export(model, cfg, sp_path, out_dir, dtype, meta):
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
    dt = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}
    sd = {}
    for name, h in header.items():
        if name == "__metadata__":
            continue
        a, b = h["data_offsets"]
        sd[name] = torch.frombuffer(bytearray(data[a:b]), dtype=dt[h["dtype"]]).view(h["shape"]).float()
    model = TinyLlama(cfg)
    model.load_state_dict(sd)
    return model, cfg


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
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    os.makedirs(args.work, exist_ok=True)
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
    model = TinyLlama(cfg).to(dev)
    for layer in model.model.layers:
        layer.mlp.track_act = args.act_l1 > 0
    nparams = sum(p.numel() for p in model.parameters())
    print("params %d (%.1f MB f32)" % (nparams, nparams * 4 / 1e6), flush=True)
    decay = [p for p in model.parameters() if p.dim() == 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), eps=1e-8)
    gen = torch.Generator().manual_seed(args.seed)
    step, history, best = 0, [], None
    ckpt = os.path.join(args.work, "ckpt.pt")
    if os.path.exists(ckpt) and not args.bench:
        st = torch.load(ckpt)
        if st["cfg"] != cfg:
            sys.exit("train.py: %s was made with another configuration; use another --work" % ckpt)
        model.load_state_dict(st["model"])
        best = st.get("best")
        opt.load_state_dict(st["opt"])
        gen.set_state(st["gen"])
        step, history = st["step"], st["history"]
        print("resumed at step %d" % step, flush=True)

    valid_wins = windows(valid_ids, args.seq_len, 1)
    probe = valid_wins[:: max(1, len(valid_wins) // 32)][:32]  # fixed subset for cheap periodic evaluation

    def lr_at(s):
        if s < args.warmup:
            return args.lr * (s + 1) / args.warmup
        p = (s - args.warmup) / max(1, args.steps - args.warmup)
        return args.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, p))))

    t0, tokens_done, train_loss_ema = time.time(), 0, None
    total = args.bench if args.bench else args.steps
    while step < total and not args.export_only:
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
        tokens_done += x.numel()
        train_loss_ema = loss.item() if train_loss_ema is None else 0.95 * train_loss_ema + 0.05 * loss.item()
        if step % 10 == 0 or args.bench:
            el = time.time() - t0
            print("step %d loss %.4f ema %.4f lr %.2e %.0f tok/s %.0fs" % (step, loss.item(), train_loss_ema,
                  lr_at(step - 1), tokens_done / el, el), flush=True)
        if args.bench:
            continue
        if step % args.eval_every == 0 or step == args.steps:
            vl, _ = evaluate(model, probe, args.batch, amp=amp)
            if args.keep_best and (best is None or vl < best["valid_probe_loss"]):
                best = {"step": step, "valid_probe_loss": vl,
                        "model": {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}}
            history.append({"step": step, "train_loss_ema": train_loss_ema, "valid_probe_loss": vl,
                            "elapsed_s": time.time() - t0})
            print("eval step %d valid(probe) %.4f" % (step, vl), flush=True)
        if step % args.ckpt_every == 0 or step == args.steps:
            torch.save({"cfg": cfg, "model": model.state_dict(), "opt": opt.state_dict(), "gen": gen.get_state(),
                        "step": step, "history": history, "best": best}, ckpt + ".tmp")
            os.replace(ckpt + ".tmp", ckpt)
    if args.bench:
        return

    # Final figures on everything: full validation split, and the same number of training windows.
    dtype = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}[args.dtype]
    kept = best if args.keep_best else None
    exported_step = kept["step"] if kept else step
    if kept:
        print("exporting the weights of step %d (validation probe %.4f)" % (kept["step"], kept["valid_probe_loss"]),
              flush=True)
    export(kept["model"] if kept else model, cfg, sp_path, args.out, dtype,
           {"steps": str(exported_step), "seed": str(args.seed)})
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
    summary = {"steps": step, "exported_step": exported_step, "tokens_seen": step * args.batch * args.seq_len,
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
