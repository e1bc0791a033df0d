#!/usr/bin/python3
"""Independent NumPy reference of Hugging Face's deepseek_v2 and deepseek_v3
causal LMs: dense MLPs before first_k_dense_replace, MoE blocks from there on.

Written from Transformers' modeling_deepseek_v2.py / modeling_deepseek_v3.py
and modeling_rope_utils (not from the C engine), in float64:

* DeepseekV2Attention / DeepseekV3Attention (multi-head latent attention):
  q = q_proj(x), or q_b_proj(q_a_layernorm(q_a_proj(x))) when q_lora_rank is
  set; kv_a_proj_with_mqa(x) split [kv_lora_rank | qk_rope_head_dim]; the
  first part through kv_a_layernorm and kv_b_proj into per-head k_nope and
  value; the rope part one key shared by every head.  The two latent norms
  are built with RMSNorm's default eps 1e-6.
* Rotary embedding of width qk_rope_head_dim (config.head_dim =
  qk_rope_head_dim), cos and sin times the rope type's attention factor:
  V2 rotates interleaved pairs as complex numbers (apply_rotary_emb); V3
  with rope_interleave permutes each rotary part to [evens, odds] before
  rotate_half (apply_rotary_pos_emb_interleave), without it plain
  rotate_half.
* Softmax scale (qk_nope_head_dim + qk_rope_head_dim)^-1/2; V3 multiplies it
  by yarn_get_mscale(factor, mscale_all_dim)^2 when rope_scaling has
  mscale_all_dim (V2 does not).
* DeepseekV2Moe / DeepseekV3MoE on the per-expert checkpoint tensors
  (mlp.experts.<e>.gate_proj/up_proj/down_proj): V2 routes by softmax,
  greedy or group_limited_greedy (a group's score: its best probability),
  weights times routed_scaling_factor; V3 (DeepseekV3TopkRouter) by sigmoid,
  choosing on scores + e_score_correction_bias within the topk_group groups
  of best two-expert sums, weights from the scores, renormalised (+1e-20)
  when norm_topk_prob, times routed_scaling_factor; masked experts are
  filled with 0.0 as masked_fill does.  shared_experts (one MLP
  n_shared_experts times moe_intermediate_size wide) is added.
* YaRN inverse frequencies and attention factor as _compute_yarn_parameters
  (factor = max_position_embeddings / original_max_position_embeddings when
  the latter is given).
"""

import math

import numpy as np

import hf_reference as base


def yarn_mscale(scale, mscale=1.0):
    if scale <= 1:
        return 1.0
    return 0.1 * mscale * math.log(scale) + 1.0


