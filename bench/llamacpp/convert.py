"""Converts a Hugging Face checkpoint of tensorpar's make-model (config.json,
model.safetensors or its shards, tokenizer.json) to GGUF, for llama.cpp.

    /usr/bin/python3 bench/llamacpp/convert.py MODEL_DIR OUT.gguf --dtype f32|bf16|q8_0

Model types: llama, qwen3, qwen3_moe, mixtral, deepseek_v2 and deepseek_v3
(tensormap.py says which tensors each becomes).  The weights are the
checkpoint's: F32 keeps their f32 values (bf16 widened exactly), BF16 keeps
bf16 values (f32 ones rounded to nearest even), Q8_0 quantizes the f32
values in blocks of 32 as ggml's reference quantizer does.  As llama.cpp's
own converter does, norms, biases and MoE routers stay F32, and every other
matrix, the embedding, the lm_head and the stacked experts included, takes
the chosen type (F32 where a row is not whole Q8_0 blocks).  With
--experts stored the experts keep the checkpoint's type instead (BF16 for a
bf16 checkpoint, else F32), as tensorpar's --dtype q8_0 keeps them.

llama.cpp applies rotary embeddings to pairs of adjacent values for the
llama architecture (llama and mixtral), where Hugging Face pairs value i
with value i + d/2 within each head; so the rows of q_proj and k_proj are
reordered per head (row h * d/2 + j becomes row 2j + h).  qwen3 and
qwen3_moe keep Hugging Face's pairing in llama.cpp ("neox" rope), and
DeepSeek's rotary part is interleaved in both, so their rows stay.

The tokenizer goes in as llama.cpp's "gpt2" (byte-level BPE) vocabulary:
the tokens in id order, padded with unused "[PADn]" entries to the model's
vocab_size, their types (normal, or control/user-defined for added tokens),
the merges, bos/eos and whether a BOS is prepended (as Hugging Face would:
a TemplateProcessing post-processor or add_bos_token).

Damaged or unexpected input (a truncated safetensors file, a dtype or shape
that config.json does not make, a missing key) is refused before anything
is written, naming the file, tensor or key; the output is written to a
temporary file beside OUT and renamed over it only when whole, so a failed
conversion leaves no GGUF behind."""
import argparse
import json
import math
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gguf  # noqa: E402
from checkpoint import Config, ConvertError, Safetensors  # noqa: E402
from tensormap import ARCH, pieces  # noqa: E402

DTYPES = {"f32": gguf.F32, "bf16": gguf.BF16, "q8_0": gguf.Q8_0}
ROWS_PER_CHUNK = 8192   # Q8_0 and BF16 are encoded this many rows at a time


# ---- tensors ---------------------------------------------------------------

def _encoder(st, src, gtype):
    """(the stored array of src, a function turning a slice of it into what
    the file holds: f32 values, bf16 bits or Q8_0 bytes)."""
    if gtype == gguf.BF16:
        return st.bf16_source(src)
    a, to_f32 = st.f32_source(src)
    if gtype == gguf.Q8_0:
        return a, lambda x: gguf.quantize_q8_0(to_f32(x))
    return a, to_f32


def producer(st, piece, gtype):
    """A function yielding the GGUF bytes of a piece in order, a block of rows
    of one source at a time (the embedding of a 1B model is 1 GB in f32,
    the experts of a layer of Qwen3-30B-A3B 0.6 GB)."""
    def rows_of(a, r):
        rows = piece.rows
        return np.asarray(a[r:r + ROWS_PER_CHUNK] if rows is None else a[rows[r:r + ROWS_PER_CHUNK]])

    def make():
        for s in piece.srcs[:1] if piece.view else piece.srcs:
            src, enc = _encoder(st, s, gguf.F32 if piece.view and gtype == gguf.Q8_0 else gtype)
            if piece.view:
                # rearranged whole (small, per-layer tensors); values only move
                x = piece.view(enc(np.asarray(src)))
                yield gguf.quantize_q8_0(x) if gtype == gguf.Q8_0 else x
            elif src.ndim < 2:
                yield enc(np.asarray(src))
            else:
                for r in range(0, src.shape[0], ROWS_PER_CHUNK):
                    yield enc(rows_of(src, r))
    return make


def piece_type(st, piece, gtype, experts_stored):
    """The ggml type a piece takes in the file."""
    if piece.kind == "f32" or len(piece.shape) < 2:
        return gguf.F32
    if piece.kind == "expert" and experts_stored:
        return gguf.BF16 if st.dtype(piece.srcs[0]) == "BF16" else gguf.F32
    if gtype == gguf.Q8_0 and piece.shape[-1] % gguf.QK8_0:
        return gguf.F32   # rows Q8_0 cannot hold (llama.cpp's converter falls back to F16)
    return gtype


