#!/usr/bin/python3
"""End-to-end: TENSORPAR_ISA and the instruction-set paths.

  - `tensorpar --isa-list` names the paths this CPU supports, one chosen;
  - an unknown value, a path the CPU lacks, or a knob TENSORPAR_ISA replaced
    is refused by every command before it does anything (exit 2, a message
    naming the value, the valid ones and what the CPU supports);
  - the logits of every path this CPU supports agree with the scalar path's;
  - under qemu-x86_64 (Debian qemu-user), where present: a CPU with only
    SSE2 (qemu64) chooses scalar and runs a forward pass without SIGILL, with
    the bits of TENSORPAR_ISA=scalar here, and refuses TENSORPAR_ISA=avx2;
    an AVX2-only CPU (Haswell) does the same on its own best path."""

import os
import platform
import shutil
import subprocess
import sys
import tempfile
import unittest

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tpe2e import BIN, NATIVE, rel  # noqa: E402

VALID = ["scalar", "avx2", "avx512", "amx"]
OLD_KNOBS = ("TENSORPAR_KERNEL", "TENSORPAR_AMX")
TOKENS = "1,5,9,2,7,3,11,4,8,6,10,12"
WORK = None
MODEL = None


def env_with(**kv):
    env = {k: v for k, v in os.environ.items() if k not in ("TENSORPAR_ISA",) + OLD_KNOBS}
    env.update(kv)
    return env


def tp(*args, env=None, prefix=(), timeout=300):
    return subprocess.run([*prefix, BIN, *map(str, args)], capture_output=True, text=True, timeout=timeout,
                          env=env if env is not None else env_with())


def isa_list(env=None, prefix=()):
    p = tp("--isa-list", env=env, prefix=prefix)
    assert p.returncode == 0, p.stderr
    lines = p.stdout.split("\n")[:-1]
    names = [ln.split()[0] for ln in lines]
    chosen = [ln.split()[0] for ln in lines if ln.endswith(" (chosen)")]
    return names, chosen


def setUpModule():
    global WORK, MODEL
    WORK = tempfile.mkdtemp(prefix="tp-e2e-isa-")
    MODEL = os.path.join(WORK, "tiny")
    p = tp("make-model", "--arch", "qwen3", "--preset", "tiny", "--out", MODEL)
    assert p.returncode == 0, p.stderr


def tearDownModule():
    shutil.rmtree(WORK, ignore_errors=True)


def logits(name, env, prefix=()):
    out = os.path.join(WORK, name + ".npy")
    p = tp("logits", "--model", MODEL, "--tokens", TOKENS, "--out", out, "--threads", "2", env=env, prefix=prefix)
    assert p.returncode == 0, f"{name}: exit {p.returncode}\n{p.stderr}"
    return np.load(out)


