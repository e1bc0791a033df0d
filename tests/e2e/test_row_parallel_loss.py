#!/usr/bin/python3
"""The row-parallel cross-entropy (src/train/loss_row_parallel.c, the default
loss at TP > 1) against tp_cross_entropy on the whole logits, at P = 1..4.

worker_rowloss runs as every rank: each rank draws the same full logits and
labels, takes its vocabulary shard and runs the row-parallel loss on it in
place; the loss and the shard's gradient must be one rank's very bits (T not
divisible by P, T < P, several blocks of 64 rows per rank with whole blocks
ignored, large logits, every row ignored).  Here: every rank passed and
printed the same bits of each loss.
"""

import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tpe2e import BIN, Checks, job_env, worker  # noqa: E402

WORKER = worker("worker_rowloss")
CASES = 5
check = Checks()


def main():
    for n in (1, 2, 3, 4):
        p = subprocess.run([BIN, "launch", "-n", str(n), "--", WORKER], env=job_env(),
                           capture_output=True, text=True, timeout=300)
        reports = re.findall(r"^worker_rowloss: rank \d+ of \d+: (\d+) checks, (\d+) failed$", p.stdout, re.M)
        check(p.returncode == 0, f"n={n}: exit {p.returncode}\n{p.stdout}{p.stderr}")
        check(len(reports) == n and all(int(c) >= 5 * CASES and f == "0" for c, f in reports),
              f"n={n}: rank reports {reports}")
        losses = re.findall(r"^loss (\S+) (\S+)$", p.stdout, re.M)
        check(len(losses) == CASES * n and len(set(losses)) == CASES,
              f"n={n}: the ranks' losses differ: {sorted(set(losses))}")
        print(f"n={n}: {'ok' if p.returncode == 0 else 'failed'}")
    print(f"{len(check.failures)} failed")
    return 1 if check.failures else 0


if __name__ == "__main__":
    sys.exit(main())
