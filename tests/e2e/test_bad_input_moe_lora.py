#!/usr/bin/python3
"""End-to-end: damaged inputs on the mixture-of-experts, LoRA and dp-shard
checkpoint paths never crash.  Each case corrupts a copy of a good input and
asserts the house standard: an error exit (> 0, not a signal), no sanitizer
or crash signature, and a message that names the key, tensor or file.

* MoE config.json: num_experts 0 / negative / missing, num_experts_per_tok
  0 or > num_experts, moe_intermediate_size 0, mlp_only_layers out of range
  or not a list, decoder_sparse_step 0.
* llama4_text and gpt_oss config.json: their own keys with a wrong type,
  a non-positive value or a layer list of the wrong length or content;
  gpt_oss's experts_per_token disagreeing with num_experts_per_tok.
* MoE checkpoint: one expert's tensor missing, of the wrong shape, of a
  dtype that is no float.
* adapter_config.json: lora_dropout a string, modules_to_save naming no
  module, bias "foo", r 0, target_modules empty; a truncated
  adapter_model.safetensors.
* A dp-shard checkpoint whose optimizer.safetensors is truncated: resume
  refuses, naming the file."""

import json
import os
import re
import shutil
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "reference"))
from tpe2e import run, write_token_rows  # noqa: E402
import hf_reference as ref  # noqa: E402
import peft_reference as peft  # noqa: E402

CRASH = re.compile(r"Sanitizer|Segmentation|runtime error:|core dumped|Aborted|stack smashing|"
                   r"double free|free\(\): |malloc\(\): ", re.I)
EXPERT = "model.layers.1.mlp.experts.3.down_proj.weight"
WORK = None
MOE = MIXTRAL = DENSE = ADAPTER = LLAMA4 = OSS = None


def setUpModule():
    global WORK, MOE, MIXTRAL, DENSE, ADAPTER, LLAMA4, OSS
    WORK = tempfile.mkdtemp(prefix="tp-e2e-bad-moe-lora-")
    MOE = os.path.join(WORK, "moe")
    run("make-model", "--arch", "qwen3_moe", "--preset", "tiny", "--dtype", "f32", "--seed", "3", "--out", MOE)
    MIXTRAL = os.path.join(WORK, "mixtral")
    run("make-model", "--arch", "mixtral", "--preset", "tiny", "--dtype", "f32", "--seed", "3", "--out", MIXTRAL)
    DENSE = os.path.join(WORK, "dense")
    run("make-model", "--arch", "qwen3", "--preset", "tiny", "--dtype", "f32", "--seed", "3", "--out", DENSE)
    LLAMA4 = os.path.join(WORK, "llama4")
    run("make-model", "--arch", "llama4_text", "--preset", "tiny", "--dtype", "f32", "--seed", "3", "--out", LLAMA4)
    OSS = os.path.join(WORK, "gpt_oss")
    run("make-model", "--arch", "gpt_oss", "--preset", "tiny", "--dtype", "f32", "--seed", "3", "--out", OSS)
    ADAPTER = os.path.join(WORK, "adapter")
    peft.write_adapter(ADAPTER, DENSE, r=4, alpha=8, targets=("q_proj", "v_proj"))


def tearDownModule():
    shutil.rmtree(WORK, ignore_errors=True)


def copy(src, name):
    d = os.path.join(WORK, name)
    shutil.copytree(src, d)
    return d


def edit_json(path, fn):
    with open(path) as f:
        cfg = json.load(f)
    fn(cfg)
    with open(path, "w") as f:
        json.dump(cfg, f)


class Case(unittest.TestCase):
    def refused(self, args, *needles):
        """Runs tensorpar ARGS; asserts an error exit, no crash, and every needle in stderr."""
        p = run(*args, check=False, timeout=300)
        info = f"\ntensorpar {' '.join(map(str, args))}\nrc={p.returncode}\nstderr: {p.stderr[-1500:]}"
        if os.environ.get("TENSORPAR_E2E_SHOW"):
            print(f"\n    rc={p.returncode} {p.stderr.strip()}", file=sys.stderr)
        self.assertGreater(p.returncode, 0, "expected an error exit (>0), got " +
                           ("success" if p.returncode == 0 else f"signal {-p.returncode}") + info)
        self.assertIsNone(CRASH.search(p.stdout + p.stderr), "crash signature in output" + info)
        for s in needles:
            self.assertIn(s, p.stderr, f"stderr does not name {s!r}" + info)
        return p.stderr

    def logits(self, model, *extra, out_dir=None):
        return ["logits", "--model", model, "--tokens", "1,2,3", "--out",
                os.path.join(out_dir or model, "out.npy"), *extra]

    def refused_logits(self, model, *extra, needles, out_dir=None):
        """A refused `tensorpar logits` that leaves no logits file behind."""
        args = self.logits(model, *extra, out_dir=out_dir)
        self.refused(args, *needles)
        self.assertFalse(os.path.exists(args[6]), "a refused run wrote " + args[6])


