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
import lora_e2e  # noqa: E402
from lora_e2e import SEQ_LEN, TRAIN, adapter_bytes, train  # noqa: E402

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

    def test_lm_head(self):
        # colwise_gather_output: lora_B split like the head's rows, the gather carries the term
        self.check("llama", tps=(1, 2, 4), targets=["lm_head", "q_proj"], r=4, alpha=8)

    def test_lm_head_tied(self):
        # PEFT puts a Linear adapter on the tied head itself: the lookup keeps the base table
        model = make("qwen3-tied", "qwen3", "--set", "tie_word_embeddings=true")
        adapter = os.path.join(WORK, "head-tied")
        peft.write_adapter(adapter, model, targets=["lm_head", "embed_tokens"], r=4, alpha=8, seed=4)
        want = peft.reference_logits(model, adapter, TOKENS)
        self.assertGreater(rel(logits(model, 1), want), 100 * TOL)
        for tp in (1, 2, 4):
            self.assertLess(rel(logits(model, tp, "--adapter", adapter), want), TOL, f"tied head TP={tp}")

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


def make_data(model, lines=24, seed=0):
    return lora_e2e.make_data(WORK, model, lines, seed)


def same_run(test, tp, got_log, got, log, want):
    """A TP = tp training run's log and adapter against the reference's."""
    for g, w in zip(got_log, log):
        test.assertLess(abs(g["loss"] - w["loss"]) / w["loss"], 1e-5, f"TP={tp} step {w['step']}")
        test.assertLess(abs(g["grad_norm"] - w["grad_norm"]) / w["grad_norm"], 1e-4, f"TP={tp}")
    test.assertEqual(set(got), set(want))
    for k in want:
        test.assertLess(rel(got[k], want[k]), 1e-4, f"TP={tp} {k}")


def init_tp1_tp2(test, model, data, name, *flags):
    """New adapters after one step at lr 0, at TP = 1 and TP = 2 into
    WORK/NAME-tp1 and -tp2, whose files must be the same bytes: the TP = 1
    adapter's tensors."""
    saved = {}
    for tp in (1, 2):
        out = os.path.join(WORK, f"{name}-tp{tp}")
        train(model, data, out, tp, dict(seq_len=SEQ_LEN, batch_size=2, steps=1, lr=0.0), *flags)
        saved[tp] = adapter_bytes(out)
    test.assertEqual(saved[1], saved[2])
    return peft.ref.read_safetensors(os.path.join(WORK, f"{name}-tp1", "adapter_model.safetensors"))


