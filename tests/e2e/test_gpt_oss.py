#!/usr/bin/python3
"""End-to-end: gpt_oss (§7.9): attention with q/k/v/o biases and per-head
sinks, alternating sliding-window / full layers, YaRN rope without
truncation, the router (Linear with bias, top-k logits softmaxed) and the
experts in Transformers' layout with biases and the clamped SwiGLU.

* Logits against the independent torch reference (tests/reference/
  hf_gpt_oss.py, from Transformers' modeling_gpt_oss.py): <= 1e-5
  relative, for a prompt longer than the window, and token by token through
  the KV cache (a sliding layer keeps the whole cache and attends to its
  window); bf16 weights; a limit that clamps most gate/up values; explicit
  layer_types.
* EP 2 and 4 (§7.9's EP plan: grouped_gemm on the weights and the biases,
  ep_router, moe_tp_experts) give the EP 1 logits, bitwise the same on every
  rank, the same greedy tokens, and each rank reads only its experts.
* Plain --tp N ("auto"): no TP plan, only lm_head is sharded, the coverage
  warning lists the rest, the logits are TP 1's.
* §2.16's user plan: q/k/v colwise, o_proj rowwise, the sinks colwise with
  local_params on self_attn; and sinks split while the heads are whole is
  refused.
* Refusals: an MXFP4 checkpoint (tensor names *_blocks / *_scales), TP-style
  expert rules.

q/k are drawn with std 0.25 (--qk-std), routers with std 0.3 (--router-std)
so that attention and the top-k choices are decisive."""

import json
import os
import re
import shutil
import sys
import unittest

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "reference"))
from tpe2e import fails, generate, rel, run, tp_logits  # noqa: E402
import hf_reference as ref  # noqa: E402
import moe_e2e as m  # noqa: E402

TOL = 1e-5
TOKENS = "1,5,9,42,7,3,11,200,17,99,4,8,300,12,6,77,31,64,128,250"   # 20 > the window of 6
WORK = None


setUpModule, tearDownModule = m.scratch_dir(globals(), "tp-e2e-gptoss-")


def make(name, *extra):
    return m.make_tiny(WORK, name, "gpt_oss", *extra)


def logits(model, tp=1, *extra):
    return tp_logits(WORK, model, tp, *extra, tokens=TOKENS)


def reference(model):
    return m.reference_logits(model, TOKENS)


def write_json(name, obj):
    path = os.path.join(WORK, name)
    with open(path, "w") as f:
        json.dump(obj, f)
    return path


class Reference(unittest.TestCase):
    def check(self, model):
        m.check_reference(self, WORK, model, TOKENS, reference(model))

    def test_tiny(self):
        self.check(make("tiny"))

    def test_clamped_swiglu(self):
        """Weights of std 0.3 and a limit of 1.5: most gate/up values are
        clamped, and the logits differ from those without a clamp."""
        clamped = make("clamped", "--std", "0.3", "--set", "swiglu_limit=1.5")
        self.check(clamped)
        loose = make("loose", "--std", "0.3", "--set", "swiglu_limit=1000")
        self.assertGreater(rel(logits(clamped), logits(loose)), 1e-3)

    def test_layer_types_and_window(self):
        """Explicit layer types (both sliding; both full) follow the config:
        the window changes the logits."""
        both = make("sliding", "--set", 'layer_types=["sliding_attention","sliding_attention"]')
        full = make("full", "--set", 'layer_types=["full_attention","full_attention"]')
        self.check(both)
        self.check(full)
        self.assertGreater(rel(logits(both), logits(full)), 1e-3)

    def test_bf16_weights(self):
        model = make("bf16", "--dtype", "bf16")
        self.assertLessEqual(rel(logits(model), reference(model)), TOL)

    def test_real_size_config(self):
        """gpt-oss-20b's config as published (24 layers alternating, 32
        experts top-4, window 128, YaRN factor 32 untruncated) round-trips."""
        d = os.path.join(WORK, "20b-config")
        if not os.path.exists(d):
            run("make-model", "--arch", "gpt_oss", "--preset", "gpt-oss-20b", "--set", "num_hidden_layers=1",
                "--set", "num_local_experts=4", "--set", "vocab_size=256", "--set", "hidden_size=64",
                "--set", "num_attention_heads=4", "--set", "num_key_value_heads=2", "--set", "head_dim=16",
                "--set", "intermediate_size=32", "--out", d)
        with open(os.path.join(d, "config.json")) as f:
            cfg = json.load(f)
        self.assertEqual(cfg["rope_scaling"], {"beta_fast": 32, "beta_slow": 1, "factor": 32,
                                               "original_max_position_embeddings": 4096, "rope_type": "yarn",
                                               "truncate": False})
        self.assertEqual((cfg["sliding_window"], cfg["num_experts_per_tok"], cfg["rope_theta"]), (128, 4, 150000))
        toks = [int(t) for t in TOKENS.split(",")][:8]
        got = tp_logits(WORK, d, 1, tokens=",".join(map(str, toks)))
        self.assertLessEqual(rel(got, ref.reference_logits(d, toks)), TOL)


