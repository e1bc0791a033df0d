#!/usr/bin/python3
"""Fault injection: one rank of a `tensorpar generate --tp N` job is killed
(SIGKILL) or frozen (SIGSTOP) at a random moment, and the job must end by
itself, quickly and cleanly.

For each case (TP2-KILL, TP4-KILL, TP2-STOP, TP4-STOP) and each run:
  - the victim rank is drawn at random (rank 0 included), and so is the
    moment: uniform over the length of an undisturbed run (measured first),
    or, one time in three, over its start (start-up, loading, prefill: up
    to the first token), so that every phase is hit (a decode step is
    mostly all-reduces, so most decode hits land in or next to one);
  - the job (the launcher, i.e. the `tensorpar` process started here) must
    exit within 5 s of the signal, with a status other than 0 and a message
    naming the victim ("rank R ... killed by signal" / "died" for SIGKILL,
    "rank R ... stopped responding" for SIGSTOP);
  - no sanitizer report (under an ASan/UBSan build: the ranks that notice
    the fault exit through their error paths);
  - afterwards no process of the job is left (a frozen victim still there
    is SIGKILLed by this script and counted) and no /dev/shm entry of the
    job exists.
A run whose victim had already exited, or was in the kernel's exit, when
the signal came (the signal landed after the end) is not counted and is
drawn again; so is a SIGSTOP after which the job ended as if undisturbed
(status 0, the same output: under LeakSanitizer the victim's exit-time
leak check ptraces it and swallows the SIGSTOP).

    /usr/bin/python3 tests/faults/faults.py [--runs 100] [--cases TP2-KILL,...]
        [--bin build/tensorpar] [--tokens 250] [--hang-timeout S] [--json out.json]

Prints one line per case: passed/runs, the time from the signal to the end
of the job (median, max), where the signals landed; exit status 1 if any run
failed.
"""
import argparse
import json
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
CASES = ("TP2-KILL", "TP4-KILL", "TP2-STOP", "TP4-STOP")
LIMIT_S = 5.0
JOB_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "TENSORPAR_BACKEND",
            "TENSORPAR_RENDEZVOUS", "TENSORPAR_SHM_FD", "MASTER_ADDR", "MASTER_PORT",
            "TENSORPAR_COMM_TIMEOUT", "TENSORPAR_HANG_TIMEOUT")


def find_bin(arg):
    for b in (arg, os.environ.get("TENSORPAR_BIN"), os.path.join(ROOT, "build", "tensorpar")):
        if b and os.path.exists(b):
            return b
    sys.exit("faults.py: tensorpar not found: build it or pass --bin")


def proc_stat(pid):
    """The fields of /proc/PID/stat after the command name (state first),
    or None once pid is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def gone(pid):
    fields = proc_stat(pid)
    return not fields or fields[0] in ("Z", "X")


PF_EXITING = 0x4    # the task's flags (stat field 9) once it is in the kernel's exit


def ending(pid):
    """Gone, or already in its exit (its status decided: a signal now
    changes nothing)."""
    fields = proc_stat(pid)
    return not fields or fields[0] in ("Z", "X") or int(fields[6]) & PF_EXITING != 0


def rank_pids(launcher):
    """{rank: pid} of the launcher's children that have become ranks."""
    out = {}
    try:
        with open(f"/proc/{launcher}/task/{launcher}/children") as f:
            kids = [int(k) for k in f.read().split()]
    except OSError:
        return out
    for k in kids:
        try:
            with open(f"/proc/{k}/environ", "rb") as f:
                env = f.read().split(b"\0")
        except OSError:
            continue
        # Before its exec a child still has the launcher's environment,
        # which has no RANK.
        for kv in env:
            if kv.startswith(b"RANK="):
                out[int(kv[5:])] = k
    return out


def shm_entries():
    return set(os.listdir("/dev/shm"))


class Job:
    def __init__(self, binary, model, tp, tokens, env):
        self.cmd = [binary, "generate", "--model", model, "--tokens", "1,2,3", "--max-new-tokens",
                    str(tokens), "--tp", str(tp), "--greedy"]
        self.env = env
        self.expected = None    # stdout of an undisturbed run

    def start(self):
        t = time.monotonic()
        p = subprocess.Popen(self.cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env=self.env)
        return p, t

    def clean_run(self):
        p, t = self.start()
        out, err = p.communicate(timeout=120)
        if p.returncode != 0:
            sys.exit(f"faults.py: an undisturbed run failed ({p.returncode}):\n{err}")
        self.expected = out
        return time.monotonic() - t


