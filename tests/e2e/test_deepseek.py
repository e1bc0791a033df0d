#!/usr/bin/python3
"""End-to-end: deepseek_v2 and deepseek_v3: multi-head latent attention,
dense MLPs before first_k_dense_replace and MoE blocks after (routed experts,
shared experts).

* Logits against the independent NumPy reference (tests/reference/
  hf_deepseek.py, from Transformers' DeepseekV2Attention /
  DeepseekV3Attention): <= 1e-5 relative, for a whole prompt and token by
  token through the KV cache; q_proj (q_lora_rank null) and the low-rank
  query; YaRN rope (attention factor on cos/sin, V3's softmax mscale);
  V3 with and without rope_interleave; a value head narrower and one wider
  than the query/key head.
* MoE blocks (the tiny presets: layer 0 dense, layer 1 8 experts top-2):
  V2 greedy and group_limited_greedy (every layer sparse, no shared
  experts, routed_scaling_factor 1.5), also where top_k reaches experts
  masked to 0 (their weight is 0, as Transformers takes it from the masked
  scores); V3's sigmoid router with
  e_score_correction_bias and group limits, with and without norm_topk_prob.
* TP 2, 3 and 4 (§7.7: q/q_b/kv_b colwise, kv_a_proj_with_mqa mla_kv_a_proj,
  o_proj rowwise; §7.8: deepseek_v3 replicates the attention) give the TP = 1
  logits, bitwise the same on every rank, and the same greedy tokens.
  EP 2 and 4 (§7.7's EP plan, shared by V3) give them too.
* Refusals: heads that do not divide, a plan splitting the latent or the
  shared experts' output.  (Training: test_deepseek_train.py.)

q/k paths are drawn with std 0.25 (--qk-std) so that attention is decisive,
routers with std 0.3 (--router-std) so that the top-k choices are."""

import json
import os
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
TOKENS = "1,5,9,42,7,3,11,200,17,99,4,8,300,12,6,77,31,64,128,250"
YARN_V2 = ('rope_scaling={"type": "yarn", "factor": 4, "original_max_position_embeddings": 512, '
           '"mscale": 0.707, "mscale_all_dim": 0.707, "beta_fast": 32, "beta_slow": 1}')
YARN_V3 = ('rope_scaling={"type": "yarn", "factor": 4, "original_max_position_embeddings": 512, '
           '"mscale": 1.0, "mscale_all_dim": 0.8}')
WORK = None


setUpModule, tearDownModule = m.scratch_dir(globals(), "tp-e2e-deepseek-")


def make(name, arch, *extra):
    return m.make_tiny(WORK, name, arch, *extra)


def logits(model, tp=1, *extra):
    return tp_logits(WORK, model, tp, *extra, tokens=TOKENS)


def reference(model):
    return m.reference_logits(model, TOKENS)


DENSE = ("--set", "first_k_dense_replace=2")
V2_GROUPS = ("--set", "first_k_dense_replace=0", "--set", "n_shared_experts=null", "--set", "n_group=4",
             "--set", "topk_group=2", "--set", "topk_method=group_limited_greedy", "--set", "routed_scaling_factor=1.5")


def models():
    """Dense models of both types, and the MoE ones."""
    return [make("v2", "deepseek_v2", *DENSE), make("v3-yarn", "deepseek_v3", "--set", YARN_V3, *DENSE)]


def moe_models():
    return [make("v2-moe", "deepseek_v2"), make("v3-moe", "deepseek_v3", "--set", YARN_V3),
            make("v2-groups", "deepseek_v2", *V2_GROUPS)]


