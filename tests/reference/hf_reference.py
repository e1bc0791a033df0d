#!/usr/bin/python3
"""Independent NumPy reference of Hugging Face causal LMs (llama, mistral, qwen2, qwen3,
qwen3_moe, mixtral).

This is tensorpar's *reference*, written from the semantics of Hugging Face
Transformers' modeling code (LlamaForCausalLM, MistralForCausalLM,
Qwen2ForCausalLM, Qwen3ForCausalLM, Qwen3MoeForCausalLM, MixtralForCausalLM
and modeling_rope_utils), not from the C engine.  The sparse blocks follow
Qwen3MoeSparseMoeBlock and MixtralSparseMoeBlock on the per-expert
checkpoint tensors as published (experts.<e>.gate_proj/up_proj/down_proj,
Mixtral's block_sparse_moe.experts.<e>.w1/w3/w2).  Everything is computed in float64 from the stored weights (bf16 and
f16 weights are widened exactly).

Usage:
    /usr/bin/python3 tests/reference/hf_reference.py --model DIR --tokens 1,2,3 --out X.npy
        writes float32 logits [T, vocab] (np.save)
    /usr/bin/python3 tests/reference/hf_reference.py --self-test
        checks the reader/writer and a few invariants on tiny models written here

Only the Python standard library and NumPy are needed.
"""

import argparse
import json
import math
import os
import struct
import sys
import tempfile

import numpy as np

DENSE_ARCHS = ("llama", "mistral", "qwen2", "qwen3")
SUPPORTED_ARCHS = DENSE_ARCHS + ("qwen3_moe", "mixtral")
# deepseek_v2 and deepseek_v3: hf_deepseek.py, through reference_model.
# llama4_text: hf_llama4.py (PyTorch), through reference_model.


class ReferenceError(Exception):
    """A model directory the reference cannot (or must not) load."""


# ---------------------------------------------------------------------------
# safetensors
# ---------------------------------------------------------------------------

# dtype string -> (numpy dtype of the raw little-endian storage, bytes per element)
ST_DTYPES = {
    "F64": (np.dtype("<f8"), 8),
    "F32": (np.dtype("<f4"), 4),
    "F16": (np.dtype("<f2"), 2),
    "BF16": (np.dtype("<u2"), 2),
    "I64": (np.dtype("<i8"), 8),
    "I32": (np.dtype("<i4"), 4),
    "I16": (np.dtype("<i2"), 2),
    "I8": (np.dtype("i1"), 1),
    "U8": (np.dtype("u1"), 1),
}


def bf16_bits_to_f32(bits):
    """bf16 bit patterns (uint16) -> float32, exactly (the bits become the high half)."""
    bits = np.asarray(bits, dtype=np.uint16)
    return (bits.astype(np.uint32) << np.uint32(16)).view(np.float32)


def f32_to_bf16_bits(x):
    """float32 -> bf16 bit patterns, round to nearest even (NaN kept as a quiet NaN)."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    u = x.view(np.uint32).astype(np.uint64)
    rounded = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    out = rounded.astype(np.uint16)
    nan = np.isnan(x)
    if nan.any():
        out[nan] = ((u[nan] >> 16) | 0x40).astype(np.uint16)
    return out


def read_safetensors_header(path):
    """Return (header dict without __metadata__, metadata, data_start, file_size).

    Validates everything the header promises against the file: the header
    length, JSON, dtype strings, shapes, that data_offsets match shape x dtype,
    lie inside the data area and do not overlap."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise ReferenceError(f"{path}: file too short for a safetensors header ({size} bytes)")
        (hlen,) = struct.unpack("<Q", head)
        if hlen > size - 8:
            raise ReferenceError(f"{path}: header length {hlen} exceeds the file size {size}")
        raw = f.read(hlen)
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ReferenceError(f"{path}: header is not valid JSON: {e}") from None
    if not isinstance(header, dict):
        raise ReferenceError(f"{path}: header is not a JSON object")
    meta = header.pop("__metadata__", None)
    data_start = 8 + hlen
    data_len = size - data_start
    spans = []
    for name, info in header.items():
        if not isinstance(info, dict):
            raise ReferenceError(f"{path}: tensor {name}: entry is not an object")
        dt = info.get("dtype")
        if dt not in ST_DTYPES:
            raise ReferenceError(f"{path}: tensor {name}: unsupported dtype {dt!r}")
        shape = info.get("shape")
        if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
            raise ReferenceError(f"{path}: tensor {name}: bad shape {shape!r}")
        offs = info.get("data_offsets")
        if (not isinstance(offs, list) or len(offs) != 2
                or not all(isinstance(o, int) and o >= 0 for o in offs) or offs[0] > offs[1]):
            raise ReferenceError(f"{path}: tensor {name}: bad data_offsets {offs!r}")
        nbytes = int(np.prod(shape, dtype=np.int64)) * ST_DTYPES[dt][1]
        if offs[1] - offs[0] != nbytes:
            raise ReferenceError(f"{path}: tensor {name}: data_offsets {offs} hold {offs[1] - offs[0]}"
                                 f" bytes but shape {shape} {dt} needs {nbytes}")
        if offs[1] > data_len:
            raise ReferenceError(f"{path}: tensor {name}: data_offsets {offs} past the end of the"
                                 f" data area ({data_len} bytes)")
        spans.append((offs[0], offs[1], name))
    spans.sort()
    for (a0, a1, an), (b0, b1, bn) in zip(spans, spans[1:]):
        if b0 < a1:
            raise ReferenceError(f"{path}: tensors {an} and {bn} overlap")
    return header, meta, data_start, size


def read_safetensors_raw(path):
    """name -> (dtype string, shape tuple, raw bytes)."""
    header, _, data_start, _ = read_safetensors_header(path)
    out = {}
    with open(path, "rb") as f:
        for name, info in header.items():
            a, b = info["data_offsets"]
            f.seek(data_start + a)
            out[name] = (info["dtype"], tuple(info["shape"]), f.read(b - a))
    return out


def decode_tensor(dtype, shape, raw, as_dtype=np.float64):
    store, _ = ST_DTYPES[dtype]
    arr = np.frombuffer(raw, dtype=store).reshape(shape)
    if dtype == "BF16":
        arr = bf16_bits_to_f32(arr)
    return arr.astype(as_dtype)


