#!/usr/bin/python3
"""End-to-end: training and saving the mixture-of-experts model types
(qwen3_moe, mixtral).

* `tensorpar grads` equals the torch autograd reference
  (tests/reference/hf_reference_grad.py: Qwen3MoeSparseMoeBlock /
  MixtralSparseMoeBlock written from Transformers, softmax -> topk ->
  renormalisation, no gradient through the choice; the router aux loss is
  not part of the loss, as output_router_logits is False in both configs)
  within 1e-5 of each tensor's largest gradient, the stacked experts
  compared with the reference's per-expert gradients stacked alike; and
  TP = 2, 4 (packed_colwise / rowwise experts) and EP = 2, 4 (grouped_gemm,
  ep_router) equal TP = 1 within 1e-5.
* 5 AdamW steps of `tensorpar train` equal hf_reference_train.py: every
  step's loss within 1e-5, every parameter within 1e-4; TP = 2 and EP = 2
  equal TP = 1 alike, and so do --dp-replicate 2 and --dp-shard 2 (with EP 2);
  --gradient-checkpointing gives the same bits.
* Saving reverses the expert stacking (§6.1, §6.4): the saved file holds the
  checkpoint's per-expert names, byte-identical at TP = 1, 2 and EP = 2, and
  (nothing trained: lr 0) the source checkpoint's values; a trained, saved
  model reloads to logits equal to the reference's on the saved files, at
  TP = 1 and EP = 2.
* A config with output_router_logits (the router's auxiliary loss added to
  Transformers' loss) is refused by grads and train.

Routers are drawn with std 0.3 so that the top-k choices are decisive and do
not flip on rounding."""

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
from tpe2e import make_model, read_log, rel, run, tp_logits, vocab_size, write_token_rows  # noqa: E402
import hf_reference as ref  # noqa: E402
import hf_reference_grad as gref  # noqa: E402
import hf_reference_train as tref  # noqa: E402

TOL = 1e-5
PARAM_TOL = 1e-4
TOKENS = [1, 5, 9, 42, 7, 3, 11, 200, 17, 99, 4, 8, 300, 12, 6, 77]
ADAMW = dict(seq_len=16, batch_size=2, grad_accum=2, steps=5, optim="adamw", lr=1e-3, lr_scheduler="linear",
             warmup_steps=1, weight_decay=0.1, max_grad_norm=1.0)
FLAGS = dict(seq_len="--seq-len", batch_size="--batch-size", grad_accum="--grad-accum", steps="--steps",
             optim="--optim", lr="--lr", lr_scheduler="--lr-scheduler", warmup_steps="--warmup-steps",
             weight_decay="--weight-decay", max_grad_norm="--max-grad-norm")
MODELS = [("qwen3_moe", "qwen3_moe", ()), ("mixtral", "mixtral", ()),
          # a dense layer between sparse ones and the weights not renormalised
          ("qwen3_moe_mixed", "qwen3_moe", ("--set", "num_hidden_layers=3", "--set", "mlp_only_layers=[1]",
                                            "--set", "norm_topk_prob=false"))]
WORK = None


def setUpModule():
    global WORK
    WORK = tempfile.mkdtemp(prefix="tp-e2e-moe-train-")


def tearDownModule():
    shutil.rmtree(WORK, ignore_errors=True)


def make(name, arch, extra=()):
    return make_model(WORK, name, arch, "--preset", "tiny", "--dtype", "f32", "--qk-std", "0.25", "--router-std", "0.3",
                      "--seed", "3", *extra)


def read(path):
    return ref.read_safetensors(path, np.float64)


def engine_grads(model, name, *extra):
    out = os.path.join(WORK, f"grads-{name}.safetensors")
    run("grads", "--model", model, "--tokens", ",".join(map(str, TOKENS)), "--out", out, *extra)
    return read(out)


def stacked_reference(model, grads):
    """The reference's gradients under the model's names: per-expert ones stacked as
    gate_up_proj [E, 2I, H] ([gate; up]) and down_proj [E, H, I]; Mixtral's
    block_sparse_moe.gate as mlp.gate."""
    with open(os.path.join(model, "config.json")) as f:
        mixtral = json.load(f)["model_type"] == "mixtral"
    names = ("w1", "w3", "w2") if mixtral else ("gate_proj", "up_proj", "down_proj")
    out, experts = {}, {}
    for k, v in grads.items():
        parts = k.split(".")
        if "experts" in parts:
            layer, e = int(parts[2]), int(parts[parts.index("experts") + 1])
            experts.setdefault(layer, {})[(e, names.index(parts[-2]))] = v
        else:
            out[k.replace(".block_sparse_moe.gate.", ".mlp.gate.")] = v
    for layer, t in experts.items():
        E = 1 + max(e for e, _ in t)
        out[f"model.layers.{layer}.mlp.experts.gate_up_proj"] = np.stack(
            [np.concatenate([t[(e, 0)], t[(e, 1)]]) for e in range(E)])
        out[f"model.layers.{layer}.mlp.experts.down_proj"] = np.stack([t[(e, 2)] for e in range(E)])
    return out


