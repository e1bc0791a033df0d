"""Converts a Hugging Face checkpoint of tensorpar's make-model (config.json,
model.safetensors or its shards, tokenizer.json) to GGUF, for llama.cpp.

    /usr/bin/python3 bench/llamacpp/convert.py MODEL_DIR OUT.gguf --dtype f32|bf16|q8_0|q4_0

Model types: llama and qwen3.  The weights are the checkpoint's: F32 keeps
their f32 values (bf16 widened exactly), BF16 keeps bf16 values (f32 ones
rounded to nearest even), Q8_0 quantizes the f32 values in blocks of 32 as
ggml's reference quantizer does.  As llama.cpp's own converter does, 1-D
tensors (the norms) stay F32, and every 2-D weight, the embedding and the
lm_head included, takes the chosen type.

Q4_0 (ggml's reference quantizer too) holds what `tensorpar --dtype q4_0`
holds, so that the two sides run the same weights: the embedding as stored
(BF16, or F32), every other 2-D weight in Q4_0, and output.weight always
written, from the embedding when the model ties them (tensorpar quantizes
its own copy of a tied lm_head; llama.cpp reads output.weight when present).

llama.cpp applies rotary embeddings to pairs of adjacent values for the
llama architecture, where Hugging Face pairs value i with value i + d/2
within each head; so the rows of q_proj and k_proj are reordered per head
(row h * d/2 + j becomes row 2j + h).  qwen3 keeps Hugging Face's pairing
in llama.cpp ("neox" rope), so its rows stay.

The tokenizer goes in as llama.cpp's "gpt2" (byte-level BPE) vocabulary:
the tokens in id order, padded with unused "[PADn]" entries to the model's
vocab_size, their types (normal, or control/user-defined for added tokens),
the merges, bos/eos and whether a BOS is prepended (as Hugging Face would:
a TemplateProcessing post-processor or add_bos_token)."""
import argparse
import json
import math
import os
import struct
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gguf  # noqa: E402

DTYPES = {"f32": gguf.F32, "bf16": gguf.BF16, "q8_0": gguf.Q8_0, "q4_0": gguf.Q4_0}
# llama.cpp's architecture name of each Hugging Face model type
ARCH = {"llama": "llama", "qwen3": "qwen3"}
ROWS_PER_CHUNK = 8192   # Q8_0, Q4_0 and BF16 are encoded this many rows at a time
QUANTIZE = {gguf.Q8_0: gguf.quantize_q8_0, gguf.Q4_0: gguf.quantize_q4_0}


# ---- the checkpoint ----------------------------------------------------------

class Safetensors:
    """The tensors of model.safetensors or of the shards its index names,
    mapped, read as f32 (or their raw bf16 bits) one tensor at a time."""

    def __init__(self, model_dir):
        index = os.path.join(model_dir, "model.safetensors.index.json")
        if os.path.exists(index):
            with open(index) as f:
                files = sorted(set(json.load(f)["weight_map"].values()))
        else:
            files = ["model.safetensors"]
        self.where = {}
        for fn in files:
            path = os.path.join(model_dir, fn)
            with open(path, "rb") as f:
                (n,) = struct.unpack("<Q", f.read(8))
                header = json.loads(f.read(n))
            for name, e in header.items():
                if name != "__metadata__":
                    self.where[name] = (path, 8 + n, e)

    def names(self):
        return list(self.where)

    def shape(self, name):
        return tuple(self.where[name][2]["shape"])

    def dtype(self, name):
        return self.where[name][2]["dtype"]

    def _raw(self, name, np_dtype):
        path, base, e = self.where[name]
        start, end = e["data_offsets"]
        count = (end - start) // np.dtype(np_dtype).itemsize
        return np.memmap(path, dtype=np_dtype, mode="r", offset=base + start, shape=(count,)).reshape(e["shape"])

    def f32_source(self, name):
        """(the stored array, a function turning a slice of it into f32)."""
        dt = self.dtype(name)
        if dt == "F32":
            return self._raw(name, np.float32), lambda a: np.ascontiguousarray(a, dtype=np.float32)
        if dt == "BF16":
            return self._raw(name, np.uint16), gguf.bf16_to_f32
        if dt == "F16":
            return self._raw(name, np.float16), lambda a: a.astype(np.float32)
        raise ValueError(f"{name}: dtype {dt} is not handled")

    def bf16_source(self, name):
        """(the stored array, a function turning a slice of it into bf16 bits):
        the stored bits when stored as bf16, else rounded to nearest even."""
        if self.dtype(name) == "BF16":
            return self._raw(name, np.uint16), np.ascontiguousarray
        src, to_f32 = self.f32_source(name)
        return src, lambda a: gguf.bf16_bits(to_f32(a))

