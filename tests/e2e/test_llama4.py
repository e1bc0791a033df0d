#!/usr/bin/python3
"""End-to-end: llama4_text (Llama4ForCausalLM), inference.

* Logits against the independent PyTorch reference (tests/reference/
  hf_llama4.py, from Transformers' modeling_llama4.py) <= 1e-5 relative, for
  a whole prompt and token by token through the KV cache.  The tiny preset
  has three layers: 0 dense with RoPE, 1 MoE with RoPE, 2 MoE without RoPE
  (NoPE: temperature tuning with floor_scale 4), chunks of 8 positions
  (shorter than the 18-token prompt), 4 experts top-1 with a shared expert.
  Variants: top-2, no q/k L2 norm, no temperature tuning, no chunks,
  llama3 rope scaling, the layer lists derived from interleave_moe_layer_step
  and no_rope_layer_interval, bf16 weights.  Each feature moves the logits.
* TP 2, 3 and 4 (§7.6: packed_rowwise gate_up_proj, colwise down_proj on the
  bmm-style experts, which sum their own output, §10.6) and EP 2 and 4
  (§7.6's EP plan, ep_router) give the TP = 1 logits, bitwise the same on
  every rank, and the same greedy tokens.  Under EP each rank reads only its
  experts (and its share of the attention and dense MLP, which the EP plan
  also splits).
* The Llama-4-Scout-17B-16E preset's text_config, as published.
* Refusals: the multimodal model type llama4 (training: test_llama4_train.py).

q/k weights are drawn with std 0.25 (--qk-std) so that attention is
decisive, routers with std 0.3 (--router-std) so that the top-k choices are."""

import json
import os
import re
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
TOKENS = "1,5,9,200,33,7,77,301,12,45,88,3,19,250,6,400,11,2"
LLAMA3 = ('rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, '
          '"original_max_position_embeddings": 16}')
WORK = None


setUpModule, tearDownModule = m.scratch_dir(globals(), "tp-e2e-llama4-")


def config(model):
    with open(os.path.join(model, "config.json")) as f:
        return json.load(f)


def make(name, *extra):
    return m.make_tiny(WORK, name, "llama4_text", *extra)


def logits(model, tp=1, *extra):
    return tp_logits(WORK, model, tp, *extra, tokens=TOKENS)


def reference(model):
    return m.reference_logits(model, TOKENS)


VARIANTS = {
    "top2": ("--set", "num_experts_per_tok=2"),
    "no-qk-norm": ("--set", "use_qk_norm=false"),
    "no-temp": ("--set", "attn_temperature_tuning=false"),
    "no-chunk": ("--set", "attention_chunk_size=null"),
    "llama3": ("--set", LLAMA3),
    # moe_layers / no_rope_layers null: every 2nd layer MoE, every 3rd NoPE
    "derived": ("--set", "moe_layers=null", "--set", "no_rope_layers=null", "--set", "interleave_moe_layer_step=2",
                "--set", "no_rope_layer_interval=3"),
}


class Reference(unittest.TestCase):
    def check(self, model):
        m.check_reference(self, WORK, model, TOKENS, reference(model))

    def test_tiny(self):
        self.check(make("tiny"))

    def test_variants(self):
        base = logits(make("tiny"))
        for name, extra in VARIANTS.items():
            model = make(name, *extra)
            self.check(model)
            # each feature reaches the numbers
            self.assertGreater(rel(logits(model), base), 1e-4, name)

    def test_bf16_weights(self):
        model = make("bf16", "--dtype", "bf16")
        self.assertLessEqual(rel(logits(model), reference(model)), TOL)

    def test_layer_lists(self):
        cfg = config(make("derived", *VARIANTS["derived"]))
        self.assertIsNone(cfg["moe_layers"])
        names = config(make("tiny"))
        self.assertEqual(names["moe_layers"], [1, 2])
        self.assertEqual(names["no_rope_layers"], [1, 1, 0])


