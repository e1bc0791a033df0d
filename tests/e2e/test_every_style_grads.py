#!/usr/bin/python3
"""End-to-end: the plans test_every_style.py shows the forward accepts, trained.

For each plan (rules over the built-in plan, as in test_every_style.py) one
`tensorpar grads` at TP = 2 (and 3 where the plan is a P = 3 case there)
must give TP = 1's loss and every gradient (gathered, HF names) within
max|d| / max|TP=1| <= 1e-5: rules on whole blocks (`all_reduce` on `mlp`
and `self_attn`, its backward the block rule's own pre_backward hook),
parameter-level rules under an `all_reduce` Linear, sequence_parallel stream
norms, colwise_gather_output on lm_head, replicated_with_grad_allreduce on
Qwen3's q/k norms.  The legacy styles (`gather`, `local`, `local_colwise`,
...) define no backward communication: training with them is refused with
the message of spec §2.19.

Run by CTest (TENSORPAR_BIN = the built CLI), or by hand:
    TENSORPAR_BIN=build/tensorpar /usr/bin/python3 tests/e2e/test_every_style_grads.py [-v]
"""

import json
import os
import shutil
import sys
import tempfile
import unittest

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "reference"))
import tpe2e  # noqa: E402
import hf_reference as st_reader  # noqa: E402

TOL = 1e-5
T = 12
COMMON = {"hidden_size": 48, "head_dim": 8, "num_attention_heads": 6, "num_key_value_heads": 6,
          "intermediate_size": 96, "vocab_size": 200, "num_hidden_layers": 2}
L = "model.layers.*."
LEGACY_MSG = "The legacy tensor parallel style '%s' is inference-only and cannot be used for training."

# (name, arch, extra config, rules over the built-in plan, TP sizes)
PLANS = [
    ("packed pair under all_reduce on mlp", "llama", {},
     {L + "mlp.gate_proj": "packed_colwise", L + "mlp.up_proj": "packed_colwise",
      L + "mlp.down_proj": "packed_rowwise", L + "mlp": "all_reduce"}, (2,)),
    ("all_reduce on self_attn over local_params o_proj", "llama", {},
     {L + "self_attn.o_proj": "local_params", L + "self_attn.o_proj.weight": "rowwise",
      L + "self_attn": "all_reduce"}, (2, 3)),
    ("parameter rules under an all_reduce Linear", "llama", {},
     {L + "mlp.gate_proj.weight": "colwise", L + "mlp.up_proj.weight": "colwise",
      L + "mlp.down_proj.weight": "rowwise", L + "mlp.down_proj": "all_reduce"}, (3,)),
    ("sequence_parallel stream norms, colwise_gather_output lm_head", "llama", {},
     {L + "input_layernorm": "sequence_parallel", L + "post_attention_layernorm": "sequence_parallel",
      "model.norm": "sequence_parallel", "lm_head": "colwise_gather_output"}, (2, 3)),
    ("replicated_with_grad_allreduce q/k norms, all_reduce mlp (qwen3, tied)", "qwen3",
     {"tie_word_embeddings": True},
     {L + "self_attn.q_norm": "replicated_with_grad_allreduce", L + "self_attn.k_norm": "replicated_with_grad_allreduce",
      L + "mlp.gate_proj": "packed_colwise", L + "mlp.up_proj": "packed_colwise",
      L + "mlp.down_proj": "packed_rowwise", L + "mlp": "all_reduce", "lm_head": "colwise_gather_output"}, (2,)),
    ("llama4_text: moe_tp_experts on the bmm experts (instead of their own sum), sequence_parallel norms",
     "llama4_text", {"intermediate_size_mlp": 96},
     {L + "feed_forward.experts": "moe_tp_experts", L + "input_layernorm": "sequence_parallel",
      L + "post_attention_layernorm": "sequence_parallel"}, (2, 3)),
]

LEGACY = [
    ("gather", {L + "self_attn.q_proj": "local_colwise", L + "self_attn.k_proj": "local_colwise",
                L + "self_attn.v_proj": "local_colwise", L + "self_attn.o_proj": "local_rowwise",
                L + "self_attn": "gather"}),
    ("local", {L + "mlp.gate_proj": "replicate", L + "mlp.up_proj": "replicate",
               L + "mlp.down_proj": "local", L + "mlp": "gather"}),
]

WORK = None


def setUpModule():
    global WORK
    WORK = tempfile.mkdtemp(prefix="tp-e2e-style-grads-")


def tearDownModule():
    shutil.rmtree(WORK, ignore_errors=True)


def make_model(arch, sets):
    d = os.path.join(WORK, arch + "".join("_%s" % k for k in sorted(sets)))
    if os.path.exists(d):
        return d
    # MoE routers with a wide spread: top-k choices that rounding cannot flip
    args = ["make-model", "--arch", arch, "--preset", "tiny", "--dtype", "f32", "--seed", 3, "--qk-std", 0.25,
            "--router-std", 0.3, "--out", d]
    for k, v in dict(COMMON, **sets).items():
        args += ["--set", f"{k}={json.dumps(v)}"]
    tpe2e.run(*args)
    return d


def write_plan(model, rules, name):
    p = tpe2e.run("plan", "--model", model, "--tp", "2", "--json")
    plan = dict(json.loads(p.stdout)["plan"], **rules)
    path = os.path.join(WORK, name + ".json")
    with open(path, "w") as f:
        json.dump(plan, f)
    return path


def read_safetensors(path):
    """The tensors of a safetensors file as float64 arrays (the reference's checked reader)."""
    return st_reader.read_safetensors(path, np.float64)


def grads(model, *extra, check=True):
    out = os.path.join(WORK, "g.safetensors")
    if os.path.exists(out):
        os.unlink(out)
    toks = ",".join(str(int(x)) for x in np.random.default_rng(7).integers(0, COMMON["vocab_size"], size=T))
    p = tpe2e.run("grads", "--model", model, "--tokens", toks, "--out", out, "--threads", 1, *extra, check=check)
    return p if not check else read_safetensors(out)


class TestEveryStyleGrads(unittest.TestCase):
    def test_plans_equal_tp1(self):
        for name, arch, sets, rules, sizes in PLANS:
            model = make_model(arch, sets)
            one = grads(model)
            plan = write_plan(model, rules, "plan")
            for p in sizes:
                with self.subTest(plan=name, tp=p):
                    got = grads(model, "--tp", p, "--tp-plan", plan)
                    self.assertEqual(set(got), set(one))
                    for k in one:
                        base = max(float(np.max(np.abs(one[k]))), 1e-30)
                        e = float(np.max(np.abs(got[k] - one[k]))) / base
                        self.assertLessEqual(e, TOL, f"{name} tp={p}: {k} differs from TP = 1 by {e:.3e}")

    def test_legacy_refused(self):
        model = make_model("llama", {})
        for style, rules in LEGACY:
            with self.subTest(style=style):
                p = grads(model, "--tp", 2, "--tp-plan", write_plan(model, rules, "legacy"), check=False)
                self.assertNotEqual(p.returncode, 0, p.stderr)
                # the first legacy style of the resolved plan is named
                self.assertIn("is inference-only and cannot be used for training.", p.stderr)
                self.assertTrue(any(LEGACY_MSG % s in p.stderr for s in ("gather", "local", "local_colwise",
                                                                         "local_rowwise")), p.stderr)


if __name__ == "__main__":
    unittest.main()
