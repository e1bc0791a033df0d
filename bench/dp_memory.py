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
    bench/dp_memory.py --preset qwen3-0.6b --configs shard+gc,shard,single+gc,single
    bench/dp_memory.py --preset small --extra "--lora-r 16 --lora-target q_proj,v_proj"   # LoRA
"""
import os
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from measure import memory_args, memory_setup, memory_train  # noqa: E402


def main():
    ap = memory_args(seq_len=512, steps=2)
    # replicate, shard: --dp-replicate 2 / --dp-shard 2; single: one process (TP = 1, no dp), whose
    # state per rank is a --dp-replicate rank's (for when two replicas do not fit in memory)
    # (a "+gc" suffix: that run with --gradient-checkpointing, e.g. shard+gc,single+gc,shard,single)
    ap.add_argument("--configs", default="replicate,shard")
    ap.add_argument("--gradient-checkpointing", action="store_true",
                    help="every run with --gradient-checkpointing (each decoder layer recomputed in its backward)")
    ap.add_argument("--extra", default="", help="more options for every run, e.g. a LoRA adapter's --lora-r 16")
    a = ap.parse_args()
    setup = memory_setup(a, "tp-dp-mem-")
    peaks = {}
    for cfg in a.configs.split(","):
        kind, gc = cfg.removesuffix("+gc"), cfg.endswith("+gc") or a.gradient_checkpointing
        extra = [*([] if kind == "single" else ["--dp-" + kind, "2"]), *(["--gradient-checkpointing"] if gc else []),
                 *a.extra.split()]
        ranks, _, log = memory_train(a, setup, cfg.replace("+", "-"), 1 if kind == "single" else 2, extra)
        losses = [e["loss"] for e in log]
        peaks[cfg] = ranks[0]
        print(f"{cfg}: peak RSS per rank {[round(r / 2**20, 3) for r in ranks]} GiB, losses {losses}")
    shutil.rmtree(setup[0])   # the made model (2.4 GB at 0.6b) and the runs' outputs
    for gc in ("", "+gc"):
        base = peaks.get("replicate" + gc, peaks.get("single" + gc))
        if base and "shard" + gc in peaks:
            print(f"dp-shard{gc} / {'dp-replicate' if 'replicate' + gc in peaks else 'single'}{gc}: "
                  f"{100 * peaks['shard' + gc] / base:.1f} %")


if __name__ == "__main__":
    main()
