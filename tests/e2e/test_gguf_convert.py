"""bench/llamacpp/convert.py, the GGUF converter of the llama.cpp harness,
without llama.cpp: tiny llama and qwen3 checkpoints (f32 and bf16, the real
Llama 3 and Qwen3 tokenizers) are converted to F32, BF16, Q8_0 and Q4_0, and the
files are read back — the fixed header bytes by hand, the rest with the
harness's own GGUF reader — and compared with the checkpoint read here from
the safetensors bytes: every key llama.cpp needs, every tensor's name,
shape, type and values (F32 and BF16 exact, Q8_0 within half a step of its
block, Q4_0 within half a step, a step where the top nibble was clamped;
Q4_0's embedding as stored and its output.weight written for a tied model
too, as tensorpar --dtype q4_0 holds them), the llama q/k row order, the vocabulary, and the encodings against
values worked out by hand."""

import json
import os
import struct
import subprocess
import sys
import tempfile

import numpy as np

from tpe2e import ROOT, TOKENIZERS, Checks, run

sys.path.insert(0, os.path.join(ROOT, "bench", "llamacpp"))
import gguf  # noqa: E402

CONVERT = os.path.join(ROOT, "bench", "llamacpp", "convert.py")
DTYPES = {"f32": gguf.F32, "bf16": gguf.BF16, "q8_0": gguf.Q8_0, "q4_0": gguf.Q4_0}
ck = Checks()


