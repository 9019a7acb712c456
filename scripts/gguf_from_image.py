#!/usr/bin/python3
# Writes a GGUF file for llama.cpp (arch "llama", "smallthinker" for gated-ReLU models, "phi2" for Phi) holding
# exactly the weights of one of our flash images (model.nlw + model.nlw.json), with llama.cpp's own gguf-py (scripts/llamacpp.sh
# exposes it). Used by the end-to-end benchmark (bench/e2e/run.py) so that both engines run the same weights.
#
#   gguf_from_image.py --image model.nlw --out model.gguf [--tokenizer tok.bin] [--gguf-py DIR]
#
# Weights: the dense tensors are copied as stored (f32 / f16 / bf16 / q8_0 / q4_0 rows are the same element and
# block layouts in GGUF); norms are written as f32 (ggml multiplies by f32 norms; widening is exact). The FFN
# bundles are put back in the original neuron order (the manifest's `order`), so the GGUF does not depend on the
# layout. gate and up rows are copied as stored; ffn_down is stored in our bundles as one column per neuron
# (quantized dtypes: blocks along dim), but GGUF stores ffn_down as [dim][hidden] rows quantized along hidden, so
# for q8_0 / q4_0 it is dequantized and requantized with gguf-py's reference quantizer (not byte-identical:
# one more rounding of the down projection); f32 / f16 / bf16 are transposed exactly.
# RoPE: our canonical convention rotates interleaved pairs (2j, 2j+1) of each head (llama2.c, Meta's original
# checkpoints); llama.cpp's LLaMA arch uses LLAMA_ROPE_TYPE_NORM, the same pairs (convert_hf_to_gguf.py permutes
# Hugging Face's rotate_half rows back into it), so q/k rows are written unchanged. Checked by greedy-token
# agreement with nl-run (bench/e2e/run.py --agreement, tests/e2e_smoke.sh).
# Gated-ReLU models (ffn_act relu: the bundled tiny-relu and small-relu, ProSparse-style): llama.cpp's LLaMA arch
# computes SiLU only and llama.cpp has no dense gated-ReLU Llama, so such a model is written as llama.cpp's
# "smallthinker" arch with one expert: a Llama block (RMSNorm, GQA attention, RoPE) whose FFN is a mixture of
# experts computing relu(gate x) * (up x) -> down per expert (src/models/smallthinker.cpp, LLM_FFN_RELU, gated).
# With one expert, always selected, the router's softmax weight is exactly 1 (softmax of one logit, then
# normalised), so the layer is exactly the model's gated-ReLU FFN; the router row is zeros. Its RoPE is
# LLAMA_ROPE_TYPE_NEOX (rotate_half), so q/k rows are permuted per head from interleaved pairs to halves (row
# moves only: exact for every dtype). Checked the same way (greedy tokens against nl-run, tests/e2e_smoke.sh).
# Phi (model.arch phi) is llama.cpp's "phi2" arch (src/models/phi2.cpp: one LayerNorm feeding attention and the GeLU
# FFN in parallel, biases, NEOX RoPE over rope.dimension_count dims, an output matrix with a bias): the same tensors
# with their biases (ffn_up = the bundles' fc1 rows, ffn_down their fc2 columns), q/k rows and biases permuted to
# NEOX halves within each head's rotary part; a tied Phi is refused (phi2 reads its own output matrix).
# Tokenizer: a llama2.c tokenizer.bin (--tokenizer, or the one the manifest names) becomes a "llama" (SPM) vocab
# exactly as llama.cpp's convert-llama2c-to-ggml builds it; a SentencePiece .model (Python's sentencepiece
# module) becomes one as convert_hf_to_gguf.py builds it (pieces, scores, control / unknown / byte / unused
# types); without one (synthetic models) a minimal llama-style vocab of the model's size is written (<unk>, <s>,
# </s>, 256 byte tokens, then "[N]" pieces). The benchmarks drive both engines with token ids.
# Streams: tensor data is written one tensor at a time from a memory map of the image (a 7B image never sits in
# DRAM); the output goes to a temporary file renamed into place. Exit codes: 2 usage, 3 bad input, 4 I/O error.
import argparse
import json
import os
import stat
import struct
import sys

