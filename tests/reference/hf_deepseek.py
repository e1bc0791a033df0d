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
  in float32 as Transformers (dtype=torch.float32), greedy or
  group_limited_greedy (a group's score: its best probability), the weights
  the masked scores (0 for a pick of a masked expert) times
  routed_scaling_factor; V3 (DeepseekV3TopkRouter) by sigmoid,
  choosing on scores + e_score_correction_bias within the topk_group groups
  of best two-expert sums, weights from the scores, renormalised (+1e-20)
  when norm_topk_prob, times routed_scaling_factor; masked experts are
  filled with 0.0 as masked_fill does.  shared_experts (one MLP
  n_shared_experts times moe_intermediate_size wide) is added.
* YaRN inverse frequencies and attention factor as _compute_yarn_parameters
  (factor = max_position_embeddings / original_max_position_embeddings when
  the latter is given).

torch_logits() is the same model in PyTorch for autograd (gradients and
training steps through hf_reference_grad.py / hf_reference_train.py): the
routers' choices under no_grad as Transformers makes them (torch.topk on the
scores; V3's e_score_correction_bias, a buffer there, only chooses), the
weights through autograd (V2's softmax probabilities, V3's gathered sigmoid
scores and their renormalisation), V2's rotary pairs as the complex product
written out in reals.
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
            # softmax(dim=-1, dtype=torch.float32) as Transformers: a probability
            # that underflows there is 0, and group_limited_greedy may then pick
            # a masked expert, at weight 0 (below)
            z = logits.astype(np.float32)
            probs = np.exp(z - z.max(axis=-1, keepdims=True))
            probs = (probs / probs.sum(axis=-1, keepdims=True, dtype=np.float32)).astype(np.float64)
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


# ---- PyTorch (autograd) ------------------------------------------------------

def _trms(x, w, eps):
    var = x.pow(2).mean(-1, keepdim=True)   # DeepseekV2RMSNorm: variance in float, then the weight
    return w * (x * __import__("torch").rsqrt(var + eps))


class TorchDeepseek(DeepseekReference):
    """The forward of DeepseekReference on a dict of torch tensors {HF name: tensor}
    (per-expert names), differentiable in every parameter the model trains."""

    def __init__(self, cfg, params):
        super().__init__(None, cfg=cfg, tensors=params)

    def _trope(self, x, cos, sin):
        import torch
        if self.arch == "deepseek_v2":   # apply_rotary_emb: (x0 + i x1) · (cos + i sin) per pair
            a, b = x[..., 0::2], x[..., 1::2]
            return torch.stack([a * cos - b * sin, a * sin + b * cos], dim=-1).reshape(x.shape)
        if self.interleave:   # apply_rotary_pos_emb_interleave: [evens, odds], then rotate_half
            x = torch.cat([x[..., 0::2], x[..., 1::2]], dim=-1)
        h = x.shape[-1] // 2
        rot = torch.cat([-x[..., h:], x[..., :h]], dim=-1)
        return x * torch.cat([cos, cos], dim=-1) + rot * torch.cat([sin, sin], dim=-1)

    def tattention(self, i, x, cos, sin, mask):
        import torch
        T, nh = x.shape[0], self.n_heads
        p = f"model.layers.{i}.self_attn."
        W = lambda n: self.t[p + n + ".weight"]  # noqa: E731
        if self.q_lora is None:
            q = x @ W("q_proj").T
        else:
            q = _trms(x @ W("q_a_proj").T, W("q_a_layernorm"), 1e-6) @ W("q_b_proj").T
        q = q.view(T, nh, -1).transpose(0, 1)
        q_nope, q_pe = q[..., :self.nope], q[..., self.nope:]
        ckv = x @ W("kv_a_proj_with_mqa").T
        k_lat, k_pe = ckv[:, :self.kv_lora], ckv[:, self.kv_lora:]
        kv = (_trms(k_lat, W("kv_a_layernorm"), 1e-6) @ W("kv_b_proj").T).view(T, nh, -1).transpose(0, 1)
        k_nope, v = kv[..., :self.nope], kv[..., self.nope:]
        q_pe = self._trope(q_pe, cos, sin)
        k_pe = self._trope(k_pe[None], cos, sin).expand(nh, T, self.rope)
        qs = torch.cat([q_nope, q_pe], dim=-1)
        ks = torch.cat([k_nope, k_pe], dim=-1)
        probs = torch.softmax((qs @ ks.transpose(1, 2)) * self.scaling + mask, dim=-1)
        o = (probs @ v).transpose(0, 1).reshape(T, nh * self.vd)
        return o @ W("o_proj").T

    def troute(self, i, x):
        import torch
        p = f"model.layers.{i}.mlp.gate."
        logits = x @ self.t[p + "weight"].T
        E, k, T = self.n_experts, int(self.top_k), x.shape[0]
        if self.arch == "deepseek_v2":   # DeepseekV2Moe.route_tokens_to_experts
            probs = torch.softmax(logits, dim=-1, dtype=torch.float32).to(logits.dtype)
            scores = probs
            if self.topk_method == "group_limited_greedy":
                G = int(self.n_group)
                group_scores = probs.view(T, G, -1).max(dim=-1).values
                group_idx = torch.topk(group_scores, k=int(self.topk_group), dim=-1, sorted=False)[1]
                group_mask = torch.zeros_like(group_scores).scatter_(1, group_idx, 1)
                score_mask = group_mask.unsqueeze(-1).expand(T, G, E // G).reshape(T, -1)
                scores = probs.masked_fill(~score_mask.bool(), 0.0)
            w, idx = torch.topk(scores, k=k, dim=-1, sorted=False)
            return idx, w * self.scale_routed
        scores = torch.sigmoid(logits)   # DeepseekV3TopkRouter + DeepseekV3MoE.route_tokens_to_experts
        with torch.no_grad():
            bias = self.t.get(p + "e_score_correction_bias")
            choice = scores + (bias.detach()[None] if bias is not None else 0.0)
            G = int(self.n_group)
            group_scores = choice.view(T, G, -1).topk(2, dim=-1)[0].sum(dim=-1)
            group_idx = torch.topk(group_scores, k=int(self.topk_group), dim=-1, sorted=False)[1]
            group_mask = torch.zeros_like(group_scores).scatter_(1, group_idx, 1)
            score_mask = group_mask.unsqueeze(-1).expand(T, G, E // G).reshape(T, -1)
            choice = choice.masked_fill(~score_mask.bool(), 0.0)
            idx = torch.topk(choice, k=k, dim=-1, sorted=False)[1]
        w = scores.gather(1, idx)
        if self.norm_topk:
            w = w / (w.sum(dim=-1, keepdim=True) + 1e-20)
        return idx, w * self.scale_routed

    def tswiglu(self, x, p):
        import torch
        g = x @ self.t[p + "gate_proj.weight"].T
        u = x @ self.t[p + "up_proj.weight"].T
        return (torch.nn.functional.silu(g) * u) @ self.t[p + "down_proj.weight"].T

    def tmlp(self, i, x):
        import torch
        if i < self.first_sparse:
            return self.tswiglu(x, f"model.layers.{i}.mlp.")
        idx, w = self.troute(i, x)
        out = torch.zeros_like(x)
        for e in range(self.n_experts):   # DeepseekV2Moe.moe / DeepseekV3NaiveMoe: the chosen tokens only
            tok, slot = torch.nonzero(idx == e, as_tuple=True)
            if tok.numel():
                y = self.tswiglu(x[tok], f"model.layers.{i}.mlp.experts.{e}.")
                out = out.index_add(0, tok, y * w[tok, slot][:, None])
        if f"model.layers.{i}.mlp.shared_experts.gate_proj.weight" in self.t:
            out = out + self.tswiglu(x, f"model.layers.{i}.mlp.shared_experts.")
        return out

    def tlogits(self, tokens):
        import torch
        emb = self.t["model.embed_tokens.weight"]
        dt, T = emb.dtype, len(tokens)
        freqs = torch.outer(torch.arange(T, dtype=torch.float64), torch.tensor(self.inv_freq, dtype=torch.float64))
        cos, sin = (freqs.cos() * self.att_factor).to(dt), (freqs.sin() * self.att_factor).to(dt)
        allowed = torch.arange(T)[None, :] <= torch.arange(T)[:, None]
        mask = torch.zeros(T, T, dtype=dt).masked_fill(~allowed, float("-inf"))
        x = emb[torch.tensor(list(tokens))]
        for i in range(self.n_layers):
            p = f"model.layers.{i}."
            x = x + self.tattention(i, _trms(x, self.t[p + "input_layernorm.weight"], self.eps), cos, sin, mask)
            x = x + self.tmlp(i, _trms(x, self.t[p + "post_attention_layernorm.weight"], self.eps))
        x = _trms(x, self.t["model.norm.weight"], self.eps)
        head = emb if self.tied else self.t["lm_head.weight"]
        return x @ head.T


def torch_logits(cfg, params, tokens):
    """The [T, vocab] logits of one sequence as a differentiable torch tensor."""
    return TorchDeepseek(cfg, params).tlogits([int(t) for t in tokens])
