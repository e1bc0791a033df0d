#!/usr/bin/python3
"""Independent PyTorch (float64, autograd) reference of Hugging Face's gpt_oss
causal LM, written from Transformers' modeling_gpt_oss.py,
configuration_gpt_oss.py and modeling_rope_utils.py (not from the C engine):

* GptOssAttention: q/k/v/o Linears with biases (attention_bias), head_dim
  from the config, rotary embedding on halves (_apply_rotary_emb) with cos
  and sin times YaRN's attention factor, grouped-query attention
  (repeat_kv), scaling head_dim^-1/2, and eager_attention_forward's sinks:
  each head's learned logit `sinks` is concatenated to every row of the
  scores, the row softmaxed (after subtracting its max) and the sink's
  column dropped.
* layer_types: "sliding_attention" layers see the keys j with
  i - sliding_window < j <= i (create_sliding_window_causal_mask),
  "full_attention" layers every j <= i; GptOssConfig's default alternates
  sliding, full, ... from layer 0.
* YaRN (_compute_yarn_parameters): the ramp between the correction
  dimensions of beta_fast and beta_slow rotations at
  original_max_position_embeddings, floored/ceiled unless truncate is
  false; factor = max_position_embeddings / original_max_position_embeddings
  when the latter is given (Transformers 4.55-4.57, which gpt-oss shipped
  with; the same value for the published config); attention factor
  0.1·ln(factor) + 1.
* GptOssMLP: GptOssTopKRouter (Linear with bias, top-k of the logits, a
  softmax over those k), GptOssExperts: gate_up_proj [E, H, 2I] with
  gate_up_proj_bias [E, 2I], gate = gate_up[..., ::2], up = gate_up[..., 1::2],
  gate clamped above at limit, up to [-limit, limit],
  glu = gate·sigmoid(gate·alpha), (up + 1)·glu, down_proj [E, I, H] +
  down_proj_bias, weighted by the routing score; alpha 1.702, limit 7.0
  (swiglu_alpha / swiglu_limit when the config names them).
* GptOssRMSNorm: weight times the normalised value (eps rms_norm_eps).

Gradients come from torch autograd on the same forward (grads())."""

import math
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_reference as base  # noqa: E402

DT = torch.float64


def config(model_dir):
    cfg = base.load_config(model_dir)
    if cfg.get("model_type") != "gpt_oss":
        raise base.ReferenceError(f"{model_dir}: not a gpt_oss model")
    return cfg


def load_params(model_dir, requires_grad=False):
    """{name: float64 tensor} of the checkpoint, as stored."""
    out = {}
    for n, a in base.load_model_tensors(model_dir).items():
        t = torch.tensor(np.asarray(a, dtype=np.float64), dtype=DT)
        t.requires_grad_(requires_grad)
        out[n] = t
    return out


def layer_types(cfg):
    n = int(cfg["num_hidden_layers"])
    lt = cfg.get("layer_types")
    if lt is None:
        return ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(n)]
    return list(lt)


