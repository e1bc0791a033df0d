#!/usr/bin/python3
"""End-to-end: `--matmul exact|bf16` (tp_kernel_options.bf16_dot).

bf16 weights with `--matmul bf16` multiply the activations rounded to bf16
(vdpbf16ps on the avx512 path of an AVX512_BF16 CPU, AMX one part; on any
other path x rounded first and the exact product, src/kernels/matmul.c).
On the process's path (scripts/test.sh reruns this on every other one):
  - the logits stay within 2e-2 of the f32 model's (the same weights
    widened, `--dtype f32`) but are not exact's: off by at least 1e-4;
  - they are the scalar path's (always emulated) up to the order of the
    sums: the option means one thing on every path;
  - TENSORPAR_BF16_DOT=1 gives the same bits, and `--matmul exact` wins over
    it; f32 weights are left alone (the same bits as exact);
  - TP = 2 and 4 give TP = 1's logits up to the order of the row-parallel
    sums (a sum that differs in its last bit can cross a bf16 rounding
    boundary of the next layer's input: ~1e-4, bound 2e-3) and the same
    argmax;
  - generate and bench model take the option, bench reports it; an unknown
    value is refused by every command that has it, naming the option.
The measured figures are printed (run with -v)."""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tpe2e import BIN, rel, tp_logits  # noqa: E402
from tpe2e import run as run_plain  # noqa: E402

TOKENS = ",".join(str((i * 37 + 5) % 500 + 1) for i in range(40))   # past the GEMV: the GEMM runs too
SHAPE = ["--set", "hidden_size=128", "--set", "intermediate_size=256", "--set", "head_dim=32"]
WORK = None
MODELS = {}


def setUpModule():
    global WORK
    WORK = tempfile.mkdtemp(prefix="tp-e2e-matmul-")
    MODELS["llama"] = os.path.join(WORK, "llama")
    run("make-model", "--arch", "llama", *SHAPE, "--dtype", "bf16", "--seed", "3", "--out", MODELS["llama"])
    MODELS["qwen3"] = os.path.join(WORK, "qwen3")
    run("make-model", "--arch", "qwen3", *SHAPE, "--dtype", "bf16", "--set", "tie_word_embeddings=true",
        "--seed", "5", "--out", MODELS["qwen3"])


def tearDownModule():
    shutil.rmtree(WORK, ignore_errors=True)


def run(*args, env=None, check=True):
    """tpe2e.run, with variables added to the environment."""
    if env is None:
        return run_plain(*args, check=check)
    args = [str(a) for a in args]
    p = subprocess.run([BIN, *args], capture_output=True, text=True, timeout=300, env=dict(os.environ, **env))
    if check and p.returncode != 0:
        raise AssertionError(f"tensorpar {' '.join(args)} exited {p.returncode}:\n{p.stderr}")
    return p


def logits(model, tp, *extra, env=None, tokens=TOKENS):
    if env is None:
        return tp_logits(WORK, model, tp, *extra, tokens=tokens)
    out = os.path.join(WORK, "env.npy")
    run("logits", "--model", model, "--tokens", tokens, "--out", out, "--tp", tp, *extra, env=env)
    return np.load(out)


