#!/usr/bin/python3
"""End-to-end: LoRA training beyond test_lora's basics (§9.3, §9.6): dropout
on the adapters' input, checkpoints and resume, data parallelism.

Dropout: the torch reference (tests/reference/peft_reference.py) computes
tensorpar's masks itself with the same counter-based hash of (seed, step,
dataset row, module name, element's global index), so 5 steps of both must
agree; TP = 2 must draw TP = 1's masks (gradients equal within 1e-5)."""

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
import lora_e2e  # noqa: E402
from lora_e2e import SEQ_LEN, TRAIN, adapter_bytes, train, train_args  # noqa: E402

TOL = 1e-5
WORK = None


def setUpModule():
    global WORK
    WORK = tempfile.mkdtemp(prefix="tp-e2e-lora-train-")


def tearDownModule():
    shutil.rmtree(WORK, ignore_errors=True)


def make(name="qwen3-base", arch="qwen3"):
    d = os.path.join(WORK, name)
    if not os.path.exists(d):
        run("make-model", "--arch", arch, "--preset", "tiny", "--qk-std", "0.25", "--seed", "3", "--out", d)
    return d


def make_data(model, lines=24, seed=0):
    return lora_e2e.make_data(WORK, model, lines, seed)


class LoraDropout(unittest.TestCase):
    def test_five_steps_match_the_reference(self):
        """lora_dropout 0.1 from the resumed adapter's adapter_config.json."""
        model = make()
        data = make_data(model)
        start = os.path.join(WORK, "drop-start")
        peft.write_adapter(start, model, targets=list(peft.PROJ), r=4, alpha=8, seed=11, b_std=0.02,
                           extra_config={"lora_dropout": 0.1})
        log, want = peft.lora_reference_train(model, start, data, seed=0, **TRAIN)
        # the masks matter: without them the reference ends elsewhere
        nodrop = os.path.join(WORK, "drop-start-0")
        peft.write_adapter(nodrop, model, targets=list(peft.PROJ), r=4, alpha=8, seed=11, b_std=0.02)
        _, plain = peft.lora_reference_train(model, nodrop, data, seed=0, **TRAIN)
        self.assertGreater(max(rel(want[k], plain[k]) for k in want), 1e-3)
        for tp in (1, 2):
            got_log, got = train(model, data, os.path.join(WORK, f"drop-tp{tp}"), tp, TRAIN, "--adapter", start)
            self.assertEqual(len(got_log), len(log))
            for g, w in zip(got_log, log):
                self.assertLess(abs(g["loss"] - w["loss"]) / w["loss"], 1e-5, f"TP={tp} step {w['step']}")
                self.assertLess(abs(g["grad_norm"] - w["grad_norm"]) / w["grad_norm"], 1e-4, f"TP={tp}")
            for k in want:
                self.assertLess(rel(got[k], want[k]), 1e-4, f"TP={tp} {k}")
            with open(os.path.join(WORK, f"drop-tp{tp}", "adapter_config.json")) as f:
                self.assertEqual(json.load(f)["lora_dropout"], 0.1)

    def test_grads_tp2_equal_tp1(self):
        """One SGD step, no clipping, lr 1e3 (as test_lora's): the gradients of every adapter
        tensor at TP = 2 equal TP = 1's with --lora-dropout 0.1, and differ from p = 0's."""
        model = make()
        data = make_data(model)
        sgd = dict(seq_len=SEQ_LEN, batch_size=4, steps=1, optim="sgd", lr=1e3, lr_scheduler="constant",
                   max_grad_norm=0)
        start = os.path.join(WORK, "dgrad-start")
        peft.write_adapter(start, model, targets=list(peft.PROJ), r=4, alpha=8, seed=12,
                           extra_config={"lora_dropout": 0.1})
        a0 = peft.ref.read_safetensors(os.path.join(start, "adapter_model.safetensors"))
        grads = {}
        for tp in (1, 2):
            _, got = train(model, data, os.path.join(WORK, f"dgrad-tp{tp}"), tp, sgd, "--adapter", start)
            grads[tp] = {k: (a0[k] - got[k]) / 1e3 for k in a0}
        nodrop = os.path.join(WORK, "dgrad-start-0")
        peft.write_adapter(nodrop, model, targets=list(peft.PROJ), r=4, alpha=8, seed=12)
        _, got = train(model, data, os.path.join(WORK, "dgrad-p0"), 1, sgd, "--adapter", nodrop)
        for k in a0:
            self.assertGreater(np.abs(grads[1][k]).max(), 0, k)
            self.assertLess(rel(grads[2][k], grads[1][k]), TOL, k)
            self.assertGreater(rel((a0[k] - got[k]) / 1e3, grads[1][k]), 1e-3, k)

    def test_evaluation_and_inference_do_not_drop(self):
        """With lr 0 the weights never move: the training losses of p = 0.3 and p = 0 differ (the
        masks), their eval losses do not; logits with the adapter ignore lora_dropout."""
        model = make()
        data = make_data(model)
        logs = {}
        for p in (0.3, 0.0):
            start = os.path.join(WORK, f"noeval-{p}")
            peft.write_adapter(start, model, targets=list(peft.PROJ), r=4, alpha=8, seed=15, b_std=0.05,
                               extra_config={"lora_dropout": p})
            out = os.path.join(WORK, f"noeval-out-{p}")
            train(model, data, out, 2, dict(TRAIN, steps=2, lr=0.0), "--adapter", start,
                  "--eval-data", make_data(model, lines=3, seed=6), "--eval-every", 1)
            logs[p] = read_log(out)
            logs[p, "logits"] = tp_logits(WORK, model, 2, "--adapter", start, tokens="1,5,9,42,7,3")
        for a, b in zip(logs[0.3], logs[0.0]):
            self.assertNotEqual(a["loss"], b["loss"])
            self.assertEqual(a["eval_loss"], b["eval_loss"])
        self.assertTrue(np.array_equal(logs[0.3, "logits"], logs[0.0, "logits"]))

    def test_refusals(self):
        model = make()
        data = make_data(model)
        bad = os.path.join(WORK, "drop-bad")
        peft.write_adapter(bad, model, extra_config={"lora_dropout": 1.0})
        for extra, needle in ((("--adapter", bad), "lora_dropout must be in [0, 1), got 1"),
                              (("--lora-r", 4, "--lora-dropout", 1), "--lora-dropout must be in [0, 1)"),
                              (("--lora-r", 4, "--lora-dropout", -0.5), "--lora-dropout must be in [0, 1)")):
            p = run(*train_args(model, data, os.path.join(WORK, "drop-refused"), 1, dict(TRAIN, steps=1), *extra),
                    check=False)
            self.assertNotEqual(p.returncode, 0)
            self.assertIn(needle, p.stderr)

    def test_fresh_adapter_and_checkpointing(self):
        """--lora-dropout on a fresh adapter: TP = 2 equals TP = 1, and --gradient-checkpointing
        (the forward recomputed in the backward, the masks drawn again) is bitwise the same."""
        model = make()
        data = make_data(model)
        opts = dict(TRAIN, steps=3)
        lora = ("--lora-r", 4, "--lora-alpha", 8, "--lora-target", "q_proj,o_proj,down_proj", "--lora-dropout", 0.2)
        _, one = train(model, data, os.path.join(WORK, "fresh-tp1"), 1, opts, *lora)
        _, two = train(model, data, os.path.join(WORK, "fresh-tp2"), 2, opts, *lora)
        for k in one:
            self.assertLess(rel(two[k], one[k]), TOL, k)
        train(model, data, os.path.join(WORK, "fresh-tp2-gc"), 2, opts, *lora, "--gradient-checkpointing")
        self.assertEqual(adapter_bytes(os.path.join(WORK, "fresh-tp2-gc")), adapter_bytes(os.path.join(WORK, "fresh-tp2")))