def yarn(cfg, dim):
    """(inv_freq [dim/2], attention_factor)."""
    theta, rtype, p = base.rope_settings_any(cfg)
    if rtype != "yarn":
        inv = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=DT) / dim))
        return inv, 1.0
    factor = float(p["factor"])
    max_pos = int(cfg.get("max_position_embeddings", 131072))
    orig = p.get("original_max_position_embeddings")
    if orig:
        factor = max_pos / int(orig)
    else:
        orig = max_pos
    af = p.get("attention_factor")
    if af is None:
        af = 1.0 if factor <= 1 else 0.1 * math.log(factor) + 1.0
    beta_fast = p.get("beta_fast") or 32
    beta_slow = p.get("beta_slow") or 1

    def corr(rot):
        return dim * math.log(int(orig) / (rot * 2 * math.pi)) / (2 * math.log(theta))

    low, high = corr(beta_fast), corr(beta_slow)
    if p.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = torch.clamp((torch.arange(dim // 2, dtype=DT) - low) / (high - low), 0, 1)
    pos_freqs = theta ** (torch.arange(0, dim, 2, dtype=DT) / dim)
    extra = 1.0 / pos_freqs
    inter = 1.0 / (factor * pos_freqs)
    extrapolation_factor = 1 - ramp
    inv = inter * (1 - extrapolation_factor) + extra * extrapolation_factor
    return inv, float(af)


def rope(x, cos, sin):
    """x [heads, T, d]; cos/sin [T, d/2]: GptOss's _apply_rotary_emb on halves."""
    h = x.shape[-1] // 2
    a, b = x[..., :h], x[..., h:]
    return torch.cat([a * cos - b * sin, b * cos + a * sin], dim=-1)


def rms_norm(x, w, eps):
    var = (x * x).mean(-1, keepdim=True)
    return w * (x * torch.rsqrt(var + eps))


def attention(cfg, P, p, x, cos, sin, window):
    T = x.shape[0]
    nh, nkv = int(cfg["num_attention_heads"]), int(cfg["num_key_value_heads"])
    D = int(cfg.get("head_dim") or int(cfg["hidden_size"]) // nh)

    def lin(name, v):
        y = v @ P[p + name + ".weight"].T
        b = P.get(p + name + ".bias")
        return y + b if b is not None else y

    q = lin("q_proj", x).view(T, nh, D).transpose(0, 1)
    k = lin("k_proj", x).view(T, nkv, D).transpose(0, 1)
    v = lin("v_proj", x).view(T, nkv, D).transpose(0, 1)
    q, k = rope(q, cos, sin), rope(k, cos, sin)
    rep = nh // nkv
    k = k.repeat_interleave(rep, dim=0)
    v = v.repeat_interleave(rep, dim=0)
    scores = (q @ k.transpose(1, 2)) * D ** -0.5                      # [nh, T, T]
    i = torch.arange(T)[:, None]
    j = torch.arange(T)[None, :]
    ok = j <= i
    if window:
        ok = ok & (j > i - window)
    scores = scores.masked_fill(~ok[None], float("-inf"))
    sinks = P[p + "sinks"].reshape(nh, 1, 1).expand(nh, T, 1)
    comb = torch.cat([scores, sinks], dim=-1)
    comb = comb - comb.max(dim=-1, keepdim=True).values
    probs = torch.softmax(comb, dim=-1)[..., :-1]
    out = (probs @ v).transpose(0, 1).reshape(T, nh * D)
    return lin("o_proj", out)


def mlp(cfg, P, p, x):
    E, k = int(cfg["num_local_experts"]), int(cfg["num_experts_per_tok"])
    alpha = float(cfg.get("swiglu_alpha", 1.702))
    limit = float(cfg.get("swiglu_limit", 7.0))
    logits = x @ P[p + "router.weight"].T + P[p + "router.bias"]
    top, idx = torch.topk(logits, k, dim=-1)
    top = torch.softmax(top, dim=1)
    scores = torch.zeros_like(logits).scatter(1, idx, top)            # [T, E]
    gu_w, gu_b = P[p + "experts.gate_up_proj"], P[p + "experts.gate_up_proj_bias"]
    dn_w, dn_b = P[p + "experts.down_proj"], P[p + "experts.down_proj_bias"]
    out = torch.zeros_like(x)
    for e in range(E):
        tok = (idx == e).any(dim=-1).nonzero().flatten()
        if tok.numel() == 0:
            continue
        cur = x[tok]
        gu = cur @ gu_w[e] + gu_b[e]
        gate, up = gu[..., ::2], gu[..., 1::2]
        gate = gate.clamp(min=None, max=limit)
        up = up.clamp(min=-limit, max=limit)
        glu = gate * torch.sigmoid(gate * alpha)
        y = ((up + 1) * glu) @ dn_w[e] + dn_b[e]
        out = out.index_add(0, tok, y * scores[tok, e, None])
    return out


def forward(cfg, P, tokens):
    """logits [T, V] (float64 torch) for one sequence from position 0."""
    H = int(cfg["hidden_size"])
    nh = int(cfg["num_attention_heads"])
    D = int(cfg.get("head_dim") or H // nh)
    eps = float(cfg.get("rms_norm_eps", 1e-5))
    inv, af = yarn(cfg, D)
    pos = torch.arange(len(tokens), dtype=DT)
    freqs = pos[:, None] * inv[None, :]
    cos, sin = torch.cos(freqs) * af, torch.sin(freqs) * af
    x = P["model.embed_tokens.weight"][torch.tensor(tokens)]
    win = cfg.get("sliding_window")
    for l, lt in enumerate(layer_types(cfg)):
        p = f"model.layers.{l}."
        h = rms_norm(x, P[p + "input_layernorm.weight"], eps)
        x = x + attention(cfg, P, p + "self_attn.", h, cos, sin, win if lt == "sliding_attention" else None)
        h = rms_norm(x, P[p + "post_attention_layernorm.weight"], eps)
        x = x + mlp(cfg, P, p + "mlp.", h)
    x = rms_norm(x, P["model.norm.weight"], eps)
    head = P["model.embed_tokens.weight"] if cfg.get("tie_word_embeddings") else P["lm_head.weight"]
    return x @ head.T


class GptOssReference:
    """hf_reference's interface: forward(tokens) -> float64 numpy logits."""

    def __init__(self, model_dir):
        self.cfg = config(model_dir)
        self.P = load_params(model_dir)

    def forward(self, tokens):
        with torch.no_grad():
            return forward(self.cfg, self.P, list(tokens)).numpy()


def reference_logits(model_dir, tokens):
    return GptOssReference(model_dir).forward(tokens)


def grads(model_dir, rows):
    """Loss and {name: gradient} of Transformers' causal-LM loss (labels =
    inputs, shifted inside, mean over all counted tokens of the rows)."""
    cfg = config(model_dir)
    P = load_params(model_dir, requires_grad=True)
    total, count = 0.0, 0
    for toks in rows:
        logits = forward(cfg, P, list(toks))
        tgt = torch.tensor(toks[1:])
        total = total + torch.nn.functional.cross_entropy(logits[:-1], tgt, reduction="sum")
        count += len(toks) - 1
    loss = total / count
    loss.backward()
    return float(loss), {n: t.grad.numpy() if t.grad is not None else np.zeros(tuple(t.shape)) for n, t in P.items()}


def reference_train(model_dir, data_path, **opts):
    """hf_reference_train's Trainer steps (its optimizer groups, schedule and
    loss normalisation) on this forward; returns (log, {name: float64 NumPy})."""
    import hf_reference_train as tref
    o = dict(tref.DEFAULTS)
    o.update(opts)
    cfg = config(model_dir)
    params = load_params(model_dir, requires_grad=True)
    seqs = tref.read_sequences(data_path, o["seq_len"])
    log = tref.train_steps(params, seqs, o, lambda s, step, row: forward(cfg, params, list(s)), cfg["vocab_size"])
    return log, {k: v.detach().numpy().copy() for k, v in params.items()}


if __name__ == "__main__":
    import argparse
    ap = argparse.ArgumentParser(description="torch float64 reference of HF gpt_oss logits")
    ap.add_argument("--model", required=True)
    ap.add_argument("--tokens", required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    np.save(a.out, reference_logits(a.model, [int(t) for t in a.tokens.split(",")]).astype(np.float32))