def calibrate(binary, model, tp, tokens, env):
    """Length of an undisturbed run, and of one that stops after the first
    token (start-up, loading and prefill): kills before the latter land in
    those phases."""
    full = statistics.median(Job(binary, model, tp, tokens, env).clean_run() for _ in range(2))
    first = statistics.median(Job(binary, model, tp, 1, env).clean_run() for _ in range(2))
    return full, first


def names_victim(err, victim, sig):
    if sig == signal.SIGKILL:
        pat = rf"\brank {victim}\b[^\n]*(killed by signal 9|died)"
    else:
        pat = rf"\brank {victim}\b[^\n]*stopped responding"
    return re.search(pat, err) is not None


def named_by(err, victim):
    """Who named the victim: the launcher ("tensorpar: rank R (pid P) was
    killed by signal 9 / stopped responding"), a waiting rank (an error
    message), or both."""
    who = []
    if re.search(rf"^tensorpar: rank {victim} \(pid \d+\) (was killed|stopped responding)", err, re.M):
        who.append("launcher")
    if re.search(rf"error: [^\n]*\brank {victim}\b[^\n]*(died|stopped responding)", err):
        who.append("rank")
    return "+".join(who) or "-"


def one_run(job, sig, tp, calib, rng):
    """One attempt; returns a result dict, or, if the signal came after the
    victim had already finished (not counted), the length of the run."""
    victim = rng.randrange(tp)
    full, first = calib
    # Start-up, loading and prefill are a small part of a run: one signal in
    # three is drawn over them alone, so that they are hit often too.
    at = rng.uniform(0, first if rng.random() < 1 / 3 else full)
    before = shm_entries()
    p, t_start = job.start()
    pids = {}
    while True:
        now = time.monotonic()
        pids = rank_pids(p.pid)
        if now - t_start >= at and victim in pids:
            break
        if p.poll() is not None:
            break
        time.sleep(0.001 if now - t_start >= at else min(0.01, at - (now - t_start)))
    vpid = pids.get(victim)
    if vpid is None or ending(vpid):
        p.communicate()
        return time.monotonic() - t_start
    t_sig = time.monotonic()
    try:
        os.kill(vpid, sig)
    except ProcessLookupError:
        p.communicate()
        return time.monotonic() - t_start
    try:
        out, err = p.communicate(timeout=30)
        took = time.monotonic() - t_sig
    except subprocess.TimeoutExpired:
        took = float("inf")
        for q in list(pids.values()) + [p.pid]:
            try:
                os.kill(q, signal.SIGKILL)
            except ProcessLookupError:
                pass
        out, err = p.communicate()
    if sig == signal.SIGSTOP and p.returncode == 0 and out == job.expected and gone(vpid):
        # The job finished as if undisturbed: the victim was past its work
        # when the SIGSTOP came.  Under LeakSanitizer that happens when it
        # lands in the exit-time leak check, which ptraces every thread of
        # the process and swallows a SIGSTOP.  Not counted, like a signal
        # that landed after the end.
        return time.monotonic() - t_start
    leftover_victim = not gone(vpid)
    if leftover_victim:
        os.kill(vpid, signal.SIGKILL)
        for _ in range(200):
            if gone(vpid):
                break
            time.sleep(0.01)
    time.sleep(0.01)
    survivors = [q for q in pids.values() if not gone(q)]
    new = shm_entries() - before
    ours = sorted(f for f in new if f"-j{p.pid}-" in f)
    fails = []
    if took >= LIMIT_S:
        fails.append(f"ended {took:.2f} s after the signal")
    if p.returncode == 0:
        fails.append("exit status 0")
    if not names_victim(err, victim, sig):
        fails.append("no message naming the victim")
    if "Sanitizer" in err or "runtime error:" in err:
        fails.append("a sanitizer report")
    if survivors:
        fails.append(f"processes left: {survivors}")
    if ours:
        fails.append(f"left in /dev/shm: {ours}")
    return {"victim": victim, "at": round(t_sig - t_start, 4), "took": round(took, 4),
            "rc": p.returncode, "fails": fails, "stopped_victim_left": leftover_victim,
            "named_by": named_by(err, victim), "stderr": err[-2000:] if fails else ""}


