"""The backward kernels (src/kernels/*: tp_*_backward, tp_cross_entropy)
against PyTorch's autograd.

worker_kernel_grad runs each kernel on random inputs and writes inputs,
upstream gradients and results as .npy files.  Here each forward is written
again from its definition in PyTorch / Transformers (LlamaRMSNorm,
rotate_half RoPE with Transformers' default, linear and llama3 frequency
rules, SiLU gate, F.linear, a vocabulary-parallel embedding lookup,
F.cross_entropy with ignore_index, eager attention with repeat_kv and the
causal / sliding-window mask), in float64, and autograd gives the gradient
of sum(dy * y).  Every tensor must agree within 1e-5 of its largest value.
"""

import math
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tpe2e  # noqa: E402

TOL = 1e-5
failures = []
checked = []


def t(arr, grad=False):
    x = torch.tensor(np.asarray(arr), dtype=torch.float64)
    return x.requires_grad_(grad)


def close(name, ours, ref):
    ours = np.asarray(ours, dtype=np.float64)
    ref = ref.detach().numpy() if isinstance(ref, torch.Tensor) else np.asarray(ref, dtype=np.float64)
    if ours.shape != ref.shape:
        failures.append(f"{name}: shape {ours.shape}, reference {ref.shape}")
        return
    scale = max(np.abs(ref).max(), 1e-30)
    err = np.abs(ours - ref).max() / scale
    checked.append((name, err))
    if not err <= TOL:
        failures.append(f"{name}: max error {err:.3g} of the largest value (bound {TOL})")
    if scale < 0.1:
        failures.append(f"{name}: reference gradient of size {scale:.3g} tells nothing")


def rmsnorm(d):
    x, w, dy = t(d["rms_x"], True), t(d["rms_w"], True), t(d["rms_dy"])
    variance = x.pow(2).mean(-1, keepdim=True)
    y = w * (x * torch.rsqrt(variance + 1e-6))
    (y * dy).sum().backward()
    close("rmsnorm dx", d["rms_dx"], x.grad)
    close("rmsnorm dw", d["rms_dw"], w.grad)