class MoeConfig(Case):
    def bad_config(self, name, fn, *needles):
        d = copy(MOE, "cfg-" + name)
        edit_json(os.path.join(d, "config.json"), fn)
        self.refused_logits(d, needles=needles)

    def test_00_good_model_runs(self):
        run(*self.logits(MOE, out_dir=WORK))   # not in MOE: the copies must start without logits

    def test_num_experts(self):
        for v in (0, -2):
            self.bad_config(f"ne{v}", lambda c, v=v: c.update(num_experts=v), "key 'num_experts' is out of range",
                            f"got 2 of {v}")
        d = copy(MIXTRAL, "cfg-mixtral-nle0")
        edit_json(os.path.join(d, "config.json"), lambda c: c.update(num_local_experts=0))
        self.refused_logits(d, needles=["key 'num_local_experts' is out of range"])
        # absent: Transformers' default (128 for qwen3_moe), which the router's tensor then contradicts
        self.bad_config("ne-missing", lambda c: c.pop("num_experts"), "model.layers.0.mlp.gate.weight",
                        "model.safetensors", "expects [128, ")

    def test_num_experts_per_tok(self):
        self.bad_config("k0", lambda c: c.update(num_experts_per_tok=0), "key 'num_experts_per_tok'", "got 0 of 8")
        self.bad_config("kbig", lambda c: c.update(num_experts_per_tok=c["num_experts"] + 1),
                        "key 'num_experts_per_tok'", "got 9 of 8")

    def test_moe_intermediate_size_zero(self):
        self.bad_config("mis0", lambda c: c.update(moe_intermediate_size=0), "key 'moe_intermediate_size'")

    def test_mlp_only_layers(self):
        self.bad_config("mol-range", lambda c: c.update(mlp_only_layers=[c["num_hidden_layers"]]), "mlp_only_layers",
                        "num_hidden_layers is")
        self.bad_config("mol-neg", lambda c: c.update(mlp_only_layers=[-1]), "key 'mlp_only_layers'")
        self.bad_config("mol-str", lambda c: c.update(mlp_only_layers="1"), "key 'mlp_only_layers'")

    def test_decoder_sparse_step_zero(self):
        self.bad_config("dss0", lambda c: c.update(decoder_sparse_step=0), "key 'decoder_sparse_step'",
                        "config.json")


class NewMoeTypesConfig(Case):
    """llama4_text's and gpt_oss's own config keys, damaged one at a time."""

    def bad(self, src, name, key, value, *needles):
        d = copy(src, "cfg-" + name)
        edit_json(os.path.join(d, "config.json"), lambda c: c.update({key: value}))
        self.refused_logits(d, needles=("config.json",) + needles)

    def test_00_good_models_run(self):
        run(*self.logits(LLAMA4, out_dir=WORK))
        run(*self.logits(OSS, out_dir=WORK))

    def test_llama4_text(self):
        self.bad(LLAMA4, "l4-chunk-str", "attention_chunk_size", "x", "key 'attention_chunk_size'")
        self.bad(LLAMA4, "l4-chunk-neg", "attention_chunk_size", -3, "attention_chunk_size")
        self.bad(LLAMA4, "l4-floor0", "floor_scale", 0, "floor_scale")
        self.bad(LLAMA4, "l4-nope-len", "no_rope_layers", [1], "key 'no_rope_layers'", "3 layers")
        self.bad(LLAMA4, "l4-step0", "interleave_moe_layer_step", 0, "key 'interleave_moe_layer_step'")
        self.bad(LLAMA4, "l4-nle0", "num_local_experts", 0, "num_local_experts")
        self.bad(LLAMA4, "l4-ism0", "intermediate_size_mlp", 0, "key 'intermediate_size_mlp'")
        self.bad(LLAMA4, "l4-types", "layer_types", ["bad"], "key 'layer_types'")

    def test_gpt_oss(self):
        self.bad(OSS, "oss-window", "sliding_window", -1, "sliding_window")
        self.bad(OSS, "oss-types-len", "layer_types", ["full_attention"], "key 'layer_types'", "2 layers")
        self.bad(OSS, "oss-types-bad", "layer_types", ["weird", "full_attention"], "layer_types[0]")
        self.bad(OSS, "oss-limit-str", "swiglu_limit", "a", "key 'swiglu_limit'")
        self.bad(OSS, "oss-nle0", "num_local_experts", 0, "num_local_experts")

    def test_gpt_oss_experts_per_token(self):
        """Published gpt-oss configs carry OpenAI's experts_per_token next to
        num_experts_per_tok; GptOssConfig maps no attribute to it and routes
        with num_experts_per_tok.  Equal: the same logits as without it;
        disagreeing (explicitly, or with num_experts_per_tok's default 4):
        refused naming both keys; a wrong type: refused naming the key."""
        with open(os.path.join(OSS, "config.json")) as f:
            k = json.load(f)["num_experts_per_tok"]
        d = copy(OSS, "cfg-oss-ept-same")
        edit_json(os.path.join(d, "config.json"), lambda c: c.update(experts_per_token=k))
        with_key, without = self.logits(d), self.logits(OSS, out_dir=d + "-plain")
        os.makedirs(d + "-plain")
        run(*with_key)
        run(*without)
        import numpy as np
        self.assertTrue(np.array_equal(np.load(with_key[6]), np.load(without[6])))
        self.bad(OSS, "oss-ept-differs", "experts_per_token", k - 1, "key 'experts_per_token' (%d)" % (k - 1),
                 "key 'num_experts_per_tok' (%d)" % k)
        d = copy(OSS, "cfg-oss-ept-default")
        edit_json(os.path.join(d, "config.json"), lambda c: (c.pop("num_experts_per_tok"), c.update(experts_per_token=2)))
        self.refused_logits(d, needles=("config.json", "key 'experts_per_token' (2)",
                                        "key 'num_experts_per_tok' (4, GptOssConfig's default)"))
        self.bad(OSS, "oss-ept-str", "experts_per_token", "2", "key 'experts_per_token'")