class LoraTraining(unittest.TestCase):
    def test_five_steps_match_the_reference(self):
        model = make("qwen3-base", "qwen3")
        data = make_data(model)
        start = os.path.join(WORK, "train-start")
        peft.write_adapter(start, model, targets=list(peft.PROJ), r=4, alpha=8, seed=11, b_std=0.02)
        log, want = peft.lora_reference_train(model, start, data, **TRAIN)
        first = peft.ref.read_safetensors(os.path.join(start, "adapter_model.safetensors"))
        self.assertGreater(min(rel(want[k], first[k]) for k in want), 1e-3, "every adapter tensor moves")
        for tp in (1, 2):
            got_log, got = train(model, data, os.path.join(WORK, f"train-tp{tp}"), tp, TRAIN, "--adapter", start)
            self.assertEqual(len(got_log), len(log))
            same_run(self, tp, got_log, got, log, want)

    def five_steps(self, model, targets, tps, seed, *extra_runs):
        """5 AdamW steps from a PEFT-layout adapter on `targets`: loss, grad norm
        and every adapter tensor equal the torch reference at each TP size
        (extra_runs: (tp, flags...) tuples run and checked the same way)."""
        data = make_data(model)
        start = os.path.join(WORK, f"steps-{seed}")
        peft.write_adapter(start, model, targets=targets, r=4, alpha=8, seed=seed, b_std=0.02)
        log, want = peft.lora_reference_train(model, start, data, **TRAIN)
        first = peft.ref.read_safetensors(os.path.join(start, "adapter_model.safetensors"))
        self.assertGreater(min(rel(want[k], first[k]) for k in want), 1e-3, "every adapter tensor moves")
        for tp, *flags in [(tp,) for tp in tps] + list(extra_runs):
            what = f"TP={tp} {' '.join(map(str, flags))}"
            got_log, got = train(model, data, os.path.join(WORK, f"steps-{seed}-tp{tp}"), tp, TRAIN, "--adapter",
                                 start, *flags)
            self.assertEqual(len(got_log), len(log))
            for g, w in zip(got_log, log):
                self.assertLess(abs(g["loss"] - w["loss"]) / w["loss"], 1e-5, f"{what} step {w['step']}")
                self.assertLess(abs(g["grad_norm"] - w["grad_norm"]) / w["grad_norm"], 1e-4, what)
            self.assertEqual(set(got), set(want))
            for k in want:
                self.assertLess(rel(got[k], want[k]), 1e-4, f"{what} {k}")

    def test_embedding_and_head_tied(self):
        # tied qwen3: embed_tokens embedding_rowwise, lm_head a Linear adapter of its own on the tied head
        model = make("qwen3-tied", "qwen3", "--set", "tie_word_embeddings=true")
        self.five_steps(model, ["embed_tokens", "lm_head", "q_proj"], (1, 2, 4), 21, (2, "--loss", "vocab-parallel"))

    def test_embedding_and_head_untied(self):
        # llama: embed_tokens replicated, lm_head colwise_gather_output
        self.five_steps(make("llama-base", "llama"), ["embed_tokens", "lm_head", "o_proj"], (1, 2), 22)

    def test_kv_replicated(self):
        # tiny qwen3 has 2 KV heads: at TP = 4 each is held by 2 ranks
        self.five_steps(make("qwen3-base", "qwen3"), ["k_proj", "v_proj", "q_proj"], (1, 4), 23,
                        (4, "--check-replicas"))

    def test_grads_tp2_equal_tp1(self):
        """One SGD step without clipping: the adapter moves by -lr times its gradient, gathered
        whole by the save; TP = 2's and TP = 4's equal TP = 1's.  lr 1e3 makes the step dwarf the start
        values, so the f32 subtraction below does not round the gradient away."""
        cases = (("qwen3-base", (), list(peft.PROJ), (2, 4)),
                 # embedding_rowwise embed_tokens and the tied head's own adapter
                 ("qwen3-tied", ("--set", "tie_word_embeddings=true"), ["embed_tokens", "lm_head", "v_proj"], (2, 4)))
        sgd = dict(seq_len=SEQ_LEN, batch_size=4, steps=1, optim="sgd", lr=1e3, lr_scheduler="constant",
                   max_grad_norm=0)
        for i, (name, mk, targets, tps) in enumerate(cases):
            model = make(name, "qwen3", *mk)
            data = make_data(model)
            start = os.path.join(WORK, f"grad-start-{i}")
            peft.write_adapter(start, model, targets=targets, r=4, alpha=8, seed=12)
            a0 = peft.ref.read_safetensors(os.path.join(start, "adapter_model.safetensors"))
            grads = {}
            for tp in (1,) + tps:
                _, got = train(model, data, os.path.join(WORK, f"grad-{i}-tp{tp}"), tp, sgd, "--adapter", start)
                grads[tp] = {k: (a0[k] - got[k]) / 1e3 for k in a0}
            for k in a0:
                self.assertGreater(np.abs(grads[1][k]).max(), 0, k)
                for tp in tps:   # TP = 4: k/v heads replicated over 2 ranks each
                    self.assertLess(rel(grads[tp][k], grads[1][k]), 1e-5, f"TP={tp} {k}")

    def test_init_is_peft_and_independent_of_tp(self):
        model = make("qwen3-base", "qwen3")
        data = make_data(model)
        t = init_tp1_tp2(self, model, data, "init", "--lora-r", 8, "--lora-alpha", 16, "--lora-target", "q_proj,o_proj")
        self.assertEqual(len(t), 8)   # 2 layers x 2 modules x (A, B)
        for k, v in t.items():
            if ".lora_B." in k:
                self.assertFalse(v.any(), k)
            else:
                bound = 1 / np.sqrt(v.shape[1])   # kaiming_uniform_(a=sqrt(5)): U(-1/sqrt(in), 1/sqrt(in))
                self.assertLessEqual(np.abs(v).max(), bound)
                self.assertGreater(np.abs(v).max(), 0.9 * bound)
                self.assertEqual(v.shape[0], 8)
        # PEFT's Embedding init: lora_embedding_A zeros, lora_embedding_B N(0, 1); the lm_head
        # Linear as any Linear; the same bytes at every TP size
        model_t = make("qwen3-tied", "qwen3", "--set", "tie_word_embeddings=true")
        e = init_tp1_tp2(self, model_t, data, "init-emb", "--lora-r", 8, "--lora-target", "embed_tokens,lm_head")
        self.assertEqual(sorted(e), ["base_model.model.lm_head.lora_A.weight", "base_model.model.lm_head.lora_B.weight",
                                     "base_model.model.model.embed_tokens.lora_embedding_A",
                                     "base_model.model.model.embed_tokens.lora_embedding_B"])
        ea, eb = (e["base_model.model.model.embed_tokens.lora_embedding_" + x] for x in "AB")
        self.assertEqual((ea.shape, eb.shape), ((8, 512), (64, 8)))
        self.assertFalse(ea.any())
        self.assertLess(abs(eb.mean()), 0.15)
        self.assertLess(abs(eb.std() - 1), 0.15)
        self.assertFalse(e["base_model.model.lm_head.lora_B.weight"].any())
        self.assertEqual(e["base_model.model.lm_head.lora_A.weight"].shape, (8, 64))
        with open(os.path.join(WORK, "init-tp1", "adapter_config.json")) as f:
            cfg = json.load(f)
        self.assertEqual((cfg["r"], cfg["lora_alpha"], cfg["peft_type"]), (8, 16, "LORA"))
        self.assertEqual(cfg["target_modules"], ["q_proj", "o_proj"])

    def test_save_load_round_trip(self):
        model = make("qwen3-base", "qwen3")
        data = make_data(model)
        start = os.path.join(WORK, "rt-start")
        peft.write_adapter(start, model, targets=["v_proj", "down_proj"], r=2, alpha=4, seed=13)
        out = os.path.join(WORK, "rt-out")
        train(model, data, out, 2, dict(seq_len=SEQ_LEN, batch_size=2, steps=1, lr=0.0), "--adapter", start)
        self.assertEqual(adapter_bytes(out), adapter_bytes(start))
        self.assertLess(rel(logits(model, 2, "--adapter", out), logits(model, 1, "--adapter", start)), TOL)


