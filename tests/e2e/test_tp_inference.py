#!/usr/bin/python3
"""End-to-end: tensor-parallel inference equals the unsplit model.

For every model type, TP = 2, 3 and 4 (where the heads allow) must give the
TP = 1 logits within 1e-5 relative, bitwise identical logits on every rank, and
the same greedy tokens; on the shared-memory backend and on MPI.  User plans
that differ from the built-in one must give the same logits, invalid plans
their messages, and each rank must read exactly its own bytes."""

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tpe2e import BIN, HAVE_MPI, MPI_SKIP, rel, run, tp_logits  # noqa: E402

os.environ.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
os.environ.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")

TOL = 1e-5
# The backends every check runs on (a build without MPI: shm only).
BACKENDS = ("shm", "mpi") if HAVE_MPI else ("shm",)
TOKENS = "1,5,9,42,7,3,11,200,17,99,4,8,300,12,6,77"
WORK = None
# 6 heads / 3 KV heads so that TP = 3 divides them; vocab 510 divides by 2 and 3.
TP3 = ["--set", "hidden_size=96", "--set", "num_attention_heads=6", "--set", "num_key_value_heads=3",
       "--set", "vocab_size=510"]


def setUpModule():
    global WORK
    WORK = tempfile.mkdtemp(prefix="tp-e2e-tp-")


def tearDownModule():
    shutil.rmtree(WORK, ignore_errors=True)


def make(name, arch, *extra):
    d = os.path.join(WORK, name)
    if not os.path.exists(d):
        run("make-model", "--arch", arch, "--preset", "tiny", "--qk-std", "0.25", "--seed", "3", *extra, "--out", d)
    return d


def logits(model, tp=1, *extra, tokens=TOKENS):
    return tp_logits(WORK, model, tp, *extra, tokens=tokens)


def generate(model, tp=1, *extra):
    return json.loads(run("generate", "--model", model, "--tokens", "1,2,3", "--max-new-tokens", "64",
                          "--greedy", "--tp", tp, *extra).stdout)


def write_plan(name, plan):
    path = os.path.join(WORK, name + ".json")
    with open(path, "w") as f:
        json.dump(plan, f)
    return path


AUTO = {
    "lm_head": "colwise_gather_output",
    "model.layers.*.self_attn.q_proj": "colwise",
    "model.layers.*.self_attn.k_proj": "colwise",
    "model.layers.*.self_attn.v_proj": "colwise",
    "model.layers.*.self_attn.o_proj": "rowwise",
    "model.layers.*.mlp.gate_proj": "colwise",
    "model.layers.*.mlp.up_proj": "colwise",
    "model.layers.*.mlp.down_proj": "rowwise",
}


class EveryArch(unittest.TestCase):
    def check(self, model, sizes):
        ref = logits(model)
        for backend in BACKENDS:
            for tp in sizes:
                err = rel(logits(model, tp, "--backend", backend), ref)
                self.assertLessEqual(err, TOL, f"{model} TP={tp} {backend}: {err}")

    def test_llama(self):
        self.check(make("llama", "llama"), (2, 4))              # TP 4 > 2 KV heads: KV replication
        self.check(make("llama3", "llama", *TP3), (3,))

    def test_mistral(self):
        self.check(make("mistral", "mistral"), (2, 4))
        self.check(make("mistral-3", "mistral", *TP3), (3,))

    def test_qwen2(self):
        self.check(make("qwen2", "qwen2"), (2, 4))              # q/k/v biases split with the heads
        self.check(make("qwen2-3", "qwen2", *TP3), (3,))

    def test_qwen3(self):
        self.check(make("qwen3", "qwen3", "--set", "tie_word_embeddings=true"), (2, 4))
        self.check(make("qwen3-3", "qwen3", *TP3), (3,))

    def test_bf16_and_mqa(self):
        self.check(make("llama-bf16", "llama", "--dtype", "bf16", "--set", "num_key_value_heads=1"), (2, 4))


# 70 tokens: q/k/v and gate/up go through one grouped GEMM each (x packed
# once), and at 64 tokens or more under TP the residual add and norm run
# inside the all-reduce, each rank on its own rows; 70 rows give TP = 3
# uneven shares (24, 24, 22) and TP = 4 (18, 18, 18, 16).
LONG = ",".join(str((i * 37 + 5) % 500) for i in range(70))


def logits_unfused(model, tp, *extra):
    os.environ["TENSORPAR_FUSE_NORM"] = "0"
    try:
        return logits(model, tp, *extra, tokens=LONG)
    finally:
        del os.environ["TENSORPAR_FUSE_NORM"]