def run_case(case, args, model, env, rng, calib):
    tp = int(case[2])
    sig = signal.SIGKILL if case.endswith("KILL") else signal.SIGSTOP
    full, first = calib[tp]
    job = Job(args.bin, model, tp, args.tokens, env)
    job.clean_run()     # its output: what a run the signal did not touch prints
    results, missed, lengths = [], 0, []
    while len(results) < args.runs:
        r = one_run(job, sig, tp, (full, first), rng)
        if not isinstance(r, dict):
            # The machine got faster than when the runs were measured: follow it.
            missed += 1
            lengths.append(r)
            if len(lengths) >= 3:
                full = min(full, statistics.median(lengths[-3:]))
            if missed > 5 * args.runs:
                sys.exit(f"faults.py: {case}: the runs end before the signals land")
            continue
        r["phase"] = "start/load/prefill" if r["at"] < first else "decode"
        results.append(r)
        if r["fails"]:
            print(f"  {case} run {len(results)}: victim rank {r['victim']} at {r['at']:.3f} s: "
                  f"{'; '.join(r['fails'])}\n{r['stderr']}", file=sys.stderr)
        elif args.verbose:
            print(f"  {case} run {len(results)}: rank {r['victim']} at {r['at']:.3f} s ({r['phase']}), "
                  f"ended after {r['took']:.3f} s, status {r['rc']}", file=sys.stderr)
    took = [r["took"] for r in results]
    summary = {
        "case": case, "runs": len(results), "passed": sum(not r["fails"] for r in results),
        "median_s": round(statistics.median(took), 3), "max_s": round(max(took), 3),
        "victims": {str(v): sum(r["victim"] == v for r in results) for v in range(tp)},
        "phases": {ph: sum(r["phase"] == ph for r in results) for ph in ("start/load/prefill", "decode")},
        "missed": missed, "run_s": round(full, 3), "first_token_s": round(first, 3),
        "named_by": {k: sum(r["named_by"] == k for r in results)
                     for k in sorted({r["named_by"] for r in results})},
    }
    print(f"{case}: {summary['passed']}/{summary['runs']} passed; time to exit median "
          f"{summary['median_s']:.2f} s, max {summary['max_s']:.2f} s; victims {summary['victims']}; "
          f"phases {summary['phases']}; named by {summary['named_by']}; {missed} signals landed after the end (redrawn); "
          f"undisturbed run {full:.2f} s, first token {first:.2f} s", flush=True)
    return summary, results


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=100)
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--bin")
    ap.add_argument("--model", help="model directory (default: a llama of --preset made here)")
    ap.add_argument("--preset", default="small", help="make-model preset of that llama (default small)")
    ap.add_argument("--tokens", type=int, default=250, help="new tokens per run")
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--hang-timeout", help="TENSORPAR_HANG_TIMEOUT for the jobs (default: theirs, 2 s)")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--verbose", action="store_true")
    args = ap.parse_args()
    args.bin = find_bin(args.bin)
    cases = [c.strip().upper() for c in args.cases.split(",") if c.strip()]
    for c in cases:
        if c not in CASES:
            sys.exit(f"faults.py: unknown case {c} (known: {', '.join(CASES)})")
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1 << 30)
    rng = random.Random(seed)
    env = {k: v for k, v in os.environ.items() if k not in JOB_VARS}
    if args.hang_timeout:
        env["TENSORPAR_HANG_TIMEOUT"] = args.hang_timeout
    print(f"faults.py: {args.runs} runs per case, seed {seed}, {args.bin}", flush=True)
    with tempfile.TemporaryDirectory(prefix="tp-faults-") as tmp:
        model = args.model
        if not model:
            model = os.path.join(tmp, "model")
            subprocess.run([args.bin, "make-model", "--arch", "llama", "--preset", args.preset, "--out", model],
                           check=True, capture_output=True, env=env)
        tps = sorted({int(c[2]) for c in cases})
        calib = {tp: calibrate(args.bin, model, tp, args.tokens, env) for tp in tps}
        summaries, runs = [], {}
        for c in cases:
            s, r = run_case(c, args, model, env, rng, calib)
            summaries.append(s)
            runs[c] = r
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"seed": seed, "runs_per_case": args.runs, "tokens": args.tokens,
                       "summaries": summaries, "runs": runs}, f, indent=1)
    bad = sum(s["runs"] - s["passed"] for s in summaries)
    print(f"faults.py: {bad} failed run(s)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