class LoraModulesToSave(unittest.TestCase):
    """PEFT's modules_to_save: the module's trained copy, saved whole under
    base_model.model.<module>.weight, replaces the base module."""

    def test_logits(self):
        model = make("llama-base", "llama")
        adapter = os.path.join(WORK, "mts-logits")
        peft.write_adapter(adapter, model, targets=["q_proj"], modules_to_save=["lm_head", "embed_tokens"], seed=31)
        want = peft.reference_logits(model, adapter, TOKENS)
        self.assertGreater(rel(logits(model, 1), want), 100 * TOL)
        for tp in (1, 2, 4):
            got = logits(model, tp, "--adapter", adapter)
            self.assertLess(rel(got, want), TOL, f"TP={tp}")
            self.assertLess(rel(logits(model, tp, "--adapter", adapter, "--merge-adapter"), got), TOL)

    def test_five_steps(self):
        # lm_head colwise_gather_output (a vocabulary shard each), o_proj rowwise, k_proj's head replicated
        # at TP 4, embed_tokens replicated (untied qwen3's plan leaves it whole)
        model = make("qwen3-base", "qwen3")
        data = make_data(model)
        start = os.path.join(WORK, "mts-start")
        peft.write_adapter(start, model, targets=["q_proj"],
                           modules_to_save=["lm_head", "o_proj", "k_proj", "embed_tokens"], r=4, alpha=8, seed=32,
                           b_std=0.02, save_std=0.02)
        log, want = peft.lora_reference_train(model, start, data, **TRAIN)
        first = peft.ref.read_safetensors(os.path.join(start, "adapter_model.safetensors"))
        self.assertIn("base_model.model.lm_head.weight", want)
        self.assertGreater(min(rel(want[k], first[k]) for k in want), 1e-4, "every tensor moves")
        for tp in (1, 2, 4):
            got_log, got = train(model, data, os.path.join(WORK, f"mts-tp{tp}"), tp, TRAIN, "--adapter", start)
            same_run(self, tp, got_log, got, log, want)

    def test_train_flag_and_round_trip(self):
        model = make("qwen3-base", "qwen3")
        data = make_data(model)
        t = init_tp1_tp2(self, model, data, "mts-flag", "--lora-r", 2, "--lora-target", "v_proj",
                         "--lora-modules-to-save", "lm_head")
        out = os.path.join(WORK, "mts-flag-tp1")
        base = peft.ref.load_model_tensors(model)
        # lr 0: the copy is the base module as it was
        self.assertTrue(np.array_equal(t["base_model.model.lm_head.weight"], base["lm_head.weight"]))
        with open(os.path.join(out, "adapter_config.json")) as f:
            self.assertEqual(json.load(f)["modules_to_save"], ["lm_head"])
        # trained: the saved copy is what inference uses, at any TP size
        out2 = os.path.join(WORK, "mts-flag-trained")
        train(model, data, out2, 2, dict(seq_len=SEQ_LEN, batch_size=2, steps=2, lr=1e-2), "--lora-r", 2,
              "--lora-target", "v_proj", "--lora-modules-to-save", "lm_head")
        t2 = peft.ref.read_safetensors(os.path.join(out2, "adapter_model.safetensors"))
        self.assertGreater(rel(t2["base_model.model.lm_head.weight"], base["lm_head.weight"]), 1e-4)
        want = peft.reference_logits(model, out2, TOKENS)
        for tp in (1, 4):
            self.assertLess(rel(logits(model, tp, "--adapter", out2), want), TOL, f"TP={tp}")

    def test_refusals(self):
        tied = make("qwen3-tied", "qwen3", "--set", "tie_word_embeddings=true")
        cases = ((tied, {"modules_to_save": ["lm_head"]}, "shares its weight with the tied embed_tokens"),
                 (make("qwen2-base", "qwen2"), {"targets": ["q_proj"], "modules_to_save": ["k_proj"]},
                  "k_proj has a bias"),
                 (make("qwen3-base", "qwen3"), {"targets": ["q_proj"], "modules_to_save": ["q_proj"]},
                  "is a LoRA target as well"),
                 (make("qwen3-base", "qwen3"), {"targets": ["q_proj"], "modules_to_save": ["nothing"]},
                  "modules_to_save ['nothing'] matches no module"),
                 (make("qwen3-base", "qwen3"), {"targets": ["q_proj"], "modules_to_save": ["input_layernorm"]},
                  "input_layernorm is not a Linear or an Embedding"),
                 (make("qwen3-base", "qwen3"), {"targets": ["q_proj"], "extra_config": {"modules_to_save": "lm_head"}},
                  "modules_to_save must be a list of names"))
        for i, (model, kw, needle) in enumerate(cases):
            with self.subTest(needle=needle):
                adapter = os.path.join(WORK, f"mts-refused-{i}")
                peft.write_adapter(adapter, model, **kw)
                p = run("logits", "--model", model, "--tokens", "1,2", "--out", os.path.join(WORK, "x.npy"),
                        "--adapter", adapter, check=False)
                self.assertNotEqual(p.returncode, 0)
                self.assertIn(needle, p.stderr)
        model = make("qwen3-base", "qwen3")
        p = run("train", "--model", model, "--data", make_data(model), "--out", os.path.join(WORK, "mts-bf16"),
                "--seq-len", SEQ_LEN, "--steps", 1, "--dtype", "bf16", "--lora-r", 2, "--lora-modules-to-save",
                "lm_head", check=False)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("training it needs f32 weights", p.stderr)


