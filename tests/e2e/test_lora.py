#!/usr/bin/python3
"""End-to-end: PEFT LoRA adapters on a tensor-parallel base model (§9.6).

Adapters written by tests/reference/peft_reference.py in PEFT's layout (B
non-zero) must give the NumPy reference's logits (base + scale · B·A) at
TP = 1, 2 and 4 (4: KV heads replicated), --merge-adapter the unmerged
logits, and each refusal its message."""

import json
import os
import shutil
import sys
import tempfile
import unittest

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "reference"))
sys.path.insert(0, HERE)
from tpe2e import rel, run, tp_logits  # noqa: E402
import peft_reference as peft  # noqa: E402

TOL = 1e-5
TOKENS = [1, 5, 9, 42, 7, 3, 11, 200, 17, 99, 4, 8, 300, 12, 6, 77]
WORK = None


def setUpModule():
    global WORK
    WORK = tempfile.mkdtemp(prefix="tp-e2e-lora-")


def tearDownModule():
    shutil.rmtree(WORK, ignore_errors=True)


def make(name, arch="qwen3", *extra):
    d = os.path.join(WORK, name)
    if not os.path.exists(d):
        run("make-model", "--arch", arch, "--preset", "tiny", "--qk-std", "0.25", "--seed", "3", *extra, "--out", d)
    return d


def logits(model, tp, *extra):
    return tp_logits(WORK, model, tp, *extra, tokens=",".join(map(str, TOKENS)))


class LoraLogits(unittest.TestCase):
    def check(self, arch, tps=(1, 2, 4), **kw):
        model = make(arch + "-base", arch)
        adapter = os.path.join(WORK, f"{arch}-{abs(hash(json.dumps(kw, sort_keys=True, default=str)))}")
        names = peft.write_adapter(adapter, model, **kw)
        self.assertTrue(names)
        want = peft.reference_logits(model, adapter, TOKENS)
        base = logits(model, 1)
        # the adapter changes the logits well beyond the tolerance
        self.assertGreater(rel(base, want), 100 * TOL)
        for tp in tps:
            got = logits(model, tp, "--adapter", adapter)
            self.assertLess(rel(got, want), TOL, f"{arch} TP={tp} {kw}")
            merged = logits(model, tp, "--adapter", adapter, "--merge-adapter")
            self.assertLess(rel(merged, got), TOL, f"{arch} TP={tp} merged")
        return model, adapter

    def test_every_projection(self):
        self.check("qwen3", targets=list(peft.PROJ), r=4, alpha=16)

    def test_llama_rslora_regex(self):
        self.check("llama", tps=(1, 2), targets=r"model\.layers\.[01]\.(self_attn\.(q|o)_proj|mlp\.down_proj)",
                   r=8, alpha=4, use_rslora=True)

    def test_embedding_rowwise(self):
        # tied: the plan puts embed_tokens under embedding_rowwise (§7.1)
        model = make("qwen3-tied", "qwen3", "--set", "tie_word_embeddings=true")
        adapter = os.path.join(WORK, "emb-tied")
        peft.write_adapter(adapter, model, targets=["embed_tokens", "q_proj", "o_proj"], r=4, alpha=8, seed=3)
        want = peft.reference_logits(model, adapter, TOKENS)
        self.assertGreater(rel(logits(model, 1), want), 100 * TOL)
        for tp in (1, 2, 4):
            self.assertLess(rel(logits(model, tp, "--adapter", adapter), want), TOL, f"tied TP={tp}")

    def test_embedding_replicated(self):
        self.check("llama", tps=(1, 2), targets=["embed_tokens", "gate_proj"], r=2, alpha=4)

    def test_qwen2_biased_colwise(self):
        self.check("qwen2", tps=(2,), targets=["k_proj", "up_proj"], r=2, alpha=2)

    def test_generate_takes_the_adapter(self):
        model, adapter = self.check("qwen3", tps=(2,), targets=["v_proj", "down_proj"], r=4, alpha=32, seed=5)
        gen = lambda *a: json.loads(run("generate", "--model", model, "--tokens", "1,2,3", "--max-new-tokens",
                                        "8", "--greedy", "--tp", 2, *a).stdout)
        with_adapter = gen("--adapter", adapter)
        self.assertEqual(with_adapter, gen("--adapter", adapter, "--merge-adapter"))