class MatmulBf16(unittest.TestCase):
    def test_near_f32_not_exact_and_as_scalar(self):
        for arch, model in MODELS.items():
            ref = logits(model, 1, "--dtype", "f32")
            exact = logits(model, 1, "--dtype", "bf16")
            bf = logits(model, 1, "--dtype", "bf16", "--matmul", "bf16")
            scalar = logits(model, 1, "--dtype", "bf16", "--matmul", "bf16", env={"TENSORPAR_ISA": "scalar"})
            print(f"\n{arch} --matmul bf16: vs f32 {rel(bf, ref):.3g}, vs exact {rel(bf, exact):.3g}, "
                  f"vs the scalar path's {rel(bf, scalar):.2g} (exact vs f32 {rel(exact, ref):.2g})", end="")
            self.assertLess(rel(exact, ref), 1e-5, arch)
            self.assertLess(rel(bf, ref), 2e-2, arch)
            self.assertGreater(rel(bf, exact), 1e-4, arch)
            # near the scalar path's rounded x, and far nearer than exact is to it
            self.assertLess(rel(bf, scalar), min(1e-3, rel(exact, scalar) / 2), arch)
            self.assertTrue(np.array_equal(bf.argmax(-1), scalar.argmax(-1)), arch)

    def test_env_and_option(self):
        model = MODELS["llama"]
        bf = logits(model, 1, "--matmul", "bf16")
        exact = logits(model, 1)
        self.assertTrue(np.array_equal(logits(model, 1, env={"TENSORPAR_BF16_DOT": "1"}), bf))
        self.assertTrue(np.array_equal(logits(model, 1, "--matmul", "exact", env={"TENSORPAR_BF16_DOT": "1"}),
                                       exact))
        # f32 weights: the option changes nothing
        self.assertTrue(np.array_equal(logits(model, 1, "--dtype", "f32", "--matmul", "bf16"),
                                       logits(model, 1, "--dtype", "f32")))

    def test_tp_equals_tp1(self):
        for arch, model in MODELS.items():
            one = logits(model, 1, "--matmul", "bf16")
            for tp in (2, 4):
                got = logits(model, tp, "--matmul", "bf16")
                print(f"\n{arch} --matmul bf16 TP={tp} vs TP=1: {rel(got, one):.2g}", end="")
                self.assertLess(rel(got, one), 2e-3, f"{arch} TP={tp}")
                self.assertTrue(np.array_equal(got.argmax(-1), one.argmax(-1)), f"{arch} TP={tp}: argmax")

    def test_generate_and_bench(self):
        model = MODELS["llama"]
        gen = json.loads(run("generate", "--model", model, "--tokens", "1,2,3", "--max-new-tokens", "8",
                             "--greedy", "--matmul", "bf16", "--tp", "2").stdout)
        self.assertEqual(len(gen), 8)
        for mm in ("bf16", "exact"):
            j = json.loads(run("bench", "model", "--model", model, "--mode", "prefill", "--seq", "16", "--reps", "1",
                               "--matmul", mm, "--json").stdout)
            self.assertEqual((j["matmul"], j["dtype"]), (mm, "bf16"))
        j = json.loads(run("bench", "model", "--model", model, "--mode", "prefill", "--seq", "16", "--reps", "1",
                           "--json", env={"TENSORPAR_BF16_DOT": "1"}).stdout)
        self.assertEqual(j["matmul"], "bf16")

    def test_bad_value_refused(self):
        model = MODELS["llama"]
        out = os.path.join(WORK, "bad.npy")
        for args in (("logits", "--model", model, "--tokens", "1,2", "--out", out),
                     ("generate", "--model", model, "--tokens", "1,2"),
                     ("chat", "--model", model),
                     ("bench", "forward", "--model", model, "--seq", "8"),
                     ("bench", "model", "--model", model, "--mode", "decode")):
            p = run(*args, "--matmul", "fast", "--tp", "2", check=False)
            self.assertEqual(p.returncode, 2, p.stderr)
            self.assertIn("option --matmul expects exact|bf16, got 'fast'", p.stderr)
            self.assertEqual(len(p.stderr.strip().splitlines()), 1, p.stderr)
        self.assertFalse(os.path.exists(out))
        p = run("logits", "--model", model, "--tokens", "1,2", "--out", out, check=False,
                env={"TENSORPAR_BF16_DOT": "yes"})
        self.assertEqual(p.returncode, 2, p.stderr)
        self.assertIn("TENSORPAR_BF16_DOT='yes'", p.stderr)


if __name__ == "__main__":
    unittest.main()