def read_safetensors(path, as_dtype=np.float64):
    """name -> numpy array (floats widened to as_dtype)."""
    return {n: decode_tensor(d, s, r, as_dtype) for n, (d, s, r) in read_safetensors_raw(path).items()}


def write_safetensors_raw(path, tensors, metadata=None, order=None):
    """tensors: name -> (dtype string, shape, raw bytes). Writes them back to back
    in `order` (default: sorted by name), header padded with spaces to 8 bytes."""
    names = list(order) if order is not None else sorted(tensors)
    header = {}
    if metadata is not None:
        header["__metadata__"] = metadata
    off = 0
    for n in names:
        dt, shape, raw = tensors[n]
        header[n] = {"dtype": dt, "shape": list(shape), "data_offsets": [off, off + len(raw)]}
        off += len(raw)
    hb = json.dumps(header, separators=(",", ":")).encode("utf-8")
    hb += b" " * ((8 - len(hb) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hb)))
        f.write(hb)
        for n in names:
            f.write(tensors[n][2])


def encode_tensor(arr, dtype):
    """numpy array -> (dtype string, shape, raw bytes) for write_safetensors_raw."""
    arr = np.asarray(arr)
    if dtype == "BF16":
        raw = f32_to_bf16_bits(arr.astype(np.float32)).astype("<u2").tobytes()
    else:
        raw = np.ascontiguousarray(arr, dtype=ST_DTYPES[dtype][0]).tobytes()
    return (dtype, tuple(arr.shape), raw)


def write_safetensors(path, arrays, dtype="F32", metadata=None):
    write_safetensors_raw(path, {n: encode_tensor(a, dtype) for n, a in arrays.items()}, metadata)


