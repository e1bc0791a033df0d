#!/usr/bin/python3
"""End-to-end: launch and command-line hygiene (tp-semantics §5.3, scenario C8).

  - WORLD_SIZE > 1 without RANK (or a bad RANK) is an error naming RANK, at once;
  - a missing model directory, a bad option or a bad value is a usage error
    (exit 2) reported once, before any rank is started;
  - a config or plan error is reported once, before any rank is started with
    --tp N, and once (by rank 0, without a rank) inside a launched job, while
    an error of one rank carries "[rank r]";
  - make-model --set refuses unknown keys and checks only the final config;
  - an option given twice takes its last value, a repeatable one collects all;
  - --dtype f16 is refused; an f16 checkpoint loads (converted to f32, exactly);
  - generate stops at max_position_embeddings with one warning;
  - exit statuses are documented in every --help.

    TENSORPAR_BIN=build/tensorpar /usr/bin/python3 tests/e2e/test_cli_hygiene.py [-v]
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "reference"))
from tpe2e import BIN, job_env  # noqa: E402

WORK = MODEL = None
ENV = job_env()


def tp(*args, env=None, timeout=120):
    """Runs tensorpar ARGS; (returncode, stdout, stderr, seconds)."""
    t0 = time.time()
    p = subprocess.run([BIN, *map(str, args)], capture_output=True, text=True, timeout=timeout,
                       env=dict(ENV, **(env or {})))
    return p.returncode, p.stdout, p.stderr, time.time() - t0


def setUpModule():
    global WORK, MODEL
    WORK = tempfile.mkdtemp(prefix="tp-e2e-cli-")
    MODEL = os.path.join(WORK, "llama")
    rc, _, err, _ = tp("make-model", "--arch", "llama", "--preset", "tiny", "--seed", "5", "--out", MODEL)
    if rc:
        raise RuntimeError(err)


def tearDownModule():
    if WORK and not os.environ.get("TENSORPAR_KEEP_TMP"):
        shutil.rmtree(WORK, ignore_errors=True)


class Launch(unittest.TestCase):
    def test_world_size_without_rank(self):
        """C8: an error naming RANK, non-zero exit, no hang, not a silent single process."""
        out = os.path.join(WORK, "c8.npy")
        rc, so, err, secs = tp("logits", "--model", MODEL, "--tokens", "1,2", "--out", out, env={"WORLD_SIZE": "2"})
        self.assertEqual(rc, 1, err)
        self.assertIn("We tried to initialize the process group for you, but it failed: "
                      "WORLD_SIZE is 2 but RANK is not set. Launch one process per rank with RANK, WORLD_SIZE "
                      "and LOCAL_RANK set (torchrun-style), or with mpirun.", err)
        self.assertEqual(err.count("\n"), 1, err)
        self.assertLess(secs, 10)
        self.assertFalse(os.path.exists(out), "a single process ran anyway")
        rc, _, err, _ = tp("logits", "--model", MODEL, "--tokens", "1,2", "--out", out,
                           env={"WORLD_SIZE": "2", "RANK": "2"})
        self.assertEqual(rc, 1)
        self.assertIn("RANK=2 must be smaller than WORLD_SIZE=2", err)
        rc, _, err, _ = tp("logits", "--model", MODEL, "--tokens", "1,2", "--out", out,
                           env={"WORLD_SIZE": "two", "RANK": "0"})
        self.assertEqual(rc, 1)
        self.assertIn("WORLD_SIZE='two'", err)
        # WORLD_SIZE=1 alone is a single process, as before
        rc, _, err, _ = tp("logits", "--model", MODEL, "--tokens", "1,2", "--out", out, env={"WORLD_SIZE": "1"})
        self.assertEqual(rc, 0, err)

    def assert_once_before_spawn(self, args, code, text):
        """One line on stderr, none on stdout, no rank started (no [rank r], no
        launcher report) and a quick exit."""
        rc, so, err, secs = tp(*args)
        self.assertEqual(rc, code, err)
        self.assertIn(text, err)
        self.assertEqual(err.count("\n"), 1, f"expected one message, got {err!r}")
        self.assertNotIn("[rank", err)
        self.assertNotIn("stopping the other ranks", err)
        self.assertEqual(so, "")
        self.assertLess(secs, 10)

    def test_usage_errors_before_spawn(self):
        gen = ("generate", "--tp", "2", "--tokens", "1,2")
        self.assert_once_before_spawn((*gen, "--model", "/nonexistent"), 2, "--model /nonexistent: No such file")
        self.assert_once_before_spawn((*gen, "--model", os.path.join(MODEL, "config.json")), 2, "not a directory")
        self.assert_once_before_spawn((*gen, "--model", MODEL, "--bogus"), 2, "unknown option '--bogus'")
        self.assert_once_before_spawn((*gen, "--model", MODEL, "--temperature", "abc"), 2,
                                      "option --temperature expects a number, got 'abc'")
        self.assert_once_before_spawn((*gen, "--model", MODEL, "--top-p", "2"), 2, "top_p must be in (0, 1]")
        self.assert_once_before_spawn((*gen, "--model", MODEL, "--threads", "0"), 2, "--threads must be in")
        self.assert_once_before_spawn((*gen, "--model", MODEL, "--max-new-tokens", "-1"), 2, "--max-new-tokens")
        self.assert_once_before_spawn((*gen, "--model", MODEL, "--backend", "tcp"), 2,
                                      "option --backend expects shm|mpi, got 'tcp'")
        self.assert_once_before_spawn(("generate", "--tp", "2", "--model", MODEL), 2, "--tokens or --prompt")
        self.assert_once_before_spawn(("generate", "--tp", "0", "--model", MODEL, "--tokens", "1"), 2,
                                      "--tp: Parallelism sizes must be >= 1, got 0.")
        self.assert_once_before_spawn(("logits", "--tp", "2", "--model", MODEL, "--tokens", "1,x", "--out", "x.npy"),
                                      2, "token ids must be comma-separated integers")
        self.assert_once_before_spawn(("chat", "--tp", "2", "--model", "/nonexistent"), 2, "No such file")
        self.assert_once_before_spawn(("plan", "--tp", "2", "--model", "/nonexistent"), 2, "No such file")

    def test_model_errors_before_spawn(self):
        # 4 heads do not split over 3 ranks: found from config.json, before launching
        self.assert_once_before_spawn(("generate", "--tp", "3", "--model", MODEL, "--tokens", "1,2"), 1,
                                      "`num_attention_heads` must be divisible by `tp_size`.")
        bad = os.path.join(WORK, "badcfg")
        shutil.copytree(MODEL, bad)
        with open(os.path.join(bad, "config.json")) as f:
            cfg = json.load(f)
        cfg["hidden_size"] = -1
        with open(os.path.join(bad, "config.json"), "w") as f:
            json.dump(cfg, f)
        self.assert_once_before_spawn(("logits", "--tp", "2", "--model", bad, "--tokens", "1", "--out", "x.npy"), 1,
                                      "key 'hidden_size' must be a positive integer")
        plan = os.path.join(WORK, "bad-plan.json")
        with open(plan, "w") as f:
            json.dump({"model.layers.*.mlp.up_proj": "no_such_style"}, f)
        self.assert_once_before_spawn(("generate", "--tp", "2", "--tp-plan", plan, "--model", MODEL,
                                       "--tokens", "1"), 1, "Unsupported tensor parallel style 'no_such_style'")

    def test_errors_inside_a_job(self):
        # Every rank finds the plan error: rank 0 prints it once, without a rank.
        rc, _, err, _ = tp("launch", "-n", "3", "--", BIN, "generate", "--model", MODEL, "--tokens", "1,2")
        self.assertEqual(rc, 1, err)
        msg = "`num_attention_heads` must be divisible by `tp_size`."
        self.assertEqual(err.count(msg), 1, err)
        self.assertIn("tensorpar generate: error: Cannot use tensor parallelism", err)
        self.assertNotIn("] tensorpar generate: error: Cannot", err)
        # Only rank 1 cannot write its file: its message names it.
        d = os.path.join(WORK, "per-rank")
        os.makedirs(os.path.join(d, "0"))
        rc, _, err, _ = tp("launch", "-n", "2", "--", BIN, "logits", "--model", MODEL, "--tokens", "1,2",
                           "--out", os.path.join(d, "%r", "x.npy"))
        self.assertEqual(rc, 1, err)
        self.assertIn("[rank 1] tensorpar logits: error: ", err)
        self.assertNotIn("[rank 0] tensorpar logits: error", err)
        # Errors all ranks meet after starting: once, without a rank.
        for args, msg in ((("--prompt", "hi"), "no tokenizer.json beside the weights"),
                          (("--tokens", ",".join(["7"] * 2049)), "more than max_position_embeddings (2048)")):
            rc, _, err, _ = tp("generate", "--tp", "2", "--model", MODEL, *args)
            self.assertEqual(rc, 1, err)
            self.assertEqual(err.count(msg), 1, err)
            self.assertEqual(err.count(" error: "), 1, err)
            self.assertNotIn("] tensorpar generate: error", err)
        # Warnings of a job carry the rank too (rank 0 gives them).
        rc, _, err, _ = tp("generate", "--tp", "2", "--model", MODEL, "--tokens", "1,2", "--max-new-tokens", "2")
        self.assertEqual(rc, 0, err)
        self.assertIn("[rank 0] tensorpar: warning: The following layers were not sharded", err)
        self.assertNotIn("[rank 1]", err)


class MakeModel(unittest.TestCase):
    def make(self, name, *sets):
        out = os.path.join(WORK, name)
        args = ["make-model", "--arch", "llama", "--preset", "tiny", "--out", out]
        for s in sets:
            args += ["--set", s]
        rc, _, err, _ = tp(*args)
        return rc, err, out

    def test_unknown_key(self):
        rc, err, out = self.make("typo", "num_attention_head=8")
        self.assertEqual(rc, 2, err)
        self.assertIn("unknown config key 'num_attention_head'", err)
        self.assertIn("known keys: ", err)
        self.assertIn("num_attention_heads", err)
        self.assertFalse(os.path.exists(out))

    def test_final_config_checked_once(self):
        configs = []
        for name, order in (("heads-first", ("num_attention_heads=8", "hidden_size=512")),
                            ("hidden-first", ("hidden_size=512", "num_attention_heads=8")),
                            ("odd-heads", ("num_attention_heads=6", "hidden_size=96"))):
            rc, err, out = self.make(name, *order)
            self.assertEqual(rc, 0, err)
            with open(os.path.join(out, "config.json")) as f:
                configs.append(json.load(f))
        self.assertEqual(configs[0], configs[1])
        self.assertEqual((configs[0]["hidden_size"], configs[0]["num_attention_heads"]), (512, 8))
        self.assertEqual((configs[2]["hidden_size"], configs[2]["num_attention_heads"]), (96, 6))
        rc, err, _ = self.make("bad-final", "num_attention_heads=5")
        self.assertEqual(rc, 2)
        self.assertIn("hidden_size 64 is not divisible by num_attention_heads 5", err)


class RepeatedOption(unittest.TestCase):
    def test_last_value_wins(self):
        """An option given twice takes its last value (README); a repeatable
        one (--set) collects them all."""
        out = os.path.join(WORK, "twice")
        rc, _, err, _ = tp("make-model", "--arch", "llama", "--preset", "tiny", "--dtype", "f32", "--dtype", "bf16",
                           "--set", "num_hidden_layers=3", "--set", "rms_norm_eps=0.001", "--out", out)
        self.assertEqual(rc, 0, err)
        with open(os.path.join(out, "config.json")) as f:
            cfg = json.load(f)
        self.assertEqual((cfg["torch_dtype"], cfg["num_hidden_layers"], cfg["rms_norm_eps"]), ("bfloat16", 3, 0.001))


class Dtype(unittest.TestCase):
    def test_f16_refused(self):
        for args in (("logits", "--model", MODEL, "--tokens", "1", "--out", "x.npy"),
                     ("generate", "--tp", "2", "--model", MODEL, "--tokens", "1"),
                     ("make-model", "--arch", "llama", "--out", os.path.join(WORK, "f16"))):
            rc, _, err, _ = tp(*args, "--dtype", "f16")
            self.assertEqual(rc, 2, err)
            self.assertIn("--dtype f16 is not supported", err)
            self.assertIn("converted to f32", err)

    def test_f16_checkpoint(self):
        """An f16 checkpoint is converted to f32 at load: its logits equal those of
        the f32 checkpoint holding the same (f16-rounded) values, bit for bit."""
        import numpy as np
        import hf_reference as ref
        tensors = ref.read_safetensors(os.path.join(MODEL, "model.safetensors"), np.float32)
        rounded = {n: a.astype(np.float16) for n, a in tensors.items()}
        dirs = {}
        for dt in ("F16", "F32"):
            d = dirs[dt] = os.path.join(WORK, "ck-" + dt)
            shutil.copytree(MODEL, d)
            ref.write_safetensors(os.path.join(d, "model.safetensors"),
                                  {n: a.astype(np.float32) if dt == "F32" else a for n, a in rounded.items()},
                                  dtype=dt, metadata={"format": "pt"})
            with open(os.path.join(d, "config.json")) as f:
                cfg = json.load(f)
            cfg["torch_dtype"] = "float16" if dt == "F16" else "float32"
            with open(os.path.join(d, "config.json"), "w") as f:
                json.dump(cfg, f)
        logits = {}
        for dt, d in dirs.items():
            for p in (1, 2):
                out = os.path.join(WORK, f"l-{dt}-{p}.npy")
                rc, _, err, _ = tp("logits", "--model", d, "--tokens", "3,1,4,1,5", "--out", out, "--tp", p)
                self.assertEqual(rc, 0, err)
                logits[dt, p] = np.load(out)
        for p in (1, 2):
            self.assertTrue(np.array_equal(logits["F16", p], logits["F32", p]), f"tp {p}")
        self.assertTrue(np.all(np.isfinite(logits["F16", 2])))


class Context(unittest.TestCase):
    def test_generate_stops_at_max_position_embeddings(self):
        d = os.path.join(WORK, "ctx16")
        shutil.copytree(MODEL, d)
        with open(os.path.join(d, "config.json")) as f:
            cfg = json.load(f)
        cfg["max_position_embeddings"] = 16
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(cfg, f)
        for p in (1, 2):
            rc, so, err, _ = tp("generate", "--model", d, "--tokens", "1,2,3,4", "--max-new-tokens", "40",
                                "--tp", p)
            self.assertEqual(rc, 0, err)
            ids = json.loads(so)
            self.assertEqual(len(ids), 12, so)
            self.assertEqual(err.count("4 prompt tokens + 40 new tokens exceed max_position_embeddings (16): generation stops after 12 new tokens"),
                             1, err)
        # Those 12 ids are what the model gives without the limit: no garbage.
        rc, so_free, err, _ = tp("generate", "--model", MODEL, "--tokens", "1,2,3,4", "--max-new-tokens", "12")
        self.assertEqual(rc, 0, err)
        self.assertEqual(json.loads(so_free), ids)
        self.assertNotIn("warning", err)
        rc, _, err, _ = tp("generate", "--model", d, "--tokens", ",".join(["5"] * 17))
        self.assertEqual(rc, 1)
        self.assertIn("the prompt has 17 tokens, more than max_position_embeddings (16)", err)


class Help(unittest.TestCase):
    def test_exit_statuses_documented(self):
        rc, so, _, _ = tp("--help")
        self.assertEqual(rc, 0)
        self.assertIn("1 runtime error", so)
        self.assertIn("2 usage error", so)
        commands = [line.split()[0] for line in so.split("commands:\n")[1].split("\n\n")[0].splitlines()]
        self.assertIn("generate", commands)
        for c in commands:
            rc, so, err, _ = tp(c, "--help")
            self.assertEqual(rc, 0, f"{c}: {err}")
            self.assertIn("2 usage error", so, c)
        rc, so, _, _ = tp("bench", "forward", "--help")
        self.assertIn("2 usage error", so)
        rc, _, err, _ = tp("no-such-command")
        self.assertEqual(rc, 2)
        rc, _, err, _ = tp()
        self.assertEqual(rc, 2)


if __name__ == "__main__":
    unittest.main()
