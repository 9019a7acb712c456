#!/usr/bin/env python3
"""A quick look at the GPU before the real run (gpu_run.sh check calls it; ~30 s, no token ids needed).

Builds train.py's model with the run's options (the same flags; others are ignored), checks that the fused
attention (--attn sdpa) gives the explicit softmax's output, then times a few AdamW steps on random tokens with the
run's batch, autocast and attention, and says how many steps --max-seconds would hold.
"""
import argparse
import importlib.util
import os
import time

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
spec = importlib.util.spec_from_file_location("train", os.path.join(HERE, "..", "tiny-relu", "train.py"))
train = importlib.util.module_from_spec(spec)
spec.loader.exec_module(train)

ap = argparse.ArgumentParser(allow_abbrev=False)
for name, typ, default in (("--dim", int, 768), ("--ffn", int, 3072), ("--layers", int, 12), ("--heads", int, 12),
                           ("--kv-heads", int, 4), ("--seq-len", int, 256), ("--batch", int, 128),
                           ("--device", str, "cuda"), ("--amp", str, "bfloat16"), ("--attn", str, "auto"),
                           ("--max-seconds", float, 420), ("--threads", int, 16), ("--smoke-steps", int, 10)):
    ap.add_argument(name, type=typ, default=default)
args, _ = ap.parse_known_args()
torch.set_num_threads(args.threads)
torch.manual_seed(0)
dev = torch.device(args.device)
amp = None if args.amp == "none" else torch.bfloat16
cfg = {"hidden_size": args.dim, "intermediate_size": args.ffn, "num_hidden_layers": args.layers,
       "num_attention_heads": args.heads, "num_key_value_heads": args.kv_heads, "vocab_size": 2048,
       "max_position_embeddings": args.seq_len, "rms_norm_eps": 1e-5, "rope_theta": 10000.0}
model = train.TinyLlama(cfg).to(dev)
has_sdpa = hasattr(F, "scaled_dot_product_attention")
sdpa = args.attn == "sdpa" or (args.attn == "auto" and has_sdpa and dev.type == "cuda")
print("smoke: torch %s, %s, params %d, attention %s" % (
    torch.__version__, torch.cuda.get_device_name(0) if dev.type == "cuda" else "cpu",
    sum(p.numel() for p in model.parameters()), "sdpa" if sdpa else "manual"), flush=True)

if has_sdpa:  # the fused path against the explicit one, float32, then under autocast
    x = torch.randint(0, 2048, (2, args.seq_len), device=dev)
    with torch.no_grad():
        ref = model(x)
        for layer in model.model.layers:
            layer.self_attn.sdpa = True
        got = model(x)
        with torch.autocast(dev.type, dtype=amp, enabled=amp is not None):
            got16 = model(x).float()
    print("smoke: sdpa vs manual logits max |diff| float32 %.2e, autocast %.2e (logits' scale %.2f)" % (
        (got - ref).abs().max().item(), (got16 - ref).abs().max().item(), ref.abs().max().item()), flush=True)
else:
    print("smoke: this torch has no scaled_dot_product_attention (the run uses the explicit softmax)")
for layer in model.model.layers:
    layer.self_attn.sdpa = sdpa

opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95))
times = []
for i in range(args.smoke_steps):
    t = time.time()
    ids = torch.randint(0, 2048, (args.batch, args.seq_len), device=dev)
    with torch.autocast(dev.type, dtype=amp, enabled=amp is not None):
        logits = model(ids)
    loss = F.cross_entropy(logits.float().view(-1, 2048), ids.view(-1))
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    loss.item()
    if dev.type == "cuda":
        torch.cuda.synchronize()
    times.append(time.time() - t)
per = sum(times[3:]) / max(1, len(times) - 3)
tok = args.batch * args.seq_len
print("smoke: %.3f s/step after warm-up (first steps %s), %.0f tokens/s; in %.0f s: ~%d steps, %.0fM tokens%s" % (
    per, " ".join("%.2f" % t for t in times[:3]), tok / per, args.max_seconds, args.max_seconds * 0.9 / per,
    args.max_seconds * 0.9 / per * tok / 1e6,
    ", peak GPU memory %.1f GiB" % (torch.cuda.max_memory_allocated() / 2 ** 30) if dev.type == "cuda" else ""),
    flush=True)
