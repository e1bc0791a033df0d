#!/usr/bin/python3
"""An independent reference of training steps, as Hugging Face's Trainer takes them.

The model is hf_reference_grad.py's (torch, float64, written from
Transformers' modeling code); around it, the parts of Trainer (Transformers
>= 4.46, with the later fixes named below) that decide what an optimizer step
does, written again from their definitions (transformers is not installed):

* Data: a .jsonl of {"input_ids": [...]} lines, no shuffle: micro-batch m
  takes the next batch-size lines in file order; a line longer than seq-len
  is cut to its first seq-len ids, a shorter one padded with labels -100.
  Right padding changes nothing before it (the attention is causal), so each
  sequence runs at its own length here.
* Loss (ForCausalLMLoss with num_items_in_batch): labels = input ids,
  shifted inside, -100 ignored; each micro-batch's loss is the SUM of its
  tokens' cross-entropies divided by N_step, the number of counted (shifted)
  labels in the whole optimizer step (all grad-accum micro-batches), and it
  is back-propagated as is (Trainer does not divide by grad-accum then).
  N_step counts shifted labels, as Transformers does since PR #46204 (before
  it, the first label of every row was counted too, though never predicted).
  So gradient accumulation equals one large batch.
* Logged loss of a step: Trainer adds up what training_step returns (each
  micro-batch's loss above) and logs the sum per step, so the loss of a step
  is  sum over its tokens of the cross-entropy / N_step  -- the token mean
  over the whole step, the very quantity whose gradient is taken.  (It is not
  the plain mean of per-micro-batch means when micro-batches hold different
  numbers of labels.)
* Optimizer: torch.optim.AdamW (betas 0.9/0.999, eps 1e-8) or torch.optim.SGD
  (momentum), with Trainer's two groups: weight decay on every parameter but
  those whose lowercased name matches bias, layernorm, rmsnorm, a `norm`
  component or a `_norm` component (get_decay_parameter_names).  A tied
  lm_head is the embedding, one parameter.
* Clipping: torch.nn.utils.clip_grad_norm_ over all gradients when
  max-grad-norm > 0; the logged grad_norm is the norm before clipping (with
  max-grad-norm 0 nothing is clipped and the norm is still reported).
* Schedule: LambdaLR with Trainer's constant, constant_with_warmup, linear,
  cosine lambdas over --steps; step s (from 1) uses lr * lambda(s - 1), and
  that is the lr logged for step s (Trainer logs the applied lr since PR
  #36973; before, the next step's).

Why float64: the engine trains in float32; against a float64 run every
difference measured is the engine's own rounding (plus the float32 rounding
of the stored start weights, which both read alike), so a 1e-5 bound says
something about the engine and nothing about the reference.  A float32
reference would add its own, differently ordered, rounding of the same size.

    /usr/bin/python3 tests/reference/hf_reference_train.py --model DIR --data FILE.jsonl --out DIR \\
        [--seq-len N] [--batch-size N] [--grad-accum N] [--lr F] [--lr-scheduler KIND] [--warmup-steps N] \\
        [--weight-decay F] [--max-grad-norm F] [--optim adamw|sgd] [--momentum F] [--steps N]
writes OUT/train_log.jsonl (step, loss, lr, grad_norm per step), the final
parameters as OUT/model.safetensors (F32, HF names) and OUT/config.json.
"""

import argparse
import json
import math
import os
import re
import shutil
import struct
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_reference_grad as model_ref  # noqa: E402

# Trainer's defaults (TrainingArguments)
DEFAULTS = dict(seq_len=None, batch_size=8, grad_accum=1, lr=5e-5, lr_scheduler="linear", warmup_steps=0,
                weight_decay=0.0, max_grad_norm=1.0, optim="adamw", momentum=0.0, steps=1,
                adam_beta1=0.9, adam_beta2=0.999, adam_epsilon=1e-8,
                dtype="float64",   # float32 only to measure what float32 rounding alone costs
                loss_norm="step")  # "micro_batch": Transformers < 4.46 (each micro-batch's mean / grad-accum)


# ---- data -------------------------------------------------------------------

