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
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "reference"))
from tpe2e import rel, run  # noqa: E402
import hf_reference as ref  # noqa: E402
import hf_reference_grad as gref  # noqa: E402
import hf_reference_train as tref  # noqa: E402
import moe_e2e as m  # noqa: E402
from moe_e2e import ADAMW, TOKENS, TOL, read, stacked_reference  # noqa: E402

MODELS = [("qwen3_moe", "qwen3_moe", ()), ("mixtral", "mixtral", ()),
          # a dense layer between sparse ones and the weights not renormalised
          ("qwen3_moe_mixed", "qwen3_moe", ("--set", "num_hidden_layers=3", "--set", "mlp_only_layers=[1]",
                                            "--set", "norm_topk_prob=false"))]
WORK = None


setUpModule, tearDownModule = m.scratch_dir(globals(), "tp-e2e-moe-train-")


def make(name, arch, extra=()):
    return m.make_tiny(WORK, name, arch, "--dtype", "f32", *extra)


class Grads(unittest.TestCase):
    def test_reference_and_splits(self):
        for name, arch, extra in MODELS:
            model = make(name, arch, extra)
            loss, want = gref.reference_grads(model, TOKENS)
            base = m.engine_grads(WORK, model, name)
            m.check_grads(self, base, loss, stacked_reference(model, want), name, "the torch reference")
            m.check_splits(self, WORK, model, name, loss, base)


class Train(unittest.TestCase):
    def test_adamw_steps(self):
        for name, arch, extra in MODELS[:2]:
            model = make(name, arch, extra)
            log, want = tref.reference_train(model, m.data_for(WORK, model), **ADAMW)
            w0 = gref.load_weights(model)
            self.assertGreater(min(rel(want[k], w0[k]) for k in want), 10 * TOL, f"{name}: a tensor hardly moves")
            base = None
            for tp, ep in ((1, ()), (2, ()), (2, ("--ep",))):
                out = os.path.join(WORK, f"train-{name}-{tp}-{len(ep)}")
                got_log = m.train(WORK, model, out, ADAMW, "--tp", tp, *ep)
                got = m.check_trained(self, f"{name} tp={tp} {ep}", out, got_log, log, want, base)
                base = got if base is None else base
            # the trained, saved model reloads: its logits are the reference's on the saved files
            saved = os.path.join(WORK, f"train-{name}-1-0")
            m.check_reload(self, WORK, saved, ref.reference_logits(saved, TOKENS), ((1, ()), (2, ("--ep",))))

    def test_data_parallel(self):
        """--dp-replicate 2 and --dp-shard 2 (with EP 2 inside) at half the per-replica batch take
        the TP = 1 steps."""
        name, arch, extra = MODELS[1]
        model = make(name, arch, extra)
        opts = dict(ADAMW, steps=3)
        base_log = m.train(WORK, model, os.path.join(WORK, "dp-base"), opts)
        base = read(os.path.join(WORK, "dp-base", "model.safetensors"))
        # gradient checkpointing recomputes each layer, the sparse blocks included: the same bits
        m.train(WORK, model, os.path.join(WORK, "dp-gc"), opts, "--gradient-checkpointing")
        self.assertEqual(m.file_bytes(os.path.join(WORK, "dp-gc", "model.safetensors")),
                         m.file_bytes(os.path.join(WORK, "dp-base", "model.safetensors")),
                         "--gradient-checkpointing changed the trained weights")
        m.check_data_parallel(self, WORK, model, opts, base_log, base)

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
                     ("train", "--model", model, "--data", m.data_for(WORK, model), "--out", out, "--seq-len", 8)):
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
                m.train(WORK, model, out, opts, "--tp", tp, *ep)
                files.append(m.file_bytes(os.path.join(out, "model.safetensors")))
            m.check_same_bytes(self, files, f"{name}: TP = 2, EP = 2")
            m.check_saved_is_source(self, os.path.join(WORK, f"save-{name}-1-0"), model, name)


if __name__ == "__main__":
    unittest.main()