def inv_freq(kind, dim, base=100.0, factor=4.0, low=1.0, high=4.0, old_ctx=64):
    """Transformers' _compute_default / _linear_scaling / _llama3 rules."""
    f = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).to(torch.float64) / dim))
    if kind == 2:
        return f / factor
    if kind == 1:
        low_wavelen, high_wavelen = old_ctx / low, old_ctx / high
        wavelen = 2 * math.pi / f
        llama = torch.where(wavelen > low_wavelen, f / factor, f)
        smooth = (old_ctx / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * llama / factor + smooth * llama
        medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
        return torch.where(medium, smoothed, llama)
    return f


def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def rope(d, pre):
    kind, pos0 = (int(v) for v in d[pre + "_meta"])
    x, dy = t(d[pre + "_x"], True), t(d[pre + "_dy"])
    T, H, hd = x.shape
    pos = torch.arange(pos0, pos0 + T, dtype=torch.float64)
    freqs = pos[:, None] * inv_freq(kind, hd)[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos()[:, None, :], emb.sin()[:, None, :]
    y = x * cos + rotate_half(x) * sin
    (y * dy).sum().backward()
    close(f"rope kind {kind} forward", d[pre + "_y"], y)
    close(f"rope kind {kind} dx", d[pre + "_dx"], x.grad)


def silu(d):
    a, b, dy = t(d["silu_a"], True), t(d["silu_b"], True), t(d["silu_dy"])
    (F.silu(a) * b * dy).sum().backward()
    close("silu_mul d gate", d["silu_da"], a.grad)
    close("silu_mul d up", d["silu_db"], b.grad)


def linear(d, pre):
    x, w, b, dy = t(d[pre + "_x"], True), t(d[pre + "_w"], True), t(d[pre + "_b"], True), t(d[pre + "_dy"])
    (F.linear(x, w, b) * dy).sum().backward()
    for g, ref in (("dx", x.grad), ("dw", w.grad), ("db", b.grad)):
        close(f"{pre} {g}", d[f"{pre}_{g}"], ref)


def embedding(d):
    """Megatron-style vocabulary-parallel lookup: this rank's rows
    [row0, row0 + rows), ids outside masked to zero."""
    ids = torch.tensor(d["emb_ids"])
    row0 = int(d["emb_meta"][0])
    dy = t(d["emb_dy"])
    rows, width = d["emb_dw"].shape
    w = torch.zeros(rows, width, dtype=torch.float64, requires_grad=True)
    inside = (ids >= row0) & (ids < row0 + rows)
    local = torch.where(inside, ids - row0, torch.zeros_like(ids))
    y = F.embedding(local, w) * inside[:, None]
    (y * dy).sum().backward()
    close("embedding dW", d["emb_dw"], w.grad)


def cross_entropy(d):
    z, labels = t(d["ce_logits"], True), torch.tensor(d["ce_labels"])
    count = float(d["ce_meta"][0])
    loss_sum = F.cross_entropy(z, labels, ignore_index=-100, reduction="sum")
    (loss_sum / count).backward()
    close("cross-entropy loss sum", d["ce_loss_sum"], loss_sum.detach().reshape(1))
    close("cross-entropy dlogits", d["ce_dlogits"], z.grad)


def attention(d, pre):
    """Transformers' eager_attention_forward: repeat_kv, scores scaled by
    1/sqrt(d), causal (and sliding-window) mask, softmax, times v."""
    T, pos0, H, KV, hd, window = (int(v) for v in d[pre + "_meta"])
    q, k, v, dy = t(d[pre + "_q"], True), t(d[pre + "_k"], True), t(d[pre + "_v"], True), t(d[pre + "_dy"])
    L = pos0 + T
    qh = q.transpose(0, 1)                                          # [H, T, d]
    kh = k.transpose(0, 1).repeat_interleave(H // KV, dim=0)         # [H, L, d]
    vh = v.transpose(0, 1).repeat_interleave(H // KV, dim=0)
    qpos = torch.arange(pos0, pos0 + T)[:, None]
    kpos = torch.arange(L)[None, :]
    allowed = kpos <= qpos
    if window > 0:
        allowed &= qpos - kpos < window
    scores = qh @ kh.transpose(1, 2) / math.sqrt(hd)
    scores = scores.masked_fill(~allowed, float("-inf"))
    out = (torch.softmax(scores, dim=-1) @ vh).transpose(0, 1)      # [T, H, d]
    lse = torch.logsumexp(scores, dim=-1).transpose(0, 1)          # [T, H]
    (out * dy).sum().backward()
    name = f"attention T={T} pos0={pos0} H={H} KV={KV} d={hd} window={window}"
    close(name + " out", d[pre + "_out"], out)
    close(name + " lse", d[pre + "_lse"], lse)
    for g, ref in (("dq", q.grad), ("dk", k.grad), ("dv", v.grad)):
        close(f"{name} {g}", d[f"{pre}_{g}"], ref)


def main():
    with tempfile.TemporaryDirectory() as out:
        r = subprocess.run([tpe2e.worker("worker_kernel_grad"), "--out-dir", out], capture_output=True, text=True)
        if r.returncode != 0:
            print(f"FAIL: worker_kernel_grad exited {r.returncode}: {r.stderr.strip()}")
            return 1
        d = {f[:-4]: np.load(os.path.join(out, f)) for f in os.listdir(out) if f.endswith(".npy")}
    rmsnorm(d)
    for pre in ("rope0", "rope1", "rope2"):
        rope(d, pre)
    silu(d)
    linear(d, "lin")
    linear(d, "linbf16")
    embedding(d)
    cross_entropy(d)
    attention(d, "attn1")
    attention(d, "attn2")
    worst = max(checked, key=lambda c: c[1])
    print(f"{len(checked)} tensors compared with torch {torch.__version__} autograd; "
          f"worst: {worst[0]} {worst[1]:.3g} (bound {TOL})")
    for f in failures:
        print("FAIL:", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
