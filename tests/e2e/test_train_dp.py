#!/usr/bin/python3
"""tensorpar train with data parallelism (--dp-replicate, --dp-shard) beside
--tp, on tiny made models: every TP x DP layout (2-D and 3-D meshes, on
shared memory and under mpirun) gives the losses per step and the saved
weights after 5 steps of ONE process on the global batch (batch size x dp)
within 1e-5, with --check-replicas covering the dp copies, and with
gradient accumulation; a product of sizes that is not the world size is
refused naming the three sizes and the world size (spec §9.4's message)."""
import os
import subprocess
import sys
import tempfile
import unittest

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "reference"))
from tpe2e import assert_runs_close, BIN, HAVE_MPI, job_env, make_train_models, read_log, run, write_token_rows  # noqa: E402
import hf_reference as st_reader  # noqa: E402

TOL = 1e-5


class TrainDataParallel(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.work = cls.tmp.name
        cls.llama, cls.qwen3 = make_train_models(cls.work)
        rng = np.random.default_rng(11)
        # truncated and padded rows; one row that counts no label
        cls.data = write_token_rows(os.path.join(cls.work, "d.jsonl"), rng, 40, 500,
                                    lambda i: 1 if i == 5 else int(rng.integers(6, 20)))
        cls.refs = {}

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def args(self, model, out, batch, *extra):
        return ["train", "--model", model, "--data", self.data, "--out", out, "--seq-len", 12, "--steps", 5,
                "--batch-size", batch, "--lr", "3e-3", "--max-grad-norm", "0.5", "--warmup-steps", 1,
                "--weight-decay", "0.1", "--no-shuffle", "--threads", 1, *extra]

    def ref(self, model, batch, accum, evaluate=False):
        """One process on the global batch (memoized)."""
        key = (model, batch, accum, evaluate)
        if key not in self.refs:
            out = os.path.join(self.work, f"ref-{os.path.basename(model)}-{batch}-{accum}-{int(evaluate)}")
            run(*self.args(model, out, batch, "--grad-accum", accum, *self.eval_args(evaluate)))
            self.refs[key] = out
        return self.refs[key]

    def eval_args(self, evaluate):
        return ["--eval-data", self.data, "--eval-every", 2] if evaluate else []

    def assert_same_run(self, a, b, what):
        la, lb = read_log(a), read_log(b)
        self.assertEqual([e["step"] for e in la], [1, 2, 3, 4, 5], what)
        self.assertEqual(len(la), len(lb), what)
        for x, y in zip(la, lb):
            self.assertLess(abs(x["loss"] - y["loss"]), TOL, f"{what}: step {x['step']} loss")
            self.assertLess(abs(x["grad_norm"] - y["grad_norm"]), TOL * max(1, y["grad_norm"]), what)
            self.assertEqual(x["lr"], y["lr"], what)
            self.assertEqual("eval_loss" in x, "eval_loss" in y, what)
            if "eval_loss" in y:
                self.assertLess(abs(x["eval_loss"] - y["eval_loss"]), TOL, f"{what}: step {x['step']} eval loss")
        wa = st_reader.read_safetensors(os.path.join(a, "model.safetensors"), np.float32)
        wb = st_reader.read_safetensors(os.path.join(b, "model.safetensors"), np.float32)
        self.assertEqual(sorted(wa), sorted(wb), what)
        moved = 0.0
        for k in wa:
            self.assertEqual(wa[k].shape, wb[k].shape, k)
            self.assertLess(float(np.abs(wa[k] - wb[k]).max()), TOL, f"{what}: {k}")
        init = st_reader.read_safetensors(os.path.join(self.qwen3 if "qwen3" in what else self.llama,
                                                       "model.safetensors"), np.float32)
        for k in wa:
            moved = max(moved, float(np.abs(wa[k] - init[k]).max()))
        self.assertGreater(moved, 1e-4, f"{what}: training moved no weight")

    def layout(self, model, tp, dpr, dps, *extra, batch=1, accum=1, mpi=False, evaluate=False):
        dp = dpr * dps
        tag = (f"{os.path.basename(model)}-tp{tp}-r{dpr}-s{dps}-b{batch}-a{accum}{'-mpi' if mpi else ''}"
               f"{'-eval' if evaluate else ''}{'-'.join(map(str, extra))}")
        out = os.path.join(self.work, tag)
        args = self.args(model, out, batch, "--grad-accum", accum, "--tp", tp, "--dp-replicate", dpr,
                         "--dp-shard", dps, "--check-replicas", *self.eval_args(evaluate), *extra)
        if mpi:
            # The job's ranks started by mpirun: each joins with the mesh.
            p = subprocess.run(["mpirun", "--oversubscribe", "-n", str(tp * dp), BIN, *map(str, args)],
                               capture_output=True, text=True, timeout=300, env=job_env(mpi=True))
            self.assertEqual(p.returncode, 0, p.stderr)
        else:
            run(*args)
        self.assert_same_run(out, self.ref(model, batch * dp, accum, evaluate), tag)

    def test_2d_meshes(self):
        self.layout(self.qwen3, 1, 2, 1, batch=2)
        self.layout(self.qwen3, 1, 1, 2, batch=2)
        self.layout(self.qwen3, 2, 2, 1)
        self.layout(self.llama, 2, 1, 2)

    def test_3d_meshes_and_grad_accum(self):
        self.layout(self.qwen3, 1, 2, 2, accum=2)
        self.layout(self.llama, 1, 2, 2)
        self.layout(self.llama, 1, 1, 2, batch=2, accum=3)

    def test_eval_and_vocab_parallel_loss(self):
        self.layout(self.qwen3, 1, 1, 2, batch=2, evaluate=True)
        self.layout(self.llama, 1, 2, 1, batch=2, evaluate=True)
        self.layout(self.qwen3, 2, 1, 2, "--loss", "vocab-parallel")

    def test_bf16_with_dp_shard(self):
        """--dtype bf16 under --dp-shard: the chunks are the f32 masters, gathered rounded to bf16; bitwise the
        --dp-replicate run (same sums), close to one process; its checkpoints resume bitwise (masters saved)."""
        w = lambda x: os.path.join(self.work, x)  # noqa: E731
        bf = ["--dtype", "bf16", "--steps", 4]
        run(*self.args(self.qwen3, w("bf-dpr"), 1, *bf, "--dp-replicate", 2))
        run(*self.args(self.qwen3, w("bf-dps"), 1, *bf, "--dp-shard", 2, "--check-replicas"))
        run(*self.args(self.qwen3, w("bf-one"), 2, *bf))
        def keys(log):
            return [(e["step"], e["loss"], e["lr"], e["grad_norm"]) for e in log]
        self.assertEqual(keys(read_log(w("bf-dps"))), keys(read_log(w("bf-dpr"))))
        self.assertEqual(len(read_log(w("bf-dps"))), 4)
        with open(w("bf-dps/model.safetensors"), "rb") as a, open(w("bf-dpr/model.safetensors"), "rb") as b:
            self.assertEqual(a.read(), b.read())
        for x, y in zip(read_log(w("bf-dps")), read_log(w("bf-one"))):
            self.assertLess(abs(x["loss"] - y["loss"]), 1e-4)
        run(*self.args(self.qwen3, w("bf-part"), 1, *bf, "--dp-shard", 2, "--tp", 2, "--save-every", 2))
        run(*self.args(self.qwen3, w("bf-whole"), 1, *bf, "--dp-shard", 2, "--tp", 2))
        run(*self.args(self.qwen3, w("bf-res"), 1, *bf, "--dp-shard", 2, "--tp", 2, "--resume",
                       w("bf-part/checkpoint-2")))
        self.assertEqual(keys(read_log(w("bf-res"))), keys(read_log(w("bf-whole"))))
        with open(w("bf-res/model.safetensors"), "rb") as a, open(w("bf-whole/model.safetensors"), "rb") as b:
            self.assertEqual(a.read(), b.read())
        opt = st_reader.read_safetensors(w("bf-part/checkpoint-2/optimizer.safetensors"), np.float32)
        self.assertIn("model.embed_tokens.weight.master", opt)

    def test_checkpoints_with_dp_replicate(self):
        """2 steps, a checkpoint, 2 resumed steps: bitwise the 4 uninterrupted steps (one TP group writes)."""
        common = ["--tp", 2, "--dp-replicate", 2, "--grad-accum", 1]
        whole, part, resumed = (os.path.join(self.work, x) for x in ("ck-whole", "ck-part", "ck-resumed"))
        run(*self.args(self.qwen3, whole, 1, *common))
        run(*self.args(self.qwen3, part, 1, *common, "--save-every", 2))
        run(*self.args(self.qwen3, resumed, 1, *common, "--resume", os.path.join(part, "checkpoint-2")))
        def keys(log):
            return [(e["step"], e["loss"], e["lr"], e["grad_norm"]) for e in log]
        self.assertEqual(keys(read_log(resumed)), keys(read_log(whole)))
        with open(os.path.join(whole, "model.safetensors"), "rb") as a, \
                open(os.path.join(resumed, "model.safetensors"), "rb") as b:
            self.assertEqual(a.read(), b.read())

    def assert_close_logs(self, a, b, what):
        assert_runs_close(self, a, b, what, TOL)

    def test_checkpoints_with_dp_shard(self):
        """--dp-shard 2 x --tp 2 saves its chunks gathered: 2 + 2 resumed steps are bitwise the 4 steps at the
        same layout; resumed at --dp-replicate 2 or one process, and a one-process checkpoint resumed under
        --dp-shard, within 1e-5; the optimizer file holds what a one-process checkpoint holds."""
        shard = ["--tp", 2, "--dp-shard", 2]
        w = lambda x: os.path.join(self.work, x)  # noqa: E731
        run(*self.args(self.qwen3, w("cks-whole"), 1, *shard))
        run(*self.args(self.qwen3, w("cks-part"), 1, *shard, "--save-every", 2))
        ck = w("cks-part/checkpoint-2")
        run(*self.args(self.qwen3, w("cks-resumed"), 1, *shard, "--resume", ck))
        def keys(log):
            return [(e["step"], e["loss"], e["lr"], e["grad_norm"]) for e in log]
        self.assertEqual(keys(read_log(w("cks-resumed"))), keys(read_log(w("cks-whole"))))
        with open(w("cks-whole/model.safetensors"), "rb") as a, open(w("cks-resumed/model.safetensors"), "rb") as b:
            self.assertEqual(a.read(), b.read())
        # Other layouts read the gathered state back (resharded on read).
        run(*self.args(self.qwen3, w("cks-dpr"), 1, "--tp", 2, "--dp-replicate", 2, "--resume", ck))
        self.assert_close_logs(w("cks-dpr"), w("cks-whole"), "dps2 saved, dpr2 x tp2 resumed")
        run(*self.args(self.qwen3, w("cks-one"), 2, "--resume", ck))
        self.assert_close_logs(w("cks-one"), w("cks-whole"), "dps2 saved, one process resumed")
        run(*self.args(self.qwen3, w("cks-one-part"), 2, "--save-every", 2))
        run(*self.args(self.qwen3, w("cks-from-one"), 1, *shard, "--resume", w("cks-one-part/checkpoint-2")))
        self.assert_close_logs(w("cks-from-one"), w("cks-whole"), "one process saved, dps2 x tp2 resumed")
        a = st_reader.read_safetensors(os.path.join(ck, "optimizer.safetensors"), np.float32)
        b = st_reader.read_safetensors(w("cks-one-part/checkpoint-2/optimizer.safetensors"), np.float32)
        self.assertEqual({k: v.shape for k, v in a.items()}, {k: v.shape for k, v in b.items()})
        for k in a:
            self.assertLess(float(np.abs(a[k] - b[k]).max()), 1e-4, k)
        self.assertGreater(max(float(np.abs(v).max()) for v in a.values()), 0)

    def test_gradient_checkpointing(self):
        """--gradient-checkpointing (each decoder layer recomputed inside its backward) gives bitwise the losses,
        gradient norms and weights of the run without it: one process, TP, TP x dp-shard, dp-shard with the
        vocabulary-parallel loss, and a LoRA adapter."""
        def keys(log):
            return [(e["step"], e["loss"], e["lr"], e["grad_norm"]) for e in log]
        for model, layout in ((self.qwen3, []), (self.llama, ["--tp", 2]),
                              (self.qwen3, ["--tp", 2, "--dp-shard", 2]),
                              (self.llama, ["--dp-shard", 2, "--loss", "vocab-parallel"])):
            outs = []
            for gc in ([], ["--gradient-checkpointing"]):
                out = os.path.join(self.work, f"gc-{os.path.basename(model)}-{'-'.join(map(str, layout))}{len(gc)}")
                run(*self.args(model, out, 1, *layout, *gc))
                outs.append(out)
            self.assertEqual(keys(read_log(outs[1])), keys(read_log(outs[0])), layout)
            self.assertEqual(len(read_log(outs[0])), 5)
            with open(os.path.join(outs[0], "model.safetensors"), "rb") as a, \
                    open(os.path.join(outs[1], "model.safetensors"), "rb") as b:
                self.assertEqual(a.read(), b.read(), layout)
        # LoRA's backward reads the layer's recomputed inputs: the adapter is bitwise the same too.
        outs = []
        for gc in ([], ["--gradient-checkpointing"]):
            outs.append(os.path.join(self.work, f"gc-lora{len(gc)}"))
            run(*self.args(self.llama, outs[-1], 2, "--lora-r", 4, "--lora-target", "q_proj,v_proj,down_proj", *gc))
        self.assertEqual(keys(read_log(outs[1])), keys(read_log(outs[0])))
        with open(os.path.join(outs[0], "adapter_model.safetensors"), "rb") as a, \
                open(os.path.join(outs[1], "adapter_model.safetensors"), "rb") as b:
            self.assertEqual(a.read(), b.read())

    def test_under_mpirun(self):
        if not HAVE_MPI:
            self.skipTest("no mpi backend")
        self.layout(self.qwen3, 2, 1, 2, mpi=True)
        self.layout(self.llama, 1, 2, 2, mpi=True)

    def test_sizes_must_multiply_to_the_world(self):
        if not HAVE_MPI:
            self.skipTest("no mpi backend")
        out = os.path.join(self.work, "bad")
        p = subprocess.run(["mpirun", "--oversubscribe", "-n", "2", BIN,
                            *map(str, self.args(self.qwen3, out, 1, "--tp", 2, "--dp-shard", 2))],
                           capture_output=True, text=True, timeout=120, env=job_env(mpi=True))
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("ParallelismConfig sizes multiply to 4 (dp_replicate=1, dp_shard=2, cp=1, tp=2), "
                      "but WORLD_SIZE is 2.", p.stderr)
        self.assertFalse(os.path.exists(os.path.join(out, "model.safetensors")))


if __name__ == "__main__":
    unittest.main()