class LongPrompt(unittest.TestCase):
    """TP = 1 logits within 1e-5, and the fused norm bitwise the logits of
    the plan's all-reduce followed by the norm (TENSORPAR_FUSE_NORM=0)."""

    def test_long_prompt(self):
        for model, sizes, extra in ((make("qwen3", "qwen3", "--set", "tie_word_embeddings=true"), (2, 4), ()),
                                    (make("qwen3-3", "qwen3", *TP3), (3,), ()),
                                    (make("llama-bf16", "llama", "--dtype", "bf16", "--set",
                                          "num_key_value_heads=1"), (2,), ()),
                                    (make("qwen2", "qwen2"), (2,), ("--backend", BACKENDS[-1]))):
            ref = logits(model, tokens=LONG)
            for tp in sizes:
                got = logits(model, tp, *extra, tokens=LONG)
                err = rel(got, ref)
                self.assertLessEqual(err, TOL, f"{model} TP={tp} {extra}: {err}")
                self.assertTrue(np.array_equal(got, logits_unfused(model, tp, *extra)),
                                f"{model} TP={tp} {extra}: the fused norm changed the logits")

    def test_bad_value_is_an_error(self):
        os.environ["TENSORPAR_FUSE_NORM"] = "yes"
        try:
            p = run("logits", "--model", make("qwen2", "qwen2"), "--tokens", "1,2", "--out",
                    os.path.join(WORK, "s.npy"), check=False)
        finally:
            del os.environ["TENSORPAR_FUSE_NORM"]
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("TENSORPAR_FUSE_NORM", p.stderr)


class Generation(unittest.TestCase):
    def test_greedy_64_tokens_identical(self):
        for arch in ("llama", "qwen3"):
            model = make(arch, arch) if arch == "llama" else make("qwen3", "qwen3", "--set", "tie_word_embeddings=true")
            ref = generate(model)
            self.assertEqual(len(ref), 64)
            for tp in (2, 4):
                self.assertEqual(generate(model, tp), ref, f"{arch} TP={tp}")
        if HAVE_MPI:
            self.assertEqual(generate(make("llama", "llama"), 2, "--backend", "mpi"), generate(make("llama", "llama")))

    def test_sampling_agrees_across_ranks(self):
        model = make("llama", "llama")
        a = run("generate", "--model", model, "--tokens", "1,2,3", "--max-new-tokens", "16", "--do-sample",
                "--seed", "5", "--tp", "2").stdout
        b = run("generate", "--model", model, "--tokens", "1,2,3", "--max-new-tokens", "16", "--do-sample",
                "--seed", "5").stdout
        self.assertEqual(a, b)


class JoinWithoutLauncher(unittest.TestCase):
    """Ranks started by mpirun, or by hand with torchrun's variables, join the
    job themselves and give the launcher's results."""

    def test_mpirun_and_torchrun_variables(self):
        model = make("llama", "llama")
        ref = logits(model)
        out = os.path.join(WORK, "join-%r.npy")
        if HAVE_MPI:
            env = dict(os.environ, ASAN_OPTIONS="detect_leaks=0")
            p = subprocess.run(["mpirun", "--oversubscribe", "-n", "2", BIN, "logits", "--model", model, "--tokens",
                                TOKENS, "--out", out], capture_output=True, text=True, timeout=120, env=env)
            self.assertEqual(p.returncode, 0, p.stderr)
            self.assertLessEqual(rel(np.load(out.replace("%r", "1")), ref), TOL)
        else:
            print(MPI_SKIP)
        out = os.path.join(WORK, "torchrun-%r.npy")
        procs = [subprocess.Popen([BIN, "logits", "--model", model, "--tokens", TOKENS, "--out", out],
                                  env=dict(os.environ, RANK=str(r), WORLD_SIZE="2", LOCAL_RANK=str(r),
                                           MASTER_ADDR="127.0.0.1", MASTER_PORT=str(29400 + os.getpid() % 500)),
                                  stderr=subprocess.PIPE, text=True) for r in range(2)]
        for proc in procs:
            _, err = proc.communicate(timeout=120)
            self.assertEqual(proc.returncode, 0, err)
        for r in range(2):
            self.assertLessEqual(rel(np.load(out.replace("%r", str(r))), ref), TOL)