# ---- tensors ---------------------------------------------------------------

def llama_rope_rows(n_rows, n_head):
    """The source row of each GGUF row of a llama q_proj/k_proj: within each
    head of d rows, GGUF row 2j + h is Hugging Face row h * d/2 + j."""
    d = n_rows // n_head
    src = np.arange(n_rows).reshape(n_head, 2, d // 2).swapaxes(1, 2)
    return src.reshape(n_rows)


def tensor_map(cfg, st, tied_output=False):
    """(GGUF name, checkpoint name, row order or None) for every tensor;
    tied_output: output.weight from the embedding when the model ties them."""
    arch = cfg["model_type"]
    out = [("token_embd.weight", "model.embed_tokens.weight", None)]
    per_layer = [("attn_norm", "input_layernorm"), ("attn_q", "self_attn.q_proj"), ("attn_k", "self_attn.k_proj"),
                 ("attn_v", "self_attn.v_proj"), ("attn_output", "self_attn.o_proj"),
                 ("ffn_norm", "post_attention_layernorm"), ("ffn_gate", "mlp.gate_proj"), ("ffn_up", "mlp.up_proj"),
                 ("ffn_down", "mlp.down_proj")]
    if arch == "qwen3":
        per_layer += [("attn_q_norm", "self_attn.q_norm"), ("attn_k_norm", "self_attn.k_norm")]
    heads, kv_heads = cfg["num_attention_heads"], cfg.get("num_key_value_heads", cfg["num_attention_heads"])
    for i in range(cfg["num_hidden_layers"]):
        for g, h in per_layer:
            rows = None
            if arch == "llama" and g in ("attn_q", "attn_k"):
                rows = llama_rope_rows(st.shape(f"model.layers.{i}.{h}.weight")[0], heads if g == "attn_q" else kv_heads)
            out.append((f"blk.{i}.{g}.weight", f"model.layers.{i}.{h}.weight", rows))
    out.append(("output_norm.weight", "model.norm.weight", None))
    if not cfg.get("tie_word_embeddings", False) and "lm_head.weight" in st.where:
        out.append(("output.weight", "lm_head.weight", None))
    elif tied_output and cfg.get("tie_word_embeddings", False):
        out.append(("output.weight", "model.embed_tokens.weight", None))
    missing = [h for _, h, _ in out if h not in st.where]
    if missing:
        raise ValueError(f"the checkpoint lacks {', '.join(missing[:4])}")
    return out


def producer(st, hf, rows, gtype):
    """A function yielding the GGUF bytes of checkpoint tensor hf, a block of
    rows at a time (the embedding of a 1B model is 1 GB in f32)."""
    def rows_of(a, r):
        a = a[r:r + ROWS_PER_CHUNK] if rows is None else a[rows[r:r + ROWS_PER_CHUNK]]
        return np.asarray(a)

    def make():
        if gtype == gguf.BF16:
            src, enc = st.bf16_source(hf)
        else:
            src, enc = st.f32_source(hf)
        if src.ndim < 2:
            yield enc(np.asarray(src))
            return
        for r in range(0, src.shape[0], ROWS_PER_CHUNK):
            x = enc(rows_of(src, r))
            yield QUANTIZE[gtype](x) if gtype in QUANTIZE else x
    return make


def llama3_rope_factors(cfg):
    """rope_scaling "llama3": llama.cpp reads the per-frequency divisors of
    the rotary frequencies from the tensor rope_freqs (Hugging Face's
    _compute_llama3_parameters: 1 for short wavelengths, factor for long
    ones, a smooth blend between)."""
    rs = cfg["rope_scaling"]
    d = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    base, factor = cfg["rope_theta"], rs.get("factor", 8.0)
    lo, hi = rs.get("low_freq_factor", 1.0), rs.get("high_freq_factor", 4.0)
    old = rs.get("original_max_position_embeddings", 8192)
    out = []
    for i in range(0, d, 2):
        wavelen = 2 * math.pi * base ** (i / d)
        if wavelen < old / hi:
            out.append(1.0)
        elif wavelen > old / lo:
            out.append(factor)
        else:
            smooth = (old / wavelen - lo) / (hi - lo)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


# ---- the tokenizer -----------------------------------------------------------

def looks_special(tok):
    return tok.startswith("<|") and tok.endswith("|>")


def token_id(tok_json, cfg_tok, key):
    """bos/eos: tokenizer_config.json names the token (a string or an added-
    token object); its id from the vocabulary or the added tokens."""
    t = cfg_tok.get(key)
    if isinstance(t, dict):
        t = t.get("content")
    if not t:
        return None
    if t in tok_json["model"]["vocab"]:
        return tok_json["model"]["vocab"][t]
    for a in tok_json.get("added_tokens", []):
        if a["content"] == t:
            return a["id"]
    return None


def adds_bos(tok_json, cfg_tok):
    post = tok_json.get("post_processor") or {}
    procs = post.get("processors", [post]) if post.get("type") == "Sequence" else [post]
    for p in procs:
        if p.get("type") == "TemplateProcessing":
            single = p.get("single", [])
            return bool(single) and "SpecialToken" in single[0]
    return bool(cfg_tok.get("add_bos_token", False))


def pre_tokenizer_name(tok_json):
    """llama.cpp's name for the pre-tokenizer: its split pattern tells Llama 3
    (digits in runs of up to 3) from Qwen2/3 (single digits)."""
    text = json.dumps(tok_json.get("pre_tokenizer"))
    if "\\\\p{N}{1,3}" in text:
        return "llama-bpe"
    if "\\\\p{N}|" in text:
        return "qwen2"
    raise ValueError("unknown pre-tokenizer (neither Llama 3's nor Qwen2's split pattern)")


def add_tokenizer(w, model_dir, cfg):
    with open(os.path.join(model_dir, "tokenizer.json"), encoding="utf-8") as f:
        tj = json.load(f)
    ct = {}
    p = os.path.join(model_dir, "tokenizer_config.json")
    if os.path.exists(p):
        with open(p, encoding="utf-8") as f:
            ct = json.load(f)
    if tj["model"]["type"] != "BPE":
        raise ValueError(f"tokenizer model {tj['model']['type']}: only byte-level BPE is handled")
    n = cfg["vocab_size"]
    tokens, types = [f"[PAD{i}]" for i in range(n)], [5] * n   # 5: unused
    for t, i in tj["model"]["vocab"].items():
        if i < n:
            tokens[i], types[i] = t, 1                           # 1: normal
    for a in tj.get("added_tokens", []):
        if a["id"] < n:
            tokens[a["id"]] = a["content"]
            types[a["id"]] = 3 if a.get("special") or looks_special(a["content"]) else 4   # control, user-defined
    merges = [m if isinstance(m, str) else " ".join(m) for m in tj["model"]["merges"]]
    w.add("tokenizer.ggml.model", gguf.STRING, "gpt2")
    w.add("tokenizer.ggml.pre", gguf.STRING, pre_tokenizer_name(tj))
    w.add_array("tokenizer.ggml.tokens", gguf.STRING, tokens)
    w.add_array("tokenizer.ggml.token_type", gguf.INT32, types)
    w.add_array("tokenizer.ggml.merges", gguf.STRING, merges)
    bos = token_id(tj, ct, "bos_token")
    eos = token_id(tj, ct, "eos_token")
    if bos is None:
        bos = cfg.get("bos_token_id")
    if eos is None:
        e = cfg.get("eos_token_id")
        eos = e[0] if isinstance(e, list) else e
    if bos is not None:
        w.add("tokenizer.ggml.bos_token_id", gguf.UINT32, bos)
    if eos is not None:
        w.add("tokenizer.ggml.eos_token_id", gguf.UINT32, eos)
    pad = token_id(tj, ct, "pad_token")
    if pad is not None:
        w.add("tokenizer.ggml.padding_token_id", gguf.UINT32, pad)
    w.add("tokenizer.ggml.add_bos_token", gguf.BOOL, adds_bos(tj, ct))


# ---- the file ---------------------------------------------------------------

def add_hparams(w, cfg, gtype, name):
    a = ARCH[cfg["model_type"]]
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    w.add("general.architecture", gguf.STRING, a)
    w.add("general.name", gguf.STRING, name)
    w.add("general.file_type", gguf.UINT32, gguf.FILE_TYPE[gtype])
    u32 = [("block_count", "num_hidden_layers"), ("context_length", "max_position_embeddings"),
           ("embedding_length", "hidden_size"), ("feed_forward_length", "intermediate_size"),
           ("attention.head_count", "num_attention_heads"), ("attention.head_count_kv", "num_key_value_heads"),
           ("vocab_size", "vocab_size")]
    for k, h in u32:
        v = cfg.get(h, cfg["num_attention_heads"] if h == "num_key_value_heads" else None)
        w.add(f"{a}.{k}", gguf.UINT32, int(v))
    w.add(f"{a}.attention.key_length", gguf.UINT32, head_dim)
    w.add(f"{a}.attention.value_length", gguf.UINT32, head_dim)
    w.add(f"{a}.rope.dimension_count", gguf.UINT32, head_dim)
    w.add(f"{a}.rope.freq_base", gguf.FLOAT32, float(cfg.get("rope_theta", 10000.0)))
    w.add(f"{a}.attention.layer_norm_rms_epsilon", gguf.FLOAT32, float(cfg["rms_norm_eps"]))


def check_config(cfg):
    mt = cfg.get("model_type")
    if mt not in ARCH:
        raise ValueError(f"model_type {mt!r}: only {', '.join(ARCH)} are converted")
    rs = cfg.get("rope_scaling")
    kind = rs and (rs.get("rope_type") or rs.get("type"))
    if kind not in (None, "default", "llama3"):
        raise ValueError(f"rope_scaling {kind!r} is not handled")
    if cfg.get("attention_bias") or cfg.get("mlp_bias"):
        raise ValueError("biases are not handled")
    if cfg.get("use_sliding_window") and cfg.get("sliding_window"):
        raise ValueError("sliding-window attention is not handled")


def convert(model_dir, out, dtype, name=None):
    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = json.load(f)
    check_config(cfg)
    gtype = DTYPES[dtype]
    st = Safetensors(model_dir)
    w = gguf.Writer()
    add_hparams(w, cfg, gtype, name or os.path.basename(os.path.normpath(model_dir)))
    add_tokenizer(w, model_dir, cfg)
    rs = cfg.get("rope_scaling")
    if rs and (rs.get("rope_type") or rs.get("type")) == "llama3":
        factors = llama3_rope_factors(cfg)
        w.add_tensor("rope_freqs.weight", gguf.F32, factors.shape, lambda: iter([factors]))
    for g, hf, rows in tensor_map(cfg, st, tied_output=gtype == gguf.Q4_0):
        shape = st.shape(hf)
        t = gtype if len(shape) == 2 else gguf.F32
        if t == gguf.Q4_0 and g == "token_embd.weight":
            t = gguf.BF16 if st.dtype(hf) == "BF16" else gguf.F32   # as tensorpar keeps it
        if t in QUANTIZE and shape[-1] % gguf.QK8_0:
            t = gguf.F32   # rows Q8_0/Q4_0 cannot hold (llama.cpp's converter falls back to F16)
        w.add_tensor(g, t, shape, producer(st, hf, rows, t))
    w.write(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("out")
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="f32")
    ap.add_argument("--name", help="general.name (default: the model folder's name)")
    a = ap.parse_args()
    try:
        convert(a.model, a.out, a.dtype, a.name)
    except (ValueError, KeyError, OSError) as e:
        sys.exit(f"convert: {e}")


if __name__ == "__main__":
    main()
