#!/usr/bin/python3
"""End-to-end: training and saving deepseek_v2 and deepseek_v3.

* `tensorpar grads` equals the torch autograd reference
  (tests/reference/hf_deepseek.py's torch_logits through
  hf_reference_grad.py, written from Transformers' DeepseekV2/V3 modeling
  code) within 1e-5 of each tensor's largest gradient: multi-head latent
  attention with q_proj and with the low-rank query (q_a_proj,
  q_a_layernorm, q_b_proj), a value head wider than the query/key head
  (the padded layout), YaRN (attention factor, V3's softmax mscale), V2's
  interleaved pairs and V3's rope_interleave / halves; V2's softmax router
  greedy and group_limited_greedy with routed_scaling_factor, V3's sigmoid
  router with e_score_correction_bias (it only chooses: its gradient is 0)
  with and without norm_topk_prob; the shared experts.
* TP = 2, 4 (§7.7: q/q_b/kv_b colwise, kv_a_proj_with_mqa mla_kv_a_proj,
  the rope key's gradient summed once; §7.8: V3's attention replicated) and
  EP = 2, 4 equal TP = 1 within 1e-5; so does deepseek_v3 with a user plan
  that splits its attention heads, and sequence_parallel stream norms with
  colwise_gather_output on lm_head.
* 5 AdamW steps equal hf_reference_train.py (losses within 1e-5, parameters
  within 1e-4) at TP = 1, 2 and EP = 2, replicated parameters identical on
  every rank (--check-replicas); the saved model reloads to the
  reference's logits; --gradient-checkpointing gives the same bits;
  --dp-replicate 2 and --dp-shard 2 (with TP 2 / EP inside) take the TP = 1 steps.
* Saving (lr 0) writes the per-expert and shared-expert tensors under the
  checkpoint's names: byte-identical at TP = 1, 2 and EP = 2, and equal to
  the source checkpoint.

q/k paths are drawn with std 0.25, routers with std 0.3 so that the top-k
choices are decisive and do not flip on rounding."""

import json
import os
import sys
import unittest

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "reference"))
from tpe2e import rel  # noqa: E402
import hf_deepseek as dref  # noqa: E402
import hf_reference_grad as gref  # noqa: E402
import hf_reference_train as tref  # noqa: E402
import moe_e2e as m  # noqa: E402
from moe_e2e import ADAMW, TOKENS, TOL, read, file_bytes, stacked_reference  # noqa: E402

YARN_V2 = ('rope_scaling={"type": "yarn", "factor": 4, "original_max_position_embeddings": 512, '
           '"mscale": 0.707, "mscale_all_dim": 0.707, "beta_fast": 32, "beta_slow": 1}')
YARN_V3 = ('rope_scaling={"type": "yarn", "factor": 4, "original_max_position_embeddings": 512, '
           '"mscale": 1.0, "mscale_all_dim": 0.8}')
# (name, arch, --set options): the tiny presets have layer 0 dense, layer 1 sparse (8 experts, top 2)
MODELS = [
    ("v2", "deepseek_v2", ()),
    ("v2-qlora-yarn", "deepseek_v2", ("q_lora_rank=24", "v_head_dim=30", YARN_V2)),
    ("v2-groups", "deepseek_v2", ("first_k_dense_replace=0", "n_shared_experts=null", "n_group=4", "topk_group=2",
                                  "topk_method=group_limited_greedy", "routed_scaling_factor=1.5")),
    ("v3-yarn", "deepseek_v3", (YARN_V3,)),
    ("v3-halves", "deepseek_v3", ("rope_interleave=false", "q_lora_rank=null", "norm_topk_prob=false",
                                  "num_experts_per_tok=3")),
]
WORK = None


setUpModule, tearDownModule = m.scratch_dir(globals(), "tp-e2e-deepseek-train-")


def make(name, arch, sets=()):
    return m.make_tiny(WORK, name, arch, "--dtype", "f32", *[a for s in sets for a in ("--set", s)])


def engine_grads(model, name, *extra):
    return m.engine_grads(WORK, model, name, *extra)


