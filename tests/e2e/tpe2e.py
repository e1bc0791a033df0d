"""Helpers shared by the end-to-end tests: where the CLI and the test data
are, and running the CLI with a clear failure message."""

import os
import platform
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))


def find_bin():
    b = os.environ.get("TENSORPAR_BIN")
    if b:
        return b
    for cand in ("build/tensorpar", "build-ref/tensorpar"):
        p = os.path.join(ROOT, cand)
        if os.path.exists(p):
            return p
    raise RuntimeError("tensorpar CLI not found: set TENSORPAR_BIN")


# Tokenizer files shipped with the repository (tests/data/tokenizers, with
# their licence notes); nothing outside the repository is read.
TOKENIZERS = os.path.join(ROOT, "tests", "data", "tokenizers")


BIN = find_bin()


def worker(name):
    """The test worker `name` (tests/workers/<name>.c, a rank program): in
    TENSORPAR_WORKERS (CTest sets it), else in workers/ beside the CLI."""
    d = os.environ.get("TENSORPAR_WORKERS") or os.path.join(os.path.dirname(os.path.abspath(BIN)), "workers")
    p = os.path.join(d, name)
    if not os.path.exists(p):
        raise RuntimeError(f"test worker {p} not found: set TENSORPAR_WORKERS")
    return p

# Whether the CLI has the mpi backend: CTest says so (TENSORPAR_HAVE_MPI=0 for
# a build without MPI, such as the arm64 cross build); the mpi runs are then
# skipped, with MPI_SKIP printed as the reason.
HAVE_MPI = os.environ.get("TENSORPAR_HAVE_MPI", "1") != "0"


def _elf_machine(path):
    with open(path, "rb") as f:
        h = f.read(20)
    return int.from_bytes(h[18:20], "little") if h[:4] == b"\x7fELF" else None


# Whether the CLI is a program of this machine's architecture; not for the
# arm64 cross build, which runs under qemu-aarch64 (and far slower).
NATIVE = _elf_machine(BIN) == {"x86_64": 62, "aarch64": 183}.get(platform.machine())
MPI_SKIP = "skipped: mpi runs (this build of tensorpar has no mpi backend)"


# Variables that make a process a rank of some job: a test's own commands
# must not inherit them from the shell that runs the tests.
JOB_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "TENSORPAR_BACKEND",
            "TENSORPAR_RENDEZVOUS", "MASTER_ADDR", "MASTER_PORT")


def job_env(mpi=False):
    """A clean environment for launching jobs; mpi=True adds what mpirun
    needs here (root, oversubscription, no leak checks under ASan)."""
    env = {k: v for k, v in os.environ.items() if k not in JOB_VARS}
    env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_rmaps_base_oversubscribe="1")
    if mpi:
        env["ASAN_OPTIONS"] = ":".join(filter(None, [env.get("ASAN_OPTIONS"), "detect_leaks=0"]))
    return env


class Checks:
    """Collects failures instead of stopping at the first (script-style tests)."""

    def __init__(self):
        self.failures = []

    def __call__(self, cond, msg):
        if not cond:
            self.failures.append(msg)
            print("FAIL:", msg, file=sys.stderr)


def mpi_env():
    """The environment for runs under mpirun: OpenMPI's plugins leak and are
    unloaded before LeakSanitizer can name them, so leak checks are off."""
    env = dict(os.environ)
    env["ASAN_OPTIONS"] = ":".join(filter(None, [env.get("ASAN_OPTIONS"), "detect_leaks=0"]))
    return env


def run(*args, input=None, check=True, timeout=300):
    """Runs `tensorpar ARGS`; returns the CompletedProcess (text mode)."""
    args = [str(a) for a in args]
    on_mpi = any(a == "--backend" and b == "mpi" for a, b in zip(args, args[1:]))
    p = subprocess.run([BIN, *args], input=input, capture_output=True, text=True, timeout=timeout,
                       env=mpi_env() if on_mpi else None)
    if check and p.returncode != 0:
        raise AssertionError(f"tensorpar {' '.join(map(str, args))} exited {p.returncode}:\n{p.stderr}")
    return p


