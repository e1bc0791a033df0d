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
import shutil
import sys
import tempfile
import unittest

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "reference"))
from tpe2e import make_model, read_log, rel, run, tp_logits, write_token_rows  # noqa: E402
import hf_llama4 as l4ref  # noqa: E402
import hf_reference as ref  # noqa: E402

TOL = 1e-5
PARAM_TOL = 1e-4
TOKENS = [1, 5, 9, 42, 7, 3, 11, 200, 17, 99, 4, 8, 300, 12, 6, 77, 31, 64]
ADAMW = dict(seq_len=16, batch_size=2, grad_accum=2, steps=3, optim="adamw", lr=1e-3, lr_scheduler="linear",
             warmup_steps=1, weight_decay=0.1, max_grad_norm=1.0)
FLAGS = dict(seq_len="--seq-len", batch_size="--batch-size", grad_accum="--grad-accum", steps="--steps",
             optim="--optim", lr="--lr", lr_scheduler="--lr-scheduler", warmup_steps="--warmup-steps",
             weight_decay="--weight-decay", max_grad_norm="--max-grad-norm")
WORK = None


def setUpModule():
    global WORK
    WORK = tempfile.mkdtemp(prefix="tp-e2e-llama4-train-")


def tearDownModule():
    shutil.rmtree(WORK, ignore_errors=True)


def make(name, *extra):
    return make_model(WORK, name, "llama4_text", "--preset", "tiny", "--dtype", "f32", "--qk-std", "0.25",
                      "--router-std", "0.3", "--seed", "3", *extra)


def read(path):
    return ref.read_safetensors(path, np.float64)


def engine_grads(model, name, *extra):
    out = os.path.join(WORK, f"grads-{name}.safetensors")
    run("grads", "--model", model, "--tokens", ",".join(map(str, TOKENS)), "--out", out, *extra)
    return read(out)


def worst(got, want):
    """(max over tensors of max|got - want| / max|want|, that tensor), the same tensors asserted."""
    assert set(got) == set(want), f"tensors differ: {sorted(set(got) ^ set(want))}"
    w = (0.0, "")
    for k, v in want.items():
        assert got[k].shape == v.shape, f"{k}: shape {got[k].shape}, want {v.shape}"
        w = max(w, (float(np.max(np.abs(got[k] - v)) / max(np.max(np.abs(v)), 1e-30)), k))
    return w


def data():
    rng = np.random.default_rng(0)
    return write_token_rows(os.path.join(WORK, "data.jsonl"), rng, 24, 512, lambda i: int(rng.integers(10, 20)))


def train(model, out, opts, *extra):
    args = ["train", "--model", model, "--data", data(), "--out", out, "--threads", 1, "--no-shuffle", "--seed", 0,
            *extra]
    for k, v in opts.items():
        args += [FLAGS[k], v]
    run(*args)
    return read_log(out)


class Grads(unittest.TestCase):
    def test_tp3(self):
        """Uneven slices of I (160 over 3 ranks) in both expert tensors."""
        model = make("tp3", "--set", "num_attention_heads=6", "--set", "num_key_value_heads=6",
                     "--set", "vocab_size=510")
        base = engine_grads(model, "tp3")
        base.pop("loss")
        g = engine_grads(model, "tp3-3", "--tp", 3)
        g.pop("loss")
        e, k = worst(g, base)
        self.assertLessEqual(e, TOL, f"tp=3: {k} vs TP = 1: {e:.3e}")

    def test_reference_and_splits(self):
        for name, extra in (("tiny", ()), ("top2", ("--set", "num_experts_per_tok=2"))):
            model = make(name, *extra)
            loss, want = l4ref.reference_grads(model, TOKENS)
            base = engine_grads(model, name)
            self.assertLessEqual(abs(float(base.pop("loss")) - loss) / loss, TOL, name)
            e, k = worst(base, want)
            self.assertLessEqual(e, TOL, f"{name}: {k} vs the torch reference: {e:.3e}")
            # the router and the experts of both MoE layers get gradients
            for layer in (1, 2):
                for t in ("router.weight", "experts.gate_up_proj", "experts.down_proj"):
                    self.assertGreater(np.abs(base[f"model.layers.{layer}.feed_forward.{t}"]).max(), 0, t)
            for tp, ep in ((2, False), (4, False), (2, True), (4, True)):
                g = engine_grads(model, f"{name}-{tp}-{ep}", "--tp", tp, *(["--ep"] if ep else []))
                self.assertLessEqual(abs(float(g.pop("loss")) - loss) / loss, TOL)
                e, k = worst(g, base)
                self.assertLessEqual(e, TOL, f"{name} tp={tp} ep={ep}: {k} vs TP = 1: {e:.3e}")