import numpy as np

EXIT_USAGE, EXIT_INPUT, EXIT_IO = 2, 3, 4


def fail(code, msg):
    print("gguf_from_image: " + msg, file=sys.stderr)
    sys.exit(code)


def require_regular(path, what):
    """An input must be a regular file: a FIFO, device or socket would block or read without end (exit 3, as the
    binaries' check_paths); a missing one is exit 4 with the OS's words, as before."""
    try:
        st = os.stat(path)
    except OSError as e:
        fail(EXIT_IO, "%s: %s" % (path, e.strerror))
    if not stat.S_ISREG(st.st_mode):
        kind = ("a FIFO" if stat.S_ISFIFO(st.st_mode) else "a folder" if stat.S_ISDIR(st.st_mode)
                else "a socket" if stat.S_ISSOCK(st.st_mode) else "a device")
        fail(EXIT_INPUT, "%s: is %s, not a regular file (%s)" % (path, kind, what))


def is_sentencepiece(path):
    """The runtime's rule (runtime/tokenizer.cpp is_sentencepiece_file): a SentencePiece model is a protobuf whose
    first byte is 0x0a; a llama2.c tokenizer.bin starts with its max token length. pack copies either kind as
    OUT.tokenizer, so the file name says nothing."""
    try:
        with open(path, "rb") as f:
            head = f.read(4)
    except OSError as e:
        fail(EXIT_IO, "%s: %s" % (path, e.strerror))
    if len(head) < 4:
        fail(EXIT_INPUT, "%s: too small for a tokenizer" % path)
    return head[0] == 0x0a


def find_gguf_py(explicit):
    if explicit:
        return explicit
    env = os.environ.get("NL_LLAMACPP_DIR")
    base = env or os.path.join(os.path.expanduser("~"), ".cache", "nl-llamacpp", "3.22.1")
    return os.path.join(base, "gguf-py")


# Element / block layouts of our image dtypes (docs/formats.md; formats/core/image.h image_row_bytes).
BLOCK = 32
Q_BYTES = {"q8_0": 34, "q4_0": 18}


def row_bytes(dtype, n):
    if dtype in Q_BYTES:
        if n % BLOCK:
            raise ValueError("row of %d elements is not a multiple of %d" % (n, BLOCK))
        return n // BLOCK * Q_BYTES[dtype]
    return n * (4 if dtype == "f32" else 2)