def tp_logits(work, model, tp=1, *extra, tokens):
    """`tensorpar logits --tp TP` on `tokens`; rank 0's logits, after checking
    that every rank's are bitwise equal (§1.4).  Files go to `work`."""
    import numpy as np
    out = os.path.join(work, "logits-%r.npy")
    run("logits", "--model", model, "--tokens", tokens, "--out", out, "--tp", tp, *extra)
    ranks = [np.load(out.replace("%r", str(r))) for r in range(tp)]
    for r in range(1, tp):
        assert np.array_equal(ranks[0], ranks[r]), f"rank {r}'s logits differ from rank 0's"
    return ranks[0]


def make_model(work, name, arch, *args):
    """`tensorpar make-model --arch ARCH ARGS` into work/name, once: later
    calls with the same name reuse the folder."""
    d = os.path.join(work, name)
    if not os.path.exists(d):
        run("make-model", "--arch", arch, *args, "--out", d)
    return d


def generate(model, tp=1, *extra, new=24):
    """`tensorpar generate`, greedy from tokens 1,2,3: its JSON output."""
    import json
    return json.loads(run("generate", "--model", model, "--tokens", "1,2,3", "--max-new-tokens", new,
                          "--greedy", "--tp", tp, *extra).stdout)


def fails(*args):
    """`tensorpar ARGS`, which must exit non-zero: its stderr."""
    p = run(*args, check=False)
    assert p.returncode != 0, f"tensorpar {' '.join(map(str, args))} succeeded"
    return p.stderr


def rel(a, b):
    """max |a - b| relative to max |b|."""
    import numpy as np
    return float(np.abs(a - b).max() / np.abs(b).max())


def read_log(out):
    """The entries of OUT/train_log.jsonl (`tensorpar train`'s log), one dict a step."""
    import json
    with open(os.path.join(out, "train_log.jsonl")) as f:
        return [json.loads(line) for line in f if line.strip()]


def vocab_size(model):
    """vocab_size of a model directory's config.json."""
    import json
    with open(os.path.join(model, "config.json")) as f:
        return json.load(f)["vocab_size"]


def write_token_rows(path, rng, rows, vocab, length):
    """A `tensorpar train` .jsonl of `rows` lines of input_ids: line i holds
    length(i) ids in [0, vocab) drawn from rng (a numpy Generator) after the
    length.  Returns path."""
    import json
    with open(path, "w") as f:
        for i in range(rows):
            n = length(i)
            f.write(json.dumps({"input_ids": [int(t) for t in rng.integers(0, vocab, size=n)]}) + "\n")
    return path


def make_train_models(work):
    """The two tiny f32 models the training tests share, made in work: (llama,
    qwen3 with tied embeddings)."""
    llama, qwen3 = os.path.join(work, "llama"), os.path.join(work, "qwen3")
    run("make-model", "--arch", "llama", "--preset", "tiny", "--dtype", "f32", "--out", llama)
    run("make-model", "--arch", "qwen3", "--preset", "tiny", "--dtype", "f32", "--set", "tie_word_embeddings=true",
        "--out", qwen3)
    return llama, qwen3


def assert_runs_close(tc, a, b, what, tol):
    """Two training runs' output folders agree: the same logged steps, each loss within tol, and every
    tensor of the saved model.safetensors within tol."""
    import numpy as np
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "reference"))
    import hf_reference as st_reader
    la, lb = read_log(a), read_log(b)
    tc.assertEqual([e["step"] for e in la], [e["step"] for e in lb], what)
    for x, y in zip(la, lb):
        tc.assertLess(abs(x["loss"] - y["loss"]), tol, f"{what}: step {x['step']}")
    wa = st_reader.read_safetensors(os.path.join(a, "model.safetensors"), np.float32)
    wb = st_reader.read_safetensors(os.path.join(b, "model.safetensors"), np.float32)
    tc.assertEqual(sorted(wa), sorted(wb), what)
    for k in wa:
        tc.assertLess(float(np.abs(wa[k] - wb[k]).max()), tol, f"{what}: {k}")
