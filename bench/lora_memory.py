#!/usr/bin/python3
"""A LoRA training step against a full fine-tuning step (bench/README.md's
LoRA targets): peak RSS per rank (VmHWM polled by bench/measure.py) and
tokens/s (median over the steps after the first) of `tensorpar train` at
one TP size, f32 AdamW, the two runs one after the other (never
both at once).

    bench/lora_memory.py --bin build/tensorpar --preset qwen3-0.6b --tp 2
    bench/lora_memory.py --preset small --tp 1 --steps 4
"""
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from measure import memory_args, memory_setup, memory_train  # noqa: E402


def main():
    ap = memory_args(seq_len=256, steps=3)
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--lora", default="--lora-r 16 --lora-alpha 32 --lora-target q_proj,k_proj,v_proj,o_proj,"
                    "gate_proj,up_proj,down_proj", help="the LoRA run's options")
    a = ap.parse_args()
    setup = memory_setup(a, "tp-lora-mem-")
    res = {}
    for cfg in ("full", "lora"):
        extra = ["--tp", str(a.tp), *(a.lora.split() if cfg == "lora" else [])]
        ranks, maxrss, log = memory_train(a, setup, cfg, a.tp, extra)
        rate = statistics.median(e["tokens_per_s"] for e in log[1:]) if len(log) > 1 else log[0]["tokens_per_s"]
        res[cfg] = (max(ranks[0], maxrss), rate)
        print(f"{cfg}: peak RSS per rank {[round(r / 2**20, 3) for r in ranks]} GiB, tokens/s {rate:.1f}, "
              f"losses {[round(e['loss'], 5) for e in log]}")
    (fm, fr), (lm, lr) = res["full"], res["lora"]
    print(f"LoRA / full: memory {100 * lm / fm:.1f} % (target <= 40 %), speed {lr / fr:.2f}x (target >= 1.3x)")


if __name__ == "__main__":
    main()
