"""train/'s optimizers, schedules and clipping against torch.optim.

worker_optim writes random parameters and five steps of random gradients as
.npy files, then runs five steps of four configurations (AdamW with the
linear schedule and weight decay, AdamW with the constant one, SGD with
momentum and the cosine schedule, SGD nesterov with constant_with_warmup),
each step clipping the gradients to norm 1 first.  Here the same steps run
through torch.optim.AdamW / SGD (weight decay only on the decay group, as
Trainer's get_decay_parameter_names makes it), torch.nn.utils.clip_grad_norm_
and LambdaLR with Transformers' schedule lambdas, written again from their
definitions (transformers is not installed).  Every parameter after every
step must agree within 1e-6 of its largest value; the lr and the norm of
every step too.

Then worker_optim --sharded runs as 1, 2 and 4 ranks: the global gradient
norm over colwise, rowwise, replicated and KV-replicated shards equals the
norm of the whole gradients, the shards after AdamW steps equal the whole
parameters narrowed, and the replica check catches one changed bit.
"""

import math
import os
import re
import subprocess
import sys
import tempfile

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tpe2e import BIN, Checks, job_env, worker  # noqa: E402

TOL = 1e-6
WORKER = worker("worker_optim")
NAMES = ["layer.weight", "layer.bias", "norm.weight", "embed.weight"]
NO_DECAY = {"layer.bias", "norm.weight"}
MAX_NORM = 1.0

check = Checks()


# Transformers' schedule lambdas (optimization.py), from their definitions.
def warmup(step, w):
    return float(step) / float(max(1, w))


def constant(w, total):
    return lambda step: 1.0


def constant_with_warmup(w, total):
    return lambda step: warmup(step, w) if step < w else 1.0


def linear(w, total):
    def f(step):
        if step < w:
            return warmup(step, w)
        return max(0.0, float(total - step) / float(max(1, total - w)))
    return f


def cosine(w, total, num_cycles=0.5):
    def f(step):
        if step < w:
            return warmup(step, w)
        progress = float(step - w) / float(max(1, total - w))
        return max(0.0, 0.5 * (1.0 + math.cos(math.pi * float(num_cycles) * 2.0 * progress)))
    return f


# The worker's configurations (tests/workers/worker_optim.c, run_alone).
CONFIGS = {
    "adamw": dict(opt="adamw", lr=1e-2, wd=0.1, sched=linear(2, 5)),
    "adamw_constant": dict(opt="adamw", lr=1e-3, wd=0.0, sched=constant(0, 0)),
    "sgd": dict(opt="sgd", lr=0.1, wd=0.01, momentum=0.9, nesterov=False, sched=cosine(0, 5)),
    "nesterov": dict(opt="sgd", lr=0.05, wd=0.0, momentum=0.8, nesterov=True, sched=constant_with_warmup(3, 0)),
}


def rel(ours, ref):
    return float(np.abs(ours.astype(np.float64) - ref.astype(np.float64)).max() / max(np.abs(ref).max(), 1e-30))


def replay(d, name, cfg, lines):
    params = {n: torch.nn.Parameter(torch.tensor(np.load(f"{d}/P_{n}.npy"))) for n in NAMES}
    decay = [params[n] for n in NAMES if n not in NO_DECAY]
    no_decay = [params[n] for n in NAMES if n in NO_DECAY]
    groups = [{"params": decay, "weight_decay": cfg["wd"]}, {"params": no_decay, "weight_decay": 0.0}]
    if cfg["opt"] == "adamw":
        opt = torch.optim.AdamW(groups, lr=cfg["lr"], foreach=False)
    else:
        opt = torch.optim.SGD(groups, lr=cfg["lr"], momentum=cfg["momentum"], nesterov=cfg["nesterov"],
                              foreach=False)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, cfg["sched"])
    clipped = 0
    for k in range(1, 6):
        lr = opt.param_groups[0]["lr"]
        for n in NAMES:
            params[n].grad = torch.tensor(np.load(f"{d}/G{k}_{n}.npy"))
        norm = float(torch.nn.utils.clip_grad_norm_(list(params.values()), MAX_NORM))
        clipped += norm > MAX_NORM
        opt.step()
        sched.step()
        c_lr, c_norm = lines[(name, k)]
        check(c_lr == lr, f"{name} step {k}: lr {c_lr!r}, torch {lr!r}")
        check(abs(c_norm - norm) <= TOL * norm, f"{name} step {k}: norm {c_norm}, torch {norm}")
        worst = 0.0
        for n in NAMES:
            e = rel(np.load(f"{d}/{name}_{k}_{n}.npy"), params[n].detach().numpy())
            worst = max(worst, e)
            check(e <= TOL, f"{name} step {k}: {n} is {e:.3g} of its largest value from torch's")
        print(f"{name} step {k}: lr {lr:.6g} norm {norm:.6g} max error {worst:.3g}")
    check(0 < clipped < 5, f"{name}: clipping was active in {clipped} of 5 steps (want some, not all)")


def torch_comparison():
    with tempfile.TemporaryDirectory() as d:
        p = subprocess.run([WORKER, "--out-dir", d], capture_output=True, text=True, timeout=300)
        check(p.returncode == 0, f"worker_optim exited {p.returncode}: {p.stderr.strip()}")
        if p.returncode:
            return
        lines = {}
        for m in re.finditer(r"^step (\S+) (\d+) lr (\S+) norm (\S+)$", p.stdout, re.M):
            lines[(m.group(1), int(m.group(2)))] = (float(m.group(3)), float(m.group(4)))
        check(len(lines) == 5 * len(CONFIGS), f"worker_optim printed {len(lines)} steps:\n{p.stdout}")
        if len(lines) != 5 * len(CONFIGS):
            return
        for name, cfg in CONFIGS.items():
            replay(d, name, cfg, lines)


def sharded():
    for n in (1, 2, 4):
        p = subprocess.run([BIN, "launch", "-n", str(n), "--", WORKER, "--sharded"], env=job_env(),
                           capture_output=True, text=True, timeout=300)
        reports = re.findall(r"^worker_optim: rank \d+ of \d+: (\d+) checks, (\d+) failed$", p.stdout, re.M)
        check(p.returncode == 0, f"n={n}: exit {p.returncode}\n{p.stdout}{p.stderr}")
        check(len(reports) == n and all(int(c) > 20 and f == "0" for c, f in reports),
              f"n={n}: rank reports {reports}")
        # every rank printed the same bits of each step's norm
        norms = re.findall(r"^norm (\d+) (\S+) ", p.stdout, re.M)
        check(len(norms) == 3 * n and len(set(norms)) == 3, f"n={n}: norms differ between ranks: {norms}")
        print(f"sharded n={n}: {'ok' if p.returncode == 0 else 'failed'} {reports[:1]}")


def main():
    torch.set_num_threads(1)
    torch_comparison()
    sharded()
    print(f"{len(check.failures)} failed")
    return 1 if check.failures else 0


if __name__ == "__main__":
    sys.exit(main())
