#!/usr/bin/python3
"""End-to-end: the mixture-of-experts model types (qwen3_moe, mixtral).

* Logits against the independent NumPy reference (tests/reference/
  hf_reference.py, Qwen3MoeSparseMoeBlock / MixtralSparseMoeBlock on the
  per-expert checkpoint tensors): <= 1e-5 relative, for a whole prompt and
  token by token through the KV cache, with dense layers mixed in
  (mlp_only_layers, decoder_sparse_step) and without norm_topk_prob.
* TP (the built-in plans of §7.4, §7.5) at 2, 3 and 4 ranks and EP (`--ep`,
  §2.17, §2.18) at 2 and 4 ranks give the TP = 1 logits, bitwise the same on
  every rank, and the same greedy tokens.
* Under EP each rank reads exactly its own experts and the replicated rest.
* The §4.7 messages for expert counts that do not divide and a dense model
  asked for EP.  (Training and saving: test_moe_train.py.)

Routers are drawn with std 0.3 (--router-std) so that the top-k choices are
decisive and do not flip on rounding."""

import json
import os
import re
import shutil
import sys
import tempfile
import unittest

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "reference"))
from tpe2e import fails, generate, make_model, rel, run, tp_logits  # noqa: E402
import hf_reference as ref  # noqa: E402

TOL = 1e-5
TOKENS = "1,5,9,42,7,3,11,200,17,99,4,8,300,12,6,77,31,64,128,250"
# 6 heads / 3 KV heads and a vocabulary of 510 so that TP = 3 divides them.
TP3 = ["--set", "num_attention_heads=6", "--set", "num_key_value_heads=3", "--set", "vocab_size=510"]
WORK = None


def setUpModule():
    global WORK
    WORK = tempfile.mkdtemp(prefix="tp-e2e-moe-")


def tearDownModule():
    shutil.rmtree(WORK, ignore_errors=True)


def make(name, arch, *extra):
    return make_model(WORK, name, arch, "--preset", "tiny", "--qk-std", "0.25", "--router-std", "0.3", "--seed", "3",
                      *extra)


def logits(model, tp=1, *extra):
    return tp_logits(WORK, model, tp, *extra, tokens=TOKENS)


def reference(model):
    return ref.reference_logits(model, [int(t) for t in TOKENS.split(",")])


class Reference(unittest.TestCase):
    def check(self, model):
        err = rel(logits(model), reference(model))
        self.assertLessEqual(err, TOL, f"{model}: {err}")

    def test_qwen3_moe(self):
        self.check(make("q", "qwen3_moe"))
        self.check(make("q-nonorm", "qwen3_moe", "--set", "norm_topk_prob=false"))
        # layer 0 dense (decoder_sparse_step 2), then layer 1 dense by mlp_only_layers
        self.check(make("q-step", "qwen3_moe", "--set", "decoder_sparse_step=2"))
        self.check(make("q-only", "qwen3_moe", "--set", "mlp_only_layers=[1]", "--set", "num_experts_per_tok=3"))

    def test_mixtral(self):
        self.check(make("x", "mixtral"))

    def test_bf16_weights(self):
        model = make("q-bf16", "qwen3_moe", "--dtype", "bf16")
        self.assertLessEqual(rel(logits(model), reference(model)), TOL)

    def test_token_by_token_through_the_kv_cache(self):
        for model in (make("q", "qwen3_moe"), make("x", "mixtral")):
            out = os.path.join(WORK, "inc.npy")
            run("logits", "--model", model, "--tokens", TOKENS, "--out", out, "--incremental")
            self.assertLessEqual(rel(np.load(out), reference(model)), TOL, model)


