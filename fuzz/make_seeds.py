#!/usr/bin/env python3
"""Write the committed seed corpora of the fuzz targets (fuzz/seeds/TARGET/*) from real files.

Usage: python3 fuzz/make_seeds.py [MODELS_DIR] [SHARED_DIR] [VINDEX_DIR]
  MODELS_DIR  the real GGUFs (default ~/.cache/infer/models: SmolLM2 Q4_1, Gemma-3 Q4_K_M)
  SHARED_DIR  ../shared (archrefs: HF configs and safetensors of the tiny reference models)
  VINDEX_DIR  a vindex whose small files seed `vindex_open` (optional; e.g. one built by
              `infer extract ../shared/archrefs/llama -o /tmp/llama.vindex`)

Seeds stay small (a few KB to ~100 KB) so the fuzzer's executions stay fast: the GGUF seeds
keep the real files' metadata keys, tokenizer type, pre-tokenizer, chat template and a real
vocabulary cut to its first tokens (with the merges among them), on a one-layer model of
real tensor types; the safetensors seeds keep a real header's names and dtypes on tiny
shapes. Deterministic: re-running writes identical files.
"""

import json
import os
import random
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
SEEDS = os.path.join(HERE, "seeds")


def out(target, name, data):
    d = os.path.join(SEEDS, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


# --- GGUF reading (enough to copy metadata) ------------------------------------------------

SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<B",
          10: "<Q", 11: "<q", 12: "<d"}


class Reader:
    def __init__(self, data):
        self.d, self.p = data, 0

    def take(self, fmt):
        v = struct.unpack_from(fmt, self.d, self.p)
        self.p += struct.calcsize(fmt)
        return v[0]

    def string(self):
        n = self.take("<Q")
        s = self.d[self.p:self.p + n]
        self.p += n
        return s.decode("utf-8")

    def value(self, t):
        if t == 8:
            return (8, self.string())
        if t == 9:
            et, n = self.take("<I"), self.take("<Q")
            return (9, (et, [self.value(et)[1] for _ in range(n)]))
        return (t, self.take(SCALAR[t]))


def read_metadata(path):
    with open(path, "rb") as f:
        data = f.read(32 << 20)
    r = Reader(data)
    assert r.d[:4] == b"GGUF"
    r.p = 8
    n_tensors, n_kv = r.take("<Q"), r.take("<Q")
    meta = []
    for _ in range(n_kv):
        k = r.string()
        meta.append((k, r.value(r.take("<I"))))
    return meta


# --- GGUF writing --------------------------------------------------------------------------

def enc_str(s):
    b = s.encode("utf-8")
    return struct.pack("<Q", len(b)) + b


def enc_value(t, v):
    if t == 8:
        return enc_str(v)
    if t == 9:
        et, items = v
        return struct.pack("<IQ", et, len(items)) + b"".join(enc_value(et, x) for x in items)
    return struct.pack(SCALAR[t], v)


# ggml type id → (block elements, block bytes)
GGML = {0: (1, 4), 1: (1, 2), 2: (32, 18), 3: (32, 20), 6: (32, 22), 7: (32, 24),
        8: (32, 34), 12: (256, 144), 14: (256, 210), 30: (1, 2)}


def gguf(meta, tensors, rng, align=32):
    """meta: [(key, (type, value))]; tensors: [(name, dims fastest-first, ggml type)]."""
    out_ = bytearray(b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(meta)))
    for k, (t, v) in meta:
        out_ += enc_str(k) + struct.pack("<I", t) + enc_value(t, v)
    offset, blobs = 0, []
    for name, dims, ty in tensors:
        n = 1
        for d in dims:
            n *= d
        be, bb = GGML[ty]
        size = n // be * bb
        out_ += enc_str(name) + struct.pack("<I", len(dims))
        out_ += b"".join(struct.pack("<Q", d) for d in dims)
        out_ += struct.pack("<IQ", ty, offset)
        if ty == 0:
            blob = b"".join(struct.pack("<f", rng.uniform(-1, 1)) for _ in range(n))
        elif ty == 1:
            blob = b"".join(struct.pack("<e", rng.uniform(-1, 1)) for _ in range(n))
        else:
            # Quant blocks: small f16 scales first in every block keep values finite.
            blob = bytearray(rng.getrandbits(8) for _ in range(size))
            for b in range(0, size, bb):
                blob[b:b + 2] = struct.pack("<e", 0.01)
            blob = bytes(blob)
        pad = (-size) % align
        blobs.append(blob + b"\0" * pad)
        offset += size + pad
    out_ += b"\0" * ((-len(out_)) % align)
    return Gguf(bytes(out_), b"".join(blobs))


class Gguf(bytes):
    """A GGUF file's bytes; `.header` is the part before the data section."""

    def __new__(cls, header, data):
        b = super().__new__(cls, header + data)
        b.header = header
        return b