def worst(got, want):
    """(max over tensors of max|got - want| / max|want|, that tensor), the same tensors asserted."""
    assert set(got) == set(want), f"tensors differ: {sorted(set(got) ^ set(want))}"
    w = (0.0, "")
    for k, v in want.items():
        assert got[k].shape == v.shape, f"{k}: shape {got[k].shape}, want {v.shape}"
        e = float(np.max(np.abs(got[k] - v)) / max(np.max(np.abs(v)), 1e-30))
        w = max(w, (e, k))
    return w


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
        for name, arch, extra in MODELS:
            model = make(name, arch, extra)
            loss, want = gref.reference_grads(model, TOKENS)
            want = stacked_reference(model, want)
            base = engine_grads(model, name)
            self.assertLessEqual(abs(float(base.pop("loss")) - loss) / loss, TOL, name)
            e, k = worst(base, want)
            self.assertLessEqual(e, TOL, f"{name}: {k} vs the torch reference: {e:.3e}")
            for tp, ep in ((2, False), (4, False), (2, True), (4, True)):
                g = engine_grads(model, f"{name}-{tp}-{ep}", "--tp", tp, *(["--ep"] if ep else []))
                self.assertLessEqual(abs(float(g.pop("loss")) - loss) / loss, TOL)
                e, k = worst(g, base)
                self.assertLessEqual(e, TOL, f"{name} tp={tp} ep={ep}: {k} vs TP = 1: {e:.3e}")


class Train(unittest.TestCase):
    def test_adamw_steps(self):
        for name, arch, extra in MODELS[:2]:
            model = make(name, arch, extra)
            log, want = tref.reference_train(model, data_for(model), **ADAMW)
            w0 = gref.load_weights(model)
            self.assertGreater(min(rel(want[k], w0[k]) for k in want), 10 * TOL, f"{name}: a tensor hardly moves")
            base = None
            for tp, ep in ((1, False), (2, False), (2, True)):
                out = os.path.join(WORK, f"train-{name}-{tp}-{ep}")
                got_log = train(model, out, ADAMW, "--tp", tp, *(["--ep"] if ep else []))
                case = f"{name} tp={tp} ep={ep}"
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
            # the trained, saved model reloads: its logits are the reference's on the saved files
            toks = ",".join(map(str, TOKENS))
            saved = os.path.join(WORK, f"train-{name}-1-False")
            want_logits = ref.reference_logits(saved, TOKENS)
            for tp, ep in ((1, ()), (2, ("--ep",))):
                self.assertLessEqual(rel(tp_logits(WORK, saved, tp, *ep, tokens=toks), want_logits), TOL,
                                     f"{name}: reloaded at tp={tp} {ep}")

    def test_data_parallel(self):
        """--dp-replicate 2 and --dp-shard 2 (with EP 2 inside) at half the per-replica batch take
        the TP = 1 steps."""
        name, arch, extra = MODELS[1]
        model = make(name, arch, extra)
        opts = dict(ADAMW, steps=3)
        base_log = train(model, os.path.join(WORK, "dp-base"), opts)
        base = read(os.path.join(WORK, "dp-base", "model.safetensors"))
        # gradient checkpointing recomputes each layer, the sparse blocks included: the same bits
        train(model, os.path.join(WORK, "dp-gc"), opts, "--gradient-checkpointing")
        with open(os.path.join(WORK, "dp-gc", "model.safetensors"), "rb") as f, \
                open(os.path.join(WORK, "dp-base", "model.safetensors"), "rb") as g:
            self.assertEqual(f.read(), g.read(), "--gradient-checkpointing changed the trained weights")
        half = dict(opts, batch_size=1)
        for case, args in (("dp-replicate", ("--dp-replicate", 2)),
                           ("dp-shard+ep", ("--dp-shard", 2, "--tp", 2, "--ep"))):
            out = os.path.join(WORK, f"dp-{case}")
            log = train(model, out, half, *args)
            for g, w in zip(log, base_log):
                self.assertLessEqual(abs(g["loss"] - w["loss"]) / w["loss"], TOL, f"{case}: step {w['step']}")
            e, k = worst(read(os.path.join(out, "model.safetensors")), base)
            self.assertLessEqual(e, PARAM_TOL, f"{case}: {k} vs TP = 1: {e:.3e}")

    def test_router_aux_loss_refused(self):
        """output_router_logits = true: Transformers' loss adds the router's load-balancing loss,
        which tensorpar does not compute, so grads and train refuse (train before writing)."""
        model = make("aux", "mixtral")
        path = os.path.join(model, "config.json")
        with open(path) as f:
            cfg = json.load(f)
        cfg["output_router_logits"] = True
        with open(path, "w") as f:
            json.dump(cfg, f)
        out = os.path.join(WORK, "aux-out")
        for args in (("grads", "--model", model, "--tokens", "1,2,3,4", "--out", out),
                     ("train", "--model", model, "--data", data_for(model), "--out", out, "--seq-len", 8)):
            p = run(*args, check=False)
            self.assertNotEqual(p.returncode, 0, args[0])
            self.assertIn("config.json sets output_router_logits", p.stderr)
            self.assertFalse(os.path.exists(out), args[0])

    def test_save_is_the_checkpoint(self):
        """lr 0: nothing moves, so the saved file holds the source checkpoint's tensors under
        their per-expert names, and the same bytes at every split."""
        opts = dict(ADAMW, lr=0.0, steps=1)
        for name, arch, extra in MODELS[1:]:
            model = make(name, arch, extra)
            files = []
            for tp, ep in ((1, ()), (2, ()), (2, ("--ep",))):
                out = os.path.join(WORK, f"save-{name}-{tp}-{len(ep)}")
                train(model, out, opts, "--tp", tp, *ep)
                with open(os.path.join(out, "model.safetensors"), "rb") as f:
                    files.append(f.read())
            self.assertEqual(files[1], files[0], f"{name}: TP = 2 saved other bytes")
            self.assertEqual(files[2], files[0], f"{name}: EP = 2 saved other bytes")
            got, src = read(os.path.join(WORK, f"save-{name}-1-0", "model.safetensors")), \
                read(os.path.join(model, "model.safetensors"))
            self.assertEqual(sorted(got), sorted(src), name)
            for k in src:
                self.assertTrue(np.array_equal(got[k], src[k]), f"{name}: {k}")


if __name__ == "__main__":
    unittest.main()
