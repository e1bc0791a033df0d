#!/usr/bin/python3
"""End-to-end: `tensorpar launch` and failure handling of the shm backend.

  - exit codes and the environment the ranks see,
  - a rank killed in the middle of all-reduces: the launcher names it, stops
    the others and exits non-zero within 5 s,
  - the launcher killed with SIGTERM, and with SIGKILL: no rank survives,
  - a rank that hangs: the others time out (TENSORPAR_COMM_TIMEOUT), naming it,
    and a busy rank is not taken for a frozen one however short
    TENSORPAR_HANG_TIMEOUT is (its heartbeat runs),
  - a frozen rank (SIGSTOP): the ranks waiting for it name it after
    TENSORPAR_HANG_TIMEOUT; frozen where nobody waits for it (or after it
    left the job), the launcher does, a little later; frozen before it
    joined, the others name it; busy
    before it joins, it is waited for,
  - without the launcher (torchrun-style), a killed rank is noticed by the
    survivor within about 2 s, and a frozen one after TENSORPAR_HANG_TIMEOUT,
and in every case nothing of the job is left in /dev/shm.

    TENSORPAR_BIN=build/tensorpar /usr/bin/python3 tests/e2e/test_launcher.py
"""
import os
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tpe2e import Checks, job_env, worker  # noqa: E402

BIN = os.environ["TENSORPAR_BIN"]
WORKER = worker("worker_comm")
ENV = job_env()
ENV.pop("TENSORPAR_COMM_TIMEOUT", None)
ENV.pop("TENSORPAR_HANG_TIMEOUT", None)

check = Checks()
failures = check.failures