def llama3_rope_factors(cfg):
    """rope_scaling "llama3": llama.cpp reads the per-frequency divisors of
    the rotary frequencies from the tensor rope_freqs (Hugging Face's
    _compute_llama3_parameters: 1 for short wavelengths, factor for long
    ones, a smooth blend between)."""
    rs = cfg.get("rope_scaling")
    d = cfg.head_dim()
    base, factor = cfg.float("rope_theta", 10000.0), rs.get("factor", 8.0)
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
    raise ConvertError("unknown pre-tokenizer (neither Llama 3's nor Qwen2's split pattern)")


def read_json(path, required=True):
    """A JSON object from path ({} when absent and not required); an error
    naming the file when it cannot be read or parsed."""
    if not required and not os.path.exists(path):
        return {}
    try:
        with open(path, encoding="utf-8") as f:
            d = json.load(f)
    except OSError as e:
        raise ConvertError(f"{path}: {e.strerror}") from None
    except ValueError as e:
        raise ConvertError(f"{path}: not JSON ({e})") from None
    if not isinstance(d, dict):
        raise ConvertError(f"{path}: not a JSON object")
    return d


def add_tokenizer(w, model_dir, cfg):
    path = os.path.join(model_dir, "tokenizer.json")
    tj = read_json(path)
    ct = read_json(os.path.join(model_dir, "tokenizer_config.json"), required=False)
    model = tj.get("model")
    if not isinstance(model, dict) or not isinstance(model.get("vocab"), dict) or "merges" not in model:
        raise ConvertError(f"{path}: no model with vocab and merges")
    if model.get("type") != "BPE":
        raise ConvertError(f"{path}: tokenizer model {model.get('type')!r}: only byte-level BPE is handled")
    n = cfg.int("vocab_size")
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
        eos = e[0] if isinstance(e, list) and e else e
    if bos is not None:
        w.add("tokenizer.ggml.bos_token_id", gguf.UINT32, bos)
    if eos is not None:
        w.add("tokenizer.ggml.eos_token_id", gguf.UINT32, eos)
    pad = token_id(tj, ct, "pad_token")
    if pad is not None:
        w.add("tokenizer.ggml.padding_token_id", gguf.UINT32, pad)
    w.add("tokenizer.ggml.add_bos_token", gguf.BOOL, adds_bos(tj, ct))


# ---- the file ---------------------------------------------------------------

def u32(w, key, v):
    w.add(key, gguf.UINT32, int(v))


def add_hparams(w, cfg, gtype, name):
    mt = cfg.get("model_type")
    a = ARCH[mt]
    w.add("general.architecture", gguf.STRING, a)
    w.add("general.name", gguf.STRING, name)
    w.add("general.file_type", gguf.UINT32, gguf.FILE_TYPE[gtype])
    heads = cfg.int("num_attention_heads")
    for k, v in (("block_count", cfg.int("num_hidden_layers")), ("context_length", cfg.int("max_position_embeddings")),
                 ("embedding_length", cfg.int("hidden_size")), ("feed_forward_length", cfg.int("intermediate_size")),
                 ("attention.head_count", heads), ("vocab_size", cfg.int("vocab_size"))):
        u32(w, f"{a}.{k}", v)
    w.add(f"{a}.rope.freq_base", gguf.FLOAT32, cfg.float("rope_theta", 10000.0))
    w.add(f"{a}.attention.layer_norm_rms_epsilon", gguf.FLOAT32, cfg.float("rms_norm_eps"))
    if a == "deepseek2":
        add_mla_hparams(w, cfg, a)
        return
    hd = cfg.head_dim()
    u32(w, f"{a}.attention.head_count_kv", cfg.int("num_key_value_heads", heads))
    u32(w, f"{a}.attention.key_length", hd)
    u32(w, f"{a}.attention.value_length", hd)
    u32(w, f"{a}.rope.dimension_count", hd)
    if mt == "mixtral":
        u32(w, f"{a}.expert_count", cfg.int("num_local_experts"))
        u32(w, f"{a}.expert_used_count", cfg.int("num_experts_per_tok"))
    elif mt == "qwen3_moe":
        u32(w, f"{a}.expert_count", cfg.int("num_experts"))
        u32(w, f"{a}.expert_used_count", cfg.int("num_experts_per_tok"))
        u32(w, f"{a}.expert_feed_forward_length", cfg.int("moe_intermediate_size"))


