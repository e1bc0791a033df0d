#!/usr/bin/python3
"""--dp-shard keeps the embedding and lm_head ([vocab, hidden]) in row blocks:
no rank gathers the whole table or its gradient, lm_head and the loss run a
vocabulary block at a time, the lookup fetches the blocks of the looked-up
rows.  On a vocabulary of 700 rows (blocks of 256: three, the last one
short, the chunks' boundaries inside rows at --dp-shard 3), tied and untied
embeddings, f32 and bf16, with an idle row (no label): the losses and
weights are bitwise those of --dp-replicate 2 (the same sums in the same
order: a tied lm_head's gradient rows are held until the lookup's gradient
is added to them), and within 1e-5 of one process on the global batch,
with gradient accumulation too."""
import os
import sys
import tempfile
import unittest

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "reference"))
from tpe2e import assert_runs_close, read_log, run, write_token_rows  # noqa: E402

TOL = 1e-5
VOCAB = 700


class DpRowBlocks(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.work = cls.tmp.name
        cls.tied = os.path.join(cls.work, "tied")
        cls.untied = os.path.join(cls.work, "untied")
        run("make-model", "--arch", "qwen3", "--preset", "tiny", "--dtype", "f32", "--set",
            "tie_word_embeddings=true", "--set", f"vocab_size={VOCAB}", "--out", cls.tied)
        run("make-model", "--arch", "llama", "--preset", "tiny", "--dtype", "f32", "--set", f"vocab_size={VOCAB}",
            "--out", cls.untied)
        rng = np.random.default_rng(5)
        # ids over the whole vocabulary (every block looked up), one row without a label
        cls.data = write_token_rows(os.path.join(cls.work, "d.jsonl"), rng, 40, VOCAB,
                                    lambda i: 1 if i == 3 else int(rng.integers(6, 20)))

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def train(self, model, tag, *extra, batch=1, steps=4, env=None):
        out = os.path.join(self.work, tag)
        old = dict(os.environ)
        os.environ.update(env or {})
        try:
            p = run("train", "--model", model, "--data", self.data, "--out", out, "--seq-len", 12, "--steps", steps,
                    "--batch-size", batch, "--lr", "3e-3", "--max-grad-norm", "0.5", "--warmup-steps", 1,
                    "--weight-decay", "0.1", "--no-shuffle", "--threads", 1, *extra)
        finally:
            os.environ.clear()
            os.environ.update(old)
        return out, p

    def weights(self, out):
        with open(os.path.join(out, "model.safetensors"), "rb") as f:
            return f.read()

    def assert_bitwise(self, a, b, what):
        keys = lambda o: [(e["step"], e["loss"], e["grad_norm"]) for e in read_log(o)]  # noqa: E731
        self.assertEqual(keys(a), keys(b), what)
        self.assertEqual(len(read_log(a)), 4, what)
        self.assertEqual(self.weights(a), self.weights(b), what)

    def assert_close(self, a, b, what):
        assert_runs_close(self, a, b, what, TOL)

    def test_blocks_are_used(self):
        """The debug log names the blocked tables: both for an untied model, the embedding (lm_head's owner)
        for a tied one; three blocks of 256 rows for 700."""
        _, p = self.train(self.untied, "log-untied", "--dp-shard", 2, steps=1, env={"TENSORPAR_LOG": "debug"})
        self.assertIn("dp_shard: model.embed_tokens.weight kept in row blocks of 256 rows (3 blocks)", p.stderr)
        self.assertIn("dp_shard: lm_head.weight kept in row blocks of 256 rows (3 blocks)", p.stderr)
        _, p = self.train(self.tied, "log-tied", "--dp-shard", 2, steps=1, env={"TENSORPAR_LOG": "debug"})
        self.assertIn("dp_shard: model.embed_tokens.weight kept in row blocks of 256 rows (3 blocks)", p.stderr)
        self.assertNotIn("lm_head.weight kept", p.stderr)

    def test_bitwise_dp_replicate_and_close_to_one_process(self):
        for name, model in (("tied", self.tied), ("untied", self.untied)):
            for accum in (1, 2):
                ga = ["--grad-accum", accum]
                shard, _ = self.train(model, f"{name}-s2-a{accum}", "--dp-shard", 2, "--check-replicas", *ga)
                rep, _ = self.train(model, f"{name}-r2-a{accum}", "--dp-replicate", 2, *ga)
                one, _ = self.train(model, f"{name}-one-a{accum}", *ga, batch=2)
                # Accumulating, dp-shard reduces each sequence's gradient and dp-replicate the sum of a
                # rank's sequences (another order of sums), with or without blocks.
                check = self.assert_bitwise if accum == 1 else self.assert_close
                check(shard, rep, f"{name} accum {accum}: dp-shard 2 vs dp-replicate 2")
                self.assert_close(shard, one, f"{name} accum {accum}: dp-shard 2 vs one process")

    def test_bf16_and_checkpointing(self):
        """bf16 blocks are the masters rounded, as the whole gather; gradient checkpointing changes nothing."""
        bf = ["--dtype", "bf16"]
        shard, _ = self.train(self.tied, "bf-s2", "--dp-shard", 2, *bf)
        rep, _ = self.train(self.tied, "bf-r2", "--dp-replicate", 2, *bf)
        self.assert_bitwise(shard, rep, "bf16 tied: dp-shard 2 vs dp-replicate 2")
        gc, _ = self.train(self.untied, "gc-s2", "--dp-shard", 2, "--gradient-checkpointing")
        plain, _ = self.train(self.untied, "plain-s2", "--dp-shard", 2)
        self.assert_bitwise(gc, plain, "untied dp-shard 2: checkpointing vs not")

    def test_three_shards_cut_rows(self):
        """--dp-shard 3: chunk boundaries fall inside rows (700 x 64 / 3 is no multiple of 64)."""
        for name, model in (("tied", self.tied), ("untied", self.untied)):
            shard, _ = self.train(model, f"{name}-s3", "--dp-shard", 3)
            one, _ = self.train(model, f"{name}-one-b3", batch=3)
            self.assert_close(shard, one, f"{name}: dp-shard 3 vs one process")


if __name__ == "__main__":
    unittest.main()
