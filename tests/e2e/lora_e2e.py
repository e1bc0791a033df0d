"""Helpers shared by the LoRA training tests (test_lora.py, test_lora_train.py):
the training options both use, a token data set, and `tensorpar train`
runs read back as (log, adapter tensors)."""

import os

import numpy as np

from tpe2e import read_log, run, vocab_size, write_token_rows
import peft_reference as peft

SEQ_LEN = 16
TRAIN = dict(seq_len=SEQ_LEN, batch_size=2, grad_accum=2, steps=5, optim="adamw", lr=2e-3, lr_scheduler="linear",
             warmup_steps=1, weight_decay=0.1, max_grad_norm=0.5)
FLAGS = dict(seq_len="--seq-len", batch_size="--batch-size", grad_accum="--grad-accum", steps="--steps",
             optim="--optim", lr="--lr", lr_scheduler="--lr-scheduler", warmup_steps="--warmup-steps",
             weight_decay="--weight-decay", max_grad_norm="--max-grad-norm")


def make_data(work, model, lines=24, seed=0):
    """work/data-SEED.jsonl: `lines` rows of 3 to SEQ_LEN + 4 random tokens."""
    rng = np.random.default_rng(seed)
    return write_token_rows(os.path.join(work, f"data-{seed}.jsonl"), rng, lines, vocab_size(model),
                            lambda i: int(rng.integers(3, SEQ_LEN + 5)))


def train_args(model, data, out, tp, opts, *extra):
    """`tensorpar train`'s arguments: opts (keys of FLAGS) as flags, then extra."""
    args = ["train", "--model", model, "--data", data, "--out", out, "--tp", tp, "--threads", 1, "--no-shuffle",
            "--seed", 0, *extra]
    for k, v in opts.items():
        args += [FLAGS[k], v]
    return args


def train(model, data, out, tp, opts, *extra):
    """Runs `tensorpar train`; its log and the adapter it saved in out."""
    run(*train_args(model, data, out, tp, opts, *extra))
    return read_log(out), peft.ref.read_safetensors(os.path.join(out, "adapter_model.safetensors"))


def adapter_bytes(d):
    with open(os.path.join(d, "adapter_model.safetensors"), "rb") as f:
        return f.read()
