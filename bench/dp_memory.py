#!/usr/bin/python3
"""Peak RSS per rank of `tensorpar train --dp-replicate 2` against
`--dp-shard 2` (ZeRO-3), f32 AdamW, one model preset: VmHWM of every rank
polled by bench/measure.py, the runs one after the other
(never two at once), the losses printed so that both runs are seen to
agree.

    bench/dp_memory.py --bin build/tensorpar --preset small
    bench/dp_memory.py --bin build/tensorpar --preset qwen3-0.6b --steps 2
    bench/dp_memory.py --preset qwen3-0.6b --set num_hidden_layers=8 --set vocab_size=32768
    bench/dp_memory.py --preset qwen3-0.6b --configs shard --gradient-checkpointing
"""
import argparse
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from measure import make_model, train_measured, write_rows  # noqa: E402


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
    ap.add_argument("--gradient-checkpointing", action="store_true",
                    help="every run with --gradient-checkpointing (each decoder layer recomputed in its backward)")
    ap.add_argument("--set", action="append", default=[], help="make-model --set KEY=VALUE (repeatable)")
    a = ap.parse_args()
    work = tempfile.mkdtemp(prefix="tp-dp-mem-")
    model = os.path.join(work, "model")
    make_model(a.bin, a.preset, model, a.set)
    data = write_rows(model, os.path.join(work, "d.jsonl"), 2 * a.steps, a.seq_len, seed=1)
    env = dict(os.environ, OPENBLAS_NUM_THREADS=str(a.threads))
    peaks = {}
    for cfg in a.configs.split(","):
        out = os.path.join(work, "out-" + cfg)
        cmd = [a.bin, "train", "--model", model, "--data", data, "--out", out, "--seq-len", str(a.seq_len),
               "--batch-size", "1", "--steps", str(a.steps), "--no-shuffle", "--threads", str(a.threads),
               *([] if cfg == "single" else ["--dp-" + cfg, "2"]),
               *(["--gradient-checkpointing"] if a.gradient_checkpointing else [])]
        ranks, _, log = train_measured(cmd, out, env, 1 if cfg == "single" else 2, cfg)
        losses = [e["loss"] for e in log]
        peaks[cfg] = ranks[0]
        print(f"{cfg}: peak RSS per rank {[round(r / 2**20, 3) for r in ranks]} GiB, losses {losses}")
    base = peaks.get("replicate", peaks.get("single"))
    if base and "shard" in peaks:
        print(f"dp-shard / {'dp-replicate' if 'replicate' in peaks else 'single'}: {100 * peaks['shard'] / base:.1f} %")


if __name__ == "__main__":
    main()
