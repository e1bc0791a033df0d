"""What the training benchmarks share (bench/train_vs_torch.py,
bench/dp_memory.py, bench/lora_memory.py): a command run with the peak RSS
of every process of its tree polled (each rank is a process), a made model
and a file of random token rows; and the options, setup and train runs of
the two memory benchmarks."""
import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import threading
import time


def tree_pids(pid):
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            for t in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{t}/children") as f:
                    todo += [int(c) for c in f.read().split()]
        except OSError:
            pass
    return out


def hwm_kb(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def run_measured(cmd, env):
    """Runs cmd; returns (rc, stdout, per-process VmHWM in KiB, wait4's maxrss in KiB).
    VmHWM is polled over the process tree (each rank a process); wait4's figure
    is the largest single process of the tree, read at its end."""
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    peaks, done = {}, threading.Event()

    def poll():
        while not done.is_set():
            for p in tree_pids(proc.pid):
                peaks[p] = max(peaks.get(p, 0), hwm_kb(p))
            time.sleep(0.1)

    th = threading.Thread(target=poll, daemon=True)
    th.start()
    out = proc.stdout.read()
    _, status, ru = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    done.set()
    th.join()
    return proc.returncode, out, peaks, ru.ru_maxrss


def rank_peaks(peaks, nranks):
    """The per-rank peaks of run_measured's tree, largest first: the ranks are
    the processes that hold the model, so the nranks largest."""
    return sorted((v for v in peaks.values() if v > 0), reverse=True)[:nranks]


def train_measured(cmd, out, env, nranks, name):
    """Runs a `tensorpar train` command that writes into out, measured: (per-rank
    peaks in KiB, largest first, wait4's maxrss in KiB, the entries of
    train_log.jsonl); exits naming the run and showing its output's end when it fails."""
    rc, text, peaks, maxrss = run_measured(cmd, env)
    if rc:
        sys.exit(f"{name} failed ({rc}):\n{text[-3000:]}")
    with open(os.path.join(out, "train_log.jsonl")) as f:
        log = [json.loads(line) for line in f if line.strip()]
    return rank_peaks(peaks, nranks), maxrss, log


def make_model(bin_path, preset, out, sets=(), quiet=True):
    """`tensorpar make-model --arch qwen3 --preset PRESET --dtype f32` with make-model's --set KEY=VALUE."""
    subprocess.run([bin_path, "make-model", "--arch", "qwen3", "--preset", preset, "--dtype", "f32",
                    *[x for kv in sets for x in ("--set", kv)], "--out", out], check=True, capture_output=quiet)


def write_rows(model, path, rows, seq_len, seed):
    """rows lines of seq_len random ids of the model's vocabulary, as `tensorpar train` reads them."""
    with open(os.path.join(model, "config.json")) as f:
        vocab = json.load(f)["vocab_size"]
    rng = random.Random(seed)
    with open(path, "w") as f:
        for _ in range(rows):
            f.write(json.dumps({"input_ids": [rng.randrange(vocab) for _ in range(seq_len)]}) + "\n")
    return path


def memory_args(seq_len, steps):
    """The options of the memory benchmarks (dp_memory, lora_memory): the binary,
    the made model, the run's size and threads; the caller adds its own."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="build/tensorpar")
    ap.add_argument("--preset", default="small")
    ap.add_argument("--seq-len", type=int, default=seq_len)
    ap.add_argument("--steps", type=int, default=steps)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--set", action="append", default=[], help="make-model --set KEY=VALUE (repeatable)")
    return ap


def memory_setup(a, prefix):
    """A temporary folder with memory_args' model and 2 x steps token rows;
    returns (work, model, data, env): env has OPENBLAS_NUM_THREADS = --threads."""
    work = tempfile.mkdtemp(prefix=prefix)
    model = os.path.join(work, "model")
    make_model(a.bin, a.preset, model, a.set)
    data = write_rows(model, os.path.join(work, "d.jsonl"), 2 * a.steps, a.seq_len, seed=1)
    return work, model, data, dict(os.environ, OPENBLAS_NUM_THREADS=str(a.threads))


def memory_train(a, setup, name, nranks, extra):
    """One measured `tensorpar train` of a memory benchmark (batch 1, no shuffle,
    memory_args' sizes) into WORK/out-NAME with the options extra; train_measured's result."""
    work, model, data, env = setup
    out = os.path.join(work, "out-" + name)
    cmd = [a.bin, "train", "--model", model, "--data", data, "--out", out, "--seq-len", str(a.seq_len),
           "--batch-size", "1", "--steps", str(a.steps), "--no-shuffle", "--threads", str(a.threads), *extra]
    return train_measured(cmd, out, env, nranks, name)
