#!/usr/bin/python3
"""End-to-end: the settings table from the command line.

  - `tensorpar --help-env` lists every TENSORPAR_* variable with its type or
    range, default and meaning, grouped by scope, and README.md's table
    names each of them;
  - a bad value of any setting is refused by a model command before it
    starts (exit status 2, one message naming the variable, the value and
    what is allowed), with --tp N before any rank is started;
  - a good value is accepted.

    TENSORPAR_BIN=build/tensorpar /usr/bin/python3 tests/e2e/test_settings.py [-v]
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from tpe2e import BIN, ROOT, job_env  # noqa: E402

WORK = MODEL = None


def tp(*args, env=None):
    """Runs tensorpar ARGS in a clean job environment plus ENV."""
    base = {k: v for k, v in job_env().items() if not k.startswith("TENSORPAR_") or k == "TENSORPAR_ISA"}
    return subprocess.run([BIN, *map(str, args)], capture_output=True, text=True, timeout=300,
                          env=dict(base, **(env or {})))


def setUpModule():
    global WORK, MODEL
    WORK = tempfile.mkdtemp(prefix="tp-e2e-settings-")
    MODEL = os.path.join(WORK, "llama")
    p = tp("make-model", "--arch", "llama", "--preset", "tiny", "--seed", "3", "--out", MODEL)
    if p.returncode:
        raise RuntimeError(p.stderr)


def tearDownModule():
    shutil.rmtree(WORK, ignore_errors=True)


def help_env_rows():
    """(name, rest of the line) of each variable --help-env prints."""
    p = tp("--help-env")
    assert p.returncode == 0, p.stderr
    return [(m.group(1), m.group(2)) for m in re.finditer(r"^  (TENSORPAR_[A-Z0-9_]+)\s+(.*)$", p.stdout, re.M)]


class HelpEnv(unittest.TestCase):
    def test_lists_every_knob(self):
        rows = dict(help_env_rows())
        for name in ("TENSORPAR_ISA", "TENSORPAR_HANG_TIMEOUT", "TENSORPAR_COMM_TIMEOUT", "TENSORPAR_BACKEND",
                     "TENSORPAR_FUSE_NORM", "TENSORPAR_BF16_DOT", "TENSORPAR_BLAS", "TENSORPAR_LOG",
                     "TENSORPAR_PIN", "TENSORPAR_SHM_SLOT_KB", "TENSORPAR_SHM_ONESHOT_KB", "TENSORPAR_SHM_CMA",
                     "TENSORPAR_SHM_CMA_KB", "TENSORPAR_RENDEZVOUS", "TENSORPAR_SHM_FD", "TENSORPAR_KERNEL",
                     "TENSORPAR_AMX"):
            self.assertIn(name, rows)
        self.assertRegex(rows["TENSORPAR_HANG_TIMEOUT"], r"^seconds in \[0, \d+\]\s+default 2\s+\S")
        self.assertRegex(rows["TENSORPAR_COMM_TIMEOUT"], r"^seconds in \(0, \d+\]\s+default 30\s")
        self.assertRegex(rows["TENSORPAR_LOG"], r"^debug\|info\|warn\|error\s+default info\s")
        self.assertRegex(rows["TENSORPAR_SHM_SLOT_KB"], r"^int in \[4, \d+\]\s+default 256\s")

    def test_readme_lists_every_knob(self):
        with open(os.path.join(ROOT, "README.md")) as f:
            readme = f.read()
        for name, _ in help_env_rows():
            self.assertIn("| `%s` |" % name, readme, "README.md's settings table lacks " + name)


class BadValues(unittest.TestCase):
    def refused(self, name, value, *extra):
        p = tp("logits", "--model", MODEL, "--tokens", "1,2,3", "--out", os.path.join(WORK, "x.npy"), *extra,
               env={name: value})
        self.assertEqual(p.returncode, 2, p.stderr)
        self.assertIn("%s='%s'" % (name, value), p.stderr)
        self.assertIn("allowed", p.stderr)
        self.assertEqual(len(p.stderr.strip().splitlines()), 1, p.stderr)   # once, not per rank
        self.assertFalse(os.path.exists(os.path.join(WORK, "x.npy")))

    def test_hang_timeout(self):
        self.refused("TENSORPAR_HANG_TIMEOUT", "abc")
        self.refused("TENSORPAR_HANG_TIMEOUT", "abc", "--tp", "2")

    def test_each_type(self):
        self.refused("TENSORPAR_FUSE_NORM", "yes")           # bool
        self.refused("TENSORPAR_SHM_SLOT_KB", "2")           # int, below its range
        self.refused("TENSORPAR_COMM_TIMEOUT", "0")          # seconds, open at 0
        self.refused("TENSORPAR_LOG", "verbose")             # enum
        self.refused("TENSORPAR_BACKEND", "nccl", "--tp", "2")

    def test_good_values_run(self):
        out = os.path.join(WORK, "ok-%r.npy")
        p = tp("logits", "--model", MODEL, "--tokens", "1,2,3", "--out", out, "--tp", "2",
               env={"TENSORPAR_HANG_TIMEOUT": "5", "TENSORPAR_LOG": "warn", "TENSORPAR_SHM_SLOT_KB": "4"})
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertTrue(os.path.exists(out.replace("%r", "0")))


if __name__ == "__main__":
    unittest.main()