class Parallel(unittest.TestCase):
    def test_tp_and_ep_equal_tp1(self):
        for model in (make("tiny"), make("top2", *VARIANTS["top2"])):
            base = logits(model)
            for extra in ((2,), (4,), (2, "--ep"), (4, "--ep")):
                self.assertLessEqual(rel(logits(model, *extra), base), TOL, f"{model} {extra}")

    def test_tp3(self):
        """6 heads and a vocabulary of 510 so that 3 divides them; the experts' I = 160 splits unevenly, alike
        in gate_up_proj's two packed halves and in down_proj."""
        model = make("tp3", "--set", "num_attention_heads=6", "--set", "num_key_value_heads=6",
                     "--set", "vocab_size=510")
        base = logits(model)
        self.assertLessEqual(rel(base, reference(model)), TOL)
        self.assertLessEqual(rel(logits(model, 3), base), TOL)

    def test_long_prompt(self):
        """80 tokens: ten chunks; temperature floors up to 20."""
        toks = ",".join(str((i * 7) % 500) for i in range(80))
        model = make("tiny")
        want = ref.reference_logits(model, [int(t) for t in toks.split(",")])
        for extra in ((1,), (2,), (2, "--ep")):
            self.assertLessEqual(rel(tp_logits(WORK, model, *extra, tokens=toks), want), TOL, f"{extra}")

    def test_greedy_tokens_identical(self):
        model = make("tiny")
        want = generate(model)
        self.assertEqual(len(want), 24)
        # through the KV cache across three chunk boundaries: the reference's greedy tokens
        ids, gap = ref.greedy_generate(ref.reference_model(model), [1, 2, 3], 24)
        self.assertGreater(gap, 1e-4)   # decisive: rounding cannot flip a choice
        self.assertEqual(want, ids)
        for extra in ((2,), (4,), (2, "--ep"), (4, "--ep")):
            self.assertEqual(generate(model, *extra), want, f"{extra}")

    def test_ep_reads_only_its_experts(self):
        """EP = 2: each rank reads half of the experts and, split by the EP
        plan's other rules, half of q/k/v/o and of the dense MLP; the rest
        (embedding, norms, router, shared expert, lm_head) whole."""
        model = make("tiny")
        P = 2
        p = run("logits", "--model", model, "--tokens", "1,2", "--out", os.path.join(WORK, "b.npy"), "--tp", P,
                "--ep", "--bytes-read")
        got = {int(r): int(b) for r, b in re.findall(r"rank (\d+) read (\d+) bytes", p.stderr)}
        tensors = ref.load_model_tensors(model, np.float32)
        split = re.compile(r"\.(experts\.|self_attn\.|feed_forward\.(gate|up|down)_proj)")
        halves = sum(a.nbytes for n, a in tensors.items() if split.search(n))
        rest = sum(a.nbytes for n, a in tensors.items() if not split.search(n))
        experts = sum(a.nbytes for n, a in tensors.items() if ".experts." in n)
        self.assertGreater(experts, rest // 2)
        for r in range(P):
            self.assertEqual(got[r], rest + halves // P, f"rank {r}")
        report = json.loads(run("plan", "--model", model, "--tp", P, "--ep", "--json").stdout)
        self.assertEqual([got[r] for r in range(P)], report["bytes_per_rank"])

    def test_plan_names_the_styles(self):
        text = run("plan", "--model", make("tiny"), "--tp", 2).stdout
        self.assertIn("packed_rowwise", text)
        text = run("plan", "--model", make("tiny"), "--tp", 2, "--ep").stdout
        self.assertIn("ep_router", text)
        self.assertIn("grouped_gemm", text)


class Presets(unittest.TestCase):
    def test_scout_config(self):
        out = os.path.join(WORK, "scout-cfg")
        # the published layer lists cut to 4 layers (the fourth NoPE); small widths
        run("make-model", "--arch", "llama4_text", "--preset", "llama-4-scout", "--set", "num_hidden_layers=4",
            "--set", "vocab_size=512", "--set", "hidden_size=64", "--set", "num_attention_heads=4",
            "--set", "num_key_value_heads=2", "--set", "head_dim=16", "--set", "intermediate_size=32",
            "--set", "intermediate_size_mlp=64", "--out", out)
        cfg = config(out)
        self.assertEqual(cfg["num_local_experts"], 16)
        self.assertEqual(cfg["num_experts_per_tok"], 1)
        self.assertEqual(cfg["attention_chunk_size"], 8192)
        self.assertEqual(cfg["rope_scaling"]["rope_type"], "llama3")
        self.assertEqual(cfg["rope_scaling"]["factor"], 8.0)
        self.assertEqual(cfg["no_rope_layers"], [1, 1, 1, 0])
        self.assertEqual(cfg["moe_layers"], [0, 1, 2, 3])
        self.assertEqual(cfg["eos_token_id"], [200001, 200007, 200008])
        self.assertLessEqual(rel(logits(out), reference(out)), TOL)


class Messages(unittest.TestCase):
    def test_multimodal_refused(self):
        d = os.path.join(WORK, "mm")
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump({"model_type": "llama4", "text_config": {"model_type": "llama4_text"}}, f)
        err = fails("logits", "--model", d, "--tokens", "1", "--out", os.path.join(WORK, "e.npy"))
        self.assertIn("model type 'llama4_text'", err)

    def test_experts_do_not_divide(self):
        err = fails("logits", "--model", make("tiny"), "--tokens", "1", "--out", os.path.join(WORK, "e.npy"),
                    "--tp", 3, "--ep")
        self.assertIn("4 % 3", err)


if __name__ == "__main__":
    unittest.main()