class Reference(unittest.TestCase):
    def check(self, model):
        m.check_reference(self, WORK, model, TOKENS, reference(model))

    def test_deepseek_v2(self):
        self.check(make("v2", "deepseek_v2", *DENSE))
        self.check(make("v2-yarn", "deepseek_v2", "--set", YARN_V2, *DENSE))
        # the low-rank query, and a value head wider than the query/key head
        self.check(make("v2-qlora", "deepseek_v2", "--set", "q_lora_rank=24", "--set", "v_head_dim=30", *DENSE))

    def test_deepseek_v3(self):
        self.check(make("v3", "deepseek_v3", *DENSE))
        self.check(make("v3-yarn", "deepseek_v3", "--set", YARN_V3, *DENSE))
        # the config's factor (3) differs from max_position_embeddings / original (4): Transformers' frequencies
        # and attention factor take the ratio, V3's softmax mscale the factor
        self.check(make("v3-ratio", "deepseek_v3", "--set", YARN_V3.replace('"factor": 4', '"factor": 3'), *DENSE))
        self.check(make("v3-halves", "deepseek_v3", "--set", YARN_V3, "--set", "rope_interleave=false",
                        "--set", "q_lora_rank=null", *DENSE))

    def test_moe_blocks(self):
        for model in moe_models():
            self.check(model)
        self.check(make("v3-moe-nonorm", "deepseek_v3", "--set", "norm_topk_prob=false", "--set", "num_experts_per_tok=3"))

    def test_group_limited_masked_picks(self):
        """group_limited_greedy where the kept groups hold fewer probabilities
        above 0 than top_k: router logits ~500 below the best underflow to 0
        in Transformers' f32 softmax, so torch.topk(tmp_scores) also picks
        experts masked to 0 — at weight 0, from tmp_scores.  The router is set
        so that every token's logits are about (-3, -500, 0, -500, -1, -500,
        -500, -500) (a large first embedding column that the norm turns into a
        constant, the router reading only it): the kept groups 1 and 2 hold two
        live experts, the third pick weighs 0; expert 0 (masked, probability
        ~0.04) weighing its probability is 9e-5 off.  TP 2 and EP 2 agree."""
        model = make("v2-masked-picks", "deepseek_v2", *V2_GROUPS, "--set", "num_experts_per_tok=3",
                     "--set", "num_hidden_layers=1")
        path = os.path.join(model, "model.safetensors")
        t = ref.read_safetensors(path, np.float32)
        emb = t["model.embed_tokens.weight"]
        emb[:, 0] += 50 * np.abs(emb).max()
        gate = t["model.layers.0.mlp.gate.weight"]
        gate[:] = 0
        gate[:, 0] = np.array([-3, -500, 0, -500, -1, -500, -500, -500], np.float32) / np.sqrt(gate.shape[1])
        ref.write_safetensors(path, t, metadata={"format": "pt"})
        want = reference(model)
        self.check(model)
        for extra in ((2,), (2, "--ep")):
            self.assertLessEqual(rel(logits(model, *extra), want), TOL, f"{model} {extra}")

    def test_bf16_weights(self):
        model = make("v2-bf16", "deepseek_v2", "--dtype", "bf16")   # layer 1 sparse
        self.assertLessEqual(rel(logits(model), reference(model)), TOL)

    def test_rope_and_scale_matter(self):
        """The YaRN model's logits differ from the plain one's (same weights):
        the factor reaches the frequencies, cos/sin and the softmax scale."""
        plain, yarn = make("v3", "deepseek_v3", *DENSE), make("v3-yarn", "deepseek_v3", "--set", YARN_V3, *DENSE)
        self.assertGreater(rel(logits(yarn), logits(plain)), 1e-3)