def yarn_parameters(cfg, dim):
    """(inv_freq [dim/2], attention_factor) as _compute_yarn_parameters."""
    theta, _, p = base.rope_settings_any(cfg)
    factor = float(p["factor"])
    max_pos = int(cfg.get("max_position_embeddings", 2048))
    if p.get("original_max_position_embeddings"):
        orig = int(p["original_max_position_embeddings"])
        factor = max_pos / orig
    else:
        orig = max_pos
    af = p.get("attention_factor")
    mscale, mscale_all = p.get("mscale"), p.get("mscale_all_dim")
    if af is None:
        if mscale and mscale_all:
            af = yarn_mscale(factor, mscale) / yarn_mscale(factor, mscale_all)
        else:
            af = yarn_mscale(factor)
    beta_fast = p.get("beta_fast") or 32
    beta_slow = p.get("beta_slow") or 1

    def corr_dim(rot):
        return dim * math.log(orig / (rot * 2 * math.pi)) / (2 * math.log(theta))

    low = max(math.floor(corr_dim(beta_fast)), 0)
    high = min(math.ceil(corr_dim(beta_slow)), dim - 1)
    if low == high:
        high += 0.001
    ramp = np.clip((np.arange(dim // 2, dtype=np.float64) - low) / (high - low), 0, 1)
    pos_freqs = theta ** (np.arange(0, dim, 2, dtype=np.float64) / dim)
    extrap = 1 - ramp
    inv = (1 / (factor * pos_freqs)) * (1 - extrap) + (1 / pos_freqs) * extrap
    return inv, float(af)


def rotate_half(x):
    h = x.shape[-1] // 2
    return np.concatenate([-x[..., h:], x[..., :h]], axis=-1)


class DeepseekReference:
    """DeepseekV2ForCausalLM / DeepseekV3ForCausalLM with dense layers."""

    def __init__(self, model_dir, cfg=None, tensors=None):
        c = cfg if cfg is not None else base.load_config(model_dir)
        self.cfg, self.dir = c, model_dir
        self.arch = c["model_type"]
        self.hidden = int(c["hidden_size"])
        self.n_layers = int(c["num_hidden_layers"])
        self.n_heads = int(c["num_attention_heads"])
        self.vocab = int(c["vocab_size"])
        self.eps = float(c.get("rms_norm_eps", 1e-6))
        self.tied = bool(c.get("tie_word_embeddings", False))
        self.q_lora = c.get("q_lora_rank")
        self.kv_lora = int(c["kv_lora_rank"])
        self.nope = int(c["qk_nope_head_dim"])
        self.rope = int(c["qk_rope_head_dim"])
        self.vd = int(c["v_head_dim"])
        v3 = self.arch == "deepseek_v3"
        self.first_sparse = int(c.get("first_k_dense_replace", 3 if v3 else 0))
        self.n_experts = int(c.get("n_routed_experts", 256 if v3 else 64))
        self.top_k = c.get("num_experts_per_tok", 8 if v3 else None)
        self.scale_routed = float(c.get("routed_scaling_factor", 2.5 if v3 else 1.0))
        self.n_group = c.get("n_group", 8 if v3 else None)
        self.topk_group = c.get("topk_group", 4 if v3 else None)
        self.topk_method = c.get("topk_method", "greedy")
        self.norm_topk = bool(c.get("norm_topk_prob", v3))
        self.interleave = self.arch == "deepseek_v2" or bool(c.get("rope_interleave", True))
        theta, rtype, p = base.rope_settings_any(c)
        if rtype == "yarn":
            self.inv_freq, self.att_factor = yarn_parameters(c, self.rope)
        elif rtype == "default":
            self.inv_freq = 1.0 / (theta ** (np.arange(0, self.rope, 2, dtype=np.float64) / self.rope))
            self.att_factor = 1.0
        else:
            raise base.ReferenceError(f"rope type {rtype!r} is not supported by the deepseek reference")
        qk = self.nope + self.rope
        self.scaling = qk ** -0.5
        if self.arch == "deepseek_v3" and rtype == "yarn" and p.get("mscale_all_dim"):
            m = yarn_mscale(float(p["factor"]), float(p["mscale_all_dim"]))
            self.scaling *= m * m
        self.t = tensors if tensors is not None else base.load_model_tensors(model_dir)

    def _rope(self, x, cos, sin):
        """x: [heads, T, rope]; cos/sin [T, rope/2] (already times the attention factor)."""
        if self.arch == "deepseek_v2":
            z = x[..., 0::2] + 1j * x[..., 1::2]
            z = z * (cos + 1j * sin)[None]
            out = np.empty_like(x)
            out[..., 0::2], out[..., 1::2] = z.real, z.imag
            return out
        if self.interleave:   # [evens, odds] then rotate_half
            x = np.concatenate([x[..., 0::2], x[..., 1::2]], axis=-1)
        c2 = np.concatenate([cos, cos], axis=-1)[None]
        s2 = np.concatenate([sin, sin], axis=-1)[None]
        return x * c2 + rotate_half(x) * s2

    def attention(self, i, x, cos, sin):
        T, nh = x.shape[0], self.n_heads
        p = f"model.layers.{i}.self_attn."
        W = lambda n: self.t[p + n + ".weight"]  # noqa: E731
        if self.q_lora is None:
            q = x @ W("q_proj").T
        else:
            q = base.rms_norm(x @ W("q_a_proj").T, W("q_a_layernorm"), 1e-6) @ W("q_b_proj").T
        q = q.reshape(T, nh, -1).transpose(1, 0, 2)
        q_nope, q_pe = q[..., :self.nope], q[..., self.nope:]
        ckv = x @ W("kv_a_proj_with_mqa").T
        k_lat, k_pe = ckv[:, :self.kv_lora], ckv[:, self.kv_lora:]
        kv = base.rms_norm(k_lat, W("kv_a_layernorm"), 1e-6) @ W("kv_b_proj").T
        kv = kv.reshape(T, nh, -1).transpose(1, 0, 2)
        k_nope, v = kv[..., :self.nope], kv[..., self.nope:]
        q_pe = self._rope(q_pe, cos, sin)
        k_pe = self._rope(k_pe[None], cos, sin)
        qs = np.concatenate([q_nope, q_pe], axis=-1)
        ks = np.concatenate([k_nope, np.repeat(k_pe, nh, axis=0)], axis=-1)
        scores = (qs @ ks.transpose(0, 2, 1)) * self.scaling
        visible = np.arange(T)[None, :] <= np.arange(T)[:, None]
        scores = np.where(visible[None], scores, -np.inf)
        w = np.exp(scores - scores.max(axis=-1, keepdims=True))
        w = w / w.sum(axis=-1, keepdims=True)
        o = (w @ v).transpose(1, 0, 2).reshape(T, nh * self.vd)
        return o @ W("o_proj").T

    def route(self, i, x):
        """(chosen [T, k], weights [T, k]) of layer i's router."""
        p = f"model.layers.{i}.mlp.gate."
        logits = x @ self.t[p + "weight"].T
        E, k, T = self.n_experts, int(self.top_k), x.shape[0]
        if self.arch == "deepseek_v2":
            probs = np.exp(logits - logits.max(axis=-1, keepdims=True))
            probs = probs / probs.sum(axis=-1, keepdims=True)
            choice = probs.copy()
            if self.topk_method == "group_limited_greedy":
                G = int(self.n_group)
                gs = probs.reshape(T, G, -1).max(axis=-1)
                keep = np.argsort(-gs, axis=-1, kind="stable")[:, :int(self.topk_group)]
                mask = np.zeros((T, G), dtype=bool)
                np.put_along_axis(mask, keep, True, axis=-1)
                choice = np.where(np.repeat(mask, E // G, axis=-1), choice, 0.0)
            chosen = np.argsort(-choice, axis=-1, kind="stable")[:, :k]
            return chosen, np.take_along_axis(choice, chosen, axis=-1) * self.scale_routed
        scores = 1 / (1 + np.exp(-logits))
        choice = scores + self.t.get(p + "e_score_correction_bias", np.zeros(E))[None]
        G = int(self.n_group)
        top2 = -np.sort(-choice.reshape(T, G, -1), axis=-1)[..., :2]
        gs = top2.sum(axis=-1)
        keep = np.argsort(-gs, axis=-1, kind="stable")[:, :int(self.topk_group)]
        mask = np.zeros((T, G), dtype=bool)
        np.put_along_axis(mask, keep, True, axis=-1)
        choice = np.where(np.repeat(mask, E // G, axis=-1), choice, 0.0)
        chosen = np.argsort(-choice, axis=-1, kind="stable")[:, :k]
        w = np.take_along_axis(scores, chosen, axis=-1)
        if self.norm_topk:
            w = w / (w.sum(axis=-1, keepdims=True) + 1e-20)
        return chosen, w * self.scale_routed

    def swiglu(self, x, p):
        g = x @ self.t[p + "gate_proj.weight"].T
        u = x @ self.t[p + "up_proj.weight"].T
        return (base.silu(g) * u) @ self.t[p + "down_proj.weight"].T

    def moe(self, i, x):
        chosen, w = self.route(i, x)
        out = np.zeros_like(x)
        for e in range(self.n_experts):
            tok, slot = np.nonzero(chosen == e)
            if tok.size:
                y = self.swiglu(x[tok], f"model.layers.{i}.mlp.experts.{e}.")
                np.add.at(out, tok, y * w[tok, slot][:, None])
        if f"model.layers.{i}.mlp.shared_experts.gate_proj.weight" in self.t:
            out = out + self.swiglu(x, f"model.layers.{i}.mlp.shared_experts.")
        return out

    def mlp(self, i, x):
        if i >= self.first_sparse:
            return self.moe(i, x)
        p = f"model.layers.{i}.mlp."
        g = x @ self.t[p + "gate_proj.weight"].T
        u = x @ self.t[p + "up_proj.weight"].T
        return (base.silu(g) * u) @ self.t[p + "down_proj.weight"].T

    def forward(self, tokens):
        ids = np.asarray(list(tokens), dtype=np.int64)
        x = self.t["model.embed_tokens.weight"][ids]
        freqs = np.outer(np.arange(ids.size, dtype=np.float64), self.inv_freq)
        cos, sin = np.cos(freqs) * self.att_factor, np.sin(freqs) * self.att_factor
        for i in range(self.n_layers):
            p = f"model.layers.{i}."
            h = base.rms_norm(x, self.t[p + "input_layernorm.weight"], self.eps)
            x = x + self.attention(i, h, cos, sin)
            h = base.rms_norm(x, self.t[p + "post_attention_layernorm.weight"], self.eps)
            x = x + self.mlp(i, h)
        x = base.rms_norm(x, self.t["model.norm.weight"], self.eps)
        head = self.t["model.embed_tokens.weight"] if self.tied else self.t["lm_head.weight"]
        return x @ head.T