LORA = ("--lora-r", 4, "--lora-alpha", 8, "--lora-target", "q_proj,v_proj,down_proj", "--lora-dropout", 0.1)


class LoraCheckpoints(unittest.TestCase):
    """--save-every/--save-total-limit/--resume with an adapter: the checkpoint holds the adapter
    (PEFT's files), the adapter tensors' optimizer state, schedule, seed and data position."""

    def run4(self):
        model = make()
        data = make_data(model)
        out = os.path.join(WORK, "ck-full")
        if not os.path.exists(out):
            train(model, data, out, 2, dict(TRAIN, steps=4), *LORA, "--save-every", 2)
        return model, data, out

    def test_checkpoint_contents(self):
        model, data, _ = self.run4()
        out = os.path.join(WORK, "ck-limit")
        train(model, data, out, 2, dict(TRAIN, steps=4), *LORA, "--save-every", 1, "--save-total-limit", 2)
        self.assertEqual(sorted(d for d in os.listdir(out) if d.startswith("checkpoint-")),
                         ["checkpoint-3", "checkpoint-4"])
        ck = os.path.join(out, "checkpoint-4")
        files = set(os.listdir(ck))
        for f in ("adapter_model.safetensors", "adapter_config.json", "optimizer.safetensors", "scheduler.json",
                  "rng_state.json", "trainer_state.json"):
            self.assertIn(f, files)
        self.assertNotIn("model.safetensors", files)   # the frozen base is not copied
        # the last checkpoint's adapter is the final one
        self.assertEqual(adapter_bytes(ck), adapter_bytes(out))
        opt = peft.ref.read_safetensors(os.path.join(ck, "optimizer.safetensors"))
        adapter = peft.ref.read_safetensors(os.path.join(ck, "adapter_model.safetensors"))
        self.assertEqual(set(opt), {k + s for k in adapter for s in (".exp_avg", ".exp_avg_sq")})
        for k in adapter:
            self.assertEqual(opt[k + ".exp_avg"].shape, adapter[k].shape)
            self.assertGreater(np.abs(opt[k + ".exp_avg_sq"]).max(), 0, k)
        with open(os.path.join(ck, "trainer_state.json")) as f:
            st = json.load(f)
        self.assertEqual((st["global_step"], st["optimizer"]["steps"]), (4, 4))

    def test_resume_is_bitwise_at_the_same_layout(self):
        model, data, full = self.run4()
        out = os.path.join(WORK, "ck-resumed")
        train(model, data, out, 2, dict(TRAIN, steps=4), *LORA, "--resume", os.path.join(full, "checkpoint-2"))
        self.assertEqual(adapter_bytes(out), adapter_bytes(full))
        self.assertEqual([e["loss"] for e in read_log(out)], [e["loss"] for e in read_log(full)])

    def test_resume_reads_the_checkpoint(self):
        """A resume continues the checkpoint's adapter and optimizer state, not fresh ones:
        either changed in a copy of checkpoint-2 changes the result."""
        model, data, full = self.run4()
        for what in ("adapter_model", "optimizer"):
            ck = os.path.join(WORK, f"ck-doctored-{what}")
            shutil.copytree(os.path.join(full, "checkpoint-2"), ck)
            path = os.path.join(ck, what + ".safetensors")
            t = peft.ref.read_safetensors(path)
            peft.ref.write_safetensors(path, {k: v * 2 for k, v in t.items()}, "F32", metadata={"format": "pt"})
            out = os.path.join(WORK, f"ck-from-{what}")
            train(model, data, out, 2, dict(TRAIN, steps=4), *LORA, "--resume", ck)
            self.assertNotEqual(adapter_bytes(out), adapter_bytes(full), what)

    def test_resume_latest_at_another_tp(self):
        model, data, full = self.run4()
        out = os.path.join(WORK, "ck-tp1")
        shutil.copytree(os.path.join(full, "checkpoint-2"), os.path.join(out, "checkpoint-2"))
        _, got = train(model, data, out, 1, dict(TRAIN, steps=4), *LORA, "--resume", "latest")
        want = peft.ref.read_safetensors(os.path.join(full, "adapter_model.safetensors"))
        for k in want:
            self.assertLess(rel(got[k], want[k]), TOL, k)
        for g, w in zip(read_log(out), read_log(full)):
            self.assertLess(abs(g["loss"] - w["loss"]) / w["loss"], TOL)

    def test_refusals(self):
        model, data, full = self.run4()
        ck = os.path.join(full, "checkpoint-2")

        def refused(needle, *extra):
            p = run(*train_args(model, data, os.path.join(WORK, "ck-refused"), 1, dict(TRAIN, steps=4), *extra),
                    check=False)
            self.assertNotEqual(p.returncode, 0)
            self.assertIn(needle, p.stderr)
        refused("a LoRA checkpoint; resume it with the run's --lora-* options", "--resume", ck)
        refused("the adapter has r 4, this run's --lora-r is 8", "--lora-r", 8, "--lora-target",
                "q_proj,v_proj,down_proj", "--lora-dropout", 0.1, "--resume", ck)
        refused("the adapter has lora_dropout 0.1, this run's --lora-dropout is 0", "--lora-r", 4,
                "--lora-target", "q_proj,v_proj,down_proj", "--resume", ck)
        plain = os.path.join(WORK, "ck-plain")
        run(*train_args(model, data, plain, 1, dict(TRAIN, steps=2), "--save-every", 2))
        refused("not a LoRA checkpoint (no adapter_config.json)", *LORA, "--resume", os.path.join(plain, "checkpoint-2"))