def add_mla_hparams(w, cfg, a):
    """deepseek2: MLA stored as llama.cpp runs it, multi-query over the latent
    (one KV head; keys kv_lora + rope wide, values kv_lora), with the heads'
    own widths as the *_mla lengths; the MoE keys."""
    kv_lora, rope = cfg.int("kv_lora_rank"), cfg.int("qk_rope_head_dim")
    u32(w, f"{a}.attention.head_count_kv", 1)
    u32(w, f"{a}.attention.key_length", kv_lora + rope)
    u32(w, f"{a}.attention.value_length", kv_lora)
    u32(w, f"{a}.attention.key_length_mla", cfg.int("qk_nope_head_dim") + rope)
    u32(w, f"{a}.attention.value_length_mla", cfg.int("v_head_dim"))
    u32(w, f"{a}.attention.kv_lora_rank", kv_lora)
    u32(w, f"{a}.attention.q_lora_rank", cfg.int("q_lora_rank", 0, minimum=0))
    u32(w, f"{a}.rope.dimension_count", rope)
    u32(w, f"{a}.leading_dense_block_count", cfg.int("first_k_dense_replace", 0, minimum=0))
    u32(w, f"{a}.expert_feed_forward_length", cfg.int("moe_intermediate_size"))
    u32(w, f"{a}.expert_count", cfg.int("n_routed_experts"))
    u32(w, f"{a}.expert_used_count", cfg.int("num_experts_per_tok"))
    u32(w, f"{a}.expert_shared_count", cfg.int("n_shared_experts", 0, minimum=0))
    w.add(f"{a}.expert_weights_scale", gguf.FLOAT32, cfg.float("routed_scaling_factor", 1.0))
    w.add(f"{a}.expert_weights_norm", gguf.BOOL, bool(cfg.get("norm_topk_prob", False)))
    v3 = cfg.get("model_type") == "deepseek_v3"
    u32(w, f"{a}.expert_gating_func", 2 if v3 else 1)   # sigmoid, softmax
    if cfg.int("n_group", 1) > 1:
        u32(w, f"{a}.expert_group_count", cfg.int("n_group"))
        u32(w, f"{a}.expert_group_used_count", cfg.int("topk_group"))


def check_config(cfg):
    """Refuses, naming the key, what llama.cpp would run differently from
    Hugging Face (and tensorpar)."""
    mt = cfg.get("model_type")
    if mt not in ARCH:
        raise ConvertError(f"{cfg.path}: model_type {mt!r}: only {', '.join(ARCH)} are converted")
    rs = cfg.get("rope_scaling")
    kind = rs and (rs.get("rope_type") or rs.get("type"))
    if kind not in (None, "default", "llama3") or (kind == "llama3" and ARCH[mt] != "llama"):
        raise ConvertError(f"{cfg.path}: rope_scaling {kind!r} is not handled for {mt}")
    if cfg.get("attention_bias") or cfg.get("mlp_bias"):
        raise ConvertError(f"{cfg.path}: biases (attention_bias, mlp_bias) are not handled")
    if (cfg.get("use_sliding_window") or mt == "mixtral") and cfg.get("sliding_window"):
        raise ConvertError(f"{cfg.path}: sliding-window attention (sliding_window) is not handled")
    if mt == "qwen3_moe":
        # llama.cpp's qwen3moe has every layer sparse and always renormalises the top-k weights
        if cfg.get("mlp_only_layers") or cfg.int("decoder_sparse_step", 1) != 1:
            raise ConvertError(f"{cfg.path}: dense layers in qwen3_moe (mlp_only_layers, decoder_sparse_step) "
                               f"are not handled by llama.cpp's qwen3moe")
        if not cfg.get("norm_topk_prob", False):
            raise ConvertError(f"{cfg.path}: norm_topk_prob false: llama.cpp's qwen3moe always renormalises "
                               f"the top-k routing weights")
    if mt in ("deepseek_v2", "deepseek_v3"):
        method = cfg.get("topk_method", "greedy" if mt == "deepseek_v2" else "noaux_tc")
        if mt == "deepseek_v2" and (method != "greedy" and cfg.int("n_group", 1) > 1):
            raise ConvertError(f"{cfg.path}: topk_method {method!r}: llama.cpp ranks expert groups by their two "
                               f"best scores, DeepSeek-V2 by its best")
        if cfg.d.get("rope_interleave") is False:
            raise ConvertError(f"{cfg.path}: rope_interleave false: llama.cpp's deepseek2 rotates adjacent pairs")
        if cfg.get("scoring_func", "softmax" if mt == "deepseek_v2" else "sigmoid") != (
                "softmax" if mt == "deepseek_v2" else "sigmoid"):
            raise ConvertError(f"{cfg.path}: scoring_func {cfg.get('scoring_func')!r} is not handled for {mt}")


def convert(model_dir, out, dtype, name=None, experts_stored=False):
    """Writes OUT.gguf whole or not at all: into a temporary file beside it,
    renamed over it at the end; removed when anything fails."""
    cfg = Config(model_dir)
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
    for p in pieces(cfg, st):
        t = piece_type(st, p, gtype, experts_stored)
        w.add_tensor(p.name, t, p.shape, producer(st, p, t))
    tmp = os.path.join(os.path.dirname(os.path.abspath(out)), f".{os.path.basename(out)}.tmp-{os.getpid()}")
    try:
        w.write(tmp)
        os.replace(tmp, out)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("out")
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="f32")
    ap.add_argument("--experts", choices=("dtype", "stored"), default="dtype",
                    help="the stacked experts in --dtype (default) or as stored in the checkpoint")
    ap.add_argument("--name", help="general.name (default: the model folder's name)")
    a = ap.parse_args()
    try:
        convert(a.model, a.out, a.dtype, a.name, a.experts == "stored")
    except (ConvertError, ValueError) as e:
        sys.exit(f"convert: {e}")
    except OSError as e:
        sys.exit(f"convert: {e.filename or a.out}: {e.strerror or e}")


if __name__ == "__main__":
    main()