class Grads(unittest.TestCase):
    def test_reference_and_splits(self):
        for name, arch, sets in MODELS:
            model = make(name, arch, sets)
            loss, want = gref.reference_grads(model, TOKENS)
            base = engine_grads(model, name)
            m.check_grads(self, base, loss, stacked_reference(model, want), name, "the torch reference")
            for k in base:
                if k.endswith("e_score_correction_bias"):
                    self.assertFalse(base[k].any(), f"{name}: {k} has a gradient")
            m.check_splits(self, WORK, model, name, loss, base)

    def test_rope_key_summed_once(self):
        """§11 E6: kv_a_proj_with_mqa's gradient at TP = 2 equals TP = 1's, with its rope rows (the
        shared key, read by every head) far from zero; and deepseek_v3 with a user plan that splits
        the heads (§7.8) sums it too, while its built-in plan (attention replicated) must not."""
        model = make("v2", "deepseek_v2")
        g1, g2 = engine_grads(model, "e6-1"), engine_grads(model, "e6-2", "--tp", 2)
        name = "model.layers.0.self_attn.kv_a_proj_with_mqa.weight"
        rope_rows = g1[name][32:]   # kv_lora_rank 32 of the tiny preset
        self.assertGreater(np.abs(rope_rows).max(), 0.05 * np.abs(g1[name]).max())
        self.assertLessEqual(rel(g2[name], g1[name]), TOL)
        path = os.path.join(WORK, "v3-mla.json")
        with open(path, "w") as f:
            json.dump({"model.layers.*.self_attn.q_b_proj": "colwise",
                       "model.layers.*.self_attn.kv_a_proj_with_mqa": "mla_kv_a_proj",
                       "model.layers.*.self_attn.kv_b_proj": "colwise",
                       "model.layers.*.self_attn.o_proj": "rowwise"}, f)
        v3 = make("v3-yarn", "deepseek_v3", (YARN_V3,))
        base = engine_grads(v3, "v3-plan-1")
        base.pop("loss")
        for tp in (2, 4):
            g = engine_grads(v3, f"v3-plan-{tp}", "--tp", tp, "--tp-plan", path)
            g.pop("loss")
            m.check_close(self, g, base, TOL, f"v3 user plan tp={tp}", "TP = 1")


    def test_sequence_parallel_plan(self):
        """Rules over the built-in plan: sequence_parallel stream norms (each rank norms its tokens,
        the norm weights' gradients summed once) and colwise_gather_output on lm_head, around MLA and
        the MoE block with shared experts, at TP = 2 and 4."""
        path = os.path.join(WORK, "sp.json")
        with open(path, "w") as f:
            json.dump({"model.layers.*.input_layernorm": "sequence_parallel",
                       "model.layers.*.post_attention_layernorm": "sequence_parallel",
                       "model.norm": "sequence_parallel", "lm_head": "colwise_gather_output"}, f)
        model = make(*MODELS[1])
        base = engine_grads(model, "sp-1")
        for tp in (2, 4):
            g = engine_grads(model, f"sp-{tp}", "--tp", tp, "--tp-plan", path)
            m.check_grads(self, g, float(base["loss"]), {k: v for k, v in base.items() if k != "loss"},
                          f"sequence_parallel tp={tp}", "TP = 1")


class Train(unittest.TestCase):
    def test_adamw_steps(self):
        for name, arch, sets in (MODELS[1], MODELS[3]):
            model = make(name, arch, sets)
            log, want = tref.reference_train(model, m.data_for(WORK, model), **ADAMW)
            w0 = gref.load_weights(model)
            moved = [k for k in want if not k.endswith("e_score_correction_bias")]
            self.assertGreater(min(rel(want[k], w0[k]) for k in moved), 10 * TOL, f"{name}: a tensor hardly moves")
            base = None
            for tp, ep in ((1, ()), (2, ()), (2, ("--ep",))):
                out = os.path.join(WORK, f"train-{name}-{tp}-{len(ep)}")
                # --check-replicas: the replicated parameters (kv_a_proj_with_mqa, the latent norms, routers,
                # V3's whole attention) stay bitwise identical on every rank after each step
                got_log = m.train(WORK, model, out, ADAMW, "--tp", tp, *ep, *(["--check-replicas"] if tp > 1 else []))
                case = f"{name} tp={tp} {ep}"
                got = m.check_trained(self, case, out, got_log, log, want, base)
                for k in got:   # it only chooses: never trained
                    if k.endswith("e_score_correction_bias"):
                        self.assertTrue(np.array_equal(got[k], w0[k]), f"{case}: {k} moved")
                base = got if base is None else base
            # the trained, saved model reloads: its logits are the reference's on the saved files
            saved = os.path.join(WORK, f"train-{name}-1-0")
            m.check_reload(self, WORK, saved, dref.DeepseekReference(saved).forward(TOKENS),
                           ((1, ()), (2, ()), (2, ("--ep",))))

    def test_gradient_checkpointing(self):
        """Each layer recomputed in the backward (MLA, the routed and the shared experts): the same bits."""
        model = make(*MODELS[1])
        opts = dict(ADAMW, steps=2)
        for extra in ((), ("--tp", 2)):
            a, b = os.path.join(WORK, f"gc-off-{len(extra)}"), os.path.join(WORK, f"gc-on-{len(extra)}")
            m.train(WORK, model, a, opts, *extra)
            m.train(WORK, model, b, opts, "--gradient-checkpointing", *extra)
            self.assertEqual(file_bytes(os.path.join(a, "model.safetensors")),
                             file_bytes(os.path.join(b, "model.safetensors")), f"{extra}")

    def test_data_parallel(self):
        """--dp-replicate 2 and --dp-shard 2 (with TP 2 in EP mode inside) at half the per-replica
        batch take the TP = 1 steps."""
        model = make(*MODELS[3])
        opts = dict(ADAMW, steps=3)
        base_log = m.train(WORK, model, os.path.join(WORK, "dp-base"), opts)
        base = read(os.path.join(WORK, "dp-base", "model.safetensors"))
        m.check_data_parallel(self, WORK, model, opts, base_log, base)

    def test_save_is_the_checkpoint(self):
        """lr 0: nothing moves, so the saved file holds the source checkpoint's tensors under their
        per-expert and shared-expert names, the same bytes at every split."""
        opts = dict(ADAMW, lr=0.0, steps=1)
        for name, arch, sets in (MODELS[0], MODELS[3]):
            model = make(name, arch, sets)
            files = []
            for tp, ep in ((1, ()), (2, ()), (2, ("--ep",))):
                out = os.path.join(WORK, f"save-{name}-{tp}-{len(ep)}")
                m.train(WORK, model, out, opts, "--tp", tp, *ep)
                files.append(file_bytes(os.path.join(out, "model.safetensors")))
            m.check_same_bytes(self, files, f"{name}: TP = 2, EP = 2")
            got = m.check_saved_is_source(self, os.path.join(WORK, f"save-{name}-1-0"), model, name)
            self.assertTrue(any(".shared_experts." in k for k in got) or "groups" in name)


if __name__ == "__main__":
    unittest.main()
