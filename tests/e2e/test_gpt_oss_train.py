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
import shutil
import sys
import tempfile
import unittest

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "reference"))
from tpe2e import fails, make_model, read_log, run, vocab_size, write_token_rows  # noqa: E402
import hf_gpt_oss as oss  # noqa: E402
import hf_reference as ref  # noqa: E402

TOL = 1e-5
PARAM_TOL = 1e-4
TOKENS = [1, 5, 9, 42, 7, 3, 11, 200, 17, 99, 4, 8, 300, 12, 6, 77]
ADAMW = dict(seq_len=16, batch_size=2, grad_accum=2, steps=5, optim="adamw", lr=1e-3, lr_scheduler="linear",
             warmup_steps=1, weight_decay=0.1, max_grad_norm=1.0)
FLAGS = dict(seq_len="--seq-len", batch_size="--batch-size", grad_accum="--grad-accum", steps="--steps",
             optim="--optim", lr="--lr", lr_scheduler="--lr-scheduler", warmup_steps="--warmup-steps",
             weight_decay="--weight-decay", max_grad_norm="--max-grad-norm")
SINKS_PLAN = {"model.layers.*.self_attn.q_proj": "colwise", "model.layers.*.self_attn.k_proj": "colwise",
              "model.layers.*.self_attn.v_proj": "colwise", "model.layers.*.self_attn.o_proj": "rowwise",
              "model.layers.*.self_attn.sinks": "colwise", "model.layers.*.self_attn": "local_params"}
WORK = None


def setUpModule():
    global WORK
    WORK = tempfile.mkdtemp(prefix="tp-e2e-gptoss-train-")


def tearDownModule():
    shutil.rmtree(WORK, ignore_errors=True)


def make(name, *extra):
    return make_model(WORK, name, "gpt_oss", "--preset", "tiny", "--dtype", "f32", "--qk-std", "0.25",
                      "--router-std", "0.3", "--seed", "3", *extra)


def models():
    return [make("tiny"), make("clamped", "--std", "0.3", "--set", "swiglu_limit=1.5")]


def read(path):
    return ref.read_safetensors(path, np.float64)


def engine_grads(model, name, *extra):
    out = os.path.join(WORK, f"grads-{name}.safetensors")
    run("grads", "--model", model, "--tokens", ",".join(map(str, TOKENS)), "--out", out, *extra)
    return read(out)


def worst(got, want):
    assert set(got) == set(want), f"tensors differ: {sorted(set(got) ^ set(want))}"
    w = (0.0, "")
    for k, v in want.items():
        assert got[k].shape == v.shape, f"{k}: shape {got[k].shape}, want {v.shape}"
        w = max(w, (float(np.max(np.abs(got[k] - v)) / max(np.max(np.abs(v)), 1e-30)), k))
    return w


def plan_file():
    import json
    path = os.path.join(WORK, "sinks.json")
    with open(path, "w") as f:
        json.dump(SINKS_PLAN, f)
    return path


def data_for(model):
    rng = np.random.default_rng(0)
    return write_token_rows(os.path.join(WORK, f"data-{vocab_size(model)}.jsonl"), rng, 24, vocab_size(model),
                            lambda i: int(rng.integers(6, 20)))


def train(model, out, opts, *extra):
    args = ["train", "--model", model, "--data", data_for(model), "--out", out, "--threads", 1, "--no-shuffle",
            "--seed", 0, *extra]
    for k, v in opts.items():
        args += [FLAGS[k], v]
    run(*args)
    return read_log(out)


class Grads(unittest.TestCase):
    def test_reference_and_splits(self):
        for model in models():
            name = os.path.basename(model)
            loss, want = oss.grads(model, [TOKENS])
            base = engine_grads(model, name)
            self.assertLessEqual(abs(float(base.pop("loss")) - loss) / loss, TOL, name)
            e, k = worst(base, want)
            self.assertLessEqual(e, TOL, f"{name}: {k} vs the torch reference: {e:.3e}")
            for sinks in ("model.layers.0.self_attn.sinks", "model.layers.1.self_attn.sinks"):
                self.assertGreater(np.abs(base[sinks]).max(), 1e-5, f"{name}: {sinks} gets no gradient")
            for tp, extra in ((2, ("--ep",)), (4, ("--ep",)), (2, ()), (2, ("--tp-plan", plan_file()))):
                g = engine_grads(model, f"{name}-{tp}-{len(extra)}", "--tp", tp, *extra)
                self.assertLessEqual(abs(float(g.pop("loss")) - loss) / loss, TOL)
                e, k = worst(g, base)
                self.assertLessEqual(e, TOL, f"{name} tp={tp} {extra}: {k} vs TP = 1: {e:.3e}")

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
        log, want = oss.reference_train(model, data_for(model), **ADAMW)
        w0 = read(os.path.join(model, "model.safetensors"))
        self.assertGreater(min(float(np.abs(want[k] - w0[k]).max()) for k in want), 0, "a tensor does not move")
        base = None
        for tp, extra in ((1, ()), (2, ("--ep",))):
            out = os.path.join(WORK, f"train-{tp}")
            got_log = train(model, out, ADAMW, "--tp", tp, *extra)
            self.assertEqual(len(got_log), len(log))
            for g, w in zip(got_log, log):
                self.assertLessEqual(abs(g["loss"] - w["loss"]) / w["loss"], TOL, f"tp={tp}: step {w['step']}")
            got = read(os.path.join(out, "model.safetensors"))
            e, k = worst(got, want)
            self.assertLessEqual(e, PARAM_TOL, f"tp={tp} {extra}: {k} vs the reference: {e:.3e}")
            if base is not None:
                e, k = worst(got, base)
                self.assertLessEqual(e, PARAM_TOL, f"EP 2: {k} vs TP = 1: {e:.3e}")
            base = got

    def test_lora_leaves_the_sinks_frozen(self):
        """LoRA on the attention: the base (sinks, experts) frozen, the adapter written and usable."""
        model = make("tiny")
        out = os.path.join(WORK, "lora")
        log = train(model, out, dict(ADAMW, steps=2), "--lora-r", 4, "--lora-target", "q_proj,v_proj,o_proj")
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
            train(model, out, opts, "--tp", tp, *extra)
            with open(os.path.join(out, "model.safetensors"), "rb") as f:
                files.append(f.read())
        self.assertEqual(files[1], files[0], "EP 2 saved other bytes than TP 1")
        self.assertEqual(files[2], files[0], "EP 4 saved other bytes than TP 1")
        got, src = read(os.path.join(WORK, "save-1", "model.safetensors")), read(os.path.join(model, "model.safetensors"))
        self.assertEqual(sorted(got), sorted(src))
        for k in src:
            self.assertTrue(np.array_equal(got[k], src[k]), k)


if __name__ == "__main__":
    unittest.main()
