#!/usr/bin/python3
"""End-to-end: vocabularies that do not divide by the TP size (§10.10).

A vocabulary of 1000 split over 2, 3 and 6 ranks (500 / 334, 334, 332 /
167 x 5, 165 rows), untied (lm_head colwise_gather_output, embedding
replicated) and tied (embedding_rowwise masking by chunk offsets, §10.3),
must give the TP = 1 logits within 1e-5 relative, bitwise identical logits
on every rank (and over MPI), and the same greedy tokens.  A vocabulary of 25 over 6 ranks
leaves the last rank an empty slice; the hidden-parallel embedding and
colwise_rep gather uneven slices too.  make-model pads a tokenizer's
vocabulary to a multiple of 128 unless --set vocab_size says otherwise.
The TP = 1 runs are checked against the NumPy reference elsewhere
(test_reference_logits.py)."""

import json
import os
import re
import shutil
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tpe2e import HAVE_MPI, TOKENIZERS, rel, run, tp_logits  # noqa: E402

TOL = 1e-5
WORK = None
# 6 heads and 6 KV heads, hidden 96, intermediate 192: everything but the
# vocabulary divides by 2, 3 and 6.
DIVIDES = ["--set", "hidden_size=96", "--set", "num_attention_heads=6", "--set", "num_key_value_heads=6",
           "--set", "intermediate_size=192"]
# Both sides of every rank boundary of 1000 over 2, 3 and 6 ranks.
IDS = "0,166,167,333,334,499,500,501,667,668,834,835,998,999,42,7"


def setUpModule():
    global WORK
    WORK = tempfile.mkdtemp(prefix="tp-e2e-vocab-")


def tearDownModule():
    shutil.rmtree(WORK, ignore_errors=True)


def make(name, arch, *extra):
    d = os.path.join(WORK, name)
    if not os.path.exists(d):
        run("make-model", "--arch", arch, "--preset", "tiny", "--qk-std", "0.25", *DIVIDES, *extra, "--out", d)
    return d


def logits(model, tp=1, *extra, tokens=IDS):
    return tp_logits(WORK, model, tp, *extra, tokens=tokens)


def generate(model, tp=1):
    return json.loads(run("generate", "--model", model, "--tokens", "1,2,3", "--max-new-tokens", "24",
                          "--greedy", "--tp", tp).stdout)


def config(model):
    with open(os.path.join(model, "config.json")) as f:
        return json.load(f)


