#!/usr/bin/python3
"""An independent autograd reference for the causal-LM loss and its gradients.

The decoder of Llama, Mistral, Qwen2 and Qwen3 written with PyTorch (deepseek_v2/v3:
hf_deepseek.torch_logits) (Debian's
python3-torch) after the structure of Transformers' modeling code
(LlamaForCausalLM and its siblings): RMSNorm computed in float, rotate_half
RoPE with the default, linear and llama3 frequency schedules, repeat_kv for
grouped-query attention, Mistral's sliding window, Qwen2's q/k/v biases,
Qwen3's per-head q_norm/k_norm, tied embeddings, and ForCausalLMLoss (labels
shifted inside, -100 ignored, mean over counted tokens).  torch.autograd
gives the gradients.  Everything runs in float64, so the reference is the
exact result against which float32 engines are measured.

It shares no code with tensorpar nor with hf_reference.py: the checkpoint is
read here with its own small safetensors reader.

    /usr/bin/python3 tests/reference/hf_reference_grad.py --model DIR --tokens 1,2,3 --out FILE.npz
writes every gradient under its Hugging Face name, plus `loss`.
"""

import argparse
import json
import math
import os
import struct
import sys

import numpy as np
import torch

IGNORE = -100


# ---- the checkpoint ---------------------------------------------------------

