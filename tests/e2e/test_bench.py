#!/usr/bin/python3
"""End-to-end: the model benchmarks run and say what they should.

CI runs each of `bench forward`, `bench decode`, `bench load`,
`bench all --json --png` (two rounds) and `bench kernels --smoke` once on a tiny
model, only to prove that they work on the kernel path the process runs (any
CPU; CI runs them again per path): the JSON has its keys with positive numbers,
names that path, and the chart is a PNG.
Timings are never asserted (the machines are shared and noisy).  What is
asserted exactly is the accounting of an MoE model (MoeAccountingTest): the
weight bytes a decoded token reads and a prefill's FLOPs count the k routed
experts of E, not all of them, and under EP each rank only its own."""

import re
import json
import os
import shutil
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tpe2e import run  # noqa: E402

WORK = None
MODEL = None

ALL_KEYS = ["prefill_fma_ratio", "bf16_over_f32", "tp2x1_over_tp1x1", "tp2x1_over_tp1x2",
            "decode_bw_ratio_tp1x2", "decode_bw_ratio_tp2x1", "comm_share_tp2", "machine_lockstep_scaling",
            "tp2x1_over_tp1x1_per_lockstep"]


def setUpModule():
    global WORK, MODEL
    WORK = tempfile.mkdtemp(prefix="tp-e2e-bench-")
    MODEL = os.path.join(WORK, "tiny")
    run("make-model", "--arch", "qwen3", "--preset", "tiny", "--out", MODEL)


def tearDownModule():
    shutil.rmtree(WORK, ignore_errors=True)


def chosen_isa():
    """The path this process runs: the one `--isa-list` marks."""
    lines = run("--isa-list").stdout.split("\n")
    return [ln.split()[0] for ln in lines if ln.endswith(" (chosen)")][0]


def thp_enabled():
    """Whether the kernel grants 2 MiB pages to memory advised MADV_HUGEPAGE."""
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            return "[never]" not in f.read()
    except OSError:
        return False


def positive(test, obj, key):
    test.assertIn(key, obj)
    test.assertIsInstance(obj[key], (int, float), key)
    test.assertGreater(obj[key], 0, key)


