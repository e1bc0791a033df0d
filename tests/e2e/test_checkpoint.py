#!/usr/bin/python3
"""Checkpoints (tp-semantics §6.4) on tiny made models:

* the saved directory is byte for byte the TP = 1 save at TP = 2, 3, 4 and
  6 (uneven MLP and vocabulary shards, KV-head replication), under mpirun too, sharded by --max-shard-size
  into model-0000k-of-0000N files with the index huggingface_hub writes;
* 2 + 2 resumed steps give bitwise the weights and losses of 4 steps at the
  same TP, and within 1e-5 at TP = 1 and 4 from a TP = 2 checkpoint;
* --save-total-limit keeps the newest, --resume latest continues;
* a full disk (RLIMIT_FSIZE, SIGXFSZ ignored: EFBIG) fails naming the file,
  leaves no temporary directory and the previous checkpoint intact;
* kill -9 of a rank at random points of runs that save every step, 20
  times: every checkpoint left is byte-equal to the uninterrupted run's and
  loads;
* under --dp-shard every rank writes its own chunks: the files are the TP = 1
  save's (and the --dp-replicate run's) byte for byte, and no rank's peak
  memory grows by a TP shard while it saves;
* a diverging run keeps its last good checkpoint."""
import filecmp
import json
import os
import shutil
import random
import resource
import signal
import subprocess
import sys
import tempfile
import time
import unittest

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "reference"))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "faults"))
from tpe2e import BIN, HAVE_MPI, MPI_SKIP, job_env, read_log, run, write_token_rows  # noqa: E402
import hf_reference as st_reader  # noqa: E402
from faults import rank_pids  # noqa: E402

TOL = 1e-5


def model_files(d):
    return sorted(f for f in os.listdir(d) if f.startswith("model"))


def same_tree(a, b):
    """Names of the files that differ between directories a and b (none:
    equal); a checkpoint's train_log.jsonl is compared without its timings."""
    fa, fb = sorted(os.listdir(a)), sorted(os.listdir(b))
    if fa != fb:
        return [f"file lists differ: {fa} vs {fb}"]
    differ = []
    for f in fa:
        if f == "train_log.jsonl":
            strip = [[{k: v for k, v in e.items() if k != "tokens_per_s"} for e in read_log(d)] for d in (a, b)]
            if strip[0] != strip[1]:
                differ.append(f)
        elif not filecmp.cmp(os.path.join(a, f), os.path.join(b, f), shallow=False):
            differ.append(f)
    return differ


def read_model(d):
    """Every tensor of a saved model directory (sharded or not), float32."""
    idx = os.path.join(d, "model.safetensors.index.json")
    files = ["model.safetensors"]
    if os.path.exists(idx):
        with open(idx) as fh:
            files = sorted(set(json.load(fh)["weight_map"].values()))
    out = {}
    for f in files:
        out.update(st_reader.read_safetensors(os.path.join(d, f), np.float32))
    return out



def slurp_dir(d):
    """Every file of d (not recursive) by name, its bytes."""
    out = {}
    for n in sorted(os.listdir(d)):
        if os.path.isfile(os.path.join(d, n)):
            with open(os.path.join(d, n), "rb") as f:
                out[n] = f.read()
    return out