class MoeCheckpoint(Case):
    def bad_tensors(self, name, fn, *needles):
        d = copy(MOE, "st-" + name)
        path = os.path.join(d, "model.safetensors")
        tensors = ref.read_safetensors_raw(path)
        self.assertIn(EXPERT, tensors)
        fn(tensors)
        ref.write_safetensors_raw(path, tensors, metadata={"format": "pt"})
        for extra in ((), ("--tp", 2, "--ep")):
            self.refused_logits(d, *extra, needles=needles)

    def test_missing_expert(self):
        self.bad_tensors("missing", lambda t: t.pop(EXPERT), EXPERT)

    def test_expert_wrong_shape(self):
        def fn(t):
            dt, shape, raw = t[EXPERT]
            t[EXPERT] = (dt, (shape[1], shape[0]) if shape[0] != shape[1] else (shape[0] * 2, shape[1] // 2), raw)
        self.bad_tensors("shape", fn, EXPERT)

    def test_expert_wrong_dtype(self):
        def fn(t):
            _, shape, raw = t[EXPERT]
            t[EXPERT] = ("I32", shape, raw)
        self.bad_tensors("dtype", fn, EXPERT, "dtype i32")


class AdapterConfig(Case):
    def bad_adapter(self, name, fn, *needles):
        d = copy(ADAPTER, "ad-" + name)
        edit_json(os.path.join(d, "adapter_config.json"), fn)
        self.refused_logits(DENSE, "--adapter", d, needles=needles, out_dir=d)

    def test_00_good_adapter_runs(self):
        run(*self.logits(DENSE, "--adapter", ADAPTER))

    def test_lora_dropout_string(self):
        self.bad_adapter("drop", lambda c: c.update(lora_dropout="0.1"), "lora_dropout", "adapter_config.json")
        self.bad_adapter("alpha", lambda c: c.update(lora_alpha="16"), "lora_alpha", "adapter_config.json")

    def test_modules_to_save_missing_module(self):
        self.bad_adapter("mts", lambda c: c.update(modules_to_save=["no_such_module"]), "modules_to_save",
                         "no_such_module", "ad-mts")

    def test_bias_foo(self):
        self.bad_adapter("bias", lambda c: c.update(bias="foo"), "bias", "foo")

    def test_r_zero(self):
        self.bad_adapter("r0", lambda c: c.update(r=0), "'r'", "adapter_config.json")

    def test_target_modules_empty(self):
        self.bad_adapter("tm", lambda c: c.update(target_modules=[]), "target_modules")

    def test_truncated_adapter_weights(self):
        d = copy(ADAPTER, "ad-trunc")
        path = os.path.join(d, "adapter_model.safetensors")
        size = os.path.getsize(path)
        with open(path, "r+b") as f:
            f.truncate(size - 64)
        self.refused_logits(DENSE, "--adapter", d, needles=["adapter_model.safetensors"], out_dir=d)


class DpShardCheckpoint(Case):
    def test_truncated_optimizer_file(self):
        import numpy as np
        data = write_token_rows(os.path.join(WORK, "d.jsonl"), np.random.default_rng(0), 16, 500, lambda i: 10)
        out = os.path.join(WORK, "dps")

        def train(*extra):
            return ["train", "--model", DENSE, "--data", data, "--seq-len", 8, "--batch-size", 1, "--lr", "1e-3",
                    "--no-shuffle", "--threads", 1, "--dp-shard", 2, *extra]
        run(*train("--out", out, "--steps", 1, "--save-every", 1))
        ck = os.path.join(out, "checkpoint-1")
        opt = os.path.join(ck, "optimizer.safetensors")
        size = os.path.getsize(opt)
        with open(opt, "r+b") as f:
            f.truncate(size // 2)
        res = os.path.join(WORK, "dps-res")
        self.refused(train("--out", res, "--steps", 2, "--resume", ck), "optimizer.safetensors")
        # nothing half-written: no weights and no checkpoint in the refused run's output
        left = os.listdir(res) if os.path.isdir(res) else []
        self.assertEqual([f for f in left if f.endswith(".safetensors") or f.startswith("checkpoint-")], [], left)


if __name__ == "__main__":
    unittest.main()
