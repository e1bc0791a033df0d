"""Driver of bench/train-vs-torch.sh: training tokens/s and peak RSS per rank,
tensorpar (TP=1x1, 1x2, 2x1) against PyTorch eager (1 and 2 threads),
in interleaved rounds whose order alternates.  See bench/README.md, "Training".
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from measure import make_model, run_measured, train_measured, write_rows  # noqa: E402


def tensorpar_run(a, tp, threads, env):
    out_dir = os.path.join(a.work, f"out-tp{tp}x{threads}")
    cmd = [a.bin, "train", "--model", a.model, "--data", a.data, "--out", out_dir,
           "--seq-len", str(a.seq_len), "--batch-size", str(a.batch_size), "--steps", str(a.steps),
           "--no-shuffle", "--threads", str(threads), "--tp", str(tp), "--loss", a.loss, "--dtype", a.dtype]
    if a.blas_threads:
        # tensorpar's backward GEMMs call OpenBLAS (src/kernels/matmul.c), which otherwise
        # starts one thread per core in every rank: 2 ranks x 2 threads on 2 cores
        env = dict(env, OPENBLAS_NUM_THREADS=str(threads))
    ranks, maxrss, log = train_measured(cmd, out_dir, env, tp, "tensorpar train")
    rates = [e["tokens_per_s"] for e in log[1:]]   # step 1 is the warm-up
    return statistics.median(rates), max(ranks[0] if ranks else 0, maxrss), ranks, [e["loss"] for e in log]


def torch_run(a, threads, env):
    env = dict(env, OMP_NUM_THREADS=str(threads), OPENBLAS_NUM_THREADS=str(threads))
    cmd = [a.python, os.path.join(HERE, "train_torch.py"), "--model", a.model, "--data", a.data,
           "--threads", str(threads), "--steps", str(a.steps), "--batch-size", str(a.batch_size),
           "--seq-len", str(a.seq_len), "--dtype", a.torch_dtype or a.dtype]
    rc, out, peaks, maxrss = run_measured(cmd, env)
    if rc != 0:
        sys.exit(f"torch run failed ({rc}):\n{out[-3000:]}")
    r = json.loads(out.strip().splitlines()[-1])
    rates = [r["tokens"] / t for t in r["step_s"][1:]]
    return statistics.median(rates), maxrss, [maxrss], r["loss"]


def prepare(a):
    os.makedirs(a.work, exist_ok=True)
    if not os.path.exists(os.path.join(a.model, "config.json")):
        make_model(a.bin, a.preset, a.model, quiet=False)
    write_rows(a.model, a.data, a.steps * a.batch_size, a.seq_len, seed=0)


def fmt(vals, unit=""):
    return f"{statistics.median(vals):.3g}{unit} [{min(vals):.3g}..{max(vals):.3g}]"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", default="build/tensorpar")
    ap.add_argument("--python", default="/usr/bin/python3")
    ap.add_argument("--preset", default="qwen3-0.6b")
    ap.add_argument("--work", default="/tmp/tp-train-bench")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=3, help="steps per run; the first is excluded")
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--batch-size", type=int, default=1)
    ap.add_argument("--configs", default="tp1x1,tp1x2,tp2x1,torch1,torch2")
    ap.add_argument("--dtype", default="f32", choices=["f32", "bf16"],
                    help="tensorpar --dtype bf16 (bf16 weights, f32 master) against torch under CPU autocast bf16")
    ap.add_argument("--torch-dtype", choices=["f32", "bf16"],
                    help="torch's side only (default: --dtype); torch's CPU autocast bf16 has no fast path on AVX2 "
                         "CPUs (~16x slower than its f32 there), so --dtype bf16 --torch-dtype f32 compares with "
                         "torch's fastest")
    ap.add_argument("--loss", default="default", help="tensorpar's --loss: default|vocab-parallel")
    ap.add_argument("--no-blas-threads", dest="blas_threads", action="store_false",
                    help="leave OPENBLAS_NUM_THREADS unset for tensorpar (default: its threads per rank)")
    a = ap.parse_args()
    a.model = os.path.join(a.work, f"{a.preset}-f32")
    a.data = os.path.join(a.work, f"ids-{a.seq_len}.jsonl")
    prepare(a)
    env = dict(os.environ)
    with open("/proc/cpuinfo") as f:
        cpu = next((l.split(":", 1)[1].strip() for l in f if l.startswith("model name")), "?")
    isa = subprocess.run([a.bin, "--isa-list"], capture_output=True, text=True).stdout.split()
    print(f"cpu: {cpu}; kernel paths: {' '.join(isa)}; OPENBLAS_CORETYPE={env.get('OPENBLAS_CORETYPE', '(unset)')}; "
          f"OPENBLAS_NUM_THREADS for tensorpar: {'its threads per rank' if a.blas_threads else 'unset'}")
    print(f"model: {a.preset} (checkpoint f32, trained in {a.dtype}; torch in {a.torch_dtype or a.dtype}), seq-len {a.seq_len}, batch {a.batch_size}, {a.steps} steps per run "
          f"(first excluded), {a.rounds} rounds", flush=True)
    configs = a.configs.split(",")
    rate = {c: [] for c in configs}
    rss = {c: [] for c in configs}
    losses = {}
    for rnd in range(a.rounds):
        order = configs if rnd % 2 == 0 else configs[::-1]
        for c in order:
            t0 = time.time()
            if c.startswith("torch"):
                r, m, ranks, loss = torch_run(a, int(c[5:]), env)
            else:
                tp, th = (int(x) for x in c[2:].split("x"))
                r, m, ranks, loss = tensorpar_run(a, tp, th, env)
            rate[c].append(r)
            rss[c].append(max(ranks) if ranks else m)
            losses[c] = loss
            load = os.getloadavg()[0]
            print(f"round {rnd + 1} {c}: {r:.1f} tokens/s, peak RSS per rank "
                  f"{' '.join(f'{k / 1048576:.2f}' for k in ranks)} GiB, "
                  f"{time.time() - t0:.0f} s, load {load:.1f}", flush=True)
    print("\nlosses of the last round (same data, same start):")
    for c in configs:
        print(f"  {c}: {' '.join(f'{x:.6f}' for x in losses[c])}")
    print("\ntokens/s, median [min..max] over rounds:")
    for c in configs:
        print(f"  {c}: {fmt(rate[c])}   peak RSS per rank {fmt([k / 1048576 for k in rss[c]], ' GiB')}")

    def ratio(num, den):
        if num in rate and den in rate:
            vals = [x / y for x, y in zip(rate[num], rate[den])]
            return fmt(vals) + f" (median {statistics.median(vals):.2f})"
        return "n/a"

    print("\nratios within each round, median [min..max]:")
    print(f"  tensorpar TP=1x2 / torch 2 threads: {ratio('tp1x2', 'torch2')}   target >= 1.5")
    print(f"  tensorpar TP=2x1 / torch 2 threads: {ratio('tp2x1', 'torch2')}   target >= 1.5")
    print(f"  tensorpar TP=1x1 / torch 1 thread:  {ratio('tp1x1', 'torch1')}")
    print(f"  TP=2x1 / TP=1x1: {ratio('tp2x1', 'tp1x1')}   target >= 1.8")
    if "tp2x1" in rss and "tp1x1" in rss:
        vals = [x / y for x, y in zip(rss["tp2x1"], rss["tp1x1"])]
        print(f"  peak RSS per rank TP=2 / TP=1: {fmt([100 * v for v in vals], ' %')}   target <= 55 %")


if __name__ == "__main__":
    main()
