#!/usr/bin/python3
"""End-to-end: every collective on every backend, checked bit for bit.

Runs the worker_comm test program (tests/workers/, the rank program that compares each
collective's result with a serial computation and checks that all ranks hold
the same all-reduce bits) as 1..4 ranks:
  - on shm through `tensorpar launch`,
  - on mpi through mpirun and through `tensorpar launch --backend mpi`,
  - torchrun-style (RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT, no launcher),
and checks that each rank's hash of everything it received is the same on
every backend (the transport never changes results, tp-semantics §5.4).
Two jobs run at once to show they do not interfere.

    TENSORPAR_BIN=build/tensorpar /usr/bin/python3 tests/e2e/test_comm_collectives.py
"""
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tpe2e import HAVE_MPI, MPI_SKIP, Checks, job_env, worker  # noqa: E402

BIN = os.environ["TENSORPAR_BIN"]
WORKER = worker("worker_comm")
MPIRUN = shutil.which("mpirun") if HAVE_MPI else None
ENV = job_env()
MPI_ENV = job_env(mpi=True)

check = Checks()
failures = check.failures


def hashes(d, n):
    out = []
    for r in range(n):
        try:
            with open(os.path.join(d, f"rank{r}.hash")) as f:
                out.append(f.read().strip())
        except OSError:
            out.append(None)
    return out


def run(label, cmd, n, d, env=ENV, timeout=120):
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    check(p.returncode == 0, f"{label}: exit {p.returncode}\n{p.stdout}{p.stderr}")
    h = hashes(d, n)
    check(all(h), f"{label}: missing hash files {h}")
    print(f"{label}: ok" if p.returncode == 0 else f"{label}: failed")
    return h


def worker_cmd(d, quick):
    return [WORKER, "--out-dir", d] + (["--quick"] if quick else [])


def main():
    ref = {}
    with tempfile.TemporaryDirectory() as tmp:
        for n in (1, 2, 3, 4):
            d = os.path.join(tmp, f"shm{n}")
            os.mkdir(d)
            ref[n] = run(f"shm n={n}", [BIN, "launch", "-n", str(n), "--"] + worker_cmd(d, n % 2 == 1), n, d)
        if MPIRUN:
            for n in (1, 2, 3, 4):
                d = os.path.join(tmp, f"mpi{n}")
                os.mkdir(d)
                h = run(f"mpirun n={n}", [MPIRUN, "-n", str(n), "--oversubscribe"] + worker_cmd(d, n % 2 == 1), n, d,
                        env=MPI_ENV)
                check(h == ref[n], f"mpi n={n}: hashes {h} differ from shm {ref[n]}")
            d = os.path.join(tmp, "launch-mpi")
            os.mkdir(d)
            run("launch --backend mpi n=2", [BIN, "launch", "-n", "2", "--backend", "mpi", "--"] +
                worker_cmd(d, True), 2, d, env=MPI_ENV)
        elif not HAVE_MPI:
            print(MPI_SKIP)
        else:
            failures.append("mpirun not found")

        # torchrun-style, without our launcher: the name comes from MASTER_*.
        d = os.path.join(tmp, "torchrun")
        os.mkdir(d)
        procs = []
        for r in range(2):
            env = dict(ENV, RANK=str(r), WORLD_SIZE="2", LOCAL_RANK=str(r), MASTER_ADDR="127.0.0.1",
                       MASTER_PORT=str(20000 + os.getpid() % 20000))
            procs.append(subprocess.Popen(worker_cmd(d, True), env=env, stdout=subprocess.PIPE,
                                          stderr=subprocess.STDOUT, text=True))
        outs = [p.communicate(timeout=120)[0] for p in procs]
        check(all(p.returncode == 0 for p in procs), f"torchrun-style: {outs}")
        check(all(hashes(d, 2)), "torchrun-style: missing hashes")
        check(not [f for f in os.listdir("/dev/shm") if f"-m-127.0.0.1-{20000 + os.getpid() % 20000}" in f],
              "torchrun-style: segment left in /dev/shm")
        print("torchrun-style n=2: ok")

        # Two jobs at once on the same host, same program.
        dirs = [os.path.join(tmp, f"concurrent{i}") for i in range(2)]
        procs = []
        for i, d in enumerate(dirs):
            os.mkdir(d)
            procs.append(subprocess.Popen([BIN, "launch", "-n", "2", "--"] + worker_cmd(d, False), env=ENV,
                                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
        outs = [p.communicate(timeout=120)[0] for p in procs]
        check(all(p.returncode == 0 for p in procs), f"concurrent jobs: {outs}")
        for d in dirs:
            check(hashes(d, 2) == ref[2], f"concurrent job {d}: hashes differ from a lone run")
        print("two concurrent jobs: ok")

    print(f"{len(failures)} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