def decode(dtype, raw, n_rows, n_cols):
    """Rows of stored elements (uint8 [n_rows][row_bytes]) -> float32 [n_rows][n_cols]."""
    raw = np.ascontiguousarray(raw).reshape(n_rows, -1)
    if dtype == "f32":
        return raw.view("<f4").reshape(n_rows, n_cols)
    if dtype == "f16":
        return raw.view("<f2").astype(np.float32).reshape(n_rows, n_cols)
    if dtype == "bf16":
        return (raw.view("<u2").astype(np.uint32) << 16).view(np.float32).reshape(n_rows, n_cols)
    blocks = raw.reshape(n_rows, n_cols // BLOCK, Q_BYTES[dtype])
    d = blocks[:, :, :2].copy().view("<f2").astype(np.float32)  # [rows][blocks][1]
    if dtype == "q8_0":
        q = blocks[:, :, 2:].view(np.int8).astype(np.float32)
    else:
        qs = blocks[:, :, 2:]
        q = np.concatenate([(qs & 0x0F), (qs >> 4)], axis=2).astype(np.float32) - 8.0
    return (q * d).reshape(n_rows, n_cols)


def read_llama2c_vocab(path, n_vocab):
    """tokenizer.bin of llama2.c -> (tokens, scores, types) as llama.cpp's convert-llama2c-to-ggml builds them."""
    try:
        data = open(path, "rb").read()
    except OSError as e:
        fail(EXIT_IO, "%s: %s" % (path, e.strerror))
    pos, tokens, scores, types = 4, [], [], []
    for tid in range(n_vocab):
        if pos + 8 > len(data):
            fail(EXIT_INPUT, "%s: truncated at token %d of %d" % (path, tid, n_vocab))
        score, length = struct.unpack_from("<fi", data, pos)
        pos += 8
        if length < 0 or pos + length > len(data):
            fail(EXIT_INPUT, "%s: token %d has a bad length %d" % (path, tid, length))
        text = data[pos:pos + length]
        pos += length
        ttype = 1  # NORMAL (llama.cpp's llama_token_type)
        if tid == 0:
            text, ttype = b"<unk>", 2  # UNKNOWN
        elif tid in (1, 2):
            text, ttype = (b"<s>" if tid == 1 else b"</s>"), 3  # CONTROL
        elif not text:
            ttype = 3
        elif len(text) == 6 and text.startswith(b"<0x") and text.endswith(b">"):
            ttype = 6  # BYTE
        tokens.append(text.replace(b" ", "\u2581".encode()))
        scores.append(score)
        types.append(ttype)
    return tokens, scores, types


def read_spm_vocab(path, n_vocab):
    """SentencePiece .model -> (tokens, scores, types) as convert_hf_to_gguf.py's _create_vocab_sentencepiece."""
    try:
        import sentencepiece
    except ImportError:
        fail(EXIT_USAGE, "%s: reading a SentencePiece .model needs Python's sentencepiece module "
             "(scripts/bootstrap.sh train installs python3-sentencepiece)" % path)
    if not os.path.isfile(path):
        fail(EXIT_IO, "%s: no such file" % path)
    sp = sentencepiece.SentencePieceProcessor()
    try:
        sp.LoadFromFile(path)
    except (OSError, RuntimeError) as e:
        fail(EXIT_INPUT, "%s: not a SentencePiece model: %s" % (path, e))
    if sp.vocab_size() != n_vocab:
        fail(EXIT_INPUT, "%s: %d pieces, the model has a vocabulary of %d" % (path, sp.vocab_size(), n_vocab))
    tokens, scores, types = [], [], []
    for i in range(n_vocab):
        ttype = 1  # NORMAL
        if sp.IsUnknown(i):
            ttype = 2
        elif sp.IsControl(i):
            ttype = 3
        elif sp.IsUnused(i):
            ttype = 5
        elif sp.IsByte(i):
            ttype = 6
        tokens.append(sp.IdToPiece(i).encode("utf-8"))
        scores.append(sp.GetScore(i))
        types.append(ttype)
    return tokens, scores, types


def neox_rows(rows, n_heads, rot=0):
    """q or k rows [n_heads * head_dim][...] from interleaved pairs (2j, 2j+1) to rotate_half halves (j, j + rot/2)
    per head: the inverse of convert_hf_to_gguf.py's permute. Partial rotary (Phi): only each head's first `rot`
    rows (0: the whole head) move; the rest stay."""
    rows = np.asarray(rows)
    hd = rows.shape[0] // n_heads
    rot = rot or hd
    h = rows.reshape(n_heads, hd, -1).copy()
    h[:, :rot] = h[:, :rot].reshape(n_heads, rot // 2, 2, -1).swapaxes(1, 2).reshape(n_heads, rot, -1)
    return np.ascontiguousarray(h.reshape(rows.shape))


def synthetic_vocab(n_vocab):
    """A minimal llama-style (SPM) vocab: <unk> <s> </s>, byte fallback tokens, then unique pieces."""
    tokens, types = [b"<unk>", b"<s>", b"</s>"], [2, 3, 3]
    for b in range(256):
        if len(tokens) >= n_vocab:
            break
        tokens.append(("<0x%02X>" % b).encode())
        types.append(6)
    while len(tokens) < n_vocab:
        tokens.append(("[%d]" % len(tokens)).encode())
        types.append(1)
    tokens, types = tokens[:n_vocab], types[:n_vocab]
    return tokens, [0.0] * n_vocab, types


def main():
    ap = argparse.ArgumentParser(description="Write a llama.cpp GGUF holding exactly a flash image's weights.")
    ap.add_argument("--image", required=True, help="model.nlw (its manifest is model.nlw.json)")
    ap.add_argument("--out", required=True, help="output .gguf")
    ap.add_argument("--tokenizer", help="llama2.c tokenizer.bin (default: the manifest's; none: synthetic vocab)")
    ap.add_argument("--gguf-py", help="llama.cpp's gguf-py folder (default: scripts/llamacpp.sh's cache)")
    ap.add_argument("--arch", choices=("auto", "llama"), default="auto",
                    help="auto: llama for SiLU models, smallthinker (one expert) for gated-ReLU ones; llama: a "
                         "gated-ReLU model's weights as a SiLU Llama (a timing twin: the same tensors and work in "
                         "llama.cpp's dense path, not the model's function; measures the one-expert route's cost)")
    args = ap.parse_args()
    # Inputs are checked before anything else: a FIFO must be refused, not waited on, wherever gguf-py is.
    require_regular(args.image + ".json", "the image's manifest")

    gdir = find_gguf_py(args.gguf_py)
    if not os.path.isfile(os.path.join(gdir, "gguf", "__init__.py")):
        fail(EXIT_USAGE, "llama.cpp's gguf-py not found in %s (run scripts/llamacpp.sh)" % gdir)
    sys.path.insert(0, gdir)
    import gguf  # noqa: E402  (llama.cpp's own writer)

    image = args.image
    mpath = image + ".json"
    if os.path.realpath(args.out) in (os.path.realpath(image), os.path.realpath(mpath)):
        fail(EXIT_USAGE, "--out %s would overwrite an input" % args.out)
    require_regular(mpath, "the image's manifest")
    try:
        man = json.load(open(mpath))
    except OSError as e:
        fail(EXIT_IO, "%s: %s" % (mpath, e.strerror))
    except ValueError as e:
        fail(EXIT_INPUT, "%s: not JSON: %s" % (mpath, e))
    if man.get("format") != "neuralink-image" or man.get("version") != 1:
        fail(EXIT_INPUT, "%s: not a neuralink-image version 1 manifest" % mpath)
    try:
        cfg, dtype, bundle = man["model"], man["dtype"], man["bundle"]
        dim, hidden, n_layers = cfg["dim"], cfg["hidden_dim"], cfg["n_layers"]
        n_heads, n_kv, vocab = cfg["n_heads"], cfg["n_kv_heads"], cfg["vocab_size"]
        regions, tensors, order = man["regions"], {t["name"]: t for t in man["dense_tensors"]}, man["order"]
    except KeyError as e:
        fail(EXIT_INPUT, "%s: missing key %s" % (mpath, e))
    if dtype not in ("f32", "f16", "bf16", "q8_0", "q4_0"):
        fail(EXIT_INPUT, "%s: dtype %r is not supported" % (mpath, dtype))
    if cfg.get("sliding_window"):  # Mistral: llama.cpp's llama arch (its Mistral-7B conversion too) has no window
        print("gguf_from_image: warning: %s: model.sliding_window %d is not written (llama.cpp's llama architecture "
              "attends over every position): contexts longer than the window compute otherwise than nl-run"
              % (mpath, cfg["sliding_window"]), file=sys.stderr)
    phi = cfg.get("arch", "llama") == "phi"  # llama.cpp's phi2 arch (src/models/phi2.cpp)
    if cfg.get("arch", "llama") not in ("llama", "phi"):  # OPT: learned positions, LayerNorm, biases, a plain FFN
        fail(EXIT_INPUT, "%s: model.arch %s: llama.cpp has no %s architecture (Llama blocks and phi2 only)"
             % (mpath, cfg["arch"], cfg["arch"]))
    act = cfg.get("ffn_act", "silu")
    if phi and (cfg.get("shared_classifier", False) or bundle["kind"] != "plain"):
        fail(EXIT_INPUT, "%s: llama.cpp's phi2 needs its own output matrix (an untied classifier) and plain bundles"
             % mpath)
    if not phi and act not in ("silu", "relu"):
        fail(EXIT_INPUT, "%s: ffn_act %s: llama.cpp runs gated SiLU (arch llama) or gated ReLU (arch smallthinker, "
             "one expert) Llama blocks only" % (mpath, act))
    if bundle["kind"] != "gated" and not phi:
        fail(EXIT_INPUT, "%s: bundle kind %s: llama.cpp's Llama blocks need a gated FFN" % (mpath, bundle["kind"]))
    arch = "phi2" if phi else "llama" if act == "silu" or args.arch == "llama" else "smallthinker"
    if arch == "llama" and act != "silu":
        print("gguf_from_image: --arch llama: %s is gated ReLU; the GGUF computes SiLU (a timing twin, different "
              "tokens)" % image, file=sys.stderr)
    rb = row_bytes(dtype, dim)
    parts = 2 if phi else 3  # plain bundles: up row, down column
    if bundle["bytes"] != parts * rb:
        fail(EXIT_INPUT, "%s: bundle bytes %d, expected %d x %d" % (mpath, bundle["bytes"], parts, rb))
    rot = cfg.get("rope_dims", 0) or dim // n_heads  # Phi's partial rotary: the first rot dims of each head
    ifile = man["image"].get("file") if isinstance(man.get("image"), dict) else None
    if not isinstance(ifile, str) or not ifile or "/" in ifile or ifile in (".", ".."):
        fail(EXIT_INPUT, "%s: 'image.file' must be a file name in the manifest's folder, not a path" % mpath)
    ipath = os.path.join(os.path.dirname(mpath), ifile)
    require_regular(ipath, "--image")
    try:
        img = np.memmap(ipath, dtype=np.uint8, mode="r")
    except OSError as e:
        fail(EXIT_IO, "%s: %s" % (ipath, e.strerror))
    if img.size != man["image"]["bytes"]:
        fail(EXIT_INPUT, "%s: %d bytes, the manifest says %d" % (ipath, img.size, man["image"]["bytes"]))
    dense_off = regions[0]["offset"]

    tok_path = args.tokenizer
    if tok_path is None and man.get("tokenizer"):
        tok_path = os.path.join(os.path.dirname(mpath), man["tokenizer"])
    if not tok_path:
        tokens, scores, types = synthetic_vocab(vocab)
    else:
        require_regular(tok_path, "the tokenizer")
        reader = read_spm_vocab if is_sentencepiece(tok_path) else read_llama2c_vocab
        tokens, scores, types = reader(tok_path, vocab)

    qtype = {"f32": gguf.GGMLQuantizationType.F32, "f16": gguf.GGMLQuantizationType.F16,
             "bf16": gguf.GGMLQuantizationType.BF16, "q8_0": gguf.GGMLQuantizationType.Q8_0,
             "q4_0": gguf.GGMLQuantizationType.Q4_0}[dtype]

    def dense_raw(name):
        t = tensors.get(name)
        if t is None:
            fail(EXIT_INPUT, "%s: dense tensor %s missing" % (mpath, name))
        rows, cols = t["shape"]
        tdtype = t.get("dtype", dtype)  # a per-tensor dtype, if a manifest records one
        n = rows * row_bytes(tdtype, cols)
        start = dense_off + t["offset"]
        return img[start:start + n], rows, cols, tdtype

    # (name, ggml type, numpy shape [rows][cols] of elements, producer of the bytes) in file order.
    plan = []

    def add_dense(gname, name, norm=False, heads=0):
        mapped, rows, cols, tdtype = dense_raw(name)

        def raw():  # the stored bytes, read when the tensor is written (streaming)
            if heads and rows == 1:  # a q / k bias: its elements permuted as the rows, stored as before (exact)
                v = neox_rows(decode(tdtype, mapped, 1, cols).reshape(cols, 1), heads, rot).reshape(1, cols)
                return {"f32": lambda: v.view(np.uint8),
                        "f16": lambda: v.astype("<f2").view(np.uint8),
                        "bf16": lambda: (v.view(np.uint32) >> 16).astype("<u2").view(np.uint8)}[tdtype]()
            if heads:  # NEOX RoPE (smallthinker, phi2): q / k rows permuted (whole stored rows: exact for any dtype)
                return neox_rows(np.asarray(mapped).reshape(rows, -1), heads, rot).reshape(-1)
            return mapped

        if norm or tdtype == "f32":
            plan.append((gname, gguf.GGMLQuantizationType.F32, (cols,) if norm else (rows, cols),
                         lambda: decode(tdtype, raw(), rows, cols).reshape(-1) if norm else decode(tdtype, raw(), rows,
                                                                                                    cols)))
        else:
            t = {"f16": gguf.GGMLQuantizationType.F16, "bf16": gguf.GGMLQuantizationType.BF16,
                 "q8_0": gguf.GGMLQuantizationType.Q8_0, "q4_0": gguf.GGMLQuantizationType.Q4_0}[tdtype]
            plan.append((gname, t, (rows, cols), lambda: np.asarray(raw())))

    def ffn(layer, part):
        """gate (0) / up (1) rows [hidden][dim] in original neuron order, as stored bytes; down (2) [dim][hidden]."""
        reg = regions[1 + layer]
        if reg["bytes"] != hidden * bundle["bytes"]:
            fail(EXIT_INPUT, "%s: region %s has %d bytes, expected %d" % (mpath, reg["name"], reg["bytes"],
                                                                          hidden * bundle["bytes"]))
        b = img[reg["offset"]:reg["offset"] + reg["bytes"]].reshape(hidden, bundle["bytes"])
        inv = np.empty(hidden, dtype=np.int64)
        inv[np.asarray(order[layer], dtype=np.int64)] = np.arange(hidden)  # neuron -> slot
        rows = b[inv, part * rb:(part + 1) * rb]  # [hidden][row bytes], neuron order
        if part < parts - 1:
            return np.ascontiguousarray(rows)
        down = decode(dtype, rows, hidden, dim).T  # [dim][hidden]
        if dtype in ("f32",):
            return np.ascontiguousarray(down)
        if dtype == "f16":
            return np.ascontiguousarray(down).astype(np.float16).view(np.uint8)  # exact: values were f16
        if dtype == "bf16":
            return (np.ascontiguousarray(down).view(np.uint32) >> 16).astype(np.uint16).view(np.uint8)
        return gguf.quants.quantize(np.ascontiguousarray(down), qtype)  # requantized along hidden

    add_dense("token_embd.weight", "tok_embeddings")
    neox = arch == "smallthinker"
    for l in range(n_layers if phi else 0):  # phi2: one LayerNorm, biases everywhere, a plain GeLU FFN
        p = "layers.%d." % l
        add_dense("blk.%d.attn_norm.weight" % l, p + "rms_att", norm=True)
        add_dense("blk.%d.attn_norm.bias" % l, p + "att_norm_b", norm=True)
        for q, heads in (("q", n_heads), ("k", n_kv)):
            add_dense("blk.%d.attn_%s.weight" % (l, q), p + "w" + q, heads=heads)
            add_dense("blk.%d.attn_%s.bias" % (l, q), p + "b" + q, norm=True, heads=heads)
        add_dense("blk.%d.attn_v.weight" % l, p + "wv")
        add_dense("blk.%d.attn_v.bias" % l, p + "bv", norm=True)
        add_dense("blk.%d.attn_output.weight" % l, p + "wo")
        add_dense("blk.%d.attn_output.bias" % l, p + "bo", norm=True)
        plan.append(("blk.%d.ffn_up.weight" % l, qtype, (hidden, dim), lambda l=l: ffn(l, 0)))
        add_dense("blk.%d.ffn_up.bias" % l, p + "b_up", norm=True)
        plan.append(("blk.%d.ffn_down.weight" % l, qtype, (dim, hidden), lambda l=l: ffn(l, 1)))
        add_dense("blk.%d.ffn_down.bias" % l, p + "b_down", norm=True)
    for l in range(0 if phi else n_layers):
        p = "layers.%d." % l
        add_dense("blk.%d.attn_norm.weight" % l, p + "rms_att", norm=True)
        add_dense("blk.%d.attn_q.weight" % l, p + "wq", heads=n_heads if neox else 0)
        add_dense("blk.%d.attn_k.weight" % l, p + "wk", heads=n_kv if neox else 0)
        add_dense("blk.%d.attn_v.weight" % l, p + "wv")
        add_dense("blk.%d.attn_output.weight" % l, p + "wo")
        add_dense("blk.%d.ffn_norm.weight" % l, p + "rms_ffn", norm=True)
        if neox:  # one expert: a router row of zeros (its softmax weight is 1), then the expert's tensors
            plan.append(("blk.%d.ffn_gate_inp.weight" % l, gguf.GGMLQuantizationType.F32, (1, dim),
                         lambda: np.zeros((1, dim), dtype=np.float32)))
        for part, gname, shape in ((0, "ffn_gate", (hidden, dim)), (1, "ffn_up", (hidden, dim)),
                                   (2, "ffn_down", (dim, hidden))):
            if neox:
                gname, shape = gname + "_exps", (1,) + shape
            plan.append(("blk.%d.%s.weight" % (l, gname), qtype, shape, lambda l=l, part=part: ffn(l, part)))
    add_dense("output_norm.weight", "rms_final", norm=True)
    if phi:
        add_dense("output_norm.bias", "final_norm_b", norm=True)
    if not cfg.get("shared_classifier", True):
        add_dense("output.weight", "wcls")
    if phi:
        add_dense("output.bias", "cls_b", norm=True)

    tmp = args.out + ".tmp%d" % os.getpid()
    try:
        w = gguf.GGUFWriter(tmp, arch)
        w.add_name(os.path.basename(image))
        w.add_context_length(int(cfg["seq_len"]))
        w.add_embedding_length(dim)
        w.add_block_count(n_layers)
        w.add_feed_forward_length(hidden)
        if arch == "smallthinker":
            w.add_expert_count(1)
            w.add_expert_used_count(1)
            w.add_expert_feed_forward_length(hidden)
            w.add_expert_gating_func(gguf.ExpertGatingFuncType.SOFTMAX)
        w.add_head_count(n_heads)
        w.add_head_count_kv(n_kv)
        w.add_rope_dimension_count(rot)
        w.add_rope_freq_base(float(cfg.get("rope_theta", 10000.0)))
        if phi:
            w.add_layer_norm_eps(float(cfg.get("norm_eps", 1e-5)))
        else:
            w.add_layer_norm_rms_eps(float(cfg.get("norm_eps", 1e-5)))
        w.add_vocab_size(vocab)
        w.add_file_type({"f32": 0, "f16": 1, "q8_0": 7, "q4_0": 2, "bf16": 32}[dtype])
        w.add_tokenizer_model("llama")
        w.add_token_list(tokens)
        w.add_token_scores(scores)
        w.add_token_types(types)
        w.add_bos_token_id(1)
        w.add_eos_token_id(2)
        w.add_unk_token_id(0)
        w.add_add_bos_token(True)
        for name, t, shape, _ in plan:
            bs, ts = gguf.GGML_QUANT_SIZES[t]
            nbytes = shape[-1] // bs * ts * int(np.prod(shape[:-1], dtype=np.int64))
            w.add_tensor_info(name, shape, np.float32 if t == gguf.GGMLQuantizationType.F32 else np.float16,
                              nbytes, raw_dtype=t)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_ti_data_to_file()
        for name, t, shape, produce in plan:
            data = produce()
            if t == gguf.GGMLQuantizationType.F32 and data.dtype != np.uint8:  # stored bytes are written as is
                data = np.ascontiguousarray(data, dtype=np.float32)
            w.write_tensor_data(np.ascontiguousarray(data))
        w.close()
        os.replace(tmp, args.out)
    except OSError as e:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        fail(EXIT_IO, "%s: %s" % (args.out, e.strerror or e))
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    print(args.out)


if __name__ == "__main__":
    try:
        main()
        sys.stdout.flush()
    except OSError as e:  # standard output (the only file main() does not guard itself): exit 4, as the binaries
        try:
            sys.stdout = open(os.devnull, "w")  # nothing left to flush at exit
        except OSError:
            pass
        fail(EXIT_IO, "standard output: %s" % (e.strerror or e))