class BenchTest(unittest.TestCase):
    def test_forward(self):
        p = run("bench", "forward", "--model", MODEL, "--seq", "16", "--reps", "1", "--tp", "2", "--json")
        j = json.loads(p.stdout)
        self.assertEqual(j["bench"], "forward")
        self.assertEqual(j["isa"], chosen_isa())
        for side in ("tp1", "tpN"):
            for k in ("seconds", "gflops"):
                positive(self, j[side], k)
        self.assertEqual(j["tpN"]["tp"], 2)
        positive(self, j["tpN"], "comm_share")   # TP=2 communicates
        positive(self, j, "speedup")
        # The table form names both configurations.
        p = run("bench", "forward", "--model", MODEL, "--seq", "8", "--reps", "1", "--threads", "1")
        self.assertIn("TP=1 x 1", p.stdout)
        self.assertIn("TP=2 x 1", p.stdout)

    def test_model_one_configuration(self):
        """bench model times the one configuration asked for, and says which."""
        p = run("bench", "model", "--model", MODEL, "--mode", "prefill", "--seq", "16", "--reps", "1", "--tp", "2",
                "--threads", "1", "--dtype", "bf16", "--json")
        j = json.loads(p.stdout)
        self.assertEqual((j["bench"], j["mode"], j["tp"], j["threads"], j["dtype"], j["seq"]),
                         ("model", "prefill", 2, 1, "bf16", 16))
        self.assertEqual(j["isa"], chosen_isa())
        for k in ("seconds", "tokens_per_s", "comm_share", "weight_bytes_per_token"):
            positive(self, j, k)
        self.assertAlmostEqual(j["tokens_per_s"] * j["seconds"], 16, delta=0.01)
        p = run("bench", "model", "--model", MODEL, "--mode", "decode", "--new-tokens", "4", "--prompt", "1",
                "--reps", "1", "--threads", "1", "--json")
        j = json.loads(p.stdout)
        self.assertEqual((j["mode"], j["tp"], j["threads"], j["new_tokens"], j["dtype"]), ("decode", 1, 1, 4, "f32"))
        self.assertEqual(j["comm_share"], 0)
        self.assertAlmostEqual(j["tokens_per_s"] * j["seconds"], 4, delta=0.01)
        p = run("bench", "model", "--model", MODEL, "--mode", "both", check=False)
        self.assertEqual(p.returncode, 2)
        self.assertIn("--mode", p.stderr)

    def test_decode(self):
        p = run("bench", "decode", "--model", MODEL, "--new-tokens", "4", "--reps", "1", "--dtype", "bf16", "--smoke",
                "--json")
        j = json.loads(p.stdout)
        self.assertEqual(j["dtype"], "bf16")
        for side in ("tp1", "tpN"):
            for k in ("tokens_per_s", "weight_bytes_per_token", "weight_bytes_per_s"):
                positive(self, j[side], k)
        # Each rank streams about half the weights; summed, about all of them.
        ratio = j["tpN"]["weight_bytes_per_token"] / j["tp1"]["weight_bytes_per_token"]
        self.assertGreater(ratio, 0.9)
        self.assertLess(ratio, 1.2)

    def test_load(self):
        p = run("bench", "load", "--model", MODEL, "--tp", "2", "--json")
        j = json.loads(p.stdout)
        positive(self, j["tp1"], "seconds")
        positive(self, j["tpN"], "bytes_read")

    def test_all(self):
        png = os.path.join(WORK, "speedup.png")
        # Two rounds, so that the per-round ratios' median and range are
        # taken over more than one value.
        p = run("bench", "all", "--model", MODEL, "--seq", "16", "--new-tokens", "4", "--reps", "2",
                "--smoke", "--json", "--png", png, timeout=300)
        j = json.loads(p.stdout)
        self.assertEqual(j["rounds"], 2)
        self.assertEqual(j["isa"], chosen_isa())
        for k in ALL_KEYS:
            positive(self, j, k)
            lo, hi = j["ratio_ranges"][k]
            self.assertLessEqual(lo, j[k] + 1e-3, k)   # the JSON rounds to 4 decimals
            self.assertGreaterEqual(hi, j[k] - 1e-3, k)
        for k in ("fma_gflops_2", "read_gbs_2"):
            positive(self, j, k)
        self.assertLessEqual(j["read_huge_share"], 1.0)
        if thp_enabled():
            positive(self, j, "read_huge_share")
        self.assertIn("1", j["speedup_by_tp"])
        self.assertIn("2", j["speedup_by_tp"])
        with open(png, "rb") as f:
            self.assertEqual(f.read(8), b"\x89PNG\r\n\x1a\n")

    def test_kernels(self):
        isa = chosen_isa()
        p = run("bench", "kernels", "--smoke", "--threads", "2", timeout=300)
        self.assertIn(f"kernel path: {isa} ", p.stdout)
        # The read probe's buffer is advised 2 MiB pages; where the kernel
        # grants them (THP "always" or "madvise"), some of it has them.
        share = re.search(r"read bandwidth \(1 GiB, (\d+) % of it in 2 MiB pages\)", p.stdout)
        self.assertIsNotNone(share, p.stdout)
        self.assertLessEqual(int(share.group(1)), 100)
        if thp_enabled():
            self.assertGreater(int(share.group(1)), 0, p.stdout)
        path = "avx512" if isa == "amx" else isa
        lines = p.stdout.split("\n")
        # The training GEMMs' rows name the weight's shape ("q_proj 2048x1024").
        train = [ln.split() for ln in lines if re.match(r"\S+ \d+x\d+ ", ln)]
        rows = [ln.split() for ln in lines if ln.startswith(("q_proj ", "down ")) and ln.split() not in train]
        self.assertEqual(len(rows), 5, p.stdout)   # GEMM and cold GEMV: q_proj, down; GEMV: "down T=1"
        if isa == "scalar":
            self.assertEqual(train, [], "the scalar loops are no rival to OpenBLAS")
        else:   # forward, dx, dW of 4 shapes (the smoke run leaves out lm_head): own and OpenBLAS, 1 and 2 threads
            self.assertEqual(len(train), 12, p.stdout)
            self.assertEqual([r[2] for r in train[:3]], ["y=x*W^T", "dx+=dy*W", "dW+=dy^T*x"])
            for r in train:
                self.assertEqual(len(r), 11, r)
                for v in r[3::2]:
                    self.assertGreater(float(v), 0, r)
        gemm = rows[0]
        # Rates below 1 GFLOP/s print with 4 decimals (the ASan build, the
        # arm64 build under qemu-aarch64), so every measured rate is > 0.
        self.assertGreater(float(gemm[1]), 0)   # this path's f32 GEMM
        self.assertGreater(float(gemm[2]), 0)   # and bf16
        self.assertIn(f"{path} f32", p.stdout)
        if isa != "amx":
            self.assertEqual(gemm[4:7], ["-"] * 3, "AMX columns without AMX")
        for line in p.stdout.split("\n"):
            self.assertNotIn("nan", line.lower())

    def test_kernels_shapes(self):
        # --shapes takes a make-model preset's Linear widths: llama-3.2-1b's
        # q_proj is 2048 x 2048, k/v 512 x 2048, down 2048 x 8192.
        p = run("bench", "kernels", "--smoke", "--shapes", "llama-3.2-1b", timeout=300)
        self.assertIn("shapes: llama-3.2-1b (hidden 2048, q 2048, k/v 512, intermediate 8192, vocabulary 128256)",
                      p.stdout)
        train = [ln.split()[1] for ln in p.stdout.split("\n") if re.match(r"\S+ \d+x\d+ ", ln)]
        if chosen_isa() != "scalar":
            self.assertEqual(sorted(set(train)), ["2048x2048", "2048x8192", "8192x2048"])
        # The GEMM table ends with the path's f32 and bf16 shares of the FMA peak.
        gemm = [ln.split() for ln in p.stdout.split("\n") if ln.startswith("k/v_proj ")]
        self.assertEqual(len(gemm), 2, p.stdout)   # the GEMM table, then the cold GEMV's
        self.assertTrue(gemm[0][-1].endswith("%") and gemm[0][-2].endswith("%"), gemm[0])
        bad = run("bench", "kernels", "--smoke", "--shapes", "nope", check=False)
        self.assertEqual(bad.returncode, 2)
        self.assertIn("unknown preset 'nope'", bad.stderr)

    def test_bad_options(self):
        p = run("bench", "forward", "--model", MODEL, "--seq", "0", check=False)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("--seq", p.stderr)
        p = run("bench", "forward", check=False)
        self.assertEqual(p.returncode, 2)



