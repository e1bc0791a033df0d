#!/usr/bin/python3
"""End-to-end: every redistribution of dist/ on 1..4 ranks, on shm and on mpi.

Runs the rank program worker_dist (tests/workers/), which redistributes
DTensors between every pair of placements (Replicate, Partial, Shard(d),
StridedShard(d, s)) for f32 and bf16, uneven and empty shards, on a 1-D mesh,
on a 2-D mesh (world 4 as dp=2 x tp=2) and on its mesh["tp"], and compares
each rank's local result bit for bit with a serial computation.  It also
all-reduces non-integer data and checks that all ranks hold the same bits;
the hash it writes must be the same on both transports (tp-semantics §5.4).

    TENSORPAR_BIN=build/tensorpar /usr/bin/python3 tests/e2e/test_dist.py
"""
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tpe2e import HAVE_MPI, MPI_SKIP, Checks, job_env, worker  # noqa: E402

BIN = os.environ["TENSORPAR_BIN"]
WORKER = worker("worker_dist")
MPIRUN = shutil.which("mpirun") if HAVE_MPI else None
ENV = job_env()
MPI_ENV = job_env(mpi=True)

check = Checks()
failures = check.failures


def run(label, cmd, n, d, env=ENV, timeout=300):
    p = subprocess.run(cmd + [WORKER, "--verbose", "--out-dir", d], env=env,
                       capture_output=True, text=True, timeout=timeout)
    lines = [l for l in p.stdout.splitlines() if l.startswith("worker_dist: rank")]
    check(p.returncode == 0, f"{label}: exit {p.returncode}\n{p.stdout}{p.stderr}")
    check(len(lines) == n and all(", 0 failed" in l for l in lines), f"{label}: rank reports {lines}")
    hashes = []
    for r in range(n):
        try:
            with open(os.path.join(d, f"rank{r}.hash")) as f:
                hashes.append(f.read().strip())
        except OSError:
            hashes.append(None)
    check(all(hashes), f"{label}: missing hash files {hashes}")
    print(f"{label}: {'ok' if p.returncode == 0 else 'failed'}  {lines[0] if lines else ''}")
    return hashes


def main():
    ref = {}
    with tempfile.TemporaryDirectory() as tmp:
        for n in (1, 2, 3, 4):
            d = os.path.join(tmp, f"shm{n}")
            os.mkdir(d)
            ref[n] = run(f"shm n={n}", [BIN, "launch", "-n", str(n), "--"], n, d)
        if MPIRUN:
            for n in (1, 2, 3, 4):
                d = os.path.join(tmp, f"mpi{n}")
                os.mkdir(d)
                h = run(f"mpirun n={n}", [MPIRUN, "-n", str(n), "--oversubscribe"], n, d, env=MPI_ENV)
                check(h == ref[n], f"mpi n={n}: hashes {h} differ from shm {ref[n]}")
        elif not HAVE_MPI:
            print(MPI_SKIP)
        else:
            failures.append("mpirun not found")
    print(f"{len(failures)} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