class LoraMerge(unittest.TestCase):
    def test_merge_command(self):
        model = make("qwen3-base", "qwen3")
        adapter = os.path.join(WORK, "merge-adapter")
        peft.write_adapter(adapter, model, targets=list(peft.PROJ), r=4, alpha=16, seed=7)
        unmerged = logits(model, 2, "--adapter", adapter)
        saved = {}
        for tp in (1, 2, 4):
            out = os.path.join(WORK, f"merged-tp{tp}")
            run("merge", "--model", model, "--adapter", adapter, "--out", out, "--tp", tp)
            with open(os.path.join(out, "model.safetensors"), "rb") as f:
                saved[tp] = f.read()
            self.assertTrue(os.path.exists(os.path.join(out, "config.json")))
            self.assertLess(rel(logits(out, 1), unmerged), TOL, f"merged at TP={tp}")
        # the collective save writes the TP = 1 bytes
        self.assertEqual(saved[1], saved[2])
        self.assertEqual(saved[1], saved[4])
        with open(os.path.join(model, "model.safetensors"), "rb") as f:
            self.assertNotEqual(f.read(), saved[1])


class LoraRefusals(unittest.TestCase):
    def refused(self, adapter_kw, tp, needle, *extra, model=None):
        model = model or make("qwen3-base", "qwen3")
        adapter = os.path.join(WORK, "refuse-" + str(abs(hash(needle))))
        peft.write_adapter(adapter, model, **adapter_kw)
        p = run("logits", "--model", model, "--tokens", "1,2", "--out", os.path.join(WORK, "x.npy"), "--tp", tp,
                "--adapter", adapter, *extra, check=False)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn(needle, p.stderr)

    def test_unsupported_style(self):
        self.refused({"targets": ["lm_head"]}, 2,
                     "Unsupported tensor parallel plan 'colwise_gather_output' for LoRA state dict sharding.")

    def test_tied_embedding_merge(self):
        model = make("qwen3-tied", "qwen3", "--set", "tie_word_embeddings=true")
        self.refused({"targets": ["embed_tokens"]}, 1, "would change the tied lm_head too", "--merge-adapter",
                     model=model)

    def test_embedding_colwise(self):
        plan = os.path.join(WORK, "emb-colwise.json")
        with open(plan, "w") as f:
            json.dump({"model.embed_tokens": "embedding_colwise", "lm_head": "colwise_gather_output"}, f)
        self.refused({"targets": ["embed_tokens"]}, 2,
                     "Unsupported tensor parallel plan 'embedding_colwise' for LoRA state dict sharding.",
                     "--tp-plan", plan)

    def test_bias(self):
        self.refused({"extra_config": {"bias": "all"}}, 1, "bias must be \"none\"")

    def test_modules_to_save(self):
        self.refused({"extra_config": {"modules_to_save": ["lm_head"]}}, 1, "'modules_to_save' is set")

    def test_no_match(self):
        self.refused({"extra_config": {"target_modules": ["nothing_here"]}}, 1, "match no Linear")

    def test_merge_without_adapter(self):
        model = make("qwen3-base", "qwen3")
        p = run("logits", "--model", model, "--tokens", "1,2", "--out", os.path.join(WORK, "x.npy"),
                "--merge-adapter", check=False)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("--merge-adapter needs --adapter DIR", p.stderr)

    def test_wrong_shape(self):
        model = make("qwen3-base", "qwen3")
        other = make("llama-96", "llama", "--set", "hidden_size=96", "--set", "num_attention_heads=6",
                     "--set", "num_key_value_heads=3")
        adapter = os.path.join(WORK, "wrong-shape")
        peft.write_adapter(adapter, other, targets=["q_proj"])
        p = run("logits", "--model", model, "--tokens", "1,2", "--out", os.path.join(WORK, "x.npy"), "--tp", 2,
                "--adapter", adapter, check=False)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("lora_A.weight", p.stderr)


if __name__ == "__main__":
    unittest.main()