def alive(pid):
    """True if pid exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def job_segments(launcher_pid):
    """/dev/shm entries of the job started by this launcher pid."""
    return [f for f in os.listdir("/dev/shm") if f.startswith("tensorpar-") and f"-j{launcher_pid}-" in f]


def wait_pids(d, n, timeout=20):
    end = time.time() + timeout
    while time.time() < end:
        try:
            pids = []
            for r in range(n):
                with open(os.path.join(d, f"rank{r}.pid")) as f:
                    pids.append(int(f.read()))
            return pids
        except (OSError, ValueError):
            time.sleep(0.05)
    return None


def start_loop(d, n, extra_env=None, extra=()):
    env = dict(ENV, **(extra_env or {}))
    return subprocess.Popen([BIN, "launch", "-n", str(n), "--", WORKER, "--loop", "60",
                             "--out-dir", d, *extra], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def started_job(tmp, name, n, extra_env=None, extra=()):
    """A `launch -n n` job of the worker_comm loop in tmp/name, and its
    ranks' pids once all have started (None, after killing it, if they
    did not)."""
    d = os.path.join(tmp, name)
    os.mkdir(d)
    p = start_loop(d, n, extra_env, extra)
    pids = wait_pids(d, n)
    check(pids is not None, "ranks did not start")
    if not pids:
        p.kill()
        p.communicate()
    return p, pids


def test_exit_codes():
    p = subprocess.run([BIN, "launch", "-n", "3", "--", "sh", "-c",
                        'test "$WORLD_SIZE" = 3 && test "$LOCAL_WORLD_SIZE" = 3 && test "$RANK" = "$LOCAL_RANK" '
                        '&& test -n "$TENSORPAR_RENDEZVOUS" && test "$TENSORPAR_BACKEND" = shm'],
                       env=ENV, capture_output=True, text=True, timeout=30)
    check(p.returncode == 0, f"environment of the ranks: {p.returncode} {p.stderr}")
    p = subprocess.run([BIN, "launch", "-n", "2", "--", "sh", "-c", 'if [ "$RANK" = 1 ]; then exit 3; fi; exec sleep 30'],
                       env=ENV, capture_output=True, text=True, timeout=30)
    check(p.returncode == 3, f"exit status of a failing rank: {p.returncode}")
    check("rank 1 (pid" in p.stderr and "exited with status 3; stopping the other ranks" in p.stderr,
          f"message for a failing rank: {p.stderr!r}")
    p = subprocess.run([BIN, "launch", "-n", "2", "--", "/nonexistent/program"], env=ENV,
                       capture_output=True, text=True, timeout=30)
    check(p.returncode == 127 and "cannot run /nonexistent/program" in p.stderr, f"missing program: {p.stderr!r}")
    p = subprocess.run([BIN, "launch", "--", "true"], env=ENV, capture_output=True, text=True, timeout=30)
    check(p.returncode == 2 and "-n N" in p.stderr, f"launch without -n: {p.returncode} {p.stderr!r}")
    print("exit codes and environment: done")


def test_kill_rank(tmp):
    p, pids = started_job(tmp, "kill-rank", 3)
    if not pids:
        return
    time.sleep(0.3)
    t0 = time.time()
    os.kill(pids[1], signal.SIGKILL)
    try:
        _, err = p.communicate(timeout=10)
    except subprocess.TimeoutExpired:
        p.kill()
        _, err = p.communicate()
    took = time.time() - t0
    check(took < 5, f"launcher took {took:.1f} s after a rank was killed")
    check(p.returncode != 0, "launcher exit status 0 after a rank was killed")
    check(f"rank 1 (pid {pids[1]}) was killed by signal 9 (Killed); stopping the other ranks" in err,
          f"message: {err!r}")
    check(not any(alive(x) for x in pids), "a rank survived")
    check(not job_segments(p.pid), f"left in /dev/shm: {job_segments(p.pid)}")
    print(f"rank killed mid-collective: launcher exited {p.returncode} after {took:.2f} s")


def test_kill_launcher(tmp, sig):
    p, pids = started_job(tmp, f"kill-launcher-{sig}", 2)
    if not pids:
        return
    t0 = time.time()
    p.send_signal(sig)
    p.communicate(timeout=10)
    end = time.time() + 5
    while time.time() < end and any(alive(x) for x in pids):
        time.sleep(0.05)
    took = time.time() - t0
    check(not any(alive(x) for x in pids), f"ranks survive the launcher's {signal.Signals(sig).name}")
    if sig == signal.SIGTERM:
        check(p.returncode == 128 + sig, f"launcher exit status after SIGTERM: {p.returncode}")
    check(not job_segments(p.pid), f"left in /dev/shm: {job_segments(p.pid)}")
    print(f"launcher killed with {signal.Signals(sig).name}: ranks gone after {took:.2f} s")


def test_hang(tmp):
    d = os.path.join(tmp, "hang")
    os.mkdir(d)
    t0 = time.time()
    p = start_loop(d, 2, {"TENSORPAR_COMM_TIMEOUT": "1.5"}, ("--stall-rank", "1"))
    try:
        _, err = p.communicate(timeout=20)
    except subprocess.TimeoutExpired:
        p.kill()
        _, err = p.communicate()
    took = time.time() - t0
    check(p.returncode != 0, "a hung rank went unnoticed")
    check("rank 1 did not answer within 1.5 s" in err, f"timeout message: {err!r}")
    check(took < 10, f"hang detected after {took:.1f} s")
    check(not job_segments(p.pid), f"left in /dev/shm: {job_segments(p.pid)}")
    print(f"hung rank: reported, launcher done after {took:.2f} s")


def test_busy_is_not_frozen(tmp):
    d = os.path.join(tmp, "busy")
    os.mkdir(d)
    p = start_loop(d, 2, {"TENSORPAR_COMM_TIMEOUT": "2.5", "TENSORPAR_HANG_TIMEOUT": "0.5"}, ("--stall-rank", "1"))
    try:
        _, err = p.communicate(timeout=20)
    except subprocess.TimeoutExpired:
        p.kill()
        _, err = p.communicate()
    check("rank 1 did not answer within 2.5 s" in err and "stopped responding" not in err,
          f"a busy rank was taken for a frozen one: {err!r}")
    print("busy rank: waited for until TENSORPAR_COMM_TIMEOUT")


def finish(p, limit=20):
    try:
        _, err = p.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        p.kill()
        _, err = p.communicate()
    return err


def test_stopped_rank(tmp):
    p, pids = started_job(tmp, "stopped", 3)
    if not pids:
        return
    time.sleep(0.3)
    t0 = time.time()
    os.kill(pids[2], signal.SIGSTOP)
    err = finish(p)
    took = time.time() - t0
    check(p.returncode == 1, f"launcher exit status {p.returncode} after a rank froze")
    check(f"rank 2 (pid {pids[2]}) stopped responding" in err, f"message for a frozen rank: {err!r}")
    check(1.9 < took < 3.5, f"frozen rank: the launcher ended after {took:.1f} s (TENSORPAR_HANG_TIMEOUT is 2)")
    check(not any(alive(x) for x in pids), "a rank survived (the frozen one must be woken to die)")
    print(f"frozen rank: launcher exited {p.returncode} after {took:.2f} s")


def test_stopped_unawaited(tmp):
    # Rank 1 stalls (asleep, but beating); rank 0, waiting for it, freezes:
    # no rank waits for rank 0, so the launcher's watch is what notices.
    p, pids = started_job(tmp, "stopped-unawaited", 2, {"TENSORPAR_COMM_TIMEOUT": "30"}, ("--stall-rank", "1"))
    if not pids:
        return
    time.sleep(0.8)
    t0 = time.time()
    os.kill(pids[0], signal.SIGSTOP)
    err = finish(p)
    took = time.time() - t0
    check(p.returncode == 1 and f"tensorpar launch: rank 0 (pid {pids[0]}) stopped responding" in err,
          f"launcher's message for a frozen rank nobody waits for: {p.returncode} {err!r}")
    check(2.4 < took < 4, f"the launcher noticed after {took:.1f} s (TENSORPAR_HANG_TIMEOUT 2 + 0.5)")
    check(not any(alive(x) for x in pids), "a rank survived")
    print(f"frozen rank nobody waits for: the launcher ended the job after {took:.2f} s")


def test_stopped_after_leaving(tmp):
    # Rank 1 freezes after it has left the job (no heartbeat any more), while
    # rank 0 has finished: only the launcher, waiting for it to exit, can tell.
    d = os.path.join(tmp, "stopped-after")
    os.mkdir(d)
    script = '"$0" --quick --out-dir "$1" || exit 1; if [ "$RANK" = 1 ]; then kill -STOP $$; fi'
    t0 = time.time()
    p = subprocess.Popen([BIN, "launch", "-n", "2", "--", "sh", "-c", script, WORKER, d], env=ENV,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    err = finish(p)
    took = time.time() - t0
    check(p.returncode == 1 and "tensorpar launch: rank 1 (pid" in err and "stopped responding" in err,
          f"a rank frozen after leaving: status {p.returncode} after {took:.1f} s: {err!r}")
    print(f"rank frozen after leaving the job: status {p.returncode} after {took:.2f} s")


def test_stopped_before_join(tmp):
    # Rank 1 freezes before it joins (before any heartbeat): rank 0, waiting
    # for it to join, names it.  A rank that is merely slow to join is waited for.
    for what, pre, hang in (("frozen", "kill -STOP $$", "1"), ("slow", "sleep 1.5", "0.5")):
        d = os.path.join(tmp, f"join-{what}")
        os.mkdir(d)
        script = f'if [ "$RANK" = 1 ]; then {pre}; fi; exec "$0" --quick --out-dir "$1"'
        t0 = time.time()
        p = subprocess.Popen([BIN, "launch", "-n", "2", "--", "sh", "-c", script, WORKER, d],
                             env=dict(ENV, TENSORPAR_HANG_TIMEOUT=hang), stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
        err = finish(p)
        took = time.time() - t0
        if what == "frozen":
            check(p.returncode != 0 and "rank 1 (pid" in err and "stopped responding" in err and took < 4,
                  f"rank frozen before joining: status {p.returncode} after {took:.1f} s: {err!r}")
        else:
            check(p.returncode == 0, f"a rank slow to join was not waited for: {p.returncode} {err!r}")
        print(f"rank {what} before joining: status {p.returncode} after {took:.2f} s")


def start_torchrun(tmp, name, port):
    """Two ranks of the comm loop worker started torchrun-style (no
    launcher), and their pids once both have started (None if not)."""
    d = os.path.join(tmp, name)
    os.mkdir(d)
    procs = []
    for r in range(2):
        env = dict(ENV, RANK=str(r), WORLD_SIZE="2", LOCAL_RANK=str(r), MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
        procs.append(subprocess.Popen([WORKER, "--loop", "60", "--out-dir", d], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    pids = wait_pids(d, 2)
    check(pids is not None, "torchrun-style ranks did not start")
    return procs, pids


def reap(procs):
    for q in procs:
        if q.poll() is None:
            q.kill()
        q.communicate()


def test_torchrun_style(tmp):
    port = str(30000 + os.getpid() % 20000)
    procs, pids = start_torchrun(tmp, "torchrun", port)
    if pids:
        time.sleep(0.3)
        t0 = time.time()
        procs[1].kill()
        err = finish(procs[0], 10)
        took = time.time() - t0
        check(procs[0].returncode == 1, f"survivor exit status {procs[0].returncode}")
        check(f"rank 1 (pid {pids[1]}) died" in err, f"survivor's message: {err!r}")
        check(took < 2.5, f"survivor noticed after {took:.1f} s")
        print(f"torchrun-style: survivor noticed the dead rank after {took:.2f} s")
    reap(procs)
    check(not [f for f in os.listdir("/dev/shm") if f"-m-127.0.0.1-{port}" in f], "segment left in /dev/shm")


def test_torchrun_stopped(tmp):
    port = str(30000 + (os.getpid() + 7) % 20000)
    procs, pids = start_torchrun(tmp, "torchrun-stop", port)
    if pids:
        time.sleep(0.3)
        t0 = time.time()
        os.kill(pids[0], signal.SIGSTOP)
        err = finish(procs[1], 10)
        took = time.time() - t0
        check(procs[1].returncode == 1, f"survivor exit status {procs[1].returncode}")
        check(f"rank 0 (pid {pids[0]}) stopped responding" in err, f"survivor's message: {err!r}")
        check(1.9 < took < 3.5, f"survivor noticed the frozen rank after {took:.1f} s")
        print(f"torchrun-style: survivor noticed the frozen rank after {took:.2f} s")
    reap(procs)


def main():
    with tempfile.TemporaryDirectory() as tmp:
        test_exit_codes()
        test_kill_rank(tmp)
        test_kill_launcher(tmp, signal.SIGTERM)
        test_kill_launcher(tmp, signal.SIGKILL)
        test_hang(tmp)
        test_busy_is_not_frozen(tmp)
        test_stopped_rank(tmp)
        test_stopped_unawaited(tmp)
        test_stopped_after_leaving(tmp)
        test_stopped_before_join(tmp)
        test_torchrun_style(tmp)
        test_torchrun_stopped(tmp)
    print(f"{len(failures)} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