class LoraDataParallel(unittest.TestCase):
    """--dp-replicate/--dp-shard with an adapter: under dp-shard the frozen base is chunked
    (gathered per layer, no gradient or optimizer state), the adapters are copies on every dp rank
    with their gradients summed over the dp group; the run equals one process on the global batch."""

    def test_tp_x_dp_equals_one_process(self):
        """Rows 1 and 6 hold one token (no label): their dp rank runs no forward while its
        dp-shard partners do (the gathers still match).  Evaluation gathers the chunks too."""
        model = make()
        rng = np.random.default_rng(4)
        data = write_token_rows(os.path.join(WORK, "dp-data.jsonl"), rng, 32, vocab_size(model),
                                lambda i: 1 if i in (1, 6) else int(rng.integers(3, SEQ_LEN + 5)))
        ev = ("--eval-data", make_data(model, lines=3, seed=5), "--eval-every", 1)
        opts = dict(TRAIN, steps=3, batch_size=1)
        one = dict(opts, batch_size=4)   # the global batch: 4 dp ranks x 1, or 2 x 2
        _, want = train(model, data, os.path.join(WORK, "dp-one"), 1, one, *LORA, *ev)
        want_log = read_log(os.path.join(WORK, "dp-one"))
        layouts = {"rep2-tp2": (2, dict(opts, batch_size=2), ("--dp-replicate", 2)),
                   "shard2-tp2": (2, dict(opts, batch_size=2), ("--dp-shard", 2, "--check-replicas")),
                   "rep2-shard2": (1, opts, ("--dp-replicate", 2, "--dp-shard", 2))}
        for name, (tp, o, extra) in layouts.items():
            out = os.path.join(WORK, "dp-" + name)
            _, got = train(model, data, out, tp, o, *LORA, *ev, *extra)
            # the parameters within 1e-4: Adam's first steps from lora_B = 0 turn the f32 rounding of
            # near-zero gradients into lr-sized steps (test_grads_equal_one_process checks 1e-5)
            for k in want:
                self.assertLess(rel(got[k], want[k]), 1e-4, f"{name} {k}")
            for g, w in zip(read_log(out), want_log):
                self.assertLess(abs(g["loss"] - w["loss"]) / w["loss"], TOL, name)
                self.assertLess(abs(g["eval_loss"] - w["eval_loss"]) / w["eval_loss"], TOL, name)
                self.assertLess(abs(g["grad_norm"] - w["grad_norm"]) / w["grad_norm"], 1e-4, name)

    def test_grads_equal_one_process(self):
        """One SGD step, no clipping, lr 1e3 (test_lora's way to read gradients): every adapter
        gradient of each TP x DP layout equals one process's on the global batch within 1e-5,
        dropout (keyed by the dataset row) included."""
        model = make()
        data = make_data(model, lines=32, seed=4)
        start = os.path.join(WORK, "dpgrad-start")
        peft.write_adapter(start, model, targets=["q_proj", "o_proj", "down_proj"], r=4, alpha=8, seed=14,
                           extra_config={"lora_dropout": 0.1})
        a0 = peft.ref.read_safetensors(os.path.join(start, "adapter_model.safetensors"))
        sgd = dict(seq_len=SEQ_LEN, batch_size=1, grad_accum=2, steps=1, optim="sgd", lr=1e3,
                   lr_scheduler="constant", max_grad_norm=0)

        def grads(name, tp, batch, *extra):
            _, got = train(model, data, os.path.join(WORK, "dpgrad-" + name), tp, dict(sgd, batch_size=batch),
                           "--adapter", start, *extra)
            return {k: (a0[k] - got[k]) / 1e3 for k in a0}
        want = grads("one", 1, 4)
        for name, tp, batch, extra in (("rep2-tp2", 2, 2, ("--dp-replicate", 2)),
                                       ("shard2-tp2", 2, 2, ("--dp-shard", 2)),
                                       ("rep2-shard2", 1, 1, ("--dp-replicate", 2, "--dp-shard", 2))):
            got = grads(name, tp, batch, *extra)
            for k in a0:
                self.assertGreater(np.abs(want[k]).max(), 0, k)
                self.assertLess(rel(got[k], want[k]), TOL, f"{name} {k}")

    def test_checkpoint_resume_under_dp(self):
        """A dp-shard LoRA checkpoint resumed at the same layout is bitwise the unbroken run."""
        model = make()
        data = make_data(model, lines=32, seed=4)
        opts = dict(TRAIN, steps=4, batch_size=2)
        full = os.path.join(WORK, "dpck-full")
        train(model, data, full, 1, opts, *LORA, "--dp-shard", 2, "--save-every", 2)
        out = os.path.join(WORK, "dpck-resumed")
        train(model, data, out, 1, opts, *LORA, "--dp-shard", 2, "--resume", os.path.join(full, "checkpoint-2"))
        self.assertEqual(adapter_bytes(out), adapter_bytes(full))