class Parallel(unittest.TestCase):
    def test_tp_equals_tp1(self):
        for model in models() + moe_models():
            base = logits(model)
            for tp in (2, 4):
                self.assertLessEqual(rel(logits(model, tp), base), TOL, f"{model} TP={tp}")

    def test_long_prompt(self):
        """80 tokens: under TP the residual add and norm run inside o_proj's reduction (fused norm)."""
        toks = ",".join(str((i * 7) % 500) for i in range(80))
        for model in (make("v2", "deepseek_v2", *DENSE), make("v2-moe", "deepseek_v2")):
            want = ref.reference_logits(model, [int(t) for t in toks.split(",")])
            for tp in (1, 2):
                got = tp_logits(WORK, model, tp, tokens=toks)
                self.assertLessEqual(rel(got, want), TOL, f"{model} TP={tp}")

    def test_tp3(self):
        # 6 heads and a vocabulary of 510 so that 3 divides them; the experts' widths split unevenly
        model = make("v2-tp3", "deepseek_v2", "--set", "num_attention_heads=6", "--set", "num_key_value_heads=6",
                     "--set", "vocab_size=510")
        self.assertLessEqual(rel(logits(model, 3), logits(model)), TOL)

    def test_ep_equals_tp1(self):
        for model in moe_models():
            base = logits(model)
            for ep in (2, 4):
                self.assertLessEqual(rel(logits(model, ep, "--ep"), base), TOL, f"{model} EP={ep}")

    def test_plans(self):
        v2 = json.loads(run("plan", "--model", make("v2", "deepseek_v2", *DENSE), "--tp", 2, "--json").stdout)
        v3 = json.loads(run("plan", "--model", make("v3-yarn", "deepseek_v3", "--set", YARN_V3, *DENSE), "--tp", 2,
                            "--json").stdout)
        text = json.dumps(v2)
        self.assertIn("mla_kv_a_proj", text)
        self.assertNotIn("mla_kv_a_proj", json.dumps(v3))
        self.assertLess(v2["bytes_per_rank"][0], v3["bytes_per_rank"][0])   # v3's attention is whole on each rank

    def test_v3_user_plan_shards_mla(self):
        """§7.8: a user plan may add the four MLA rules to deepseek_v3."""
        path = os.path.join(WORK, "v3-mla.json")
        with open(path, "w") as f:
            json.dump({"model.layers.*.self_attn.q_b_proj": "colwise",
                       "model.layers.*.self_attn.kv_a_proj_with_mqa": "mla_kv_a_proj",
                       "model.layers.*.self_attn.kv_b_proj": "colwise",
                       "model.layers.*.self_attn.o_proj": "rowwise",
                       "model.layers.*.mlp.shared_experts.gate_proj": "colwise",
                       "model.layers.*.mlp.shared_experts.up_proj": "colwise",
                       "model.layers.*.mlp.shared_experts.down_proj": "rowwise"}, f)
        model = make("v3-moe", "deepseek_v3", "--set", YARN_V3)
        self.assertLessEqual(rel(logits(model, 2, "--tp-plan", path), logits(model)), TOL)

    def test_greedy_tokens_identical(self):
        for model in models() + moe_models()[:2]:
            want = generate(model)
            self.assertEqual(len(want), 24)
            for extra in ((2,), (4,)) + (((2, "--ep"), (4, "--ep")) if "moe" in model else ()):
                self.assertEqual(generate(model, *extra), want, f"{model} {extra}")


class Messages(unittest.TestCase):
    def test_heads_do_not_divide(self):
        err = fails("logits", "--model", make("v2", "deepseek_v2", *DENSE), "--tokens", "1", "--out",
                    os.path.join(WORK, "e.npy"), "--tp", 3)
        self.assertIn("`num_attention_heads` must be divisible by `tp_size`", err)

    def test_latent_must_stay_whole(self):
        path = os.path.join(WORK, "split-latent.json")
        with open(path, "w") as f:
            json.dump({"model.layers.*.self_attn.kv_a_proj_with_mqa": "colwise"}, f)
        err = fails("plan", "--model", make("v2", "deepseek_v2", *DENSE), "--tp", 2, "--tp-plan", path)
        self.assertIn("needs the latent whole on every rank", err)

    def test_shared_experts_output_must_be_whole(self):
        path = os.path.join(WORK, "split-shared.json")
        with open(path, "w") as f:
            json.dump({"model.layers.*.mlp.shared_experts.gate_proj": "colwise",
                       "model.layers.*.mlp.shared_experts.up_proj": "colwise"}, f)
        err = fails("plan", "--model", make("v2-moe", "deepseek_v2"), "--tp", 2, "--tp-plan", path)
        self.assertIn("shared_experts.down_proj", err)

    def test_group_limits_checked(self):
        err = fails("make-model", "--arch", "deepseek_v3", "--preset", "tiny", "--set", "n_group=3",
                    "--out", os.path.join(WORK, "bad-groups"))
        self.assertIn("n_group dividing n_routed_experts", err)


if __name__ == "__main__":
    unittest.main()