class Checkpoint(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.work = cls.tmp.name
        cls.llama = os.path.join(cls.work, "llama")
        run("make-model", "--arch", "llama", "--preset", "tiny", "--dtype", "f32", "--out", cls.llama)
        # 12 heads: TP 1 to 4 on one model; intermediate 100 and vocab 512: uneven shards at 3.
        cls.llama12 = os.path.join(cls.work, "llama12")
        run("make-model", "--arch", "llama", "--preset", "tiny", "--dtype", "f32", "--set", "hidden_size=96",
            "--set", "num_attention_heads=12", "--set", "num_key_value_heads=12", "--set", "intermediate_size=100",
            "--out", cls.llama12)
        # 6 heads over 3 KV heads: TP 3 and 6 (KV replicated); intermediate 100: uneven shards at 3 and 6.
        cls.qwen3 = os.path.join(cls.work, "qwen3")
        run("make-model", "--arch", "qwen3", "--preset", "tiny", "--dtype", "bf16", "--set", "num_attention_heads=6",
            "--set", "num_key_value_heads=3", "--set", "head_dim=8", "--set", "intermediate_size=100",
            "--set", "tie_word_embeddings=true", "--out", cls.qwen3)
        rng = np.random.default_rng(3)
        cls.data = write_token_rows(os.path.join(cls.work, "d.jsonl"), rng, 16, 500, lambda i: int(rng.integers(6, 20)))

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def train_args(self, out, model=None, tp=1, steps=4):
        return ["train", "--model", model or self.llama, "--data", self.data, "--out", out, "--tp", tp,
                "--seq-len", 12, "--steps", steps, "--lr", "3e-3", "--warmup-steps", 1, "--weight-decay", "0.1",
                "--batch-size", 4, "--grad-accum", 2, "--threads", 1, "--max-shard-size", "100KB"]

    def train(self, name, *extra, model=None, tp=1, steps=4, check=True):
        out = os.path.join(self.work, name)
        p = run(*self.train_args(out, model, tp, steps), *extra, check=check)
        return out, p

    def test_save_is_byte_exact_at_every_tp(self):
        # lr 0: the weights stay those loaded, so every TP saves the same values.
        for model, sizes, dtype in ((self.llama12, (1, 2, 3, 4), "f32"), (self.qwen3, (1, 3, 6), "bf16")):
            tag = os.path.basename(model)
            outs = {}
            for tp in sizes:
                outs[tp], _ = self.train(f"exact-{tag}-{tp}", "--lr", "0", "--dtype", dtype, model=model, tp=tp,
                                         steps=1)
            files = model_files(outs[1])
            self.assertIn("model.safetensors.index.json", files, tag)
            self.assertGreaterEqual(len(files), 3, f"{tag}: --max-shard-size 100KB gives several files")
            for tp in sizes[1:]:
                self.assertEqual(model_files(outs[tp]), files, f"{tag} TP={tp}")
                for f in files:
                    self.assertTrue(filecmp.cmp(os.path.join(outs[1], f), os.path.join(outs[tp], f), shallow=False),
                                    f"{tag}: {f} at TP={tp} differs from TP=1")
            # The values are the source model's, and the index is huggingface_hub's.
            src = st_reader.read_safetensors(os.path.join(model, "model.safetensors"), np.float32)
            got = read_model(outs[1])
            self.assertEqual(sorted(src), sorted(got), tag)
            for k in src:
                self.assertTrue(np.array_equal(src[k], got[k]), f"{tag}: {k}")
            with open(os.path.join(outs[1], "model.safetensors.index.json")) as fh:
                index_text = fh.read()
            index = json.loads(index_text)
            self.assertEqual(index_text, json.dumps(index, indent=2, sort_keys=True) + "\n")
            itemsize = 4 if dtype == "f32" else 2
            self.assertEqual(index["metadata"]["total_size"], sum(v.size for v in src.values()) * itemsize)
            self.assertEqual(index["metadata"]["total_parameters"], sum(v.size for v in src.values()))
            for f in files:   # at most the limit, or one tensor alone (huggingface_hub's rule)
                if f.endswith(".safetensors"):
                    held = [k for k, v in index["weight_map"].items() if v == f]
                    data = sum(src[k].size for k in held) * itemsize
                    self.assertTrue(data <= 100000 or len(held) == 1, f"{f}: {data} bytes in {len(held)} tensors")
            # Inside a file: names sorted, __metadata__ first, data back to back.
            first = os.path.join(outs[1], files[0])
            with open(first, "rb") as fh:
                n = int.from_bytes(fh.read(8), "little")
                header = json.loads(fh.read(n))
            names = [k for k in header if k != "__metadata__"]
            self.assertEqual(list(header)[0], "__metadata__")
            self.assertEqual(names, sorted(names))
            self.assertEqual(n % 8, 0)

    def test_save_under_mpi(self):
        """The ranks of an mpirun job (their own processes, the temporary
        directory's path broadcast) write the same bytes."""
        if not HAVE_MPI:
            self.skipTest(MPI_SKIP)
        ref, _ = self.train("mpi-ref", "--lr", "0", steps=1)
        out, _ = self.train("mpi", "--lr", "0", "--backend", "mpi", "--save-every", 1, steps=1, tp=2)
        for f in model_files(ref):
            self.assertTrue(filecmp.cmp(os.path.join(ref, f), os.path.join(out, f), shallow=False), f)
        self.assertTrue(os.path.exists(os.path.join(out, "checkpoint-1", "optimizer.safetensors.index.json")))

    def dp_save(self, name, model, dtype, *layout):
        """One step at lr 0 (the weights stay the loaded ones, whatever the layout) saving checkpoint-1."""
        out = os.path.join(self.work, name)
        run("train", "--model", model, "--data", self.data, "--out", out, "--seq-len", 12, "--steps", 1, "--lr", "0",
            "--batch-size", 1, "--threads", 1, "--max-shard-size", "100KB", "--save-every", 1, "--dtype", dtype,
            *layout)
        return out

    def test_dp_shard_save_is_byte_exact(self):
        """Under --dp-shard each rank writes its chunks' bytes (chunks that cross rows of column shards, uneven
        ones at 3, KV heads replicated at TP 3): the checkpoint's model files are byte for byte the TP = 1 save,
        and the whole checkpoint (optimizer files included) that of the --dp-replicate run of the same layout,
        which the TP writer saves; a bf16 model's f32 masters are the TP = 1 ones."""
        for model, dtype, layouts in ((self.llama12, "f32", (("--tp", 2, "--dp-shard", 2), ("--dp-shard", 3),
                                                            ("--dp-replicate", 2, "--dp-shard", 2))),
                                      (self.qwen3, "bf16", (("--tp", 3, "--dp-shard", 2),))):
            tag = os.path.basename(model)
            one = self.dp_save(f"dpx-{tag}-one", model, dtype)
            files = model_files(one)
            self.assertGreaterEqual(len(files), 3, tag)
            for layout in layouts:
                what = f"{tag} {' '.join(map(str, layout))}"
                name = "-".join(map(str, layout)).replace("--", "")
                sharded = self.dp_save(f"dpx-{tag}-{name}", model, dtype, *layout)
                for d in (sharded, os.path.join(sharded, "checkpoint-1")):
                    self.assertEqual(model_files(d), files, what)
                    for f in files:
                        self.assertTrue(filecmp.cmp(os.path.join(one, f), os.path.join(d, f), shallow=False),
                                        f"{what}: {d}/{f} differs from TP=1")
                if "--dp-replicate" in layout:
                    continue   # one replica of two saved; its moments are summed in another order than dpr 4's
                replica = self.dp_save(f"dpx-{tag}-{name}-rep", model, dtype,
                                       *("--dp-replicate" if x == "--dp-shard" else x for x in layout))
                ck, rep = os.path.join(sharded, "checkpoint-1"), os.path.join(replica, "checkpoint-1")
                self.assertIn("optimizer.safetensors.index.json", os.listdir(ck), what)
                self.assertEqual(same_tree(ck, rep), [], what)
                if dtype == "bf16":
                    def masters(d):
                        with open(os.path.join(d, "optimizer.safetensors.index.json")) as fh:
                            shards = sorted(set(json.load(fh)["weight_map"].values()))
                        out = {}
                        for f in shards:
                            out.update(st_reader.read_safetensors(os.path.join(d, f), np.float32))
                        return {k: v for k, v in out.items() if k.endswith(".master")}
                    a, b = masters(ck), masters(os.path.join(one, "checkpoint-1"))
                    self.assertTrue(a and sorted(a) == sorted(b), what)
                    for k in a:
                        self.assertTrue(np.array_equal(a[k], b[k]), f"{what}: {k}")

    def test_dp_shard_save_gathers_no_shard(self):
        """A --dp-shard 2 x --tp 2 checkpoint holds no whole TP shard on any rank: saving every step raises the
        largest rank's peak RSS (wait4 over the job's processes) by less than a quarter of a TP shard's weights
        (a gather would add the shard and its two AdamW moments)."""
        if os.environ.get("TENSORPAR_SANITIZED") == "1":
            self.skipTest("ASan's quarantine and shadow memory are not the program's peak")
        model = os.path.join(self.work, "small8")
        run("make-model", "--arch", "llama", "--preset", "small", "--dtype", "f32", "--set", "num_hidden_layers=8",
            "--out", model)
        rng = np.random.default_rng(5)
        data = write_token_rows(os.path.join(self.work, "d4096.jsonl"), rng, 8, 4096, lambda i: 16)

        def peak_kib(out, *extra):
            cmd = [BIN, "train", "--model", model, "--data", data, "--out", out, "--seq-len", "16", "--steps", "2",
                   "--batch-size", "1", "--no-shuffle", "--threads", "1", "--tp", "2", "--dp-shard", "2",
                   *map(str, extra)]
            p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=job_env())
            err = p.stderr.read()
            _, status, ru = os.wait4(p.pid, 0)
            self.assertEqual(os.waitstatus_to_exitcode(status), 0, err)
            return ru.ru_maxrss

        plain = peak_kib(os.path.join(self.work, "mem-plain"))
        saving = peak_kib(os.path.join(self.work, "mem-save"), "--save-every", 1, "--save-total-limit", 1)
        self.assertTrue(os.path.exists(os.path.join(self.work, "mem-save", "checkpoint-2", "optimizer.safetensors")))
        shard_kib = os.path.getsize(os.path.join(model, "model.safetensors")) / 2 / 1024
        self.assertLess(saving - plain, shard_kib / 4, f"peak RSS {plain} KiB without saves, {saving} KiB with")

    def test_single_file_when_it_fits(self):
        # First sharded, then into the same OUT in one file: the old shards and index go.
        out, _ = self.train("single", "--lr", "0", steps=1, tp=2)
        self.assertIn("model.safetensors.index.json", model_files(out))
        out, _ = self.train("single", "--lr", "0", "--max-shard-size", "5GB", steps=1, tp=2)
        self.assertEqual(model_files(out), ["model.safetensors"])
        self.assertEqual([d for d in os.listdir(self.work) if d.startswith(".single.")], [])

    def test_resume_is_bitwise_at_the_same_tp(self):
        full, _ = self.train("full", tp=2)
        part, _ = self.train("part", "--save-every", 2, tp=2)
        ck = os.path.join(part, "checkpoint-2")
        for f in ("trainer_state.json", "scheduler.json", "rng_state.json", "optimizer.safetensors.index.json",
                  "config.json", "generation_config.json", "model.safetensors.index.json"):
            self.assertTrue(os.path.exists(os.path.join(ck, f)), f)
        with open(os.path.join(ck, "trainer_state.json")) as fh:
            state = json.load(fh)
        self.assertEqual(state["global_step"], 2)
        self.assertEqual(state["optimizer"], {"kind": "adamw", "steps": 2})
        self.assertEqual(state["data"]["epoch"], 1)   # 16 rows, 8 per step: epoch 1 starts at step 3
        res, _ = self.train("res", "--resume", ck, tp=2)
        lf, lr = read_log(full), read_log(res)
        self.assertEqual([e["step"] for e in lr], [1, 2, 3, 4])   # the checkpoint's history, then its own
        for a, b in zip(lf, lr):
            self.assertEqual(a["loss"], b["loss"], f"step {a['step']}")
            self.assertEqual(a["grad_norm"], b["grad_norm"], f"step {a['step']}")
        for f in model_files(full):
            self.assertTrue(filecmp.cmp(os.path.join(full, f), os.path.join(res, f), shallow=False), f)
        # Other TP sizes read the TP = 2 checkpoint's shards back (optimizer state resharded on read).
        wf = read_model(full)
        for tp in (1, 4):
            other, _ = self.train(f"res-tp{tp}", "--resume", ck, tp=tp)
            for a, b in zip(lf[2:], read_log(other)[2:]):
                self.assertLess(abs(a["loss"] - b["loss"]), TOL, f"TP={tp} step {a['step']}")
            wo = read_model(other)
            for k in wf:
                self.assertLess(float(np.abs(wf[k] - wo[k]).max()), TOL, f"TP={tp}: {k}")

    def test_corrupt_checkpoint_is_refused(self):
        """A damaged checkpoint file stops the resume with the file's name and
        a non-zero exit; the checkpoint itself is left as it was."""
        part, _ = self.train("corrupt", "--save-every", 2, steps=2)
        ck = os.path.join(part, "checkpoint-2")
        opt = sorted(f for f in os.listdir(ck) if f.startswith("optimizer") and f.endswith(".safetensors"))[0]
        cases = (("trainer_state.json", lambda f: f.write(b"garbage{"), "trainer_state.json"),
                 (opt, lambda f: f.truncate(200), opt),
                 (sorted(f for f in model_files(ck) if f.endswith(".safetensors"))[0], lambda f: f.truncate(300),
                  ".safetensors"))
        for name, damage, needle in cases:
            with self.subTest(file=name):
                bad = os.path.join(self.work, "corrupt-" + name.replace(".", "-"))
                shutil.copytree(part, bad)
                with open(os.path.join(bad, "checkpoint-2", name), "r+b") as f:
                    f.seek(0)
                    damage(f)
                before = slurp_dir(os.path.join(bad, "checkpoint-2"))
                _, p = self.train(os.path.basename(bad), "--resume", "latest", check=False)
                self.assertNotEqual(p.returncode, 0)
                self.assertIn(needle, p.stderr)
                self.assertIn("error", p.stderr)
                self.assertEqual(slurp_dir(os.path.join(bad, "checkpoint-2")), before)

    def test_resume_bf16_sgd_is_bitwise(self):
        """bf16 weights train through f32 masters, and the norms stay f32:
        the checkpoint keeps those f32 values beside the bf16 model file."""
        extra = ("--dtype", "bf16", "--optim", "sgd", "--momentum", "0.9")
        full, _ = self.train("bf-full", *extra, model=self.qwen3, tp=3)
        part, _ = self.train("bf-part", *extra, "--save-every", 2, model=self.qwen3, tp=3)
        res, _ = self.train("bf-res", *extra, "--resume", os.path.join(part, "checkpoint-2"), model=self.qwen3, tp=3)
        self.assertEqual([e["loss"] for e in read_log(full)], [e["loss"] for e in read_log(res)])
        for f in model_files(full):
            self.assertTrue(filecmp.cmp(os.path.join(full, f), os.path.join(res, f), shallow=False), f)

    def test_total_limit_and_resume_latest(self):
        # A constant schedule: 3 steps then 2 more are the 5 steps of one run.
        const = ("--lr-scheduler", "constant")
        out, _ = self.train("limit", "--save-every", 1, "--save-total-limit", 2, *const, tp=2, steps=3)
        self.assertEqual(sorted(d for d in os.listdir(out) if d.startswith("checkpoint")),
                         ["checkpoint-2", "checkpoint-3"])
        self.assertEqual([d for d in os.listdir(out) if d.startswith(".")], [])
        full, _ = self.train("limit-full", *const, tp=2, steps=5)
        res, _ = self.train("limit", "--resume", "latest", "--save-every", 1, "--save-total-limit", 2, *const, tp=2,
                            steps=5)
        self.assertEqual([e["step"] for e in read_log(res)], [1, 2, 3, 4, 5])
        self.assertEqual(read_log(full)[4]["loss"], read_log(res)[-1]["loss"])
        p = run(*self.train_args(os.path.join(self.work, "none"), steps=2), "--resume", "latest", check=False)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("no checkpoint-<step> directory", p.stderr)
        p = run(*self.train_args(out, steps=5), "--resume", "latest", "--batch-size", 2, check=False)
        self.assertIn("--batch-size 4, this run has 2", p.stderr)

    def test_full_disk_keeps_the_previous_checkpoint(self):
        out, _ = self.train("disk", "--save-every", 1, tp=1, steps=1)
        ck1 = os.path.join(out, "checkpoint-1")
        copy = os.path.join(self.work, "disk-copy")
        subprocess.run(["cp", "-a", ck1, copy], check=True)

        def limit():
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
            resource.setrlimit(resource.RLIMIT_FSIZE, (60000, 60000))

        p = subprocess.run([BIN, *map(str, self.train_args(out, steps=3)), "--save-every", "1", "--resume", "latest"],
                           capture_output=True, text=True, preexec_fn=limit, env=job_env(), timeout=120)
        self.assertNotEqual(p.returncode, 0)
        self.assertRegex(p.stderr, r"checkpoint-2\.tmp-[0-9]+/(model|optimizer)[^:]*\.safetensors: cannot allocate "
                                   r"[0-9]+ bytes: File too large")
        left = [d for d in os.listdir(out) if d.startswith(".") or d == "checkpoint-2"]
        left += [d for d in os.listdir(self.work) if d.startswith(".disk.")]
        self.assertEqual(left, [], "no temporary directory, no checkpoint-2")
        self.assertEqual(same_tree(ck1, copy), [])
        run("logits", "--model", ck1, "--tokens", "1,2,3", "--out", os.path.join(self.work, "disk.npy"))

    def test_kill_a_rank_during_saves(self):
        """kill -9 of a random rank at a random moment of a run that saves
        every step, 20 times: what is left is a prefix of the uninterrupted
        run's checkpoints, byte for byte."""
        ref, _ = self.train("kill-ref", "--save-every", 1, tp=2, steps=8)
        out = os.path.join(self.work, "kill")
        args = [BIN, *map(str, self.train_args(out, tp=2, steps=8)), "--save-every", "1", "--save-total-limit", "2"]
        t0 = time.monotonic()
        subprocess.run(args, capture_output=True, env=job_env(), check=True)
        duration = time.monotonic() - t0
        subprocess.run(["rm", "-rf", out], check=True)
        rng = random.Random(14)
        during_save = 0
        for i in range(20):
            has = os.path.isdir(out) and any(d.startswith("checkpoint-") for d in os.listdir(out))
            resume = ["--resume", "latest"] if has else []
            p = subprocess.Popen(args + resume, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=job_env())
            time.sleep(rng.uniform(0.05, duration))
            # Only the ranks: under LeakSanitizer the launcher's exit-time
            # check runs in a child of its own, and killing that one leaves
            # the launcher stopped forever.
            ranks = list(rank_pids(p.pid).values())
            if ranks and p.poll() is None:
                os.kill(rng.choice(ranks), signal.SIGKILL)
            p.wait(timeout=60)
            if os.path.isdir(out) and any(".tmp-" in d for d in os.listdir(out)):
                during_save += 1
            cks = sorted((d for d in os.listdir(out) if d.startswith("checkpoint-")), key=lambda d: int(d[11:])) \
                if os.path.isdir(out) else []
            for d in cks:
                self.assertEqual(same_tree(os.path.join(out, d), os.path.join(ref, d)), [], f"kill {i}: {d}")
            if cks:   # the newest one loads
                run("logits", "--model", os.path.join(out, cks[-1]), "--tokens", "1,2,3",
                    "--out", os.path.join(self.work, "kill.npy"))
            if p.returncode == 0:   # finished before the kill: start again
                subprocess.run(["rm", "-rf", out], check=True)
        print(f"{during_save} of 20 kills left a save half done", file=sys.stderr)
        self.assertGreater(during_save, 0)

    def test_diverging_run_keeps_the_last_good_checkpoint(self):
        out, p = self.train("nan", "--save-every", 1, "--lr", "1e38", "--warmup-steps", 3, "--max-grad-norm", "0",
                            steps=6, check=False)
        self.assertNotEqual(p.returncode, 0)
        self.assertRegex(p.stderr, r"step [0-9]+: (the loss is (nan|inf)|.* is (nan|inf) after the update)")
        cks = sorted(d for d in os.listdir(out) if d.startswith("checkpoint-"))
        self.assertTrue(cks)
        for d in cks:
            for k, v in read_model(os.path.join(out, d)).items():
                self.assertTrue(np.isfinite(v).all(), f"{d}: {k}")
        self.assertFalse(any(f.startswith("model") for f in os.listdir(out)), "no final model after a failure")


if __name__ == "__main__":
    unittest.main()