class Train(unittest.TestCase):
    def test_adamw_steps(self):
        model = make("tiny")
        log, want = l4ref.reference_train(model, data(), **ADAMW)
        w0 = read(os.path.join(model, "model.safetensors"))
        self.assertGreater(min(rel(want[k], w0[k]) for k in want), 10 * TOL, "a tensor hardly moves")
        base = None
        for tp, ep in ((1, False), (2, False), (2, True)):
            out = os.path.join(WORK, f"train-{tp}-{ep}")
            got_log = train(model, out, ADAMW, "--tp", tp, *(["--ep"] if ep else []))
            case = f"tp={tp} ep={ep}"
            self.assertEqual(len(got_log), len(log), case)
            for g, w in zip(got_log, log):
                self.assertLessEqual(abs(g["loss"] - w["loss"]) / w["loss"], TOL, f"{case}: step {w['step']}")
            got = read(os.path.join(out, "model.safetensors"))
            e, k = worst(got, want)
            self.assertLessEqual(e, PARAM_TOL, f"{case}: {k} vs the reference: {e:.3e}")
            if base is None:
                base = got
            else:
                e, k = worst(got, base)
                self.assertLessEqual(e, PARAM_TOL, f"{case}: {k} vs TP = 1: {e:.3e}")
        saved = os.path.join(WORK, "train-1-False")
        toks = ",".join(map(str, TOKENS))
        want_logits = ref.reference_logits(saved, TOKENS)
        for tp, extra in ((1, ()), (2, ("--ep",))):
            self.assertLessEqual(rel(tp_logits(WORK, saved, tp, *extra, tokens=toks), want_logits), TOL,
                                 f"reloaded at tp={tp} {extra}")


class Save(unittest.TestCase):
    def test_save_bytes_identical(self):
        model = make("tiny")
        files = []
        for extra in ((1,), (2,), (4,), (2, "--ep"), (4, "--ep")):
            out = os.path.join(WORK, "save-" + "-".join(map(str, extra)))
            train(model, out, dict(seq_len=16, batch_size=2, steps=1, lr=0.0), "--tp", *extra)
            with open(os.path.join(out, "model.safetensors"), "rb") as f:
                files.append(f.read())
        for i, b in enumerate(files[1:], 1):
            self.assertEqual(b, files[0], f"save {i} differs from TP = 1's")
        got = read(os.path.join(WORK, "save-1", "model.safetensors"))
        src = read(os.path.join(model, "model.safetensors"))
        self.assertEqual(sorted(got), sorted(src))
        self.assertIn("model.layers.1.feed_forward.experts.gate_up_proj", got)
        self.assertEqual(got["model.layers.1.feed_forward.experts.gate_up_proj"].shape, (4, 64, 320))
        for k in src:
            self.assertTrue(np.array_equal(got[k], src[k]), k)
        with open(os.path.join(WORK, "save-1", "config.json")) as f:
            self.assertEqual(json.load(f)["model_type"], "llama4_text")


if __name__ == "__main__":
    unittest.main()