def safetensors(path):
    """{name: f32 array} of a model.safetensors, read here (not by the converter)."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        blob = f.read()
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        a, b = e["data_offsets"]
        raw = blob[a:b]
        if e["dtype"] == "F32":
            v = np.frombuffer(raw, dtype=np.float32)
        else:
            assert e["dtype"] == "BF16", e["dtype"]
            v = (np.frombuffer(raw, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)
        out[name] = v.reshape(e["shape"])
    return out


def convert(model, out, dtype):
    p = subprocess.run([sys.executable, CONVERT, model, out, "--dtype", dtype], capture_output=True, text=True)
    if p.returncode:
        raise AssertionError(f"convert {model} --dtype {dtype} exited {p.returncode}:\n{p.stderr}")


def check_header_by_hand(path, n_tensors):
    with open(path, "rb") as f:
        head = f.read(24)
    ck(head[:4] == b"GGUF", f"{path}: magic {head[:4]!r}")
    version, nt, nkv = struct.unpack("<IQQ", head[4:])
    ck(version == 3, f"{path}: version {version}")
    ck(nt == n_tensors, f"{path}: {nt} tensors, expected {n_tensors}")
    ck(nkv > 20, f"{path}: only {nkv} key-values")


def hf_rows(g, a, arch, cfg):
    """The GGUF tensor a in Hugging Face's row order: llama's q/k rows are
    stored with each head's rotary pairs adjacent (row 2j + h of a head is
    Hugging Face row h * d/2 + j)."""
    if arch != "llama" or not g.endswith(("attn_q.weight", "attn_k.weight")):
        return a
    heads = cfg["num_attention_heads"] if g.endswith("attn_q.weight") else cfg["num_key_value_heads"]
    d = a.shape[0] // heads
    return a.reshape(heads, d // 2, 2, -1).swapaxes(1, 2).reshape(a.shape)


NAMES = {"attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
         "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj", "ffn_norm": "post_attention_layernorm",
         "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
         "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm"}


def hf_name(g, tied=False):
    if g == "token_embd.weight" or (g == "output.weight" and tied):
        return "model.embed_tokens.weight"
    if g == "output_norm.weight":
        return "model.norm.weight"
    if g == "output.weight":
        return "lm_head.weight"
    _, i, part, _ = g.split(".")
    return f"model.layers.{i}.{NAMES[part]}.weight"


def check_tensors(r, w, arch, cfg, dtype, tag, stored):
    want = {gguf.F32: "f32", gguf.BF16: "bf16", gguf.Q8_0: "q8_0", gguf.Q4_0: "q4_0"}
    tied = bool(cfg.get("tie_word_embeddings"))
    expect = set(w) - ({"lm_head.weight"} if tied else set())
    seen = set()
    if dtype == "q4_0":
        ck("output.weight" in r.tensors, f"{tag}: no output.weight")
    for g, (gtype, dims, off) in r.tensors.items():
        ck(off % 32 == 0, f"{tag} {g}: offset {off} not aligned to 32")
        hf = hf_name(g, tied)
        seen.add(hf)
        src = w[hf]
        ck(tuple(reversed(dims)) == src.shape, f"{tag} {g}: dims {dims} for shape {src.shape}")
        exp_type = gguf.F32 if src.ndim == 1 else DTYPES[dtype]
        if dtype == "q4_0" and g == "token_embd.weight":
            exp_type = gguf.BF16 if stored == "bf16" else gguf.F32
        ck(gtype == exp_type, f"{tag} {g}: type {gguf.TYPE_NAMES.get(gtype)}, expected {want[exp_type]}")
        got = hf_rows(g, r.array(g), arch, cfg)
        if gtype == gguf.Q4_0:
            # half a step of its block (d = max|x| / 8) from the value, a whole
            # one where the nibble was clamped at 15 (x / d in [7.5, 8]), plus
            # what storing d as f16 moves the extreme nibble (8 d 2^-11)
            blocks = src.reshape(-1, 32)
            step = np.abs(blocks).max(axis=1, keepdims=True) / 8
            err = np.abs(got.reshape(-1, 32) - blocks)
            ck(bool((err <= step * (1 + 8 * 2.0 ** -11) + 1e-12).all()),
               f"{tag} {g}: Q4_0 error {float((err / np.maximum(step, 1e-30)).max()):.3f} steps")
            ck(float((err <= step * (0.5 + 8 * 2.0 ** -11) + 1e-12).mean()) > 0.95,
               f"{tag} {g}: Q4_0 over half a step too often")
        elif gtype == gguf.Q8_0:
            # each value within half a step of its block (the step d = max|x| / 127),
            # plus what storing d as f16 moves the largest q (127 d 2^-11)
            blocks = src.reshape(-1, 32)
            step = np.abs(blocks).max(axis=1, keepdims=True) / 127
            err = np.abs(got.reshape(-1, 32) - blocks)
            ck(bool((err <= step * (0.5 + 127 * 2.0 ** -11) + 1e-12).all()),
               f"{tag} {g}: Q8_0 error {float((err / np.maximum(step, 1e-30)).max()):.3f} steps")
        elif gtype == gguf.BF16:
            # the checkpoint's values rounded to bf16 (exact when stored as bf16)
            exp = gguf.bf16_to_f32(gguf.bf16_bits(src)).reshape(src.shape)
            ck(np.array_equal(got, exp), f"{tag} {g}: BF16 values differ")
        else:
            ck(np.array_equal(got, src), f"{tag} {g}: F32 values differ")
    ck(seen == expect, f"{tag}: tensors {sorted(expect - seen)} missing, {sorted(seen - expect)} extra")


def check_kv(r, cfg, model, dtype, tag):
    arch = cfg["model_type"]
    kv = r.kv
    ck(kv.get("general.architecture") == arch, f"{tag}: architecture {kv.get('general.architecture')}")
    ck(kv.get("general.file_type") == {"f32": 0, "bf16": 32, "q8_0": 7, "q4_0": 2}[dtype], f"{tag}: file_type {kv.get('general.file_type')}")
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    exp = {"block_count": cfg["num_hidden_layers"], "context_length": cfg["max_position_embeddings"],
           "embedding_length": cfg["hidden_size"], "feed_forward_length": cfg["intermediate_size"],
           "attention.head_count": cfg["num_attention_heads"], "attention.head_count_kv": cfg["num_key_value_heads"],
           "attention.key_length": head_dim, "attention.value_length": head_dim, "rope.dimension_count": head_dim,
           "vocab_size": cfg["vocab_size"]}
    for k, v in exp.items():
        ck(kv.get(f"{arch}.{k}") == v and r.kv_types[f"{arch}.{k}"] == gguf.UINT32,
           f"{tag}: {arch}.{k} = {kv.get(f'{arch}.{k}')}, expected {v} (u32)")
    for k, v in (("rope.freq_base", cfg["rope_theta"]), ("attention.layer_norm_rms_epsilon", cfg["rms_norm_eps"])):
        got = kv.get(f"{arch}.{k}")
        ck(got is not None and np.float32(got) == np.float32(v) and r.kv_types[f"{arch}.{k}"] == gguf.FLOAT32,
           f"{tag}: {arch}.{k} = {got}, expected {v} (f32)")
    with open(os.path.join(model, "tokenizer.json"), encoding="utf-8") as f:
        tj = json.load(f)
    toks, types = kv["tokenizer.ggml.tokens"], kv["tokenizer.ggml.token_type"]
    ck(len(toks) == cfg["vocab_size"] and len(types) == cfg["vocab_size"], f"{tag}: {len(toks)} tokens")
    bad = [t for t, i in tj["model"]["vocab"].items() if toks[i] != t or types[i] != 1]
    ck(not bad, f"{tag}: vocabulary entries differ, e.g. {bad[:3]}")
    for a in tj["added_tokens"]:
        # control: special, or named <|...|> as llama.cpp's converter reads such names
        control = a["special"] or (a["content"].startswith("<|") and a["content"].endswith("|>"))
        ck(toks[a["id"]] == a["content"] and types[a["id"]] == (3 if control else 4),
           f"{tag}: added token {a['id']} {toks[a['id']]!r} type {types[a['id']]}")
    n_known = len(tj["model"]["vocab"]) + len(tj["added_tokens"])
    ck(all(types[i] == 5 for i in range(n_known, cfg["vocab_size"])), f"{tag}: padding tokens not UNUSED")
    merges = tj["model"]["merges"]
    ck(kv["tokenizer.ggml.merges"][:3] == [m if isinstance(m, str) else " ".join(m) for m in merges[:3]]
       and len(kv["tokenizer.ggml.merges"]) == len(merges), f"{tag}: merges differ")
    ck(kv["tokenizer.ggml.model"] == "gpt2", f"{tag}: tokenizer model {kv['tokenizer.ggml.model']}")
    ck(kv["tokenizer.ggml.pre"] == {"llama": "llama-bpe", "qwen3": "qwen2"}[arch], f"{tag}: pre {kv['tokenizer.ggml.pre']}")
    # BOS as tensorpar's tokenizer adds it (it follows Hugging Face's rules)
    ids = json.loads(run("tokenize", "--tokenizer", model, "--text", "Hello world", "--special").stdout)
    bos = kv.get("tokenizer.ggml.bos_token_id")
    ck(kv["tokenizer.ggml.add_bos_token"] == (ids[0] == bos), f"{tag}: add_bos_token {kv['tokenizer.ggml.add_bos_token']}, "
                                                               f"tensorpar's ids {ids[:3]}, bos {bos}")
    eos = kv.get("tokenizer.ggml.eos_token_id")
    eos_ids = cfg["eos_token_id"] if isinstance(cfg["eos_token_id"], list) else [cfg["eos_token_id"]]
    ck(eos in eos_ids, f"{tag}: eos {eos}, config's {eos_ids}")


def check_encodings():
    # Q8_0 by hand: one block with max |x| 127 (d = 1): halves go away from zero
    x = np.zeros(32, dtype=np.float32)
    x[:6] = [127, -0.5, 0.5, 2.5, -2.5, 0.49999997]
    q = gguf.quantize_q8_0(x[None, :])[0]
    ck(q[:2].tobytes() == struct.pack("<e", 1.0), f"Q8_0 scale bytes {q[:2].tobytes()!r}")
    ck(q[2:8].view(np.int8).tolist() == [127, -1, 1, 3, -3, 0], f"Q8_0 values {q[2:8].view(np.int8).tolist()}")
    # d = 2 / 127 as f16; q = x * (127 / 2) rounded
    y = np.linspace(-2, 2, 32, dtype=np.float32)
    q = gguf.quantize_q8_0(y[None, :])[0]
    d = np.float32(2) / np.float32(127)
    ck(q[:2].tobytes() == struct.pack("<e", float(d)), "Q8_0 scale of [-2, 2]")
    exp = [int(np.sign(v) * np.floor(abs(float(v * (np.float32(1) / d))) + 0.5)) for v in y]
    ck(q[2:].view(np.int8).tolist() == exp, "Q8_0 values of [-2, 2]")
    ck(gguf.quantize_q8_0(np.zeros((1, 32), np.float32))[0].tobytes() == bytes(34), "Q8_0 of zeros")
    # Q4_0 by hand: x[i] = i - 16, the largest magnitude x[0] = -16 (first of
    # |-16| and 15), d = -16 / -8 = 2, nibble i = floor(x / 2 + 8.5) (16 -> 15);
    # byte j holds nibble j low and nibble j + 16 high
    x = np.arange(32, dtype=np.float32) - 16
    q = gguf.quantize_q4_0(x[None, :])[0]
    ck(q[:2].tobytes() == struct.pack("<e", 2.0), f"Q4_0 scale bytes {q[:2].tobytes()!r}")
    nib = [min(15, (i + 1) // 2) for i in range(32)]
    ck(q[2:].tolist() == [nib[j] | nib[j + 16] << 4 for j in range(16)], f"Q4_0 bytes {q[2:].tolist()}")
    ck(gguf.dequantize_q4_0(q, 32)[0, [0, 1, 16, 31]].tolist() == [-16, -14, 0, 14], "Q4_0 values back")
    # a positive extreme: d negative; zeros: d = -0, nibbles 8
    y = np.zeros(32, dtype=np.float32)
    y[3], y[9] = 4, -4
    q = gguf.quantize_q4_0(y[None, :])[0]
    ck(q[:2].tobytes() == struct.pack("<e", -0.5) and q[5] & 15 == 0 and q[11] & 15 == 15, "Q4_0 of +-4")
    z = gguf.quantize_q4_0(np.zeros((1, 32), np.float32))[0]
    ck(z.tobytes() == struct.pack("<e", -0.0) + bytes([0x88] * 16), f"Q4_0 of zeros {z.tobytes()!r}")
    # bf16: nearest, ties to even; NaN stays NaN
    v = np.array([1 + 2 ** -8, 1 + 3 * 2 ** -8, 1 + 2 ** -7 + 2 ** -9, -1.5, np.nan], dtype=np.float32)
    b = gguf.bf16_bits(v)
    ck(b[:4].tolist() == [0x3F80, 0x3F82, 0x3F81, 0xBFC0], f"bf16 rounding {[hex(i) for i in b[:4]]}")
    ck(bool(np.isnan(gguf.bf16_to_f32(b[4:]))[0]), "bf16 of NaN")


def main():
    check_encodings()
    with tempfile.TemporaryDirectory(prefix="tp-gguf-") as work:
        models = []
        for arch, dt, extra in (("llama", "f32", []), ("qwen3", "bf16", ["--set", "tie_word_embeddings=true"]),
                                ("llama", "bf16", ["--set", "rope_scaling={\"rope_type\": \"llama3\", \"factor\": 8.0, "
                                                   "\"low_freq_factor\": 1.0, \"high_freq_factor\": 4.0, "
                                                   "\"original_max_position_embeddings\": 256}"])):
            tok = os.path.join(TOKENIZERS, "llama3" if arch == "llama" else "qwen3")
            m = os.path.join(work, f"{arch}-{dt}-{len(models)}")
            run("make-model", "--arch", arch, "--preset", "tiny", "--dtype", dt, "--tokenizer", tok, *extra, "--out", m)
            models.append((arch, m))
        for arch, m in models:
            with open(os.path.join(m, "config.json")) as f:
                cfg = json.load(f)
            w = safetensors(os.path.join(m, "model.safetensors"))
            stored = os.path.basename(m).split("-")[1]
            for dtype in ("f32", "bf16", "q8_0", "q4_0"):
                out = os.path.join(work, os.path.basename(m) + f".{dtype}.gguf")
                convert(m, out, dtype)
                tag = f"{os.path.basename(m)} -> {dtype}"
                scaled = bool(cfg.get("rope_scaling"))
                tied = cfg.get("tie_word_embeddings", False)
                n = len(w) - (tied and "lm_head.weight" in w) + scaled + (tied and dtype == "q4_0")
                check_header_by_hand(out, n)
                r = gguf.Reader(out)
                if scaled:
                    f = r.tensors.pop("rope_freqs.weight")
                    # head_dim 16, theta 1e4, 256 original positions: the shortest
                    # wavelength (2 pi) keeps 1, the longest (2 pi 1e4^(14/16)) takes
                    # the factor 8, the ones between blend, rising
                    v = np.frombuffer(r.buf, np.float32, count=8, offset=f[2])
                    ck(f[0] == gguf.F32 and f[1] == (8,) and v[0] == 1 and v[-1] == 8 and
                       bool((np.diff(v) >= 0).all()) and 1 < v[3] < 8, f"{tag}: rope_freqs {f[:2]} {v}")
                check_kv(r, cfg, m, dtype, tag)
                check_tensors(r, w, arch, cfg, dtype, tag, stored)
                r.close()
        # a model type the converter does not know is refused, naming it
        m = os.path.join(work, "mistral")
        run("make-model", "--arch", "mistral", "--preset", "tiny", "--tokenizer", os.path.join(TOKENIZERS, "llama3"),
            "--out", m)
        p = subprocess.run([sys.executable, CONVERT, m, os.path.join(work, "x.gguf")], capture_output=True, text=True)
        ck(p.returncode != 0 and "mistral" in p.stderr, f"mistral: exit {p.returncode}, {p.stderr.strip()}")
    if ck.failures:
        sys.exit(f"{len(ck.failures)} failure(s)")
    print("ok")


if __name__ == "__main__":
    main()
