#!/usr/bin/python3
"""Peak RSS per rank of `tensorpar train --dp-replicate 2` against
`--dp-shard 2` (ZeRO-3), f32 AdamW, one model preset: VmHWM of every rank
polled as bench/train_vs_torch.py does, the runs one after the other
(never two at once), the losses printed so that both runs are seen to
agree.

    bench/dp_memory.py --bin build/tensorpar --preset small
    bench/dp_memory.py --bin build/tensorpar --preset qwen3-0.6b --steps 2
    bench/dp_memory.py --preset qwen3-0.6b --set num_hidden_layers=8 --set vocab_size=32768
"""
import argparse
import json
import os
import random
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_vs_torch import run_measured  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="build/tensorpar")
    ap.add_argument("--preset", default="small")
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    # replicate, shard: --dp-replicate 2 / --dp-shard 2; single: one process (TP = 1, no dp), whose
    # state per rank is a --dp-replicate rank's (for when two replicas do not fit in memory)
    ap.add_argument("--configs", default="replicate,shard")
    ap.add_argument("--set", action="append", default=[], help="make-model --set KEY=VALUE (repeatable)")
    a = ap.parse_args()
    work = tempfile.mkdtemp(prefix="tp-dp-mem-")
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
    peaks = {}
    for cfg in a.configs.split(","):
        out = os.path.join(work, "out-" + cfg)
        cmd = [a.bin, "train", "--model", model, "--data", data, "--out", out, "--seq-len", str(a.seq_len),
               "--batch-size", "1", "--steps", str(a.steps), "--no-shuffle", "--threads", str(a.threads),
               *([] if cfg == "single" else ["--dp-" + cfg, "2"])]
        rc, text, tree, _ = run_measured(cmd, env)
        if rc:
            sys.exit(f"{cfg} failed ({rc}):\n{text[-3000:]}")
        ranks = sorted((v for v in tree.values() if v > 0), reverse=True)[:1 if cfg == "single" else 2]
        with open(os.path.join(out, "train_log.jsonl")) as f:
            losses = [json.loads(line)["loss"] for line in f]
        peaks[cfg] = ranks[0]
        print(f"{cfg}: peak RSS per rank {[round(r / 2**20, 3) for r in ranks]} GiB, losses {losses}")
    base = peaks.get("replicate", peaks.get("single"))
    if base and "shard" in peaks:
        print(f"dp-shard / {'dp-replicate' if 'replicate' in peaks else 'single'}: {100 * peaks['shard'] / base:.1f} %")


if __name__ == "__main__":
    main()