class IsaTest(unittest.TestCase):
    def test_list(self):
        names, chosen = isa_list()
        self.assertEqual(names[0], "scalar")
        self.assertEqual(names, [v for v in VALID if v in names])   # known names, in order
        self.assertEqual(chosen, [names[-1]])                        # the best by default
        for v in names:
            self.assertEqual(isa_list(env_with(TENSORPAR_ISA=v)), (names, [v]))
        self.assertIn("TENSORPAR_ISA", tp("--help").stdout)

    def refused(self, env, *needles, names_cpu=True):
        names, _ = isa_list()
        if names_cpu:
            needles += ("this CPU supports: " + ", ".join(names) + ")",)
        out = os.path.join(WORK, "refused")
        for cmd in (["logits", "--model", MODEL, "--tokens", "1,2", "--out", out + ".npy"],
                    ["make-model", "--arch", "qwen3", "--preset", "tiny", "--out", out],
                    ["plan", "--model", MODEL, "--tp", "2"], ["bench", "kernels", "--smoke"],
                    ["bench", "all", "--model", MODEL, "--smoke"], ["--isa-list"]):
            p = tp(*cmd, env=env)
            self.assertEqual(p.returncode, 2, f"{cmd}: {p.stderr}")
            for n in needles:
                self.assertIn(n, p.stderr, cmd)
            self.assertEqual(p.stderr.count("\n"), 1, f"{cmd}: one line, no more:\n{p.stderr}")
            self.assertFalse(os.path.exists(out) or os.path.exists(out + ".npy"), cmd)

    def test_unknown_value(self):
        for bad in ("avx-512", "AVX2", "sse2", "auto"):
            self.refused(env_with(TENSORPAR_ISA=bad), f"TENSORPAR_ISA={bad}: unknown path",
                         "valid: scalar, avx2, avx512, amx")

    def test_path_the_cpu_lacks(self):
        names, _ = isa_list()
        missing = [v for v in VALID if v not in names]
        if not missing:
            self.skipTest("this CPU has every path (" + ", ".join(names) + ")")
        for v in missing:
            self.refused(env_with(TENSORPAR_ISA=v), f"TENSORPAR_ISA={v}: this CPU does not support it",
                         "valid: scalar, avx2, avx512, amx")

    def test_replaced_knobs(self):
        for knob in OLD_KNOBS:
            self.refused(env_with(**{knob: "0"}), f"{knob} is no longer read", "TENSORPAR_ISA=", names_cpu=False)

    def test_every_path_agrees(self):
        names, _ = isa_list()
        ref = logits("scalar", env_with(TENSORPAR_ISA="scalar"))
        self.assertTrue(np.isfinite(ref).all())
        for v in names[1:]:
            got = logits(v, env_with(TENSORPAR_ISA=v))
            self.assertLess(rel(got, ref), 1e-5, v)
        # The default is the best path, bit for bit.
        self.assertTrue(np.array_equal(logits("default", env_with()), logits("best", env_with(TENSORPAR_ISA=names[-1]))))


def qemu_usable():
    q = shutil.which("qemu-x86_64")
    if not NATIVE or platform.machine() != "x86_64":
        return None, "the CLI is not an x86-64 program of this machine (a cross build, run emulated)"
    if not q:
        return None, "qemu-x86_64 not installed (Debian qemu-user)"
    with open(BIN, "rb") as f:
        if b"__asan_init" in f.read():
            return None, "an AddressSanitizer build (its shadow memory does not map under qemu-user)"
    return q, ""


class EmulatedCpuTest(unittest.TestCase):
    """Other CPUs, emulated.  qemu-user runs this process only (the ranks of a
    --tp job would exec natively), so the runs here are TP = 1."""

    def setUp(self):
        self.qemu, why = qemu_usable()
        if not self.qemu:
            print("skipped: " + why, file=sys.stderr)
            self.skipTest(why)

    def on(self, cpu, want_paths):
        prefix = (self.qemu, "-cpu", cpu)
        names, chosen = isa_list(env_with(), prefix)
        self.assertEqual((names, chosen), (want_paths, [want_paths[-1]]), cpu)
        got = logits(cpu, env_with(), prefix)
        ref = logits(cpu + "-ref", env_with(TENSORPAR_ISA=want_paths[-1]))
        self.assertTrue(np.array_equal(got, ref), f"{cpu}: differs from TENSORPAR_ISA={want_paths[-1]} here")
        nxt = VALID[len(want_paths)]
        p = tp("--isa-list", env=env_with(TENSORPAR_ISA=nxt), prefix=prefix)
        self.assertEqual(p.returncode, 2)
        self.assertIn(f"TENSORPAR_ISA={nxt}: this CPU does not support it", p.stderr)

    def test_sse2_only(self):
        self.on("qemu64", ["scalar"])

    def test_avx2_only(self):
        names, _ = isa_list()
        if "avx2" not in names:
            self.skipTest("this CPU has no AVX2 to compare with")
        self.on("Haswell", ["scalar", "avx2"])


if __name__ == "__main__":
    unittest.main()