class UnevenVocabulary(unittest.TestCase):
    def check(self, model, sizes=(2, 3, 6)):
        ref = logits(model)
        self.assertEqual(ref.shape, (len(IDS.split(",")), config(model)["vocab_size"]))
        for tp in sizes:
            with self.subTest(tp=tp):
                got = logits(model, tp)
                self.assertLessEqual(rel(got, ref), TOL)
                if tp == 3 and HAVE_MPI:   # the MPI backend's all-gather-v gives the same bits (D9)
                    self.assertTrue((logits(model, tp, "--backend", "mpi") == got).all())
        want = generate(model)
        self.assertGreater(len(set(want)), 3, f"greedy tokens {want} do not discriminate")
        for tp in sizes[1:]:
            with self.subTest(tp=tp):
                self.assertEqual(generate(model, tp), want)

    def test_untied(self):
        self.check(make("untied", "llama", "--seed", "3", "--set", "vocab_size=1000"))

    def test_tied(self):
        # --std 0.08: a tied tiny model otherwise repeats its last token
        self.check(make("tied", "qwen3", "--seed", "5", "--std", "0.08", "--set", "vocab_size=1000",
                        "--set", "tie_word_embeddings=true"))

    def test_each_rank_reads_its_slice(self):
        # shard-on-read (§6.2): 334, 334, 332 rows of the tied [1000, 96] f32
        # table; everything else divides, so rank 2 reads 2 rows less
        model = make("tied", "qwen3", "--seed", "5", "--std", "0.08", "--set", "vocab_size=1000",
                     "--set", "tie_word_embeddings=true")
        report = json.loads(run("plan", "--model", model, "--tp", "3", "--json").stdout)
        p = run("logits", "--model", model, "--tokens", "1,2", "--out", os.path.join(WORK, "b.npy"), "--tp", "3",
                "--bytes-read")
        got = {int(r): int(b) for r, b in re.findall(r"rank (\d+) read (\d+) bytes", p.stderr)}
        self.assertEqual(sorted(got), [0, 1, 2])
        self.assertEqual([got[r] for r in range(3)], report["bytes_per_rank"])
        self.assertEqual(got[0], got[1])
        self.assertEqual(got[0] - got[2], 2 * 96 * 4)

    def test_empty_last_slice(self):
        # 25 over 6: 5, 5, 5, 5, 5, 0 rows; the last rank's lm_head and
        # embedding slices are empty, and it still joins every collective
        model = make("v25", "qwen3", "--seed", "5", "--std", "0.08", "--set", "vocab_size=25",
                     "--set", "tie_word_embeddings=true")
        ids = "0,4,5,19,20,24,3,1"
        self.assertLessEqual(rel(logits(model, 6, tokens=ids), logits(model, tokens=ids)), TOL)

    def test_hidden_parallel_embedding(self):
        # 7 ranks: the hidden size 96 gives 14 x 6 + 12 columns, the
        # vocabulary 143 x 6 + 142 rows; attention and MLP stay replicated
        model = make("untied", "llama", "--seed", "3", "--set", "vocab_size=1000")
        path = os.path.join(WORK, "colwise-embed.json")
        with open(path, "w") as f:
            json.dump({"model.embed_tokens": "embedding_colwise", "lm_head": "colwise_rep"}, f)
        self.assertLessEqual(rel(logits(model, 7, "--tp-plan", path), logits(model)), TOL)


class MakeModelPadding(unittest.TestCase):
    QWEN3 = os.path.join(TOKENIZERS, "qwen3")   # 151669 ids

    def made(self, name, *args):
        d = os.path.join(WORK, name)
        # tied and bf16 (as Qwen3 is): one table of 151k rows to write
        run("make-model", "--arch", "qwen3", "--dtype", "bf16", "--set", "tie_word_embeddings=true",
            "--tokenizer", self.QWEN3, *args, "--out", d)
        return config(d)["vocab_size"], d

    def test_padded_to_128(self):
        v, d = self.made("pad", "--preset", "tiny")
        self.assertEqual(v % 128, 0)
        self.assertTrue(151669 <= v < 151669 + 128, v)
        self.assertTrue(os.path.exists(os.path.join(d, "tokenizer.json")))
        # the real Qwen3 config already covers the tokenizer: kept (151936)
        v, _ = self.made("qwen3-0.6b", "--preset", "qwen3-0.6b", "--set", "num_hidden_layers=1",
                         "--set", "hidden_size=64", "--set", "head_dim=32", "--set", "num_key_value_heads=1",
                         "--set", "num_attention_heads=2", "--set", "intermediate_size=64")
        self.assertEqual(v, 151936)

    def test_set_vocab_size_is_honoured(self):
        # the tokenizer's exact size, odd, split over 2 ranks
        v, d = self.made("exact", "--preset", "tiny", "--set", "vocab_size=151669")
        self.assertEqual(v, 151669)
        ids = "151668,151643,0,75834,75835,9707"   # 75835 = ceil(151669 / 2)
        self.assertLessEqual(rel(logits(d, 2, tokens=ids), logits(d, tokens=ids)), TOL)
        p = run("make-model", "--arch", "qwen3", "--preset", "tiny", "--tokenizer", self.QWEN3,
                "--set", "vocab_size=1000", "--out", os.path.join(WORK, "small"), check=False)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("vocab_size 1000 (from --set) is smaller than the 151669 ids of the tokenizer", p.stderr)


if __name__ == "__main__":
    unittest.main()
