#!/usr/bin/python3
"""A LoRA training step against a full fine-tuning step (bench/README.md's
LoRA targets): peak RSS per rank (VmHWM polled by bench/measure.py) and
tokens/s (median over the steps after the first) of `tensorpar train` at
one TP size, f32 AdamW, the two runs one after the other (never
both at once).

    bench/lora_memory.py --bin build/tensorpar --preset qwen3-0.6b --tp 2
    bench/lora_memory.py --preset small --tp 1 --steps 4
"""
import argparse
import os
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from measure import make_model, train_measured, write_rows  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="build/tensorpar")
    ap.add_argument("--preset", default="small")
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--lora", default="--lora-r 16 --lora-alpha 32 --lora-target q_proj,k_proj,v_proj,o_proj,"
                    "gate_proj,up_proj,down_proj", help="the LoRA run's options")
    ap.add_argument("--set", action="append", default=[], help="make-model --set KEY=VALUE (repeatable)")
    a = ap.parse_args()
    work = tempfile.mkdtemp(prefix="tp-lora-mem-")
    model = os.path.join(work, "model")
    make_model(a.bin, a.preset, model, a.set)
    data = write_rows(model, os.path.join(work, "d.jsonl"), 2 * a.steps, a.seq_len, seed=1)
    env = dict(os.environ, OPENBLAS_NUM_THREADS=str(a.threads))
    res = {}
    for cfg in ("full", "lora"):
        out = os.path.join(work, "out-" + cfg)
        cmd = [a.bin, "train", "--model", model, "--data", data, "--out", out, "--seq-len", str(a.seq_len),
               "--batch-size", "1", "--steps", str(a.steps), "--no-shuffle", "--threads", str(a.threads),
               "--tp", str(a.tp), *(a.lora.split() if cfg == "lora" else [])]
        ranks, maxrss, log = train_measured(cmd, out, env, a.tp, cfg)
        rate = statistics.median(e["tokens_per_s"] for e in log[1:]) if len(log) > 1 else log[0]["tokens_per_s"]
        res[cfg] = (max(ranks[0], maxrss), rate)
        print(f"{cfg}: peak RSS per rank {[round(r / 2**20, 3) for r in ranks]} GiB, tokens/s {rate:.1f}, "
              f"losses {[round(e['loss'], 5) for e in log]}")
    (fm, fr), (lm, lr) = res["full"], res["lora"]
    print(f"LoRA / full: memory {100 * lm / fm:.1f} % (target <= 40 %), speed {lr / fr:.2f}x (target >= 1.3x)")


if __name__ == "__main__":
    main()