def cut_vocab(meta, n):
    """The first n tokens of a real vocabulary, its merges among them, ids clamped."""
    d = dict(meta)
    tokens = d["tokenizer.ggml.tokens"][1][1][:n]
    keep = set(tokens)
    res = []
    for k, (t, v) in meta:
        if k == "tokenizer.ggml.tokens":
            v = (8, tokens)
        elif k in ("tokenizer.ggml.token_type", "tokenizer.ggml.scores"):
            v = (v[0], v[1][:n])
        elif k == "tokenizer.ggml.merges":
            ms = [m for m in v[1] if all(p in keep for p in m.split(" ", 1))
                  and m.replace(" ", "", 1) in keep]
            v = (8, ms[:2000])
        elif k.startswith("tokenizer.ggml.") and k.endswith("_token_id"):
            v = min(v, n - 1)
        elif k.endswith(".vocab_size"):
            v = n
        res.append((k, (t, v)))
    return res


def tiny_model(meta, arch, hidden=64, ff=256, heads=2, kv_heads=1):
    """Real metadata with the model shrunk to one layer of `hidden` (and the vocab cut)."""
    sizes = {f"{arch}.block_count": 1, f"{arch}.embedding_length": hidden,
             f"{arch}.feed_forward_length": ff, f"{arch}.attention.head_count": heads,
             f"{arch}.attention.head_count_kv": kv_heads, f"{arch}.context_length": 128,
             f"{arch}.rope.dimension_count": hidden // heads,
             f"{arch}.attention.key_length": hidden // heads,
             f"{arch}.attention.value_length": hidden // heads}
    res = []
    for k, (t, v) in meta:
        if k in sizes:
            v = sizes[k]
        res.append((k, (t, v)))
    return res


def tiny_tensors(vocab, hidden, ff, heads, kv_heads, types):
    hd = hidden // heads
    q, kv, mat, down = types
    return [
        ("token_embd.weight", [hidden, vocab], 8),
        ("output_norm.weight", [hidden], 0),
        ("blk.0.attn_norm.weight", [hidden], 0),
        ("blk.0.attn_q.weight", [hidden, heads * hd], q),
        ("blk.0.attn_k.weight", [hidden, kv_heads * hd], kv),
        ("blk.0.attn_v.weight", [hidden, kv_heads * hd], kv),
        ("blk.0.attn_output.weight", [heads * hd, hidden], q),
        ("blk.0.ffn_norm.weight", [hidden], 0),
        ("blk.0.ffn_gate.weight", [hidden, ff], mat),
        ("blk.0.ffn_up.weight", [hidden, ff], mat),
        ("blk.0.ffn_down.weight", [ff, hidden], down),
    ]


def gguf_seeds(models):
    rng = random.Random(21)
    specs = [
        ("SmolLM2-135M-Instruct.Q4_1.gguf", "llama", (3, 3, 7, 14), 300),
        ("gemma-3-270m-q4_k_m.gguf", "gemma3", (2, 6, 8, 12), 400),
    ]
    for file, arch, types, n_vocab in specs:
        path = os.path.join(models, file)
        if not os.path.exists(path):
            print(f"skip {file}: not in {models}", file=sys.stderr)
            continue
        meta = read_metadata(path)
        stem = file.split(".")[0].split("-")[0].lower()
        small = cut_vocab(tiny_model(meta, arch), n_vocab)
        tensors = tiny_tensors(n_vocab, 64, 256, 2, 1, types)
        full = gguf(small, tensors, rng)
        # The header target reads no tensor data: the file cut where the data starts.
        out("gguf_header", f"{stem}-tiny-header.gguf", full.header)
        out("gguf_tensors", f"{stem}-tiny.gguf", full)
        # Metadata only (no tensors): the tokenizer target's other shape.
        out("gguf_tokenizer", f"{stem}-vocab.gguf", gguf(small, [], rng))
        # The real file's own first 64 KiB: a header cut inside the vocabulary.
        with open(path, "rb") as f:
            out("gguf_header", f"{stem}-real-prefix.gguf", f.read(64 << 10))
        tmpl = dict(meta).get("tokenizer.chat_template")
        if tmpl:
            out("chat_template", f"{stem}.jinja", b"Hello {{ there }}!\n" + tmpl[1].encode())
    # Every scalar and array type, nested arrays, alignment 64.
    meta = [("general.architecture", (8, "llama")), ("general.alignment", (4, 64)),
            ("u8", (0, 7)), ("i8", (1, -7)), ("u16", (2, 700)), ("i16", (3, -700)),
            ("i32", (5, -70000)), ("f32", (6, 0.5)), ("bool", (7, 1)), ("u64", (10, 1 << 40)),
            ("i64", (11, -(1 << 40))), ("f64", (12, 0.25)),
            ("nested", (9, (9, [(5, [1, 2]), (8, ["a", "bc"])]))),
            ("f32s", (9, (6, [1.0, 2.0, 3.0])))]
    tensors = [("a", [32, 2], 2), ("b", [64], 1), ("c", [256], 12), ("d", [8], 30)]
    out("gguf_header", "all-types.gguf", gguf(meta, tensors, rng, align=64))
    out("gguf_tensors", "all-types.gguf", gguf(meta, tensors, rng, align=64))


# --- safetensors ---------------------------------------------------------------------------

def safetensors(entries, metadata=None):
    """entries: [(name, dtype, shape)] → bytes with deterministic data."""
    sizes = {"F32": 4, "F16": 2, "BF16": 2, "I64": 8, "U8": 1}
    header, data = {}, bytearray()
    if metadata:
        header["__metadata__"] = metadata
    for name, dtype, shape in entries:
        n = 1
        for s in shape:
            n *= s
        b = bytes((i * 37 + 11) % 251 for i in range(n * sizes[dtype]))
        header[name] = {"dtype": dtype, "shape": shape,
                        "data_offsets": [len(data), len(data) + len(b)]}
        data += b
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((-len(h)) % 8)
    return struct.pack("<Q", len(h)) + h + bytes(data)


def safetensors_seeds(shared):
    out("safetensors_header", "mixed.safetensors", safetensors(
        [("a", "F32", [2, 3]), ("b", "F16", [4]), ("c", "BF16", [2, 2]), ("e", "F32", [])],
        {"format": "pt"}))
    for arch in ("llama", "gemma3", "qwen2-moe"):
        path = os.path.join(shared, "archrefs", arch, "model.safetensors")
        if not os.path.exists(path):
            continue
        with open(path, "rb") as f:
            n = struct.unpack("<Q", f.read(8))[0]
            header = json.loads(f.read(n))
        meta = header.pop("__metadata__", None)
        # The real names and dtypes on tiny shapes (first 24 tensors).
        entries = [(k, v["dtype"], [min(s, 4) for s in v["shape"]])
                   for k, v in list(header.items())[:24]]
        out("safetensors_header", f"{arch}-tiny.safetensors", safetensors(entries, meta))


# --- configs, templates, vindex ------------------------------------------------------------

def config_seeds(shared):
    for root in ("archrefs", "archrefs-next", "configs"):
        base = os.path.join(shared, root)
        if not os.path.isdir(base):
            continue
        for name in sorted(os.listdir(base)):
            p = os.path.join(base, name, "config.json")
            if os.path.isfile(p):
                with open(p, "rb") as f:
                    out("hf_config", f"{root}-{name}.json", f.read())


CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
          "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}"
          "{{ '<|im_start|>assistant\\n' }}{% endif %}")
