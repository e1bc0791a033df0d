"""What tests/e2e/test_q4.py and test_q8.py share: the two models every
block-quantized dtype is checked on, greedy generation, and the checks that
only differ by the dtype's name and block size (refusals, decode bytes).

A test module sets up with `setup(prefix)` and reaches the models through
`MODELS` and the scratch folder through `work()`; its test classes derive from
the mixins below with DTYPE (and BLOCK_BYTES for the bench one) set."""

import json
import os
import shutil
import tempfile

from tpe2e import run

TOKENS = "1,5,9,42,7,3,11,200,17,99,4,8,300,12,6,77"
# Every Linear's input width a multiple of 32 at TP = 4: hidden 128, 4 heads of
# 32 (o_proj 128 / 4), intermediate 256 (down_proj 256 / 4).
SHAPE = ["--set", "hidden_size=128", "--set", "intermediate_size=256", "--set", "head_dim=32"]
MODELS = {}
_STATE = {"work": None}


def work():
    return _STATE["work"]


def setup(prefix):
    """Makes the llama (f32) and qwen3 (bf16 on disk, tied lm_head, which gets
    a quantized copy of the embedding) models in a fresh scratch folder."""
    _STATE["work"] = tempfile.mkdtemp(prefix=prefix)
    MODELS["llama"] = os.path.join(work(), "llama")
    run("make-model", "--arch", "llama", *SHAPE, "--dtype", "f32", "--seed", "3", "--out", MODELS["llama"])
    MODELS["qwen3"] = os.path.join(work(), "qwen3")
    run("make-model", "--arch", "qwen3", *SHAPE, "--dtype", "bf16", "--set", "tie_word_embeddings=true",
        "--seed", "3", "--out", MODELS["qwen3"])


def teardown():
    shutil.rmtree(work(), ignore_errors=True)


def generate(model, tp, dtype):
    return json.loads(run("generate", "--model", model, "--tokens", "1,2,3", "--max-new-tokens", "64", "--greedy",
                          "--dtype", dtype, "--tp", tp).stdout)


def agree(a, b):
    """How many leading tokens of a and b are equal."""
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


class BenchBytes:
    """`bench decode` streams BLOCK_BYTES a block of 32 against f32's 128 (the
    norms are f32 in both, so the ratio is a little above, below MAX_RATIO)."""
    DTYPE = None
    BLOCK_BYTES = None
    MAX_RATIO = None

    def test_bench_decode_weight_bytes(self):
        model = MODELS["llama"]
        got = {}
        for dt in ("f32", self.DTYPE):
            got[dt] = json.loads(run("bench", "decode", "--model", model, "--new-tokens", "4", "--reps", "1",
                                     "--dtype", dt, "--tp", "2", "--json").stdout)
            self.assertEqual(got[dt]["dtype"], dt)
        for side in ("tp1", "tpN"):
            ratio = got[self.DTYPE][side]["weight_bytes_per_token"] / got["f32"][side]["weight_bytes_per_token"]
            self.assertGreater(ratio, self.BLOCK_BYTES / 128)
            self.assertLess(ratio, self.MAX_RATIO, side)


class Refusals:
    """A shard whose rows are not whole blocks, and training, are refused."""
    DTYPE = None

    def test_rows_not_whole_blocks(self):
        # the tiny preset: intermediate 160, so down_proj's rows are 80 long at TP = 2
        d = os.path.join(work(), "tiny")
        run("make-model", "--arch", "llama", "--preset", "tiny", "--out", d)
        p = run("logits", "--model", d, "--tokens", "1,2", "--out", os.path.join(work(), "x-%r.npy"),
                "--dtype", self.DTYPE, "--tp", "2", check=False)
        self.assertEqual(p.returncode, 1, p.stderr)
        self.assertIn(f"--dtype {self.DTYPE}: model.layers.0.mlp.down_proj.weight has rows of 80 values on this "
                      "rank (160 in all), not a multiple of the block of 32", p.stderr)
        # TP = 1: every row is whole blocks (64 and 160)
        p = run("logits", "--model", d, "--tokens", "1,2", "--out", os.path.join(work(), "y.npy"),
                "--dtype", self.DTYPE)
        self.assertIn(f"{self.DTYPE}: 15 Linear weights quantized", p.stderr)

    def test_training_refuses(self):
        model = MODELS["llama"]
        data = os.path.join(work(), "d.jsonl")
        with open(data, "w") as f:
            f.write(json.dumps({"input_ids": [1, 2, 3, 4, 5]}) + "\n")
        for args in (("train", "--model", model, "--data", data, "--out", os.path.join(work(), "t"), "--steps", "1"),
                     ("grads", "--model", model, "--tokens", "1,2,3",
                      "--out", os.path.join(work(), "g.safetensors"))):
            p = run(*args, "--dtype", self.DTYPE, check=False)
            self.assertEqual(p.returncode, 2, p.stderr)
            self.assertIn(f"--dtype {self.DTYPE} is for inference only", p.stderr)