class Parallel(unittest.TestCase):
    def test_tp_equals_tp1(self):
        for model in (make("q", "qwen3_moe"), make("x", "mixtral")):
            base = logits(model)
            for tp in (2, 4):
                self.assertLessEqual(rel(logits(model, tp), base), TOL, f"{model} TP={tp}")
        model = make("q3", "qwen3_moe", *TP3)
        self.assertLessEqual(rel(logits(model, 3), logits(model)), TOL, "qwen3_moe TP=3")

    def test_ep_equals_tp1(self):
        for model in (make("q", "qwen3_moe"), make("x", "mixtral"), make("q-step", "qwen3_moe", "--set",
                                                                       "decoder_sparse_step=2")):
            base = logits(model)
            for ep in (2, 4):
                self.assertLessEqual(rel(logits(model, ep, "--ep"), base), TOL, f"{model} EP={ep}")

    def test_greedy_tokens_identical(self):
        for model in (make("q", "qwen3_moe"), make("x", "mixtral")):
            want = generate(model)
            self.assertEqual(len(want), 24)
            for extra in ((2,), (4,), (2, "--ep"), (4, "--ep")):
                self.assertEqual(generate(model, *extra), want, f"{model} {extra}")

    def test_ep_reads_only_its_experts(self):
        model = make("q", "qwen3_moe")
        P = 4
        p = run("logits", "--model", model, "--tokens", "1,2", "--out", os.path.join(WORK, "b.npy"), "--tp", P,
                "--ep", "--bytes-read")
        got = {int(r): int(b) for r, b in re.findall(r"rank (\d+) read (\d+) bytes", p.stderr)}
        tensors = ref.load_model_tensors(model, np.float32)
        expert = sum(a.nbytes for n, a in tensors.items() if ".mlp.experts." in n)
        rest = sum(a.nbytes for n, a in tensors.items() if ".mlp.experts." not in n)   # lm_head whole too (§4.2)
        self.assertEqual(sorted(got), list(range(P)))
        for r in range(P):
            self.assertEqual(got[r], rest + expert // P, f"rank {r}")
        report = json.loads(run("plan", "--model", model, "--tp", P, "--ep", "--json").stdout)
        self.assertEqual([got[r] for r in range(P)], report["bytes_per_rank"])

    def test_tp_reads_a_slice_of_every_expert(self):
        model = make("x", "mixtral")
        p = run("logits", "--model", model, "--tokens", "1,2", "--out", os.path.join(WORK, "b.npy"), "--tp", 2,
                "--bytes-read")
        got = {int(r): int(b) for r, b in re.findall(r"rank (\d+) read (\d+) bytes", p.stderr)}
        report = json.loads(run("plan", "--model", model, "--tp", 2, "--json").stdout)
        self.assertEqual([got[0], got[1]], report["bytes_per_rank"])


class Messages(unittest.TestCase):
    def test_experts_do_not_divide(self):
        err = fails("logits", "--model", make("q", "qwen3_moe"), "--tokens", "1", "--out",
                    os.path.join(WORK, "e.npy"), "--tp", 3, "--ep")
        self.assertIn("Global number of experts must be divisible by number of devices: 8 % 3 != 0", err)

    def test_router_experts_do_not_divide(self):
        path = os.path.join(WORK, "router.json")
        with open(path, "w") as f:
            json.dump({"model.layers.*.mlp.gate": "ep_router"}, f)
        err = fails("plan", "--model", make("q", "qwen3_moe"), "--tp", 3, "--tp-plan", path)
        self.assertIn("num_experts must be divisible by ep_size: 8 % 3 != 0", err)

    def test_ep_plan_has_no_head_rules(self):
        model = make("q-tied", "qwen3_moe", "--set", "tie_word_embeddings=true")
        plan = json.loads(run("plan", "--model", model, "--tp", 2, "--ep", "--json").stdout)["plan"]
        self.assertEqual(plan, {"model.layers.*.mlp.gate": "ep_router",
                                "model.layers.*.mlp.experts.gate_up_proj": "grouped_gemm",
                                "model.layers.*.mlp.experts.down_proj": "grouped_gemm",
                                "model.layers.*.mlp.experts": "moe_tp_experts"})
        self.assertLessEqual(rel(logits(model, 2, "--ep"), logits(model)), TOL)

    def test_dense_model_has_no_ep_plan(self):
        d = os.path.join(WORK, "llama")
        if not os.path.exists(d):
            run("make-model", "--arch", "llama", "--out", d)
        err = fails("logits", "--model", d, "--tokens", "1", "--out", os.path.join(WORK, "e.npy"), "--tp", 2, "--ep")
        self.assertIn("Expert parallelism was requested (`enable_expert_parallel=True`), but `LlamaForCausalLM` "
                      "does not define an expert-parallel plan.", err)


if __name__ == "__main__":
    unittest.main()