class MoeKernelBenchTest(unittest.TestCase):
    def test_kernels_moe(self):
        """bench kernels --moe runs the grouped kernel and the dense GEMM on
        the preset's expert shapes and prints both rates and their ratio,
        then a decode in the stacked and the [in, out] expert layouts."""
        p = run("bench", "kernels", "--moe", "--shapes", "tiny", "--smoke", "--seq", "16")
        self.assertIn("hidden 64, expert width 40, 8 experts, top-2", p.stdout)
        self.assertIn("32 rows over 8 experts", p.stdout)   # 16 tokens x top-2
        rates = [float(v) for v in re.findall(r"([0-9.]+) GFLOP/s", p.stdout)]
        ratio = float(re.search(r"grouped / dense ([0-9.]+)", p.stdout).group(1))
        self.assertEqual(len(rates), 2)
        self.assertGreater(min(rates), 0)
        self.assertGreater(ratio, 0)
        # the decode line: one token's top-2 experts in both layouts
        m = re.search(r"decode of one token's 2 experts, weight GB/s: stacked \[E, 2I, H\] ([0-9.]+), "
                      r"the same bytes as \[E, H, 2I\] \(Llama 4, gpt_oss\) ([0-9.]+), ratio ([0-9.]+)", p.stdout)
        self.assertIsNotNone(m, p.stdout)
        self.assertGreater(min(float(v) for v in m.groups()), 0)
        p = run("bench", "kernels", "--moe", "--shapes", "no-such-preset", check=False)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("no-such-preset", p.stderr)