class LoraBias(unittest.TestCase):
    """PEFT's bias "all" / "lora_only": the base biases (qwen2's q/k/v) train
    with the adapter and are saved with it."""

    def test_logits(self):
        model = make("qwen2-base", "qwen2")
        for bias, targets in (("all", ["q_proj", "o_proj"]), ("lora_only", ["k_proj", "up_proj"])):
            adapter = os.path.join(WORK, f"bias-{bias}")
            peft.write_adapter(adapter, model, targets=targets, bias=bias, seed=41, save_std=0.2)
            keys = peft.ref.read_safetensors(os.path.join(adapter, "adapter_model.safetensors"))
            self.assertEqual(sum(k.endswith("bias") for k in keys), 6 if bias == "all" else 2)
            want = peft.reference_logits(model, adapter, TOKENS)
            for tp in (1, 2, 4):   # TP 4: k/v heads (and their biases) replicated over 2 ranks
                got = logits(model, tp, "--adapter", adapter)
                self.assertLess(rel(got, want), TOL, f"{bias} TP={tp}")
                self.assertLess(rel(logits(model, tp, "--adapter", adapter, "--merge-adapter"), got), TOL)
            # the saved biases matter: without them the logits differ
            no_bias = os.path.join(WORK, f"bias-{bias}-none")
            peft.write_adapter(no_bias, model, targets=targets, seed=41)
            self.assertGreater(rel(peft.reference_logits(model, no_bias, TOKENS), want), 100 * TOL)

    def test_five_steps(self):
        model = make("qwen2-base", "qwen2")
        data = make_data(model)
        for bias, targets, tps in (("all", ["q_proj"], (1, 2, 4)), ("lora_only", ["q_proj", "v_proj"], (1, 4))):
            start = os.path.join(WORK, f"bias-start-{bias}")
            peft.write_adapter(start, model, targets=targets, bias=bias, r=4, alpha=8, seed=42, b_std=0.02,
                               save_std=0.02)
            log, want = peft.lora_reference_train(model, start, data, **TRAIN)
            first = peft.ref.read_safetensors(os.path.join(start, "adapter_model.safetensors"))
            self.assertTrue(any(k.endswith("bias") for k in want))
            self.assertGreater(min(rel(want[k], first[k]) for k in want), 1e-4, "every tensor moves")
            for tp in tps:
                got_log, got = train(model, data, os.path.join(WORK, f"bias-{bias}-tp{tp}"), tp, TRAIN, "--adapter",
                                     start)
                for g, w in zip(got_log, log):
                    self.assertLess(abs(g["loss"] - w["loss"]) / w["loss"], 1e-5, f"{bias} TP={tp} step {w['step']}")
                    self.assertLess(abs(g["grad_norm"] - w["grad_norm"]) / w["grad_norm"], 1e-4, f"{bias} TP={tp}")
                self.assertEqual(set(got), set(want))
                for k in want:
                    # k's bias shifts all of a query's scores alike but for the rotation: softmax cancels
                    # most of its gradient, and f32's rounding of what is left, normalised by Adam, is
                    # 4e-5..1e-4 at TP = 1 already
                    tol = 1e-3 if k.endswith("k_proj.bias") else 1e-4
                    self.assertLess(rel(got[k], want[k]), tol, f"{bias} TP={tp} {k}")

    def test_train_flag(self):
        model = make("qwen2-base", "qwen2")
        data = make_data(model)
        t = init_tp1_tp2(self, model, data, "bias-flag", "--lora-r", 2, "--lora-target", "q_proj,o_proj",
                         "--lora-bias", "lora_only")
        base = peft.ref.load_model_tensors(model)
        biases = sorted(k for k in t if k.endswith("bias"))
        # o_proj has no bias: lora_only trains the two q_proj biases, under the base layer's key
        self.assertEqual(biases,
                         [f"base_model.model.model.layers.{i}.self_attn.q_proj.base_layer.bias" for i in (0, 1)])
        for k in biases:
            self.assertTrue(np.array_equal(t[k], base[k[len("base_model.model."):].replace(".base_layer.", ".")]))
        with open(os.path.join(WORK, "bias-flag-tp1", "adapter_config.json")) as f:
            self.assertEqual(json.load(f)["bias"], "lora_only")


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
        plan = os.path.join(WORK, "head-replicate.json")
        with open(plan, "w") as f:
            json.dump({"lm_head": "replicate"}, f)
        self.refused({"targets": ["lm_head"]}, 2,
                     "Unsupported tensor parallel plan 'replicate' for LoRA state dict sharding.", "--tp-plan", plan)

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

    def train_refused(self, needle, *extra, tp=1):
        model = make("qwen3-base", "qwen3")
        data = make_data(model)
        p = run("train", "--model", model, "--data", data, "--out", os.path.join(WORK, "refused-train"),
                "--seq-len", SEQ_LEN, "--steps", 1, "--tp", tp, *extra, check=False)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn(needle, p.stderr)

    def test_train_refusals(self):
        self.train_refused("it takes no --lora-* option", "--lora-r", 4, "--adapter", WORK)
        self.train_refused("need --lora-r", "--lora-target", "q_proj")
        self.train_refused("--lora-target matches no Linear", "--lora-r", 4, "--lora-target", "nothing")
        plan = os.path.join(WORK, "head-replicate.json")
        with open(plan, "w") as f:
            json.dump({"lm_head": "replicate"}, f)
        self.train_refused("Unsupported tensor parallel plan 'replicate' for LoRA state dict sharding.",
                           "--lora-r", 4, "--lora-target", "lm_head", "--tp-plan", plan, tp=2)

    def test_bias(self):
        self.refused({"extra_config": {"bias": "some"}}, 1,
                     "bias 'some'; it must be \"none\", \"all\" or \"lora_only\"")

    def test_dora(self):
        self.refused({"extra_config": {"use_dora": True}}, 1, "'use_dora' is set")

    def test_no_match(self):
        self.refused({"extra_config": {"target_modules": ["nothing_here"]}}, 1, "match no Linear")

    def test_merge_without_adapter(self):
        model = make("qwen3-base", "qwen3")
        p = run("logits", "--model", model, "--tokens", "1,2", "--out", os.path.join(WORK, "x.npy"),
                "--merge-adapter", check=False)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("--merge-adapter needs --adapter DIR", p.stderr)

    def test_garbage_adapter_files(self):
        """An adapter_config.json that is not JSON, or not PEFT's fields, and
        an adapter_model.safetensors that is noise or missing: each a clear
        error naming the file, non-zero exit."""
        model = make("qwen3-base", "qwen3")
        good = {"r": 4, "lora_alpha": 8, "target_modules": ["q_proj"], "peft_type": "LORA"}
        cases = (("{not json", None, "adapter_config.json"),
                 (json.dumps(dict(good, r="x")), None, "'r' must be a positive integer"),
                 (json.dumps(good), os.urandom(100), "adapter_model.safetensors"),
                 (json.dumps(good), b"", "adapter_model.safetensors"),
                 (json.dumps(good), None, "adapter_model.safetensors"))
        for i, (config, weights, needle) in enumerate(cases):
            with self.subTest(case=i):
                d = os.path.join(WORK, f"garbage-adapter-{i}")
                os.makedirs(d, exist_ok=True)
                with open(os.path.join(d, "adapter_config.json"), "w") as f:
                    f.write(config)
                if weights is not None:
                    with open(os.path.join(d, "adapter_model.safetensors"), "wb") as f:
                        f.write(weights)
                p = run("logits", "--model", model, "--tokens", "1,2", "--out", os.path.join(WORK, "x.npy"),
                        "--adapter", d, check=False)
                self.assertNotEqual(p.returncode, 0)
                self.assertIn(needle, p.stderr)
                self.assertIn("error", p.stderr)

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