def read_sequences(path, seq_len):
    """Every line's input_ids, cut to seq_len (None: kept whole)."""
    seqs = []
    with open(path) as f:
        for i, line in enumerate(f, 1):
            if not line.strip():
                continue
            ids = json.loads(line)["input_ids"]
            if not ids or not all(isinstance(t, int) for t in ids):
                raise ValueError(f"{path}:{i}: input_ids is not a non-empty list of integers")
            seqs.append(ids[:seq_len] if seq_len else ids)
    return seqs


def step_batches(seqs, step, batch_size, grad_accum):
    """The micro-batches of optimizer step `step` (from 1): lists of sequences, in file order."""
    first = (step - 1) * grad_accum * batch_size
    if first + grad_accum * batch_size > len(seqs):
        raise ValueError(f"step {step} needs sequences {first + 1}..{first + grad_accum * batch_size}; "
                         f"the data holds {len(seqs)} (this reference covers one epoch, unshuffled)")
    return [seqs[first + m * batch_size:first + (m + 1) * batch_size] for m in range(grad_accum)]


def counted_labels(seq):
    """Labels that count after the shift: every id but the first (input_ids carry no -100)."""
    return max(0, len(seq) - 1)


# ---- Trainer's optimizer groups and schedules --------------------------------

NO_DECAY = [re.compile(p) for p in (r"bias", r"layernorm", r"rmsnorm", r"(?:^|\.)norm(?:$|\.)", r"_norm(?:$|\.)")]


def decays(name):
    return not any(p.search(name.lower()) for p in NO_DECAY)


def _warmup(step, warmup):
    return float(step) / float(max(1, warmup))


def schedule(kind, warmup, total, num_cycles=0.5):
    """Trainer's lr multiplier as a function of the scheduler's step count (0 for the first update)."""
    if kind == "constant":
        return lambda s: 1.0
    if kind == "constant_with_warmup":
        return lambda s: _warmup(s, warmup) if s < warmup else 1.0
    if kind == "linear":
        return lambda s: _warmup(s, warmup) if s < warmup else \
            max(0.0, float(total - s) / float(max(1, total - warmup)))
    if kind == "cosine":
        def f(s):
            if s < warmup:
                return _warmup(s, warmup)
            progress = float(s - warmup) / float(max(1, total - warmup))
            return max(0.0, 0.5 * (1.0 + math.cos(math.pi * float(num_cycles) * 2.0 * progress)))
        return f
    raise ValueError(f"lr scheduler {kind!r} not handled")


def make_optimizer(params, o):
    decay = [p for n, p in params.items() if decays(n)]
    rest = [p for n, p in params.items() if not decays(n)]
    groups = [{"params": decay, "weight_decay": o["weight_decay"]}, {"params": rest, "weight_decay": 0.0}]
    groups = [g for g in groups if g["params"]]
    if o["optim"] == "adamw":
        return torch.optim.AdamW(groups, lr=o["lr"], betas=(o["adam_beta1"], o["adam_beta2"]),
                                 eps=o["adam_epsilon"])
    if o["optim"] == "sgd":
        return torch.optim.SGD(groups, lr=o["lr"], momentum=o["momentum"])
    raise ValueError(f"optimizer {o['optim']!r} not handled")


# ---- the steps ------------------------------------------------------------------

