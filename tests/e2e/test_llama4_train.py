#!/usr/bin/python3
"""End-to-end: training and saving llama4_text (Llama4ForCausalLM).

* `tensorpar grads` equals torch autograd on the reference
  (tests/reference/hf_llama4.py, from Transformers' modeling_llama4.py)
  within 1e-5 of each tensor's largest gradient: the attention with the L2
  q/k norm after the interleaved rotation, chunks shorter than the sequence
  and the NoPE layer's temperature; the sigmoid router whose score scales the
  experts' input (its gradient comes through the experts' input gradient);
  the bmm-style experts [E, H, 2I] / [E, I, H]; the shared expert; the dense
  layer.  Top-1 (the preset) and top-2.  TP = 2, 3, 4 (§7.6: packed_rowwise /
  colwise experts summing their own output, §10.6) and EP = 2, 4
  (grouped_gemm, ep_router) equal TP = 1 within 1e-5.
* 3 AdamW steps of `tensorpar train` equal hf_reference_train.py's Trainer
  steps on the same model: every step's loss within 1e-5, every parameter
  within 1e-4; TP = 2 and EP = 2 alike.
* Saving: the stacked expert tensors under their HF names (Llama 4 stores
  them stacked); with lr 0 the saved file is byte-identical at TP = 1, 2, 4
  and EP = 2, 4 and holds the source values; a trained model reloads to the
  reference's logits on its saved files at TP = 1 and EP = 2.

Routers are drawn with std 0.3 so that the top-k choices are decisive."""

import json
import os
import sys
import unittest

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "reference"))
from tpe2e import rel, write_token_rows  # noqa: E402
import hf_llama4 as l4ref  # noqa: E402
import hf_reference as ref  # noqa: E402
import moe_e2e as m  # noqa: E402
from moe_e2e import TOL, read  # noqa: E402

TOKENS = m.TOKENS + [31, 64]
ADAMW = dict(m.ADAMW, steps=3)
WORK = None


setUpModule, tearDownModule = m.scratch_dir(globals(), "tp-e2e-llama4-train-")


def make(name, *extra):
    return m.make_tiny(WORK, name, "llama4_text", "--dtype", "f32", *extra)


def engine_grads(model, name, *extra):
    return m.engine_grads(WORK, model, name, *extra, tokens=TOKENS)


def data():
    rng = np.random.default_rng(0)
    return write_token_rows(os.path.join(WORK, "data.jsonl"), rng, 24, 512, lambda i: int(rng.integers(10, 20)))


class Grads(unittest.TestCase):
    def test_tp3(self):
        """Uneven slices of I (160 over 3 ranks) in both expert tensors."""
        model = make("tp3", "--set", "num_attention_heads=6", "--set", "num_key_value_heads=6",
                     "--set", "vocab_size=510")
        base = engine_grads(model, "tp3")
        base.pop("loss")
        g = engine_grads(model, "tp3-3", "--tp", 3)
        g.pop("loss")
        m.check_close(self, g, base, TOL, "tp=3", "TP = 1")

    def test_reference_and_splits(self):
        for name, extra in (("tiny", ()), ("top2", ("--set", "num_experts_per_tok=2"))):
            model = make(name, *extra)
            loss, want = l4ref.reference_grads(model, TOKENS)
            base = engine_grads(model, name)
            m.check_grads(self, base, loss, want, name, "the torch reference")
            # the router and the experts of both MoE layers get gradients
            for layer in (1, 2):
                for t in ("router.weight", "experts.gate_up_proj", "experts.down_proj"):
                    self.assertGreater(np.abs(base[f"model.layers.{layer}.feed_forward.{t}"]).max(), 0, t)
            m.check_splits(self, WORK, model, name, loss, base, tokens=TOKENS)


class Train(unittest.TestCase):
    def test_adamw_steps(self):
        model = make("tiny")
        log, want = l4ref.reference_train(model, data(), **ADAMW)
        w0 = read(os.path.join(model, "model.safetensors"))
        self.assertGreater(min(rel(want[k], w0[k]) for k in want), 10 * TOL, "a tensor hardly moves")
        base = None
        for tp, ep in ((1, ()), (2, ()), (2, ("--ep",))):
            out = os.path.join(WORK, f"train-{tp}-{len(ep)}")
            got_log = m.train(WORK, model, out, ADAMW, "--tp", tp, *ep, data=data())
            got = m.check_trained(self, f"tp={tp} {ep}", out, got_log, log, want, base)
            base = got if base is None else base
        saved = os.path.join(WORK, "train-1-0")
        m.check_reload(self, WORK, saved, ref.reference_logits(saved, TOKENS), ((1, ()), (2, ("--ep",))), tokens=TOKENS)


class Save(unittest.TestCase):
    def test_save_bytes_identical(self):
        model = make("tiny")
        files = []
        for extra in ((1,), (2,), (4,), (2, "--ep"), (4, "--ep")):
            out = os.path.join(WORK, "save-" + "-".join(map(str, extra)))
            m.train(WORK, model, out, dict(seq_len=16, batch_size=2, steps=1, lr=0.0), "--tp", *extra, data=data())
            files.append(m.file_bytes(os.path.join(out, "model.safetensors")))
        m.check_same_bytes(self, files, "TP = 2, 4, EP = 2, 4 vs TP = 1")
        got = m.check_saved_is_source(self, os.path.join(WORK, "save-1"), model)
        self.assertIn("model.layers.1.feed_forward.experts.gate_up_proj", got)
        self.assertEqual(got["model.layers.1.feed_forward.experts.gate_up_proj"].shape, (4, 64, 320))
        with open(os.path.join(WORK, "save-1", "config.json")) as f:
            self.assertEqual(json.load(f)["model_type"], "llama4_text")


if __name__ == "__main__":
    unittest.main()
