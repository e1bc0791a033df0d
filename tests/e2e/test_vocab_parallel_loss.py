"""The vocabulary-parallel cross-entropy (src/train/loss_vocab_parallel.c)
against tp_cross_entropy on the gathered logits, at P = 1, 2, 3, 4.

worker_vploss runs as every rank: each rank draws the same full logits and
labels, takes its vocabulary shard (vocabularies not divisible by P, one
smaller than P, large logits, ignored rows, all rows ignored) and checks the
loss and its gradient columns against the full computation within 1e-6
relative, in place, loss-only and over a thread pool.  It measures the bytes
the library allocates during the loss step (malloc wrapped at link time):
the vocab-parallel step must stay within O(T·P) scratch and, for the
largest case, at most 1/P of the gathered step.  Here: every rank passed,
every rank printed the same bits of each loss, and the memory figures fall
as P grows.
"""

import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tpe2e import BIN, Checks, job_env, worker  # noqa: E402

WORKER = worker("worker_vploss")
CASES = 5
check = Checks()


def main():
    mem = {}
    for n in (1, 2, 3, 4):
        p = subprocess.run([BIN, "launch", "-n", str(n), "--", WORKER], env=job_env(),
                           capture_output=True, text=True, timeout=300)
        reports = re.findall(r"^worker_vploss: rank \d+ of \d+: (\d+) checks, (\d+) failed$", p.stdout, re.M)
        check(p.returncode == 0, f"n={n}: exit {p.returncode}\n{p.stdout}{p.stderr}")
        check(len(reports) == n and all(int(c) > 50 and f == "0" for c, f in reports),
              f"n={n}: rank reports {reports}")
        losses = re.findall(r"^loss (\S+) (\S+)$", p.stdout, re.M)
        check(len(losses) == CASES * n and len(set(losses)) == CASES,
              f"n={n}: the ranks' losses differ: {sorted(set(losses))}")
        errs = [(float(a), float(b)) for a, b in re.findall(r"^err \S+ (\S+) (\S+)$", p.stdout, re.M)]
        if errs:
            print(f"n={n}: largest relative error: loss {max(a for a, _ in errs):.3g}, "
                  f"gradient {max(b for _, b in errs):.3g}")
        big = [(int(a), int(b)) for a, b in re.findall(r"^mem memory (\d+) (\d+)$", p.stdout, re.M)]
        check(len(big) == n, f"n={n}: memory lines {big}")
        if big:
            mem[n] = (max(a for a, _ in big), max(b for _, b in big))
            print(f"n={n}: {'ok' if p.returncode == 0 else 'failed'}  peak bytes of the loss step "
                  f"(T=64, V=4099): vocab-parallel {mem[n][0]}, gathered {mem[n][1]}")
    for n in (2, 3, 4):
        if n in mem and 1 in mem:
            # The shard and the scratch: about 1/n of the one-rank step.
            check(mem[n][0] <= mem[1][0] / n * 1.05, f"n={n}: {mem[n][0]} bytes, not ~1/{n} of {mem[1][0]}")
    print(f"{len(check.failures)} failed")
    return 1 if check.failures else 0


if __name__ == "__main__":
    sys.exit(main())
