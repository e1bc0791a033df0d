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
from tpe2e import read_log, rel, run, tp_logits, vocab_size, write_token_rows  # noqa: E402
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


SEQ_LEN = 16
TRAIN = dict(seq_len=SEQ_LEN, batch_size=2, grad_accum=2, steps=5, optim="adamw", lr=2e-3, lr_scheduler="linear",
             warmup_steps=1, weight_decay=0.1, max_grad_norm=0.5)
FLAGS = dict(seq_len="--seq-len", batch_size="--batch-size", grad_accum="--grad-accum", steps="--steps",
             optim="--optim", lr="--lr", lr_scheduler="--lr-scheduler", warmup_steps="--warmup-steps",
             weight_decay="--weight-decay", max_grad_norm="--max-grad-norm")


def make_data(model, lines=24, seed=0):
    rng = np.random.default_rng(seed)
    return write_token_rows(os.path.join(WORK, f"data-{seed}.jsonl"), rng, lines, vocab_size(model),
                            lambda i: int(rng.integers(3, SEQ_LEN + 5)))


def train(model, data, out, tp, opts, *extra):
    args = ["train", "--model", model, "--data", data, "--out", out, "--tp", tp, "--threads", 1, "--no-shuffle",
            "--seed", 0, *extra]
    for k, v in opts.items():
        args += [FLAGS[k], v]
    run(*args)
    log = read_log(out)
    return log, peft.ref.read_safetensors(os.path.join(out, "adapter_model.safetensors"))


def adapter_bytes(d):
    with open(os.path.join(d, "adapter_model.safetensors"), "rb") as f:
        return f.read()


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
            for g, w in zip(got_log, log):
                self.assertLess(abs(g["loss"] - w["loss"]) / w["loss"], 1e-5, f"TP={tp} step {w['step']}")
                self.assertLess(abs(g["grad_norm"] - w["grad_norm"]) / w["grad_norm"], 1e-4, f"TP={tp}")
            self.assertEqual(set(got), set(want))
            for k in want:
                self.assertLess(rel(got[k], want[k]), 1e-4, f"TP={tp} {k}")

    def test_grads_tp2_equal_tp1(self):
        """One SGD step without clipping: the adapter moves by -lr times its gradient, gathered
        whole by the save; TP = 2's equals TP = 1's.  lr 1e3 makes the step dwarf the start
        values, so the f32 subtraction below does not round the gradient away."""
        model = make("qwen3-base", "qwen3")
        data = make_data(model)
        start = os.path.join(WORK, "grad-start")
        peft.write_adapter(start, model, targets=list(peft.PROJ), r=4, alpha=8, seed=12)
        a0 = peft.ref.read_safetensors(os.path.join(start, "adapter_model.safetensors"))
        sgd = dict(seq_len=SEQ_LEN, batch_size=4, steps=1, optim="sgd", lr=1e3, lr_scheduler="constant",
                   max_grad_norm=0)
        grads = {}
        for tp in (1, 2):
            _, got = train(model, data, os.path.join(WORK, f"grad-tp{tp}"), tp, sgd, "--adapter", start)
            grads[tp] = {k: (a0[k] - got[k]) / 1e3 for k in a0}
        for k in a0:
            self.assertGreater(np.abs(grads[1][k]).max(), 0, k)
            self.assertLess(rel(grads[2][k], grads[1][k]), 1e-5, k)

    def test_init_is_peft_and_independent_of_tp(self):
        model = make("qwen3-base", "qwen3")
        data = make_data(model)
        frozen = dict(seq_len=SEQ_LEN, batch_size=2, steps=1, lr=0.0)
        saved = {}
        for tp in (1, 2):
            out = os.path.join(WORK, f"init-tp{tp}")
            train(model, data, out, tp, frozen, "--lora-r", 8, "--lora-alpha", 16, "--lora-target", "q_proj,o_proj")
            saved[tp] = adapter_bytes(out)
        self.assertEqual(saved[1], saved[2])
        t = peft.ref.read_safetensors(os.path.join(WORK, "init-tp1", "adapter_model.safetensors"))
        self.assertEqual(len(t), 8)   # 2 layers x 2 modules x (A, B)
        for k, v in t.items():
            if ".lora_B." in k:
                self.assertFalse(v.any(), k)
            else:
                bound = 1 / np.sqrt(v.shape[1])   # kaiming_uniform_(a=sqrt(5)): U(-1/sqrt(in), 1/sqrt(in))
                self.assertLessEqual(np.abs(v).max(), bound)
                self.assertGreater(np.abs(v).max(), 0.9 * bound)
                self.assertEqual(v.shape[0], 8)
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
        self.train_refused("training LoRA on lm_head is not supported yet", "--lora-r", 4, "--lora-target", "lm_head")
        self.train_refused("training LoRA on an embedding is not supported yet", "--lora-r", 4,
                           "--lora-target", "embed_tokens")
        self.train_refused("Unsupported tensor parallel plan 'colwise_gather_output' for LoRA state dict sharding.",
                           "--lora-r", 4, "--lora-target", "lm_head", tp=2)
        self.train_refused("tp_size > num_key_value_heads", "--lora-r", 4, "--lora-target", "k_proj", tp=4)

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