LOOPY = ("{% set ns = namespace(n=0) %}{% for m in messages %}{% for c in m.content %}"
         "{% set ns.n = ns.n + 1 %}{{ c | upper }}{% endfor %}{% endfor %}{{ ns.n }}"
         "{{ messages | length }}{{ raise_exception('x') if messages | length > 9 }}")


def template_seeds():
    out("chat_template", "chatml.jinja", b"hi <|im_end|>\n" + CHATML.encode())
    out("chat_template", "loops.jinja", b"a\xc3\xa9\n" + LOOPY.encode())


def pack_files(files):
    b = bytearray()
    for name, content in files:
        nb = name.encode()
        b += bytes([len(nb)]) + nb + struct.pack("<I", len(content)) + content
    return bytes(b)


def vindex_seeds(vindex):
    if not vindex or not os.path.isdir(vindex):
        print("skip vindex_open seeds: no VINDEX_DIR", file=sys.stderr)
        return
    files = []
    for name in sorted(os.listdir(vindex)):
        p = os.path.join(vindex, name)
        # Small files only: .bin data is recreated (as zeros) by the target from index.json.
        if name.endswith(".bin") and name != "down_meta.bin":
            continue
        with open(p, "rb") as f:
            content = f.read()
        if name == "tokenizer.json" and len(content) > (64 << 10):
            continue
        files.append((name, content))
    out("vindex_open", os.path.basename(vindex.rstrip("/")) + ".pack", pack_files(files))


def main():
    home = os.path.expanduser("~")
    models = sys.argv[1] if len(sys.argv) > 1 else os.path.join(home, ".cache/infer/models")
    shared = sys.argv[2] if len(sys.argv) > 2 else os.path.join(HERE, "..", "..", "shared")
    vindex = sys.argv[3] if len(sys.argv) > 3 else None
    gguf_seeds(models)
    safetensors_seeds(shared)
    config_seeds(shared)
    template_seeds()
    vindex_seeds(vindex)


if __name__ == "__main__":
    main()