class LoraEverything(unittest.TestCase):
    """Embedding and lm_head adapters, k/v heads replicated over ranks (TP 4), modules_to_save,
    bias "lora_only" and dropout in one run: checkpoints resume bitwise at the same layout and
    within 1e-5 at another TP size; tp x dp equals one process on the global batch."""
    FLAGS = ("--lora-r", 4, "--lora-target", "embed_tokens,lm_head,k_proj", "--lora-modules-to-save", "o_proj",
             "--lora-bias", "lora_only", "--lora-dropout", 0.1)

    def test_resume(self):
        model = make("qwen2-base", "qwen2")
        data = make_data(model)
        full = os.path.join(WORK, "all-full")
        _, got = train(model, data, full, 4, dict(TRAIN, steps=4), *self.FLAGS, "--save-every", 2)
        self.assertEqual(sum(k.endswith("base_layer.bias") for k in got), 2)   # the k_proj biases
        self.assertIn("base_model.model.model.layers.0.self_attn.o_proj.weight", got)
        opt = peft.ref.read_safetensors(os.path.join(full, "checkpoint-2", "optimizer.safetensors"))
        self.assertEqual(set(opt), {k + s for k in got for s in (".exp_avg", ".exp_avg_sq")})
        out = os.path.join(WORK, "all-resumed")
        train(model, data, out, 4, dict(TRAIN, steps=4), *self.FLAGS, "--resume", os.path.join(full, "checkpoint-2"))
        self.assertEqual(adapter_bytes(out), adapter_bytes(full))
        other = os.path.join(WORK, "all-tp2")
        shutil.copytree(os.path.join(full, "checkpoint-2"), os.path.join(other, "checkpoint-2"))
        _, got2 = train(model, data, other, 2, dict(TRAIN, steps=4), *self.FLAGS, "--resume", "latest")
        for k in got:   # 1e-4: see LoraEverything.test_tp_x_dp_equals_one_process
            self.assertLess(rel(got2[k], got[k]), 1e-4, k)
        p = run(*train_args(model, data, os.path.join(WORK, "all-refused"), 1, dict(TRAIN, steps=4), "--lora-r", 4,
                            "--lora-target", "embed_tokens,lm_head,k_proj", "--lora-modules-to-save", "o_proj",
                            "--lora-dropout", 0.1, "--resume", os.path.join(full, "checkpoint-2")), check=False)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("the adapter has bias lora_only, this run's --lora-bias is none", p.stderr)

    def test_tp_x_dp_equals_one_process(self):
        model = make("qwen2-base", "qwen2")
        data = make_data(model, lines=32, seed=4)
        opts = dict(TRAIN, steps=3, batch_size=1)
        _, want = train(model, data, os.path.join(WORK, "all-dp-one"), 1, dict(opts, batch_size=4), *self.FLAGS)
        for name, tp, extra in (("rep2-tp4", 4, ("--dp-replicate", 2)), ("shard2-tp2", 2, ("--dp-shard", 2))):
            _, got = train(model, data, os.path.join(WORK, "all-dp-" + name), tp, dict(opts, batch_size=2),
                           *self.FLAGS, *extra, "--check-replicas")
            # 1e-4, not 1e-5: Adam's first steps from lora_B = 0 and k_proj's bias (a gradient softmax
            # mostly cancels) turn f32 rounding of near-zero gradients into lr-sized steps; TP = 4
            # without dp already differs from one process by up to 5e-5 in those two
            for k in want:
                self.assertLess(rel(got[k], want[k]), 1e-4, f"{name} {k}")


if __name__ == "__main__":
    unittest.main()