class Parallel(unittest.TestCase):
    def test_ep_equals_ep1(self):
        for model in (make("tiny"), make("clamped", "--std", "0.3", "--set", "swiglu_limit=1.5")):
            base = logits(model)
            for ep in (2, 4):
                self.assertLessEqual(rel(logits(model, ep, "--ep"), base), TOL, f"{model} EP={ep}")

    def test_greedy_tokens_identical(self):
        model = make("tiny")
        want = generate(model)
        self.assertEqual(len(want), 24)
        for extra in ((2, "--ep"), (4, "--ep"), (2,)):
            self.assertEqual(generate(model, *extra), want, f"{extra}")

    def test_ep_reads_only_its_experts(self):
        model, P = make("tiny"), 4
        p = run("logits", "--model", model, "--tokens", "1,2", "--out", os.path.join(WORK, "b.npy"), "--tp", P,
                "--ep", "--bytes-read")
        got = {int(r): int(b) for r, b in re.findall(r"rank (\d+) read (\d+) bytes", p.stderr)}
        tensors = ref.load_model_tensors(model, np.float32)
        expert = sum(a.nbytes for n, a in tensors.items() if ".mlp.experts." in n)
        rest = sum(a.nbytes for n, a in tensors.items() if ".mlp.experts." not in n)
        self.assertEqual(sorted(got), list(range(P)))
        for r in range(P):
            self.assertEqual(got[r], rest + expert // P, f"rank {r}")
        report = json.loads(run("plan", "--model", model, "--tp", P, "--ep", "--json").stdout)
        self.assertEqual([got[r] for r in range(P)], report["bytes_per_rank"])
        self.assertEqual(report["plan"], {
            "model.layers.*.mlp.router": "ep_router",
            "model.layers.*.mlp.experts.gate_up_proj": "grouped_gemm",
            "model.layers.*.mlp.experts.gate_up_proj_bias": "grouped_gemm",
            "model.layers.*.mlp.experts.down_proj": "grouped_gemm",
            "model.layers.*.mlp.experts.down_proj_bias": "grouped_gemm",
            "model.layers.*.mlp.experts": "moe_tp_experts"})

    def test_auto_shards_only_lm_head(self):
        model = make("tiny")
        report = json.loads(run("plan", "--model", model, "--tp", 2, "--json").stdout)
        self.assertFalse(report["supports_tp"])
        self.assertEqual(report["plan"], {"lm_head": "colwise_gather_output"})
        p = run("logits", "--model", model, "--tokens", TOKENS, "--out", os.path.join(WORK, "auto-%r.npy"),
                "--tp", 2)
        self.assertIn("model.layers.*.self_attn.sinks", p.stderr)
        self.assertIn("model.layers.*.mlp.experts.gate_up_proj_bias", p.stderr)
        self.assertNotIn("lm_head", p.stderr.split("not sharded:")[-1])
        self.assertLessEqual(rel(np.load(os.path.join(WORK, "auto-0.npy")), logits(model)), TOL)

    def test_sinks_under_local_params(self):
        """§2.16: each rank holds the sinks of its own heads."""
        model = make("tiny")
        plan = write_json("sinks.json", {
            "model.layers.*.self_attn.q_proj": "colwise", "model.layers.*.self_attn.k_proj": "colwise",
            "model.layers.*.self_attn.v_proj": "colwise", "model.layers.*.self_attn.o_proj": "rowwise",
            "model.layers.*.self_attn.sinks": "colwise", "model.layers.*.self_attn": "local_params"})
        report = run("plan", "--model", model, "--tp", 2, "--tp-plan", plan).stdout
        self.assertRegex(report, r"self_attn\.sinks\s+rule \S+\s+style colwise\s+Shard\(0\)\s+global \[4\]\s+"
                                 r"rank 0 \[2\]")
        self.assertLessEqual(rel(logits(model, 2, "--tp-plan", plan), logits(model)), TOL)


class Messages(unittest.TestCase):
    def test_sinks_split_without_the_heads(self):
        plan = write_json("bad-sinks.json", {"model.layers.*.self_attn.sinks": "colwise",
                                             "model.layers.*.self_attn": "local_params"})
        err = fails("plan", "--model", make("tiny"), "--tp", 2, "--tp-plan", plan)
        self.assertIn("the sinks are Shard(0) here, but the query heads are whole", err)

    def test_tp_style_experts_refused(self):
        plan = write_json("tp-experts.json", {"model.layers.*.mlp.experts.gate_up_proj": "packed_colwise",
                                              "model.layers.*.mlp.experts.down_proj": "rowwise",
                                              "model.layers.*.mlp.experts": "moe_tp_experts"})
        err = fails("plan", "--model", make("tiny"), "--tp", 2, "--tp-plan", plan)
        self.assertIn("gpt_oss's experts keep Transformers' layout", err)

    def test_experts_do_not_divide(self):
        err = fails("logits", "--model", make("tiny"), "--tokens", "1", "--out", os.path.join(WORK, "e.npy"),
                    "--tp", 3, "--ep")
        self.assertIn("Global number of experts must be divisible by number of devices: 8 % 3 != 0", err)

    def test_mxfp4_checkpoint_refused(self):
        """The published checkpoints' MXFP4 experts: refused naming the tensor."""
        src = make("tiny")
        d = os.path.join(WORK, "mxfp4")
        shutil.rmtree(d, ignore_errors=True)
        shutil.copytree(src, d)
        path = os.path.join(d, "model.safetensors")
        t = ref.read_safetensors(path, np.float32)
        name = "model.layers.0.mlp.experts.gate_up_proj"
        t[name + "_blocks"] = np.zeros((8, 80, 2, 16), np.float32)
        t[name + "_scales"] = np.zeros((8, 80, 2), np.float32)
        del t[name]
        ref.write_safetensors(path, t)
        err = fails("logits", "--model", d, "--tokens", "1", "--out", os.path.join(WORK, "e.npy"))
        self.assertIn(f"stores {name}_blocks (MXFP4 blocks and scales) instead of {name}", err)


if __name__ == "__main__":
    unittest.main()