def train_steps(params, seqs, o, forward, vocab):
    """Trainer's o["steps"] optimizer steps on params {name: leaf tensor} over
    the token sequences seqs; forward(seq, step, row) gives one sequence's
    logits from the current params (step from 0, row: the sequence's index in
    seqs, what LoRA dropout masks are keyed by).  Returns the log: a list of {"step", "loss", "lr",
    "grad_norm"}.  reference_train's loop, and peft_reference's with LoRA."""
    dt = getattr(torch, o["dtype"])
    opt = make_optimizer(params, o)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, schedule(o["lr_scheduler"], o["warmup_steps"], o["steps"]))
    every = list(params.values())
    log = []
    for step in range(1, o["steps"] + 1):
        batches = step_batches(seqs, step, o["batch_size"], o["grad_accum"])
        n_step = sum(counted_labels(s) for b in batches for s in b)
        if n_step == 0:
            raise ValueError(f"step {step}: no counted label in its micro-batches")
        lr = opt.param_groups[0]["lr"]
        opt.zero_grad(set_to_none=True)
        loss = 0.0
        for m, batch in enumerate(batches):
            mb = torch.zeros((), dtype=dt)
            for i, s in enumerate(batch):
                row = (step - 1) * o["grad_accum"] * o["batch_size"] + m * o["batch_size"] + i
                if any(t < 0 or t >= vocab for t in s):
                    raise ValueError(f"step {step}: an id outside the vocabulary [0, {vocab})")
                if counted_labels(s):
                    labels = torch.tensor(list(s[1:]) + [model_ref.IGNORE])
                    mb = mb + torch.nn.functional.cross_entropy(forward(s, step - 1, row), labels,
                                                                ignore_index=model_ref.IGNORE, reduction="sum")
            if o["loss_norm"] == "step":
                mb = mb / n_step
            else:
                mb = mb / max(1, sum(counted_labels(s) for s in batch)) / len(batches)
            if mb.requires_grad:
                mb.backward()
            loss += float(mb.item())
        for p in every:   # a parameter no token reached (all-padding) still steps, with a zero gradient
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        if o["max_grad_norm"] and o["max_grad_norm"] > 0:
            norm = float(torch.nn.utils.clip_grad_norm_(every, o["max_grad_norm"]))
        else:
            norm = float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(p.grad) for p in every])))
        opt.step()
        sched.step()
        log.append({"step": step, "loss": loss, "lr": lr, "grad_norm": norm})
    return log


def reference_train(model_dir, data_path, **opts):
    """Runs opts["steps"] optimizer steps; returns (log, params): log is a list of
    {"step", "loss", "lr", "grad_norm"}, params {HF name: float64 NumPy} after the last step
    (a tied lm_head has no entry of its own, as in the checkpoint's sense of one tensor)."""
    o = dict(DEFAULTS)
    unknown = set(opts) - set(o)
    if unknown:
        raise TypeError(f"unknown options {sorted(unknown)}")
    o.update(opts)
    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = json.load(f)
    weights = model_ref.load_weights(model_dir)
    if cfg.get("tie_word_embeddings"):
        weights.pop("lm_head.weight", None)
    dt = getattr(torch, o["dtype"])
    params = {k: torch.tensor(v, dtype=dt, requires_grad=True) for k, v in weights.items()}
    seqs = read_sequences(data_path, o["seq_len"])
    log = train_steps(params, seqs, o, lambda s, step, row: model_ref.forward_logits(cfg, params, s), cfg["vocab_size"])
    return log, {k: v.detach().numpy().copy() for k, v in params.items()}


# ---- output ---------------------------------------------------------------------

def write_safetensors(path, tensors):
    """F32 tensors under their names, in the file layout Transformers writes."""
    header, blobs, at = {}, [], 0
    for name in sorted(tensors):
        b = np.ascontiguousarray(tensors[name], dtype="<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(tensors[name].shape), "data_offsets": [at, at + len(b)]}
        blobs.append(b)
        at += len(b)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--seq-len", type=int, default=DEFAULTS["seq_len"])
    ap.add_argument("--batch-size", type=int, default=DEFAULTS["batch_size"])
    ap.add_argument("--grad-accum", type=int, default=DEFAULTS["grad_accum"])
    ap.add_argument("--lr", type=float, default=DEFAULTS["lr"])
    ap.add_argument("--lr-scheduler", default=DEFAULTS["lr_scheduler"],
                    choices=["constant", "constant_with_warmup", "linear", "cosine"])
    ap.add_argument("--warmup-steps", type=int, default=DEFAULTS["warmup_steps"])
    ap.add_argument("--weight-decay", type=float, default=DEFAULTS["weight_decay"])
    ap.add_argument("--max-grad-norm", type=float, default=DEFAULTS["max_grad_norm"])
    ap.add_argument("--optim", default=DEFAULTS["optim"], choices=["adamw", "sgd"])
    ap.add_argument("--momentum", type=float, default=DEFAULTS["momentum"])
    ap.add_argument("--steps", type=int, default=DEFAULTS["steps"])
    a = ap.parse_args(argv)
    opts = {k: v for k, v in vars(a).items() if k not in ("model", "data", "out")}
    log, params = reference_train(a.model, a.data, **opts)
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "train_log.jsonl"), "w") as f:
        for e in log:
            f.write(json.dumps(e) + "\n")
    write_safetensors(os.path.join(a.out, "model.safetensors"), params)
    shutil.copy(os.path.join(a.model, "config.json"), os.path.join(a.out, "config.json"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