class MoeAccountingTest(unittest.TestCase):
    """bench decode's bytes per token and bench forward's FLOPs of a
    qwen3_moe model (layer 0 dense, layer 1 sparse: decoder_sparse_step 2),
    against the same figures computed here from its config."""

    @classmethod
    def setUpClass(cls):
        cls.model = os.path.join(WORK, "moe")
        run("make-model", "--arch", "qwen3_moe", "--preset", "tiny", "--set", "decoder_sparse_step=2",
            "--out", cls.model)
        with open(os.path.join(cls.model, "config.json")) as f:
            cls.cfg = json.load(f)

    def sizes(self):
        """(floats of the non-expert weights a token reads, of the sparse
        layers' experts, of those a token reads, of the norms and router
        that a TP split replicates)."""
        c = self.cfg
        H, D, V = c["hidden_size"], c["head_dim"], c["vocab_size"]
        nq, nkv, E, k = c["num_attention_heads"], c["num_key_value_heads"], c["num_experts"], c["num_experts_per_tok"]
        attn = 2 * H * nq * D + 2 * H * nkv * D + 2 * D   # q, o, k, v; q_norm, k_norm
        rest, experts, replicated = H * V + H, 0, H       # lm_head (untied), final norm
        for layer in range(c["num_hidden_layers"]):
            sparse = (layer + 1) % c["decoder_sparse_step"] == 0
            rest += attn + 2 * H                         # the layer's two norms
            replicated += 2 * H + 2 * D
            if sparse:
                rest += E * H                            # the router
                replicated += E * H
                experts += E * 3 * H * c["moe_intermediate_size"]
            else:
                rest += 3 * H * c["intermediate_size"]
        self.assertEqual(c["tie_word_embeddings"], False)
        return rest, experts, experts * k // E, replicated

    def decode(self, *extra):
        p = run("bench", "decode", "--model", self.model, "--new-tokens", "2", "--prompt", "1", "--reps", "1",
                "--threads", "1", "--smoke", "--json", *extra)
        return json.loads(p.stdout)

    def test_decode_bytes_count_the_routed_experts(self):
        rest, experts, routed, replicated = self.sizes()
        self.assertEqual(routed * 4, experts)    # k = 2 of E = 8
        j = self.decode("--tp", "2", "--ep")
        self.assertTrue(j["expert_parallel"])
        self.assertEqual(j["tp1"]["weight_bytes_per_token"], 4 * (rest + routed))
        # EP = 2: the rest on both ranks, each expert on one (summed over ranks)
        self.assertEqual(j["tpN"]["weight_bytes_per_token"], 4 * (2 * rest + routed))
        # TP = 2: attention and experts split, norms and router on both
        j = self.decode("--tp", "2")
        self.assertEqual(j["tpN"]["weight_bytes_per_token"], 4 * (rest + routed + replicated))
        for side in ("tp1", "tpN"):
            positive(self, j[side], "read_gbs")
            self.assertAlmostEqual(j[side]["bw_ratio"],
                                   j[side]["weight_bytes_per_s"] / 1e9 / j[side]["read_gbs"], delta=1e-3)

    def test_prefill_flops_count_the_routed_experts(self):
        c, T = self.cfg, 8
        H, D, nq, nkv = c["hidden_size"], c["head_dim"], c["num_attention_heads"], c["num_key_value_heads"]
        attn_w = 2 * H * nq * D + 2 * H * nkv * D
        dense = 3 * H * c["intermediate_size"]
        sparse = H * c["num_experts"] + 3 * H * c["moe_intermediate_size"] * c["num_experts_per_tok"]
        keys = T * (T + 1) // 2
        flops = 2 * c["vocab_size"] * H
        for layer in range(c["num_hidden_layers"]):
            mlp = sparse if (layer + 1) % c["decoder_sparse_step"] == 0 else dense
            flops += 2 * T * (attn_w + mlp) + 4 * D * nq * keys
        p = run("bench", "forward", "--model", self.model, "--seq", T, "--reps", "1", "--threads", "1", "--json")
        self.assertEqual(json.loads(p.stdout)["flops"], flops)


if __name__ == "__main__":
    unittest.main()