def load_model_tensors(model_dir, as_dtype=np.float64):
    """All tensors of a model directory: model.safetensors, or the shards listed in
    model.safetensors.index.json."""
    single = os.path.join(model_dir, "model.safetensors")
    index = os.path.join(model_dir, "model.safetensors.index.json")
    if os.path.exists(index):
        try:
            with open(index) as f:
                wmap = json.load(f)["weight_map"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise ReferenceError(f"{index}: cannot read weight_map: {e}") from None
        out = {}
        for shard in sorted(set(wmap.values())):
            part = read_safetensors(os.path.join(model_dir, shard), as_dtype)
            for n, a in part.items():
                if n in out:
                    raise ReferenceError(f"{index}: tensor {n} appears in more than one shard")
                out[n] = a
        for n, shard in wmap.items():
            if n not in out:
                raise ReferenceError(f"{index}: tensor {n} listed in {shard} but not found there")
        return out
    if os.path.exists(single):
        return read_safetensors(single, as_dtype)
    raise ReferenceError(f"{model_dir}: neither model.safetensors nor model.safetensors.index.json")


# ---------------------------------------------------------------------------
# config
# ---------------------------------------------------------------------------

def load_config(model_dir):
    path = os.path.join(model_dir, "config.json")
    try:
        with open(path) as f:
            cfg = json.load(f)
    except (OSError, ValueError) as e:
        raise ReferenceError(f"{path}: {e}") from None
    if not isinstance(cfg, dict):
        raise ReferenceError(f"{path}: not a JSON object")
    return cfg


def rope_settings(cfg):
    """(theta, rope_type, params) following HF: legacy rope_theta + rope_scaling, or
    the newer rope_parameters dict.  'type' is the old spelling of 'rope_type'."""
    theta, rtype, params = rope_settings_any(cfg)
    if rtype not in ("default", "linear", "llama3"):
        raise ReferenceError(f"config.json: rope_scaling type {rtype!r} is not supported by the reference")
    return theta, rtype, params


def rope_settings_any(cfg):
    """rope_settings without the check of the type (hf_deepseek.py reads yarn)."""
    rp = cfg.get("rope_parameters") if isinstance(cfg.get("rope_parameters"), dict) else {}
    rs = cfg.get("rope_scaling")
    if rs is not None and not isinstance(rs, dict):
        raise ReferenceError(f"config.json: rope_scaling must be an object or null, got {rs!r}")
    params = dict(rp)
    if rs:
        params.update(rs)
    theta = cfg.get("rope_theta", params.get("rope_theta", 10000.0))
    rtype = params.get("rope_type", params.get("type", "default"))
    return float(theta), rtype, params


def rope_inv_freq(cfg, head_dim):
    """inv_freq [head_dim/2] as modeling_rope_utils computes it (in float64 here)."""
    theta, rtype, p = rope_settings(cfg)
    prf = cfg.get("partial_rotary_factor", 1.0)
    if prf != 1.0:
        raise ReferenceError("config.json: partial_rotary_factor != 1 is not supported by the reference")
    dim = head_dim
    inv_freq = 1.0 / (theta ** (np.arange(0, dim, 2, dtype=np.int64).astype(np.float64) / dim))
    if rtype == "linear":
        inv_freq = inv_freq / float(p["factor"])
    elif rtype == "llama3":
        factor = float(p["factor"])
        low = float(p["low_freq_factor"])
        high = float(p["high_freq_factor"])
        old_ctx = float(p["original_max_position_embeddings"])
        low_wl = old_ctx / low
        high_wl = old_ctx / high
        wavelen = 2.0 * math.pi / inv_freq
        scaled = np.where(wavelen > low_wl, inv_freq / factor, inv_freq)
        smooth = (old_ctx / wavelen - low) / (high - low)
        smoothed = (1.0 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelen < high_wl) & ~(wavelen > low_wl)
        inv_freq = np.where(medium, smoothed, scaled)
    return inv_freq


def rope_cos_sin(inv_freq, positions):
    freqs = np.outer(np.asarray(positions, dtype=np.float64), inv_freq)  # [T, d/2]
    emb = np.concatenate([freqs, freqs], axis=-1)                        # [T, d]
    return np.cos(emb), np.sin(emb)


def rotate_half(x):
    h = x.shape[-1] // 2
    return np.concatenate([-x[..., h:], x[..., :h]], axis=-1)


def apply_rope(x, cos, sin):
    """x: [heads, T, d]; cos/sin: [T, d]."""
    return x * cos[None] + rotate_half(x) * sin[None]


def rms_norm(x, w, eps):
    var = np.mean(x * x, axis=-1, keepdims=True)
    return w * (x / np.sqrt(var + eps))


def silu(x):
    return x / (1.0 + np.exp(-x))


# ---------------------------------------------------------------------------
# the model
# ---------------------------------------------------------------------------

class HFReference:
    """A Llama / Mistral / Qwen2 / Qwen3 causal LM in float64."""

    def __init__(self, model_dir, cfg=None, tensors=None):
        self.dir = model_dir
        self.cfg = cfg if cfg is not None else load_config(model_dir)
        c = self.cfg
        self.arch = c.get("model_type")
        if self.arch not in SUPPORTED_ARCHS:
            raise ReferenceError(f"config.json: model_type {self.arch!r} not one of {SUPPORTED_ARCHS}")

        def need(key):
            if key not in c or c[key] is None:
                raise ReferenceError(f"config.json: missing {key}")
            return c[key]

        self.hidden = int(need("hidden_size"))
        self.inter = int(need("intermediate_size"))
        self.n_layers = int(need("num_hidden_layers"))
        self.n_heads = int(need("num_attention_heads"))
        kvh = c.get("num_key_value_heads")
        self.n_kv = int(kvh) if kvh is not None else self.n_heads
        self.vocab = int(need("vocab_size"))
        self.head_dim = int(c.get("head_dim") or self.hidden // self.n_heads)
        self.eps = float(c.get("rms_norm_eps", 1e-6))
        self.tied = bool(c.get("tie_word_embeddings", False))
        act = c.get("hidden_act", "silu")
        if act != "silu":
            raise ReferenceError(f"config.json: hidden_act {act!r} is not supported by the reference")
        if self.n_heads % self.n_kv:
            raise ReferenceError("config.json: num_attention_heads is not a multiple of num_key_value_heads")
        self.inv_freq = rope_inv_freq(c, self.head_dim)

        # Which projections carry a bias (as the HF modules are built).
        attn_bias = bool(c.get("attention_bias", False))
        if self.arch == "qwen2":
            self.qkv_bias, self.o_bias = True, False
        elif self.arch == "mistral":
            # MistralAttention builds q/k/v/o with bias=False whatever the config says.
            self.qkv_bias, self.o_bias = False, False
        elif self.arch == "mixtral":
            self.qkv_bias, self.o_bias = False, False
        else:  # llama, qwen3, qwen3_moe
            self.qkv_bias, self.o_bias = attn_bias, attn_bias
        self.qk_norm = self.arch in ("qwen3", "qwen3_moe")
        self._moe_config(c)
        self.mlp_bias = bool(c.get("mlp_bias", False)) if self.arch == "llama" else False

        # Sliding window per layer (None = full causal attention).
        self.windows = []
        sw = c.get("sliding_window")
        layer_types = c.get("layer_types")
        for i in range(self.n_layers):
            w = None
            if self.arch in ("mistral", "mixtral"):
                w = sw
            elif self.arch in ("qwen2", "qwen3", "qwen3_moe"):
                if layer_types is not None:
                    if layer_types[i] == "sliding_attention":
                        w = sw if c.get("use_sliding_window", False) else None
                elif c.get("use_sliding_window", False) and sw is not None \
                        and i >= int(c.get("max_window_layers", 28)):
                    w = sw
            self.windows.append(int(w) if w is not None else None)

        self.t = tensors if tensors is not None else load_model_tensors(model_dir)
        self._check_shapes()

    def _moe_config(self, c):
        """The expert settings of Qwen3MoeConfig / MixtralConfig; self.sparse[i] says
        whether layer i has a sparse block (Qwen3MoeDecoderLayer's rule)."""
        self.sparse = [False] * self.n_layers
        if self.arch == "qwen3_moe":
            self.n_experts = int(c.get("num_experts", 128))
            self.top_k = int(c.get("num_experts_per_tok", 8))
            self.moe_inter = int(c.get("moe_intermediate_size", 768))
            self.norm_topk = bool(c.get("norm_topk_prob", False))
            step = int(c.get("decoder_sparse_step", 1))
            only = c.get("mlp_only_layers") or []
            self.sparse = [(i not in only) and self.n_experts > 0 and (i + 1) % step == 0
                           for i in range(self.n_layers)]
        elif self.arch == "mixtral":
            self.n_experts = int(c.get("num_local_experts", 8))
            self.top_k = int(c.get("num_experts_per_tok", 2))
            self.moe_inter = self.inter
            self.norm_topk = True
            self.sparse = [True] * self.n_layers

    def _moe_names(self, i, e):
        """(router, gate, up, down) tensor names of layer i, expert e, as stored."""
        if self.arch == "mixtral":
            p = f"model.layers.{i}.block_sparse_moe."
            x = f"{p}experts.{e}."
            return p + "gate.weight", x + "w1.weight", x + "w3.weight", x + "w2.weight"
        p = f"model.layers.{i}.mlp."
        x = f"{p}experts.{e}."
        return p + "gate.weight", x + "gate_proj.weight", x + "up_proj.weight", x + "down_proj.weight"

    def _expected(self):
        H, I, D = self.hidden, self.inter, self.head_dim
        exp = {"model.embed_tokens.weight": (self.vocab, H), "model.norm.weight": (H,)}
        if not self.tied:
            exp["lm_head.weight"] = (self.vocab, H)
        for i in range(self.n_layers):
            p = f"model.layers.{i}."
            exp[p + "input_layernorm.weight"] = (H,)
            exp[p + "post_attention_layernorm.weight"] = (H,)
            exp[p + "self_attn.q_proj.weight"] = (self.n_heads * D, H)
            exp[p + "self_attn.k_proj.weight"] = (self.n_kv * D, H)
            exp[p + "self_attn.v_proj.weight"] = (self.n_kv * D, H)
            exp[p + "self_attn.o_proj.weight"] = (H, self.n_heads * D)
            if self.qkv_bias:
                exp[p + "self_attn.q_proj.bias"] = (self.n_heads * D,)
                exp[p + "self_attn.k_proj.bias"] = (self.n_kv * D,)
                exp[p + "self_attn.v_proj.bias"] = (self.n_kv * D,)
            if self.o_bias:
                exp[p + "self_attn.o_proj.bias"] = (H,)
            if self.qk_norm:
                exp[p + "self_attn.q_norm.weight"] = (D,)
                exp[p + "self_attn.k_norm.weight"] = (D,)
            if self.sparse[i]:
                for e in range(self.n_experts):
                    router, g, u, d = self._moe_names(i, e)
                    exp[router] = (self.n_experts, H)
                    exp[g] = exp[u] = (self.moe_inter, H)
                    exp[d] = (H, self.moe_inter)
                continue
            exp[p + "mlp.gate_proj.weight"] = (I, H)
            exp[p + "mlp.up_proj.weight"] = (I, H)
            exp[p + "mlp.down_proj.weight"] = (H, I)
            if self.mlp_bias:
                exp[p + "mlp.gate_proj.bias"] = (I,)
                exp[p + "mlp.up_proj.bias"] = (I,)
                exp[p + "mlp.down_proj.bias"] = (H,)
        return exp

    def _check_shapes(self):
        for name, shape in self._expected().items():
            if name not in self.t:
                raise ReferenceError(f"{self.dir}: missing tensor {name}")
            if tuple(self.t[name].shape) != shape:
                raise ReferenceError(f"{self.dir}: tensor {name} has shape {list(self.t[name].shape)},"
                                     f" config.json implies {list(shape)}")
        unused = sorted(set(self.t) - set(self._expected()) - {"lm_head.weight"})
        if unused:
            print(f"hf_reference: warning: tensors not used by {self.arch}: {', '.join(unused[:6])}"
                  f"{' ...' if len(unused) > 6 else ''}", file=sys.stderr)

    def _linear(self, x, name, bias):
        y = x @ self.t[name + ".weight"].T
        if bias:
            y = y + self.t[name + ".bias"]
        return y

    def attention(self, i, x, cos, sin):
        """x: [T, H] (already normed) -> [T, H]."""
        T = x.shape[0]
        D, nh, nkv = self.head_dim, self.n_heads, self.n_kv
        p = f"model.layers.{i}.self_attn."
        q = self._linear(x, p + "q_proj", self.qkv_bias).reshape(T, nh, D).transpose(1, 0, 2)
        k = self._linear(x, p + "k_proj", self.qkv_bias).reshape(T, nkv, D).transpose(1, 0, 2)
        v = self._linear(x, p + "v_proj", self.qkv_bias).reshape(T, nkv, D).transpose(1, 0, 2)
        if self.qk_norm:  # per-head RMSNorm over head_dim, before RoPE
            q = rms_norm(q, self.t[p + "q_norm.weight"], self.eps)
            k = rms_norm(k, self.t[p + "k_norm.weight"], self.eps)
        q = apply_rope(q, cos, sin)
        k = apply_rope(k, cos, sin)
        rep = nh // nkv  # repeat_kv: query head h reads kv head h // rep
        k = np.repeat(k, rep, axis=0)
        v = np.repeat(v, rep, axis=0)
        scores = (q @ k.transpose(0, 2, 1)) / math.sqrt(D)  # [nh, T, T]
        qi = np.arange(T)[:, None]
        kj = np.arange(T)[None, :]
        visible = kj <= qi
        if self.windows[i] is not None:
            visible &= kj > qi - self.windows[i]
        scores = np.where(visible[None], scores, -np.inf)
        scores = scores - scores.max(axis=-1, keepdims=True)
        w = np.exp(scores)
        w = w / w.sum(axis=-1, keepdims=True)
        o = (w @ v).transpose(1, 0, 2).reshape(T, nh * D)
        return self._linear(o, p + "o_proj", self.o_bias)

    def sparse_moe(self, i, x):
        """Qwen3MoeSparseMoeBlock / MixtralSparseMoeBlock: softmax over all experts,
        top-k, renormalised (norm_topk_prob; Mixtral always), each expert's SwiGLU
        on the tokens that chose it, added with its routing weight."""
        E, k = self.n_experts, self.top_k
        logits = x @ self.t[self._moe_names(i, 0)[0]].T                      # [T, E]
        probs = np.exp(logits - logits.max(axis=-1, keepdims=True))
        probs = probs / probs.sum(axis=-1, keepdims=True)
        chosen = np.argsort(-probs, axis=-1, kind="stable")[:, :k]           # [T, k]
        weights = np.take_along_axis(probs, chosen, axis=-1)
        if self.norm_topk:
            weights = weights / weights.sum(axis=-1, keepdims=True)
        out = np.zeros_like(x)
        for e in range(E):
            tok, slot = np.nonzero(chosen == e)
            if tok.size == 0:
                continue
            _, g, u, d = self._moe_names(i, e)
            h = x[tok]
            y = (silu(h @ self.t[g].T) * (h @ self.t[u].T)) @ self.t[d].T
            np.add.at(out, tok, y * weights[tok, slot][:, None])
        return out

    def mlp(self, i, x):
        if self.sparse[i]:
            return self.sparse_moe(i, x)
        p = f"model.layers.{i}.mlp."
        g = self._linear(x, p + "gate_proj", self.mlp_bias)
        u = self._linear(x, p + "up_proj", self.mlp_bias)
        return self._linear(silu(g) * u, p + "down_proj", self.mlp_bias)

    def forward(self, tokens):
        """tokens: sequence of ints -> logits [T, vocab] float64."""
        ids = np.asarray(list(tokens), dtype=np.int64)
        if ids.ndim != 1 or ids.size == 0:
            raise ReferenceError("need a non-empty 1-D token sequence")
        bad = ids[(ids < 0) | (ids >= self.vocab)]
        if bad.size:
            raise ReferenceError(f"token id {int(bad[0])} out of range [0, {self.vocab})")
        x = self.t["model.embed_tokens.weight"][ids]
        cos, sin = rope_cos_sin(self.inv_freq, np.arange(ids.size))
        for i in range(self.n_layers):
            p = f"model.layers.{i}."
            h = rms_norm(x, self.t[p + "input_layernorm.weight"], self.eps)
            x = x + self.attention(i, h, cos, sin)
            h = rms_norm(x, self.t[p + "post_attention_layernorm.weight"], self.eps)
            x = x + self.mlp(i, h)
        x = rms_norm(x, self.t["model.norm.weight"], self.eps)
        head = self.t["model.embed_tokens.weight"] if self.tied else self.t["lm_head.weight"]
        return x @ head.T


def reference_model(model_dir):
    """The reference of the directory's model type (deepseek_v2/v3: hf_deepseek.py)."""
    if load_config(model_dir).get("model_type") in ("deepseek_v2", "deepseek_v3"):
        import hf_deepseek
        return hf_deepseek.DeepseekReference(model_dir)
    if load_config(model_dir).get("model_type") == "gpt_oss":
        import hf_gpt_oss
        return hf_gpt_oss.GptOssReference(model_dir)
    if load_config(model_dir).get("model_type") == "llama4_text":
        import hf_llama4   # torch, float64 (autograd for gradients)
        return hf_llama4.Llama4Reference(model_dir)
    return HFReference(model_dir)


def reference_logits(model_dir, tokens):
    return reference_model(model_dir).forward(tokens)


def greedy_generate(model, prompt, n_new):
    """Greedy decoding by re-running the full forward on the growing sequence.
    Returns (new ids, smallest top-1/top-2 logit gap seen)."""
    seq = list(prompt)
    new, min_gap = [], float("inf")
    for _ in range(n_new):
        last = model.forward(seq)[-1]
        top2 = np.sort(last)[-2:]
        min_gap = min(min_gap, float(top2[1] - top2[0]))
        nxt = int(np.argmax(last))
        new.append(nxt)
        seq.append(nxt)
    return new, min_gap


# ---------------------------------------------------------------------------
# self-test: tiny models written here, invariants that must hold
# ---------------------------------------------------------------------------

def make_tiny(model_dir, arch="llama", seed=0, hidden=32, inter=48, layers=2, heads=4, kv_heads=2,
              head_dim=None, vocab=61, tied=False, dtype="F32", extra=None, qk_std=0.25, shard=False):
    """Write a random tiny HF-layout model; returns (config, float64 tensors as stored)."""
    rng = np.random.default_rng(seed)
    D = head_dim or hidden // heads
    cfg = {"model_type": arch, "architectures": [{"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM",
                                                  "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}[arch]],
           "hidden_size": hidden, "intermediate_size": inter, "num_hidden_layers": layers,
           "num_attention_heads": heads, "num_key_value_heads": kv_heads, "vocab_size": vocab,
           "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "rope_scaling": None,
           "max_position_embeddings": 128, "tie_word_embeddings": tied, "attention_bias": False,
           "hidden_act": "silu", "torch_dtype": {"F32": "float32", "BF16": "bfloat16", "F16": "float16"}[dtype]}
    if head_dim:
        cfg["head_dim"] = head_dim
    if arch == "qwen3":
        cfg["head_dim"] = D
    if extra:
        cfg.update(extra)

    def n(*shape, std=0.1):
        return rng.normal(0.0, std, size=shape)

    t = {"model.embed_tokens.weight": n(vocab, hidden, std=1.0),
         "model.norm.weight": 1.0 + n(hidden)}
    if not tied:
        t["lm_head.weight"] = n(vocab, hidden, std=0.2)
    for i in range(layers):
        p = f"model.layers.{i}."
        t[p + "input_layernorm.weight"] = 1.0 + n(hidden)
        t[p + "post_attention_layernorm.weight"] = 1.0 + n(hidden)
        t[p + "self_attn.q_proj.weight"] = n(heads * D, hidden, std=qk_std)
        t[p + "self_attn.k_proj.weight"] = n(kv_heads * D, hidden, std=qk_std)
        t[p + "self_attn.v_proj.weight"] = n(kv_heads * D, hidden, std=0.2)
        t[p + "self_attn.o_proj.weight"] = n(hidden, heads * D, std=0.2)
        if arch == "qwen2" or (arch in ("llama", "qwen3") and cfg.get("attention_bias")):
            t[p + "self_attn.q_proj.bias"] = n(heads * D)
            t[p + "self_attn.k_proj.bias"] = n(kv_heads * D)
            t[p + "self_attn.v_proj.bias"] = n(kv_heads * D)
        if arch in ("llama", "qwen3") and cfg.get("attention_bias"):
            t[p + "self_attn.o_proj.bias"] = n(hidden)
        if arch == "qwen3":
            t[p + "self_attn.q_norm.weight"] = 1.0 + n(D)
            t[p + "self_attn.k_norm.weight"] = 1.0 + n(D)
        t[p + "mlp.gate_proj.weight"] = n(inter, hidden, std=0.2)
        t[p + "mlp.up_proj.weight"] = n(inter, hidden, std=0.2)
        t[p + "mlp.down_proj.weight"] = n(hidden, inter, std=0.2)
    os.makedirs(model_dir, exist_ok=True)
    with open(os.path.join(model_dir, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    enc = {k: encode_tensor(v, dtype) for k, v in t.items()}
    if shard:
        names = sorted(enc)
        half = len(names) // 2
        parts = {"model-00001-of-00002.safetensors": names[:half],
                 "model-00002-of-00002.safetensors": names[half:]}
        wmap = {}
        for fn, ns in parts.items():
            write_safetensors_raw(os.path.join(model_dir, fn), {k: enc[k] for k in ns})
            wmap.update({k: fn for k in ns})
        with open(os.path.join(model_dir, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {}, "weight_map": wmap}, f)
    else:
        write_safetensors_raw(os.path.join(model_dir, "model.safetensors"), enc)
    stored = {k: decode_tensor(*enc[k]) for k in enc}
    return cfg, stored


def _rel(a, b):
    return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


def self_test(verbose=True):
    """Returns the number of failed checks."""
    failures = []

    def check(cond, what):
        if verbose:
            print(f"  [{'ok' if cond else 'FAIL'}] {what}")
        if not cond:
            failures.append(what)

    rng = np.random.default_rng(123)
    with tempfile.TemporaryDirectory(prefix="hfref-selftest-") as tmp:
        d = lambda name: os.path.join(tmp, name)  # noqa: E731

        # --- dtype conversions
        bits = np.array([0x3F80, 0xC000, 0x0000, 0x8000, 0x7F80, 0x3E20], dtype=np.uint16)
        check(np.array_equal(bf16_bits_to_f32(bits), np.array([1.0, -2.0, 0.0, -0.0, np.inf, 0.15625],
                                                              dtype=np.float32)), "bf16 -> f32 known values")
        x = rng.normal(size=1000).astype(np.float32)
        back = bf16_bits_to_f32(f32_to_bf16_bits(x))
        check(np.all(np.abs(back - x) <= np.abs(x) * 2.0 ** -8), "f32 -> bf16 rounding within half an ulp")
        check(np.array_equal(f32_to_bf16_bits(np.array([1.00390625], np.float32)), np.array([0x3F80], np.uint16))
              and np.array_equal(f32_to_bf16_bits(np.array([1.01171875], np.float32)),
                                 np.array([0x3F82], np.uint16)), "f32 -> bf16 ties to even")

        # --- safetensors round trip, F32 / BF16 / F16, single and sharded
        for dt in ("F32", "BF16", "F16"):
            arr = rng.normal(size=(3, 5)).astype(np.float32)
            write_safetensors(d(f"rt_{dt}.safetensors"), {"a": arr, "b": arr[:1]}, dtype=dt,
                              metadata={"format": "pt"})
            got = read_safetensors(d(f"rt_{dt}.safetensors"))
            tol = {"F32": 0.0, "BF16": 2.0 ** -8, "F16": 2.0 ** -11}[dt]
            check(got["a"].shape == (3, 5) and np.all(np.abs(got["a"] - arr) <= np.abs(arr) * tol + 1e-7)
                  and np.array_equal(got["b"], got["a"][:1]), f"safetensors round trip {dt}")
        with open(d("rt_F32.safetensors"), "rb") as f:
            (hl,) = struct.unpack("<Q", f.read(8))
        check(hl % 8 == 0, "header padded to 8 bytes")

        _, stored = make_tiny(d("single"), seed=5)
        make_tiny(d("sharded"), seed=5, shard=True)
        ref_single = HFReference(d("single")).forward([1, 2, 3, 4, 5])
        ref_sharded = HFReference(d("sharded")).forward([1, 2, 3, 4, 5])
        check(np.array_equal(ref_single, ref_sharded), "sharded checkpoint == single file")

        # malformed files are refused with the tensor's name
        raw = read_safetensors_raw(d("single") + "/model.safetensors")
        bad = dict(raw)
        name = "model.layers.0.mlp.up_proj.weight"
        dt, shape, r = bad[name]
        bad[name] = (dt, shape, r[:-4])
        write_safetensors_raw(d("bad.safetensors"), bad)
        try:
            read_safetensors(d("bad.safetensors"))
            check(False, "size/shape mismatch refused")
        except ReferenceError as e:
            check(name in str(e), "size/shape mismatch refused, names the tensor")

        # --- invariants of the forward pass
        T = 24
        toks = list(rng.integers(0, 61, size=T))
        for arch in DENSE_ARCHS:   # make_tiny writes dense models; the MoE ones are made by make-model
            make_tiny(d(f"c_{arch}"), arch=arch, seed=11)
            m = HFReference(d(f"c_{arch}"))
            a = m.forward(toks)
            toks2 = toks[:15] + list((np.array(toks[15:]) + 7) % 61)
            b = m.forward(toks2)
            check(_rel(b[:15], a[:15]) < 1e-13 and _rel(a[15:], b[15:]) > 1e-3,
                  f"{arch}: causal (positions < 15 unchanged when later tokens change)")
            check(_rel(m.forward(toks[:10]), a[:10]) < 1e-13, f"{arch}: prefix forward == full forward rows")

        # tied: an untied model whose lm_head equals embed_tokens gives the same logits
        _, st = make_tiny(d("tied"), seed=3, tied=True)
        cfg_u = load_config(d("tied"))
        cfg_u["tie_word_embeddings"] = False
        st_u = dict(st)
        st_u["lm_head.weight"] = st["model.embed_tokens.weight"]
        lt = HFReference(d("tied")).forward(toks)
        lu = HFReference(d("tied"), cfg=cfg_u, tensors=st_u).forward(toks)
        check(np.array_equal(lt, lu), "tied == untied with lm_head := embed_tokens")
        st_u["lm_head.weight"] = st["model.embed_tokens.weight"] * 1.5
        check(_rel(HFReference(d("tied"), cfg=cfg_u, tensors=st_u).forward(toks), lt) > 0.1,
              "untied uses lm_head.weight")

        # GQA == MHA with k/v heads repeated (query head h reads kv head h // group)
        cfg_g, st_g = make_tiny(d("gqa"), seed=4, heads=4, kv_heads=2)
        cfg_m = dict(cfg_g, num_key_value_heads=4)
        st_m = dict(st_g)
        D = 8
        for i in range(2):
            for kv in ("k_proj", "v_proj"):
                w = st_g[f"model.layers.{i}.self_attn.{kv}.weight"].reshape(2, D, 32)
                st_m[f"model.layers.{i}.self_attn.{kv}.weight"] = np.repeat(w, 2, axis=0).reshape(4 * D, 32)
        lg = HFReference(d("gqa"), cfg=cfg_g, tensors=st_g).forward(toks)
        lm = HFReference(d("gqa"), cfg=cfg_m, tensors=st_m).forward(toks)
        check(_rel(lg, lm) < 1e-12, "GQA == MHA with repeat_interleave'd k/v heads")
        st_m2 = dict(st_m)
        for i in range(2):  # tile instead of repeat_interleave: must differ
            for kv in ("k_proj", "v_proj"):
                w = st_g[f"model.layers.{i}.self_attn.{kv}.weight"].reshape(2, D, 32)
                st_m2[f"model.layers.{i}.self_attn.{kv}.weight"] = np.tile(w, (2, 1, 1)).reshape(4 * D, 32)
        check(_rel(HFReference(d("gqa"), cfg=cfg_m, tensors=st_m2).forward(toks), lg) > 1e-3,
              "GQA grouping is repeat_interleave, not tile")

        # RoPE: scores depend on relative position only; rotation preserves norms
        inv = rope_inv_freq({"rope_theta": 10000.0}, 16)
        q = rng.normal(size=16)
        k = rng.normal(size=16)

        def rot(v, pos):
            c, s = rope_cos_sin(inv, [pos])
            return apply_rope(v[None, None], c, s)[0, 0]
        check(abs(rot(q, 7) @ rot(k, 3) - rot(q, 14) @ rot(k, 10)) < 1e-12
              and abs(np.linalg.norm(rot(q, 9)) - np.linalg.norm(q)) < 1e-12, "RoPE relative-position property")
        check(np.allclose(inv, [10000.0 ** (-i / 8) for i in range(8)], rtol=1e-14), "default inv_freq")
        # linear: factor f at position p == default at p / f
        lin = rope_inv_freq({"rope_theta": 10000.0, "rope_scaling": {"rope_type": "linear", "factor": 2.0}}, 16)
        c1, s1 = rope_cos_sin(lin, [10])
        c2, s2 = rope_cos_sin(inv, [5])
        check(np.allclose(c1, c2, atol=1e-14) and np.allclose(s1, s2, atol=1e-14), "linear rope = positions / factor")
        # "type" is accepted as the old name of "rope_type"
        lin2 = rope_inv_freq({"rope_theta": 10000.0, "rope_scaling": {"type": "linear", "factor": 2.0}}, 16)
        check(np.array_equal(lin, lin2), "rope_scaling 'type' alias")
        # llama3: high freqs untouched, low freqs / factor, medium smoothed, continuous
        l3cfg = {"rope_theta": 10000.0, "rope_scaling": {"rope_type": "llama3", "factor": 8.0,
                 "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 16}}
        l3 = rope_inv_freq(l3cfg, 16)
        wl = 2 * math.pi / inv
        ok = True
        for i in range(8):
            if wl[i] < 16 / 4.0:
                ok &= l3[i] == inv[i]
            elif wl[i] > 16 / 1.0:
                ok &= abs(l3[i] - inv[i] / 8.0) < 1e-18
            else:
                sm = (16 / wl[i] - 1.0) / 3.0
                ok &= abs(l3[i] - ((1 - sm) * inv[i] / 8.0 + sm * inv[i])) < 1e-15
                ok &= inv[i] / 8.0 < l3[i] < inv[i]
        check(ok and np.sum((wl >= 4) & (wl <= 16)) >= 1 and np.sum(wl > 16) >= 1,
              "llama3 rope: wavelength bands (with at least one smoothed and one scaled band)")
        # smooth factor is continuous at the band edges
        eps_cfg = dict(l3cfg)
        eps_cfg["rope_scaling"] = dict(l3cfg["rope_scaling"], original_max_position_embeddings=2 * math.pi * 1.0)
        e = rope_inv_freq(eps_cfg, 16)  # wavelen of band 0 (2*pi) == low_freq_wavelen exactly
        check(abs(e[0] - inv[0] / 8.0) < 1e-15, "llama3 rope continuous at the low-frequency edge")
        try:
            rope_inv_freq({"rope_scaling": {"rope_type": "yarn", "factor": 2.0}}, 16)
            check(False, "yarn refused")
        except ReferenceError as ex:
            check("rope_scaling" in str(ex), "unsupported rope_scaling type refused")

        # rope scaling changes logits at these positions
        make_tiny(d("r_none"), seed=8)
        make_tiny(d("r_l3"), seed=8, extra={"rope_scaling": l3cfg["rope_scaling"]})
        check(_rel(HFReference(d("r_l3")).forward(toks), HFReference(d("r_none")).forward(toks)) > 1e-3,
              "llama3 scaling changes the logits")

        # sliding window: window >= T changes nothing; window 1 -> each position sees only itself
        make_tiny(d("m_none"), arch="mistral", seed=9, extra={"sliding_window": None})
        make_tiny(d("m_big"), arch="mistral", seed=9, extra={"sliding_window": T})
        make_tiny(d("m_1"), arch="mistral", seed=9, extra={"sliding_window": 1})
        make_tiny(d("m_4"), arch="mistral", seed=9, extra={"sliding_window": 4})
        a = HFReference(d("m_none")).forward(toks)
        check(np.array_equal(a, HFReference(d("m_big")).forward(toks)), "mistral: window >= T == no window")
        m1 = HFReference(d("m_1"))
        solo = np.stack([m1.forward([tk])[0] for tk in toks])
        check(_rel(m1.forward(toks), solo) < 1e-12, "mistral: window 1 == every token alone")
        m4 = HFReference(d("m_4"))
        l4 = m4.forward(toks)
        # with 2 layers and window 4, position t depends on tokens t-6..t only (receptive field 2*(4-1))
        toks3 = list(toks)
        toks3[10] = (toks3[10] + 1) % 61
        l4b = m4.forward(toks3)
        check(np.array_equal(l4[:10], l4b[:10]) and np.array_equal(l4[17:], l4b[17:])
              and _rel(l4[10:17], l4b[10:17]) > 1e-6, "mistral: window 4 receptive field (i - j < window)")
        make_tiny(d("q_sw"), arch="qwen2", seed=9, extra={"sliding_window": 1, "use_sliding_window": False})
        make_tiny(d("q_nosw"), arch="qwen2", seed=9)
        check(np.array_equal(HFReference(d("q_sw")).forward(toks), HFReference(d("q_nosw")).forward(toks)),
              "qwen2: sliding_window ignored unless use_sliding_window")
        make_tiny(d("q_sw2"), arch="qwen2", seed=9, extra={"sliding_window": 1, "use_sliding_window": True,
                                                          "max_window_layers": 1})
        check(HFReference(d("q_sw2")).windows == [None, 1], "qwen2: sliding only from max_window_layers on")

        # qwen3: q_norm/k_norm make attention invariant to scaling q_proj/k_proj
        cfg3, st3 = make_tiny(d("q3"), arch="qwen3", seed=10)
        st3s = dict(st3)
        for i in range(2):
            st3s[f"model.layers.{i}.self_attn.q_proj.weight"] = st3[f"model.layers.{i}.self_attn.q_proj.weight"] * 3.0
            st3s[f"model.layers.{i}.self_attn.k_proj.weight"] = st3[f"model.layers.{i}.self_attn.k_proj.weight"] * 0.5
        l3a = HFReference(d("q3"), cfg=cfg3, tensors=st3).forward(toks)
        l3b = HFReference(d("q3"), cfg=cfg3, tensors=st3s).forward(toks)
        check(_rel(l3a, l3b) < 1e-6, "qwen3: q/k scale invariance from q_norm/k_norm")
        # ... and q_norm weight acts per head_dim element, shared by all heads
        st3w = dict(st3)
        st3w["model.layers.0.self_attn.q_norm.weight"] = st3["model.layers.0.self_attn.q_norm.weight"] * 1.3
        check(_rel(HFReference(d("q3"), cfg=cfg3, tensors=st3w).forward(toks), l3a) > 1e-4,
              "qwen3: q_norm weight is used")

        # qwen3 with head_dim != hidden/heads
        make_tiny(d("q3hd"), arch="qwen3", seed=12, head_dim=16)
        check(HFReference(d("q3hd")).forward(toks).shape == (T, 61), "qwen3: explicit head_dim 16 != 32/4")

        # qwen2 q/k/v biases are used
        cfg2, st2 = make_tiny(d("q2"), arch="qwen2", seed=13)
        st2b = dict(st2)
        st2b["model.layers.1.self_attn.v_proj.bias"] = st2["model.layers.1.self_attn.v_proj.bias"] + 0.5
        check(_rel(HFReference(d("q2"), cfg=cfg2, tensors=st2b).forward(toks),
                   HFReference(d("q2"), cfg=cfg2, tensors=st2).forward(toks)) > 1e-4, "qwen2: v bias is used")

        # an independent, loop-by-loop formulation of one llama forward (no vectorized attention)
        cfg_l, st_l = make_tiny(d("loop"), seed=14, layers=1, heads=4, kv_heads=1)
        m = HFReference(d("loop"))
        tk = toks[:9]
        check(_rel(m.forward(tk), _loop_forward(cfg_l, st_l, tk)) < 1e-12, "vectorized == scalar-loop forward")

        # bf16-stored weights are read exactly as their f32 widening
        make_tiny(d("bf"), seed=15, dtype="BF16")
        st_bf = read_safetensors(d("bf") + "/model.safetensors")
        w = st_bf["model.layers.0.mlp.up_proj.weight"]
        check(np.array_equal(w, w.astype(np.float32).astype(np.float64))
              and np.all((w.astype(np.float32).view(np.uint32) & 0xFFFF) == 0), "bf16 weights widen exactly")

    if verbose:
        print(f"self-test: {'all checks passed' if not failures else f'{len(failures)} FAILED'}")
    return len(failures)


def _loop_forward(cfg, t, tokens):
    """Deliberately naive llama forward: per position, per head loops."""
    H = cfg["hidden_size"]
    nh = cfg["num_attention_heads"]
    nkv = cfg["num_key_value_heads"]
    D = H // nh
    eps = cfg["rms_norm_eps"]
    theta = cfg["rope_theta"]

    def norm(v, w):
        return w * v / math.sqrt(sum(x * x for x in v) / len(v) + eps)

    def rope(v, pos):
        out = np.empty(D)
        for i in range(D // 2):
            ang = pos * theta ** (-2.0 * i / D)
            c, s = math.cos(ang), math.sin(ang)
            out[i] = v[i] * c - v[i + D // 2] * s
            out[i + D // 2] = v[i + D // 2] * c + v[i] * s
        return out

    xs = [t["model.embed_tokens.weight"][tk].copy() for tk in tokens]
    for L in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{L}."
        hs = [norm(x, t[p + "input_layernorm.weight"]) for x in xs]
        qs = [t[p + "self_attn.q_proj.weight"] @ h for h in hs]
        ks = [t[p + "self_attn.k_proj.weight"] @ h for h in hs]
        vs = [t[p + "self_attn.v_proj.weight"] @ h for h in hs]
        new = []
        for i in range(len(xs)):
            o = np.zeros(nh * D)
            for h in range(nh):
                g = h // (nh // nkv)
                qi = rope(qs[i][h * D:(h + 1) * D], i)
                sc = [rope(ks[j][g * D:(g + 1) * D], j) @ qi / math.sqrt(D) for j in range(i + 1)]
                mx = max(sc)
                e = [math.exp(s - mx) for s in sc]
                z = sum(e)
                for j in range(i + 1):
                    o[h * D:(h + 1) * D] += e[j] / z * vs[j][g * D:(g + 1) * D]
            x = xs[i] + t[p + "self_attn.o_proj.weight"] @ o
            hh = norm(x, t[p + "post_attention_layernorm.weight"])
            gt = t[p + "mlp.gate_proj.weight"] @ hh
            up = t[p + "mlp.up_proj.weight"] @ hh
            act = np.array([g_ / (1 + math.exp(-g_)) for g_ in gt]) * up
            new.append(x + t[p + "mlp.down_proj.weight"] @ act)
        xs = new
    head = t["model.embed_tokens.weight"] if cfg["tie_word_embeddings"] else t["lm_head.weight"]
    return np.stack([head @ norm(x, t["model.norm.weight"]) for x in xs])


# ---------------------------------------------------------------------------

def parse_tokens(s):
    try:
        toks = [int(x) for x in s.split(",") if x.strip() != ""]
    except ValueError:
        raise SystemExit(f"hf_reference: --tokens must be comma-separated integers, got {s!r}")
    if not toks:
        raise SystemExit("hf_reference: --tokens is empty")
    return toks


def main(argv=None):
    ap = argparse.ArgumentParser(description="NumPy float64 reference of HF llama/mistral/qwen2/qwen3/qwen3_moe/mixtral logits")
    ap.add_argument("--model", help="Hugging Face model directory")
    ap.add_argument("--tokens", help="comma-separated token ids")
    ap.add_argument("--out", help="output .npy: float32 logits [T, vocab]")
    ap.add_argument("--self-test", action="store_true", help="run the reference's own checks")
    a = ap.parse_args(argv)
    if a.self_test:
        return 1 if self_test() else 0
    if not (a.model and a.tokens and a.out):
        ap.error("--model, --tokens and --out are required")
    try:
        logits = reference_logits(a.model, parse_tokens(a.tokens))
    except ReferenceError as e:
        print(f"hf_reference: error: {e}", file=sys.stderr)
        return 1
    np.save(a.out, logits.astype(np.float32))
    return 0


if __name__ == "__main__":
    sys.exit(main())