def _read_file(path):
    with open(path, "rb") as f:
        data = f.read()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    base = 8 + n
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        a, b = e["data_offsets"]
        raw = data[base + a:base + b]
        if e["dtype"] == "F32":
            x = np.frombuffer(raw, dtype="<f4").astype(np.float64)
        elif e["dtype"] == "BF16":
            x = (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view(np.float32).astype(np.float64)
        elif e["dtype"] == "F16":
            x = np.frombuffer(raw, dtype="<f2").astype(np.float64)
        else:
            raise ValueError(f"{path}: {name}: dtype {e['dtype']} not handled")
        out[name] = x.reshape(e["shape"])
    return out


def load_weights(model_dir):
    index = os.path.join(model_dir, "model.safetensors.index.json")
    if not os.path.exists(index):
        return _read_file(os.path.join(model_dir, "model.safetensors"))
    with open(index) as f:
        files = sorted(set(json.load(f)["weight_map"].values()))
    out = {}
    for fn in files:
        out.update(_read_file(os.path.join(model_dir, fn)))
    return out


# ---- the modules ------------------------------------------------------------

def rms_norm(x, w, eps):
    # LlamaRMSNorm: variance in float, then the weight
    var = x.pow(2).mean(-1, keepdim=True)
    return w * (x * torch.rsqrt(var + eps))


def inv_frequencies(cfg, dim):
    base = float(cfg.get("rope_theta", 10000.0))
    inv = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    rs = cfg.get("rope_scaling") or {}
    kind = rs.get("rope_type", rs.get("type", "default"))
    if kind == "linear":
        inv = inv / float(rs["factor"])
    elif kind == "llama3":
        factor, lo, hi = float(rs["factor"]), float(rs["low_freq_factor"]), float(rs["high_freq_factor"])
        old = float(rs["original_max_position_embeddings"])
        low_wavelen, high_wavelen = old / lo, old / hi
        wavelen = 2 * math.pi / inv
        scaled = torch.where(wavelen > low_wavelen, inv / factor, inv)
        smooth = (old / wavelen - lo) / (hi - lo)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
        inv = torch.where(medium, smoothed, scaled)
    elif kind not in ("default", None):
        raise ValueError(f"rope_type {kind} not handled")
    return inv


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def repeat_kv(x, n_rep):
    # [heads_kv, T, D] -> [heads_kv * n_rep, T, D], each KV head repeated for its group
    if n_rep == 1:
        return x
    h, t, d = x.shape
    return x[:, None, :, :].expand(h, n_rep, t, d).reshape(h * n_rep, t, d)


def window_of(cfg):
    w = cfg.get("sliding_window")
    if not w:
        return None
    if cfg.get("model_type") in ("qwen2", "qwen3") and not cfg.get("use_sliding_window", False):
        return None
    return int(w)


def causal_mask(T, window):
    q = torch.arange(T)[:, None]
    k = torch.arange(T)[None, :]
    allowed = k <= q
    if window is not None:
        allowed &= (q - k) < window
    mask = torch.zeros(T, T, dtype=torch.float64)
    return mask.masked_fill(~allowed, float("-inf"))


def linear(x, p, name, adapter=None):
    """x·Wᵀ + b, plus adapter(name, x) when that gives a term (LoRA with dropout)."""
    y = x @ p[name + ".weight"].T
    b = p.get(name + ".bias")
    y = y + b if b is not None else y
    extra = adapter(name, x) if adapter else None
    return y if extra is None else y + extra


def attention(x, p, pre, cfg, cos, sin, mask, adapter=None):
    T = x.shape[0]
    nq, nkv = cfg["num_attention_heads"], cfg.get("num_key_value_heads") or cfg["num_attention_heads"]
    D = cfg.get("head_dim") or cfg["hidden_size"] // nq
    eps = cfg["rms_norm_eps"]
    q = linear(x, p, pre + "q_proj", adapter).view(T, nq, D)
    k = linear(x, p, pre + "k_proj", adapter).view(T, nkv, D)
    v = linear(x, p, pre + "v_proj", adapter).view(T, nkv, D)
    if pre + "q_norm.weight" in p:   # Qwen3: per head, before the rotation
        q = rms_norm(q, p[pre + "q_norm.weight"], eps)
        k = rms_norm(k, p[pre + "k_norm.weight"], eps)
    q, k, v = q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1)   # [heads, T, D]
    q = q * cos + rotate_half(q) * sin
    k = k * cos + rotate_half(k) * sin
    k, v = repeat_kv(k, nq // nkv), repeat_kv(v, nq // nkv)
    scores = (q @ k.transpose(1, 2)) / math.sqrt(D) + mask
    probs = torch.softmax(scores, dim=-1)
    out = (probs @ v).transpose(0, 1).reshape(T, nq * D)
    return linear(out, p, pre + "o_proj", adapter)


def mlp(x, p, pre, adapter=None):
    g = linear(x, p, pre + "gate_proj", adapter)
    u = linear(x, p, pre + "up_proj", adapter)
    return linear(torch.nn.functional.silu(g) * u, p, pre + "down_proj", adapter)


def sparse_layer(cfg, i):
    """Qwen3MoeDecoderLayer's rule (mlp_only_layers, decoder_sparse_step); Mixtral: every layer."""
    if cfg.get("model_type") == "mixtral":
        return True
    if cfg.get("model_type") != "qwen3_moe" or int(cfg.get("num_experts", 0)) <= 0:
        return False
    step = int(cfg.get("decoder_sparse_step", 1))
    return i not in (cfg.get("mlp_only_layers") or []) and (i + 1) % step == 0


def sparse_moe(x, p, cfg, i):
    """Qwen3MoeSparseMoeBlock / MixtralSparseMoeBlock: softmax (float) over every expert,
    torch.topk, renormalised (norm_topk_prob; Mixtral always), each expert's SwiGLU
    weighted; autograd flows through the chosen weights, not through the choice.  The
    router aux loss is not added: output_router_logits is False in both configs."""
    mixtral = cfg.get("model_type") == "mixtral"
    pre = f"model.layers.{i}." + ("block_sparse_moe." if mixtral else "mlp.")
    E = int(cfg["num_local_experts"] if mixtral else cfg["num_experts"])
    k = int(cfg.get("num_experts_per_tok", 2))
    probs = torch.softmax(x @ p[pre + "gate.weight"].T, dim=-1)
    weights, chosen = torch.topk(probs, k, dim=-1)
    if mixtral or cfg.get("norm_topk_prob", False):
        weights = weights / weights.sum(dim=-1, keepdim=True)
    out = torch.zeros_like(x)
    names = ("w1", "w3", "w2") if mixtral else ("gate_proj", "up_proj", "down_proj")
    for e in range(E):
        tok, slot = torch.nonzero(chosen == e, as_tuple=True)
        if tok.numel() == 0:
            continue
        g, u, d = (p[f"{pre}experts.{e}.{n}.weight"] for n in names)
        h = x[tok]
        y = (torch.nn.functional.silu(h @ g.T) * (h @ u.T)) @ d.T
        out = out.index_add(0, tok, y * weights[tok, slot][:, None])
    return out


def causal_lm_loss(logits, tokens):
    # ForCausalLMLoss: labels = input ids, padded with -100 and shifted
    labels = torch.tensor(list(tokens[1:]) + [IGNORE])
    return torch.nn.functional.cross_entropy(logits, labels, ignore_index=IGNORE, reduction="mean")


def forward_loss(cfg, p, tokens):
    return causal_lm_loss(forward_logits(cfg, p, tokens), tokens)


def forward_logits(cfg, p, tokens, adapter=None):
    """The [T, vocab] logits of one sequence (no batch dimension); adapter(name, x),
    when given, adds a term to each projection (None: nothing)."""
    if cfg.get("model_type") in ("deepseek_v2", "deepseek_v3"):
        if adapter is not None:
            raise ValueError("adapters are not handled for deepseek models")
        import hf_deepseek   # multi-head latent attention and DeepSeek's routers: their own file
        return hf_deepseek.torch_logits(cfg, p, tokens)
    T = len(tokens)
    nq = cfg["num_attention_heads"]
    D = cfg.get("head_dim") or cfg["hidden_size"] // nq
    eps = cfg["rms_norm_eps"]
    ids = torch.tensor(tokens)
    inv = inv_frequencies(cfg, D)
    freqs = torch.arange(T, dtype=torch.float64)[:, None] * inv[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    dt = p["model.embed_tokens.weight"].dtype   # float64; float32 only to measure float32 rounding
    cos, sin = emb.cos().to(dt), emb.sin().to(dt)
    mask = causal_mask(T, window_of(cfg)).to(dt)
    h = p["model.embed_tokens.weight"][ids]
    for i in range(cfg["num_hidden_layers"]):
        pre = f"model.layers.{i}."
        h = h + attention(rms_norm(h, p[pre + "input_layernorm.weight"], eps), p, pre + "self_attn.", cfg,
                          cos, sin, mask, adapter)
        hn = rms_norm(h, p[pre + "post_attention_layernorm.weight"], eps)
        h = h + (sparse_moe(hn, p, cfg, i) if sparse_layer(cfg, i) else mlp(hn, p, pre + "mlp.", adapter))
    h = rms_norm(h, p["model.norm.weight"], eps)
    head = p["model.embed_tokens.weight"] if cfg.get("tie_word_embeddings") else p["lm_head.weight"]
    return h @ head.T


def reference_grads(model_dir, tokens):
    """(loss, {HF name: gradient}) as float64 NumPy; a tied lm_head has no entry of its own."""
    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = json.load(f)
    weights = load_weights(model_dir)
    if cfg.get("tie_word_embeddings"):
        weights.pop("lm_head.weight", None)
    p = {k: torch.tensor(v, dtype=torch.float64, requires_grad=True) for k, v in weights.items()}
    loss = forward_loss(cfg, p, [int(t) for t in tokens])
    loss.backward()
    # an expert no token chose has no gradient in torch (None): zeros here
    return float(loss.item()), {k: v.grad.numpy() if v.grad is not None else np.zeros(tuple(v.shape))
                                for k, v in p.items()}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--tokens", required=True)
    ap.add_argument("--out", required=True, help=".npz with every gradient and `loss`")
    a = ap.parse_args(argv)
    loss, grads = reference_grads(a.model, [int(t) for t in a.tokens.split(",")])
    np.savez(a.out, loss=np.float64(loss), **grads)
    return 0


if __name__ == "__main__":
    sys.exit(main())
