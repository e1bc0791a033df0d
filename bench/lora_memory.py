#!/usr/bin/python3
"""A LoRA training step against a full fine-tuning step (bench/README.md's
LoRA targets): peak RSS per rank (VmHWM polled as bench/train_vs_torch.py
does) and tokens/s (median over the steps after the first) of `tensorpar
train` at one TP size, f32 AdamW, the two runs one after the other (never
both at once).

    bench/lora_memory.py --bin build/tensorpar --preset qwen3-0.6b --tp 2
    bench/lora_memory.py --preset small --tp 1 --steps 4
"""
import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_vs_torch import run_measured  # noqa: E402


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
    sets = [x for kv in a.set for x in ("--set", kv)]
    subprocess.run([a.bin, "make-model", "--arch", "qwen3", "--preset", a.preset, "--dtype", "f32", *sets,
                    "--out", model], check=True, capture_output=True)
    with open(os.path.join(model, "config.json")) as f:
        vocab = json.load(f)["vocab_size"]
    data = os.path.join(work, "d.jsonl")
    rng = random.Random(1)
    with open(data, "w") as f:
        for _ in range(2 * a.steps):
            f.write(json.dumps({"input_ids": [rng.randrange(vocab) for _ in range(a.seq_len)]}) + "\n")
    env = dict(os.environ, OPENBLAS_NUM_THREADS=str(a.threads))
    res = {}
    for cfg in ("full", "lora"):
        out = os.path.join(work, "out-" + cfg)
        cmd = [a.bin, "train", "--model", model, "--data", data, "--out", out, "--seq-len", str(a.seq_len),
               "--batch-size", "1", "--steps", str(a.steps), "--no-shuffle", "--threads", str(a.threads),
               "--tp", str(a.tp), *(a.lora.split() if cfg == "lora" else [])]
        rc, text, tree, maxrss = run_measured(cmd, env)
        if rc:
            sys.exit(f"{cfg} failed ({rc}):\n{text[-3000:]}")
        ranks = sorted((v for v in tree.values() if v > 0), reverse=True)[:a.tp]
        with open(os.path.join(out, "train_log.jsonl")) as f:
            log = [json.loads(line) for line in f]
        rate = statistics.median(e["tokens_per_s"] for e in log[1:]) if len(log) > 1 else log[0]["tokens_per_s"]
        res[cfg] = (max(ranks[0], maxrss), rate)
        print(f"{cfg}: peak RSS per rank {[round(r / 2**20, 3) for r in ranks]} GiB, tokens/s {rate:.1f}, "
              f"losses {[round(e['loss'], 5) for e in log]}")
    (fm, fr), (lm, lr) = res["full"], res["lora"]
    print(f"LoRA / full: memory {100 * lm / fm:.1f} % (target <= 40 %), speed {lr / fr:.2f}x (target >= 1.3x)")


if __name__ == "__main__":
    main()
