#!/usr/bin/python3
"""End-to-end: training and saving gpt_oss.

* `tensorpar grads` equals torch autograd on the reference
  (tests/reference/hf_gpt_oss.py, from Transformers' modeling_gpt_oss.py)
  within 1e-5 of each tensor's largest gradient: the sinks (their column of
  each softmax), the sliding window, q/k/v/o and expert biases, the clamped
  SwiGLU (no gradient where a clamp cuts, as torch's clamp), the router's
  top-k softmax and its bias; on the tiny model and on one whose gate/up
  values are mostly clamped.  EP 2 and 4, plain --tp 2 ("auto": lm_head
  only) and §2.16's plan with the sinks split with the heads equal TP = 1.
* 5 AdamW steps of `tensorpar train` equal the reference's Trainer steps
  (every step's loss within 1e-5, every parameter within 1e-4), at TP = 1
  and EP = 2; the sinks decay as Transformers' Trainer decays them (their
  name holds neither "bias" nor "norm"), the biases do not.
* Saving keeps Transformers' names and layout: with lr 0 the saved file
  holds the checkpoint's values, byte-identical at TP = 1, EP = 2 and EP 4.
* Training with the heads split and the sinks replicated is refused (each
  rank would add only its heads' gradients).  LoRA on the attention trains
  with the sinks and experts frozen.

Routers are drawn with std 0.3 so that the top-k choices are decisive."""

import os
import sys
import unittest

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "reference"))
from tpe2e import fails, run  # noqa: E402
import hf_gpt_oss as oss  # noqa: E402
import moe_e2e as m  # noqa: E402
from moe_e2e import ADAMW, TOKENS, read  # noqa: E402

SINKS_PLAN = {"model.layers.*.self_attn.q_proj": "colwise", "model.layers.*.self_attn.k_proj": "colwise",
              "model.layers.*.self_attn.v_proj": "colwise", "model.layers.*.self_attn.o_proj": "rowwise",
              "model.layers.*.self_attn.sinks": "colwise", "model.layers.*.self_attn": "local_params"}
WORK = None


setUpModule, tearDownModule = m.scratch_dir(globals(), "tp-e2e-gptoss-train-")


def make(name, *extra):
    return m.make_tiny(WORK, name, "gpt_oss", "--dtype", "f32", *extra)


def models():
    return [make("tiny"), make("clamped", "--std", "0.3", "--set", "swiglu_limit=1.5")]


def plan_file():
    import json
    path = os.path.join(WORK, "sinks.json")
    with open(path, "w") as f:
        json.dump(SINKS_PLAN, f)
    return path


class Grads(unittest.TestCase):
    def test_reference_and_splits(self):
        for model in models():
            name = os.path.basename(model)
            loss, want = oss.grads(model, [TOKENS])
            base = m.engine_grads(WORK, model, name)
            m.check_grads(self, base, loss, want, name, "the torch reference")
            for sinks in ("model.layers.0.self_attn.sinks", "model.layers.1.self_attn.sinks"):
                self.assertGreater(np.abs(base[sinks]).max(), 1e-5, f"{name}: {sinks} gets no gradient")
            m.check_splits(self, WORK, model, name, loss, base,
                           ((2, ("--ep",)), (4, ("--ep",)), (2, ()), (2, ("--tp-plan", plan_file()))))

    def test_replicated_sinks_with_split_heads_refused(self):
        import json
        path = os.path.join(WORK, "heads-only.json")
        with open(path, "w") as f:
            json.dump({k: v for k, v in SINKS_PLAN.items() if "sinks" not in k and v != "local_params"}, f)
        err = fails("grads", "--model", make("tiny"), "--tokens", "1,2,3", "--out", os.path.join(WORK, "x.st"),
                    "--tp", 2, "--tp-plan", path)
        self.assertIn("training with the query heads split needs the sinks split with them", err)


class Train(unittest.TestCase):
    def test_adamw_steps(self):
        model = make("tiny")
        log, want = oss.reference_train(model, m.data_for(WORK, model), **ADAMW)
        w0 = read(os.path.join(model, "model.safetensors"))
        self.assertGreater(min(float(np.abs(want[k] - w0[k]).max()) for k in want), 0, "a tensor does not move")
        base = None
        for tp, extra in ((1, ()), (2, ("--ep",))):
            out = os.path.join(WORK, f"train-{tp}")
            got_log = m.train(WORK, model, out, ADAMW, "--tp", tp, *extra)
            got = m.check_trained(self, f"tp={tp} {extra}", out, got_log, log, want, base)
            base = got if base is None else base

    def test_lora_leaves_the_sinks_frozen(self):
        """LoRA on the attention: the base (sinks, experts) frozen, the adapter written and usable."""
        model = make("tiny")
        out = os.path.join(WORK, "lora")
        log = m.train(WORK, model, out, dict(ADAMW, steps=2), "--lora-r", 4, "--lora-target", "q_proj,v_proj,o_proj")
        self.assertEqual(len(log), 2)
        names = read(os.path.join(out, "adapter_model.safetensors"))
        self.assertTrue(names and all("lora_" in k and "sinks" not in k for k in names), sorted(names))
        run("logits", "--model", model, "--adapter", out, "--tokens", "1,2,3", "--out", os.path.join(WORK, "la.npy"))

    def test_save_lr0_byte_identical(self):
        model = make("tiny")
        opts = dict(ADAMW, steps=1, lr=0.0, weight_decay=0.0)
        files = []
        for tp, extra in ((1, ()), (2, ("--ep",)), (4, ("--ep",))):
            out = os.path.join(WORK, f"save-{tp}")
            m.train(WORK, model, out, opts, "--tp", tp, *extra)
            files.append(m.file_bytes(os.path.join(out, "model.safetensors")))
        m.check_same_bytes(self, files, "EP 2, EP 4 vs TP 1")
        m.check_saved_is_source(self, os.path.join(WORK, "save-1"), model)


if __name__ == "__main__":
    unittest.main()
