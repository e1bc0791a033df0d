#!/usr/bin/python3
"""Independent PyTorch reference of Hugging Face's llama4_text causal LM
(Llama4ForCausalLM), in float64, with autograd for gradients.

Written from Transformers' modeling_llama4.py / configuration_llama4.py (not
from the C engine):

* Llama4TextConfig.__post_init__: moe_layers defaults to every
  interleave_moe_layer_step-th layer (range(step - 1, L, step));
  no_rope_layers (1: the layer uses RoPE) defaults to a NoPE layer every
  no_rope_layer_interval-th ((l + 1) % interval == 0), an empty list counting
  as absent; layer_types: "chunked_attention" on RoPE layers, else
  "full_attention".
* Llama4TextAttention: q/k/v projections; on RoPE layers the rotation of
  interleaved pairs (x[2i], x[2i+1]) as complex numbers times
  exp(i * pos * inv_freq[i]) (apply_rotary_emb; llama3 rope_scaling through
  the inverse frequencies), then when use_qk_norm the weightless L2 norm
  x * rsqrt(mean(x^2) + rms_norm_eps) of every head; on NoPE layers with
  attn_temperature_tuning q times log1p(floor((pos + 1) / floor_scale)) *
  attn_scale + 1.  Softmax scale head_dim^-1/2; the mask causal, and on
  chunked layers also key // chunk == query // chunk
  (create_chunked_causal_mask, no padding).
* Llama4TextMoe: Llama4Router (Linear H -> E, top-k of the logits, sigmoid
  of those, sigmoid(-inf) = 0 for the rest); every expert runs on the input
  scaled by its score (Llama4TextExperts: bmm with gate_up_proj [E, H, 2I],
  gate | up halves, SiLU(gate) * up, bmm with down_proj [E, I, H]); the sum
  over the experts plus the shared expert (a SwiGLU MLP of
  intermediate_size).  Dense layers: a SwiGLU MLP of intermediate_size_mlp.
* Llama4TextRMSNorm with rms_norm_eps; lm_head (or the tied embedding).
* Loss: Transformers' causal-LM loss (labels shifted inside, mean over the
  counted positions), gradients by torch.autograd.
"""

import argparse
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_reference as base  # noqa: E402

torch.set_default_dtype(torch.float64)


def derived_layers(cfg):
    """(moe flags, rope flags) per layer, as Llama4TextConfig derives them."""
    L = int(cfg["num_hidden_layers"])
    step = int(cfg.get("interleave_moe_layer_step", 1))
    moe_list = cfg.get("moe_layers")
    moe = set(moe_list) if moe_list is not None else set(range(step - 1, L, step))
    nope_iv = int(cfg.get("no_rope_layer_interval", 4))
    rope_list = cfg.get("no_rope_layers") or [int((l + 1) % nope_iv != 0) for l in range(L)]
    if len(rope_list) < L:
        raise base.ReferenceError("no_rope_layers is shorter than num_hidden_layers")
    return [l in moe for l in range(L)], [bool(rope_list[l]) for l in range(L)]


