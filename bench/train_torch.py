"""PyTorch eager side of bench/train-vs-torch.sh: AdamW steps on a model directory.

The model is tests/reference/hf_reference_grad.py's code (written from
Transformers' modeling code) on float32 parameters; each step is one
forward + backward of the causal-LM loss over --batch-size sequences, the
gradient-norm clip at 1.0 and AdamW, as `tensorpar train` does with its
defaults.  Prints one JSON line: per-step seconds.
"""
import argparse
import json
import os
import struct
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "reference"))
import hf_reference_grad as ref  # noqa: E402


def load_f32(model_dir):
    # the reference's loader widens to float64 (2x the memory); read float32 straight
    path = os.path.join(model_dir, "model.safetensors")
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
    mm = np.memmap(path, dtype=np.uint8, mode="r")
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        if e["dtype"] != "F32":
            raise ValueError(f"{name}: dtype {e['dtype']}: make the model with --dtype f32")
        a, b = e["data_offsets"]
        x = np.array(mm[8 + n + a:8 + n + b]).view("<f4").reshape(e["shape"])
        out[name] = torch.from_numpy(x)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--threads", type=int, required=True)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=1)
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--dtype", default="f32", choices=["f32", "bf16"],
                    help="bf16: the forward and backward under CPU autocast to bfloat16, f32 master "
                         "parameters and AdamW state (tensorpar's --dtype bf16 arrangement)")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    with open(os.path.join(a.model, "config.json")) as f:
        cfg = json.load(f)
    w = load_f32(a.model)
    if cfg.get("tie_word_embeddings"):
        w.pop("lm_head.weight", None)
    p = {k: v.requires_grad_(True) for k, v in w.items()}
    with open(a.data) as f:
        seqs = [json.loads(line)["input_ids"][:a.seq_len] for line in f if line.strip()]
    opt = torch.optim.AdamW(list(p.values()), lr=5e-5, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
    times, losses = [], []
    for s in range(a.steps):
        t0 = time.perf_counter()
        batch = [seqs[(s * a.batch_size + i) % len(seqs)] for i in range(a.batch_size)]
        total = 0.0
        for toks in batch:   # the reference model has no batch dimension; the mean over the batch
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.dtype == "bf16"):
                loss = ref.forward_loss(cfg, p, toks) / len(batch)
            loss.backward()
            total += float(loss.item())
        torch.nn.utils.clip_grad_norm_(list(p.values()), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - t0)
        losses.append(total)
    print(json.dumps({"step_s": times, "loss": losses, "tokens": a.batch_size * a.seq_len}))


if __name__ == "__main__":
    main()
