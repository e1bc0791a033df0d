#!/usr/bin/python3
"""End-to-end: `tensorpar grads` against the torch autograd reference.

Run by CTest (TENSORPAR_BIN = the built CLI), or by hand:
    TENSORPAR_BIN=build/tensorpar /usr/bin/python3 tests/e2e/test_grads_reference.py [-v]

For every case a tiny f32 model is made with `tensorpar make-model` (q/k
weights with std 0.25, so that attention is far from uniform), the engine's
loss and gradients (`tensorpar grads`) are compared with
tests/reference/hf_reference_grad.py (torch autograd in float64, written from
Transformers' modeling code).  The measure, per tensor:
    max|engine - ref| / max|ref|   <= 1e-5
and for the loss |engine - ref| / |ref| <= 1e-5.  Every parameter of the
checkpoint must have its gradient, under its Hugging Face name and shape.
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "reference"))
sys.path.insert(0, HERE)
from tpe2e import BIN  # noqa: E402
import hf_reference_grad as ref  # noqa: E402
import hf_reference as st_reader  # noqa: E402

TOL = 1e-5
T = 24
WINDOW = 5   # Mistral's sliding window, shorter than T so that it matters
LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 16}

WORK = None
RESULTS = []


def setUpModule():
    global WORK
    if not os.path.exists(BIN):
        raise RuntimeError(f"tensorpar CLI not found (TENSORPAR_BIN={BIN!r})")
    WORK = tempfile.mkdtemp(prefix="tp-e2e-grads-")


def tearDownModule():
    if RESULTS:
        print("\n%-40s %-48s %s" % ("case", "tensor (worst)", "max|d|/max|ref|"), file=sys.stderr)
        for c, name, e, ok in RESULTS:
            print("%-40s %-48s %.3e%s" % (c, name, e, "" if ok else "   <-- FAIL"), file=sys.stderr)
    if WORK:
        shutil.rmtree(WORK, ignore_errors=True)


def run(args, timeout=120, check=True):
    p = subprocess.run([BIN] + [str(a) for a in args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       timeout=timeout, text=True)
    if check and p.returncode != 0:
        raise AssertionError(f"`tensorpar {' '.join(map(str, args))}` exited {p.returncode}\n"
                             f"stderr: {p.stderr[-2000:]}")
    return p


def make_model(name, arch, sets):
    d = os.path.join(WORK, name)
    sets = dict(sets)
    dtype = sets.pop("dtype", "f32")   # the stored weights' dtype (not a config key)
    args = ["make-model", "--arch", arch, "--preset", "tiny", "--dtype", dtype, "--seed", 1, "--qk-std", 0.25,
            "--out", d]
    for k, v in sets.items():
        args += ["--set", f"{k}={json.dumps(v)}"]
    run(args)
    return d


def read_safetensors(path):
    """The tensors of a safetensors file as float32 arrays (the reference's checked reader)."""
    return st_reader.read_safetensors(path, np.float32)


def tokens_for(d, seed=0):
    with open(os.path.join(d, "config.json")) as f:
        v = json.load(f)["vocab_size"]
    return [int(x) for x in np.random.default_rng(seed).integers(0, v, size=T)]


def engine_grads(d, tokens, extra=()):
    out = os.path.join(d, "grads.safetensors")
    run(["grads", "--model", d, "--tokens", ",".join(map(str, tokens)), "--out", out, *extra])
    return read_safetensors(out)


def rel(x, r):
    return float(np.max(np.abs(x.astype(np.float64) - r)) / np.max(np.abs(r)))


CASES = [
    ("llama", "llama", {}),
    ("llama/tied", "llama", {"tie_word_embeddings": True}),
    ("llama/llama3-rope", "llama", {"rope_scaling": LLAMA3}),
    ("llama/linear-rope/bias", "llama", {"rope_scaling": {"rope_type": "linear", "factor": 2.0},
                                         "attention_bias": True}),
    ("mistral/window", "mistral", {"sliding_window": WINDOW}),
    ("qwen2", "qwen2", {}),
    ("qwen2/tied", "qwen2", {"tie_word_embeddings": True}),
    ("qwen3", "qwen3", {}),
    ("qwen3/tied/mha", "qwen3", {"tie_word_embeddings": True, "num_key_value_heads": 4}),
    ("qwen2/bf16-weights", "qwen2", {"dtype": "bf16"}),   # the reference reads the same bf16 values
]


class TestGradsVsReference(unittest.TestCase):
    def check(self, case, arch, sets):
        d = make_model(case.replace("/", "_"), arch, sets)
        toks = tokens_for(d)
        want_loss, want = ref.reference_grads(d, toks)
        got = engine_grads(d, toks)
        self.assertEqual(set(got), set(want) | {"loss"}, f"{case}: the tensors written")
        self.assertEqual(got["loss"].shape, (), f"{case}: loss is a scalar")
        e_loss = abs(float(got["loss"]) - want_loss) / abs(want_loss)
        worst, worst_name = e_loss, "loss"
        self.assertLessEqual(e_loss, TOL, f"{case}: loss {float(got['loss'])} vs {want_loss}")
        for name, w in want.items():
            self.assertEqual(got[name].shape, w.shape, f"{case}: {name} shape")
            self.assertTrue(np.all(np.isfinite(got[name])), f"{case}: {name} not finite")
            self.assertGreater(np.max(np.abs(w)), 0, f"{case}: {name}: the reference gradient is zero")
            e = rel(got[name], w)
            if e > worst:
                worst, worst_name = e, name
            self.assertLessEqual(e, TOL, f"{case}: {name}: max|d|/max|ref| = {e:.3e}")
        RESULTS.append((case, worst_name, worst, worst <= TOL))

    def test_cases(self):
        for case, arch, sets in CASES:
            with self.subTest(case=case):
                self.check(case, arch, sets)

    def test_sensitivity(self):
        """The window, the tied head and the rope schedule change the reference gradients, or the cases
        above would prove nothing about them."""
        base = make_model("sens_base", "mistral", {})
        toks = tokens_for(base)
        _, g0 = ref.reference_grads(base, toks)
        for name, sets in (("window", {"sliding_window": WINDOW}), ("llama3", {"rope_scaling": LLAMA3})):
            _, g1 = ref.reference_grads(make_model("sens_" + name, "mistral", sets), toks)
            e = rel(g1["model.layers.0.self_attn.q_proj.weight"], g0["model.layers.0.self_attn.q_proj.weight"])
            self.assertGreater(e, 1e-3, f"{name} does not change the reference gradients")


# (case, arch, config changes, TP sizes): q/k/v and gate/up colwise, o/down rowwise, lm_head
# colwise_gather_output, Qwen3's q/k norms replicated_with_grad_allreduce; P > num_key_value_heads
# replicates KV heads (their gradients summed over each KV subgroup).
TP_CASES = [
    ("llama/6h-1kv", "llama", {"num_attention_heads": 6, "num_key_value_heads": 1, "head_dim": 16}, (2, 3)),
    ("qwen3/4h-2kv", "qwen3", {}, (2, 4)),
    ("qwen3/6h-1kv", "qwen3", {"num_attention_heads": 6, "num_key_value_heads": 1}, (3,)),
    ("mistral/window/1kv", "mistral", {"sliding_window": WINDOW, "num_key_value_heads": 1}, (2, 4)),
    ("qwen2/qkv-bias", "qwen2", {}, (2, 4)),   # at 4: the k/v biases of replicated KV heads too
    ("llama/bias", "llama", {"attention_bias": True}, (2,)),   # o_proj's bias after the reduction
    # tied: embedding_rowwise and colwise_gather_output on the one tensor, both gradients in its shard
    ("qwen3/tied", "qwen3", {"tie_word_embeddings": True}, (2, 4)),
    ("llama/tied/vocab500/6h-3kv", "llama", {"tie_word_embeddings": True, "vocab_size": 500,
                                              "num_attention_heads": 6, "num_key_value_heads": 3, "head_dim": 16},
     (3,)),
    # sequence_parallel stream norms (T = 24 rows over 3 ranks; over 2)
    ("llama/6h-1kv/sequence_parallel", "llama",
     {"num_attention_heads": 6, "num_key_value_heads": 1, "head_dim": 16, "plan": "sp"}, (2, 3)),
]

L = "model.layers.*."
SP_PLAN = {L + "self_attn.q_proj": "colwise", L + "self_attn.k_proj": "colwise", L + "self_attn.v_proj": "colwise",
           L + "self_attn.o_proj": "rowwise", L + "mlp.gate_proj": "colwise", L + "mlp.up_proj": "colwise",
           L + "mlp.down_proj": "rowwise", "lm_head": "colwise_gather_output",
           L + "input_layernorm": "sequence_parallel", L + "post_attention_layernorm": "sequence_parallel",
           "model.norm": "sequence_parallel"}


class TestGradsTensorParallel(unittest.TestCase):
    """--tp N gives TP = 1's gradients (whole, gathered) within 1e-5, and the reference's."""

    def test_tp_equals_tp1(self):
        for case, arch, sets, sizes in TP_CASES:
            sets = dict(sets)
            plan_args = []
            if sets.pop("plan", None) == "sp":
                plan_args = ["--tp-plan", os.path.join(WORK, "sp_plan.json")]
                with open(plan_args[1], "w") as f:
                    json.dump(SP_PLAN, f)
            d = make_model("tp_" + case.replace("/", "_"), arch, sets)
            toks = tokens_for(d, seed=5)
            one = engine_grads(d, toks, ["--threads", 1])
            _, want = ref.reference_grads(d, toks)
            for p in sizes:
                with self.subTest(case=case, tp=p):
                    got = engine_grads(d, toks, ["--tp", p, "--threads", 1] + plan_args)
                    self.assertEqual(set(got), set(one), f"{case} tp={p}: the tensors written")
                    worst, worst_name = 0.0, ""
                    for name in one:
                        self.assertEqual(got[name].shape, one[name].shape, name)
                        base = np.max(np.abs(one[name])) if one[name].ndim else abs(float(one[name]))
                        e = float(np.max(np.abs(got[name].astype(np.float64) - one[name])) / base)
                        if e > worst:
                            worst, worst_name = e, name
                        self.assertLessEqual(e, TOL, f"{case} tp={p}: {name} vs TP=1: {e:.3e}")
                        if name != "loss":
                            self.assertLessEqual(rel(got[name], want[name]), TOL, f"{case} tp={p}: {name} vs ref")
                    RESULTS.append((f"{case} tp={p} vs tp=1", worst_name, worst, worst <= TOL))

    def test_refused_legacy_block_rule(self):
        """The legacy `gather` on self_attn (over local_colwise / local_rowwise) defines no backward
        communication: refused for training with spec §2.19's message.  Rules on blocks that train:
        test_every_style_grads.py."""
        d = make_model("tp_block", "llama", {})
        plan = os.path.join(WORK, "block_plan.json")
        with open(plan, "w") as f:
            L = "model.layers.*.self_attn"
            json.dump({L + ".q_proj": "local_colwise", L + ".k_proj": "local_colwise", L + ".v_proj": "local_colwise",
                       L + ".o_proj": "local_rowwise", L: "gather"}, f)
        p = run(["grads", "--model", d, "--tokens", "1,2,3", "--out", os.path.join(WORK, "t.safetensors"),
                 "--tp", 2, "--threads", 1, "--tp-plan", plan], check=False)
        self.assertEqual(p.returncode, 1, p.stderr)
        self.assertIn("is inference-only and cannot be used for training.", p.stderr)


class TestGradsRowParallelLoss(unittest.TestCase):
    """The default loss at TP > 1 never gathers lm_head's [T, V] logits: whole rows move to one rank each
    (Shard(1) -> Shard(0), by blocks of 64 rows per rank) and the loss kernel of TP = 1 runs on them.  With
    a plan that splits only lm_head (every other module runs as on one rank, the logits are TP = 1's), the
    loss is bitwise TP = 1's; T not divisible by P, T < P, and T over one block of rows (200 > 64·P at
    P = 2, 3).  The gradients go through OpenBLAS's GEMMs, whose order of summation depends on the
    shard's shape (lm_head.weight's differs in the last bit at T = 24 with the gathered logits too):
    those are checked to the usual tolerance; the logits' gradient itself is bitwise TP = 1's
    (test_row_parallel_loss.py)."""

    def test_bitwise_tp1(self):
        d = make_model("rowloss_qwen3", "qwen3", {})
        plan = os.path.join(WORK, "head_plan.json")
        with open(plan, "w") as f:
            json.dump({"lm_head": "colwise_gather_output"}, f)
        v = 512
        for n, sizes in ((24, (2, 3, 4)), (7, (2, 4)), (3, (4,)), (200, (2, 3))):
            toks = [int(x) for x in np.random.default_rng(n).integers(0, v, size=n)]
            one = engine_grads(d, toks, ["--threads", 1])
            for p in sizes:
                with self.subTest(T=n, tp=p):
                    got = engine_grads(d, toks, ["--tp", p, "--threads", 1, "--tp-plan", plan])
                    self.assertEqual(float(got["loss"]), float(one["loss"]), f"T={n} tp={p}: loss")
                    for name in one:
                        base = np.max(np.abs(one[name])) if one[name].ndim else abs(float(one[name]))
                        self.assertLessEqual(float(np.max(np.abs(got[name].astype(np.float64) - one[name])) / base),
                                             TOL, f"T={n} tp={p}: {name}")


class TestGradsCli(unittest.TestCase):
    def test_refusals(self):
        d = make_model("cli_qwen3", "qwen3", {})
        out = os.path.join(WORK, "x.safetensors")
        p = run(["grads", "--model", d, "--tokens", "5", "--out", out], check=False)
        self.assertEqual(p.returncode, 2, p.stderr)
        self.assertIn("at least two tokens", p.stderr)
        p = run(["grads", "--model", d, "--tokens", "5,600000", "--out", out], check=False)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("outside the vocabulary", p.stderr)
        self.assertFalse(os.path.exists(out), "nothing written on failure")

    def test_deterministic(self):
        """Two runs (and thread counts) give bitwise the same gradients."""
        d = make_model("det_qwen3", "qwen3", {})
        toks = tokens_for(d, seed=3)
        a = engine_grads(d, toks, ["--threads", 1])
        b = engine_grads(d, toks, ["--threads", 2])
        for k in a:
            self.assertTrue(np.array_equal(a[k], b[k]), k)


if __name__ == "__main__":
    unittest.main()