class Llama4Reference:
    def __init__(self, model_dir, requires_grad=False):
        c = base.load_config(model_dir)
        if c.get("model_type") != "llama4_text":
            raise base.ReferenceError(f"config.json: model_type {c.get('model_type')!r} is not llama4_text")
        self.cfg = c
        self.H = int(c["hidden_size"])
        self.nh = int(c["num_attention_heads"])
        self.nkv = int(c.get("num_key_value_heads") or self.nh)
        self.D = int(c.get("head_dim") or self.H // self.nh)
        self.eps = float(c.get("rms_norm_eps", 1e-5))
        self.k = int(c.get("num_experts_per_tok", 1))
        self.chunk = c.get("attention_chunk_size")
        self.qk_norm = bool(c.get("use_qk_norm", True))
        self.temp = bool(c.get("attn_temperature_tuning", True))
        self.floor_scale = float(c.get("floor_scale", 8192))
        self.attn_scale = float(c.get("attn_scale", 0.1))
        self.tied = bool(c.get("tie_word_embeddings", False))
        self.moe, self.rope = derived_layers(c)
        self.inv_freq = torch.tensor(base.rope_inv_freq(c, self.D))
        raw = base.load_model_tensors(model_dir)
        self.t = {n: torch.tensor(a, requires_grad=requires_grad) for n, a in raw.items()}

    # ---- blocks ----------------------------------------------------------

    def rms(self, x, w):
        return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + self.eps) * w

    def rotate(self, x, pos):
        """x [T, heads, D]: interleaved pairs times exp(i pos f)."""
        ang = pos[:, None] * self.inv_freq[None, :]                  # [T, D/2]
        c, s = torch.cos(ang)[:, None, :], torch.sin(ang)[:, None, :]
        a, b = x[..., 0::2], x[..., 1::2]
        return torch.stack([a * c - b * s, a * s + b * c], dim=-1).flatten(-2)

    def attention(self, l, h, pos):
        p = f"model.layers.{l}.self_attn."
        T = h.shape[0]
        q = (h @ self.t[p + "q_proj.weight"].T).view(T, self.nh, self.D)
        k = (h @ self.t[p + "k_proj.weight"].T).view(T, self.nkv, self.D)
        v = (h @ self.t[p + "v_proj.weight"].T).view(T, self.nkv, self.D)
        if self.rope[l]:
            q, k = self.rotate(q, pos), self.rotate(k, pos)
            if self.qk_norm:
                q = q * torch.rsqrt((q * q).mean(-1, keepdim=True) + self.eps)
                k = k * torch.rsqrt((k * k).mean(-1, keepdim=True) + self.eps)
        elif self.temp:
            scale = torch.log1p(torch.floor((pos + 1.0) / self.floor_scale)) * self.attn_scale + 1.0
            q = q * scale[:, None, None]
        rep = self.nh // self.nkv
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
        s = torch.einsum("qhd,khd->hqk", q, k) * self.D ** -0.5
        qi, ki = pos[:, None], pos[None, :]
        allowed = ki <= qi
        if self.rope[l] and self.chunk:
            allowed = allowed & (torch.div(ki, self.chunk, rounding_mode="floor")
                                 == torch.div(qi, self.chunk, rounding_mode="floor"))
        s = s.masked_fill(~allowed[None], float("-inf"))
        a = torch.softmax(s, dim=-1)
        o = torch.einsum("hqk,khd->qhd", a, v).reshape(T, self.nh * self.D)
        return o @ self.t[p + "o_proj.weight"].T

    def mlp(self, prefix, x):
        g = x @ self.t[prefix + "gate_proj.weight"].T
        u = x @ self.t[prefix + "up_proj.weight"].T
        return (torch.nn.functional.silu(g) * u) @ self.t[prefix + "down_proj.weight"].T

    def moe_block(self, l, x):
        p = f"model.layers.{l}.feed_forward."
        logits = x @ self.t[p + "router.weight"].T                  # [T, E]
        top_v, top_i = torch.topk(logits, self.k, dim=1)
        scores = torch.full_like(logits, float("-inf")).scatter(1, top_i, top_v)
        scores = torch.sigmoid(scores)                              # 0 for the unchosen
        gu, dn = self.t[p + "experts.gate_up_proj"], self.t[p + "experts.down_proj"]
        E = gu.shape[0]
        routed_in = x[None, :, :] * scores.T[:, :, None]            # [E, T, H]
        gate_up = torch.bmm(routed_in, gu)                          # [E, T, 2I]
        g, u = gate_up.chunk(2, dim=-1)
        out = torch.bmm(torch.nn.functional.silu(g) * u, dn)       # [E, T, H]
        assert out.shape[0] == E
        return self.mlp(p + "shared_expert.", x) + out.sum(0)

    # ---- the model ---------------------------------------------------------

    def hidden(self, tokens):
        ids = torch.tensor(tokens, dtype=torch.long)
        pos = torch.arange(len(tokens), dtype=torch.float64)
        x = self.t["model.embed_tokens.weight"][ids]
        for l in range(int(self.cfg["num_hidden_layers"])):
            p = f"model.layers.{l}."
            x = x + self.attention(l, self.rms(x, self.t[p + "input_layernorm.weight"]), pos)
            h = self.rms(x, self.t[p + "post_attention_layernorm.weight"])
            x = x + (self.moe_block(l, h) if self.moe[l] else self.mlp(p + "feed_forward.", h))
        return self.rms(x, self.t["model.norm.weight"])

    def logits_t(self, tokens):
        head = self.t["model.embed_tokens.weight"] if self.tied else self.t["lm_head.weight"]
        return self.hidden(tokens) @ head.T

    def forward(self, tokens):
        with torch.no_grad():
            return self.logits_t(tokens).numpy()

    def loss_and_grads(self, tokens, labels=None):
        """Transformers' causal-LM loss (mean over counted shifted labels)
        and d loss / d every tensor, by autograd: (loss, {name: grad})."""
        labels = list(tokens) if labels is None else list(labels)
        z = self.logits_t(tokens)
        y = torch.tensor(labels[1:] + [-100], dtype=torch.long)
        loss = torch.nn.functional.cross_entropy(z, y, ignore_index=-100)
        for t in self.t.values():
            t.grad = None
        loss.backward()
        return float(loss), {n: t.grad.numpy() for n, t in self.t.items() if t.grad is not None}


def reference_grads(model_dir, tokens):
    """(loss, {name: gradient}) of one sequence, by autograd."""
    return Llama4Reference(model_dir, requires_grad=True).loss_and_grads(tokens)


def reference_train(model_dir, data_path, **opts):
    """hf_reference_train.py's Trainer steps (data, loss normalisation,
    AdamW / SGD, clipping, schedule) on this model: (log, {name: float64
    parameters after the last step})."""
    import hf_reference_train as tr
    o = dict(tr.DEFAULTS)
    unknown = set(opts) - set(o)
    if unknown:
        raise TypeError(f"unknown options {sorted(unknown)}")
    o.update(opts)
    r = Llama4Reference(model_dir, requires_grad=True)
    if r.tied:
        r.t.pop("lm_head.weight", None)
    seqs = tr.read_sequences(data_path, o["seq_len"])
    log = tr.train_steps(r.t, seqs, o, lambda s, step, row: r.logits_t(s), int(r.cfg["vocab_size"]))
    return log, {k: v.detach().numpy().copy() for k, v in r.t.items()}


def reference_logits(model_dir, tokens):
    return Llama4Reference(model_dir).forward(tokens)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model")
    ap.add_argument("--tokens", required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    np.save(a.out, reference_logits(a.model, [int(t) for t in a.tokens.split(",")]).astype(np.float32))
    return 0


if __name__ == "__main__":
    sys.exit(main())