class UserPlans(unittest.TestCase):
    def test_gathered_qkv_with_split_input(self):
        plan = dict(AUTO)
        for k in ("q_proj", "k_proj", "v_proj"):
            plan["model.layers.*.self_attn." + k] = "colwise_gather_output"
        plan["model.layers.*.self_attn.o_proj"] = "rowwise_split_input"
        model = make("llama", "llama")
        self.assertLessEqual(rel(logits(model, 2, "--tp-plan", write_plan("gathered", plan)), logits(model)), TOL)

    def test_indexed_override(self):
        plan = dict(AUTO)
        for k in ("gate_proj", "up_proj", "down_proj"):
            plan["model.layers.0.mlp." + k] = "replicate"
        model = make("llama", "llama")
        path = write_plan("indexed", plan)
        self.assertLessEqual(rel(logits(model, 2, "--tp-plan", path), logits(model)), TOL)
        report = json.loads(run("plan", "--model", model, "--tp", "2", "--tp-plan", path, "--json").stdout)
        shapes = {p["name"]: p["local_shape"] for p in report["parameters"]}
        self.assertEqual(shapes["model.layers.0.mlp.up_proj.weight"], [160, 64])
        self.assertEqual(shapes["model.layers.1.mlp.up_proj.weight"], [80, 64])

    def test_indexed_attention_override(self):
        # layer 0's attention unsplit, layer 1's split: the KV cache differs per layer
        plan = dict(AUTO)
        for k in ("q_proj", "k_proj", "v_proj", "o_proj"):
            plan["model.layers.0.self_attn." + k] = "replicate"
        plan["model.embed_tokens"] = "embedding_rowwise"       # tied embeddings
        model = make("qwen3", "qwen3", "--set", "tie_word_embeddings=true")
        path = write_plan("indexed-attn", plan)
        self.assertLessEqual(rel(logits(model, 2, "--tp-plan", path), logits(model)), TOL)
        self.assertEqual(generate(model, 2, "--tp-plan", path), generate(model))

    def test_uneven_vocabulary(self):
        # 509 over 2: 255, 254 rows; the gathered lm_head uses per-rank
        # counts (§10.10).  More sizes and ranks: test_uneven_vocab.py.
        model = make("llama-v", "llama", "--set", "vocab_size=509")
        plan = dict(AUTO, **{"model.embed_tokens": "embedding_rowwise"})
        ids = "1,2,508,300,255,254,256,253,0"
        ref = logits(model, tokens=ids)
        self.assertLessEqual(rel(logits(model, 2, tokens=ids), ref), TOL)
        self.assertLessEqual(rel(logits(model, 2, "--tp-plan", write_plan("vocab", plan), tokens=ids), ref), TOL)

    def test_custom_style_example(self):
        exe = os.path.join(os.environ.get("TENSORPAR_EXAMPLES", os.path.join(os.path.dirname(BIN), "examples")),
                           "custom_style")
        p = subprocess.run([BIN, "launch", "-n", "2", "--", exe, make("llama", "llama")], capture_output=True,
                           text=True, timeout=120)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn("max |logits - built-in plan| = 0", p.stdout)
        # it trains too: the custom plan's gradients equal the built-in plan's,
        # and the overridden backward hook ran once per q/k/v of each layer
        self.assertIn("max |gradient - built-in plan| = 0", p.stdout)
        layers = json.load(open(os.path.join(make("llama", "llama"), "config.json")))["num_hidden_layers"]
        self.assertIn("transform_grad_input_post_backward: %d calls for %d layers" % (3 * layers, layers), p.stdout)


class InvalidPlans(unittest.TestCase):
    def fails(self, *args, model=None):
        p = run("logits", "--model", model or make("llama", "llama"), "--tokens", "1,2", "--out",
                os.path.join(WORK, "bad.npy"), *args, check=False)
        self.assertNotEqual(p.returncode, 0)
        self.assertNotIn("read", p.stdout)
        return p.stderr

    def test_unknown_styles(self):
        plan = dict(AUTO)
        plan["model.layers.*.mlp.up_proj"] = "invalid_style"
        plan["model.layers.*.mlp.down_proj"] = "bad_style_2"
        err = self.fails("--tp", "2", "--bytes-read", "--tp-plan", write_plan("bad", plan))
        self.assertIn("'invalid_style'", err)
        self.assertIn("'bad_style_2'", err)
        self.assertIn("Supported styles are", err)
        self.assertNotIn("read ", err)          # failed before any weight was read

    def test_not_an_object(self):
        self.assertIn("Can only set a dictionary as `tp_plan`", self.fails("--tp", "2", "--tp-plan",
                                                                            write_plan("list", ["colwise"])))

    def test_heads_do_not_divide(self):
        err = self.fails("--tp", "3", model=make("llama-510", "llama", "--set", "vocab_size=510"))
        self.assertRegex(err, r"num_attention_heads|attention heads")
        self.assertIn("4", err)


class ShardOnRead(unittest.TestCase):
    def test_each_rank_reads_its_bytes(self):
        model = make("qwen3", "qwen3", "--set", "tie_word_embeddings=true")
        report = json.loads(run("plan", "--model", model, "--tp", "2", "--json").stdout)
        p = run("logits", "--model", model, "--tokens", "1,2", "--out", os.path.join(WORK, "b.npy"), "--tp", "2",
                "--bytes-read")
        got = {int(r): int(b) for r, b in re.findall(r"rank (\d+) read (\d+) bytes", p.stderr)}
        self.assertEqual(sorted(got), [0, 1])
        total = os.path.getsize(os.path.join(model, "model.safetensors"))
        for r in (0, 1):
            self.assertEqual(got[r], report["bytes_per_rank"][r])
            self.assertLess(got[r], 0.6 * total)


if __name__ == "__main__":
    unittest.main()
