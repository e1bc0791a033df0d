#!/usr/bin/python3
"""bench/compare-builds.sh and its summary (bench/compare_builds.py).

  - the summary's arithmetic on made-up figures: speed ratios new/old (times
    inverted), medians and ranges per metric, the verdict (slower in every
    round beyond the tolerance: exit 3; only the median: "suspect", exit 0);
  - the parsers of every part's output (bench all/forward/decode/comm JSON,
    the kernels' text tables);
  - the script end to end with --bins (no build): the CLI against itself on
    a tiny model, two rounds in the order old new / new old, one ratio per
    round and metric.  Timings are never asserted.  The plain build's suite
    runs it; the sanitized build's does not: the script is bash and Python,
    and the `bench forward` and `bench decode` runs it makes are test_bench's,
    which the sanitized suite runs.

    TENSORPAR_BIN=build/tensorpar /usr/bin/python3 tests/e2e/test_compare_builds.py [-v]
"""
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from tpe2e import BIN, ROOT, run  # noqa: E402

sys.path.insert(0, os.path.join(ROOT, "bench"))
import compare_builds as cb  # noqa: E402

KERNELS_TEXT = """kernel path: avx2 (TENSORPAR_ISA=unset: the CPU's best)
compute peak (avx2: 8-lane FMA, registers only): 70.8 GFLOP/s on 1 thread, 21.3 on 2
read bandwidth (1 GiB, 2 MiB pages): 12.6 GB/s on 1 thread, 8.3 on 2 (without software prefetch: 12.6, 1.7)

GEMM GFLOP/s, 2 thread(s), T = 8 rows (OpenBLAS under OPENBLAS_CORETYPE=(auto)):
shape                  avx2 f32        avx2 bf16  avx512 bf16-dot         avx2 f32
q_proj                      2.3              2.0                -              4.5
gate/up                     2.5           0.9895                -                -

GEMV, bf16 weights cold (copies cycled through 16 MiB), T=1, GB/s of weights and share of the read bandwidth:
shape              1 thread    share   threads: 2     share
gate/up T=1             8.9      71%          7.2      88%
"""


def all_json(prefill_tp1x2, decode_tp2x1):
    return json.dumps({"bench": "all", "prefill_seconds": {"f32_tp1x2": prefill_tp1x2},
                       "decode_tokens_per_s": {"bf16_tp2x1": decode_tp2x1},
                       "fma_gflops_2": 300.0, "read_gbs_2": 20.0})


def write_rounds(folder, rounds):
    """rounds: [(old_all_json, new_all_json)], one per round."""
    for r, (o, n) in enumerate(rounds, 1):
        for side, text in (("old", o), ("new", n)):
            with open(os.path.join(folder, f"r{r}-all-{side}.out"), "w") as f:
                f.write(text)
            with open(os.path.join(folder, f"r{r}-all-{side}.load"), "w") as f:
                f.write("0.50 0.40 0.30\n")


class Summary(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="tp-e2e-cmp-")

    def tearDown(self):
        shutil.rmtree(self.dir, ignore_errors=True)

    def summarise(self, tol=0.05):
        out = os.path.join(self.dir, "summary.json")
        buf = io.StringIO()
        old_stdout, sys.stdout = sys.stdout, buf
        try:
            rc = cb.main(["compare_builds.py", self.dir, str(tol), out])
        finally:
            sys.stdout = old_stdout
        with open(out) as f:
            return rc, json.load(f), buf.getvalue()

    def test_ratios_are_speed_new_over_old(self):
        # prefill: old 2.0 s, new 1.6 s -> 1.25 faster; decode: 10 -> 12 tok/s -> 1.2
        write_rounds(self.dir, [(all_json(2.0, 10.0), all_json(1.6, 12.0))])
        rc, s, text = self.summarise()
        self.assertEqual(rc, 0, text)
        m = s["metrics"]
        self.assertAlmostEqual(m["prefill f32_tp1x2 (s)"]["ratios"][0], 1.25)
        self.assertAlmostEqual(m["decode bf16_tp2x1 (tokens/s)"]["ratios"][0], 1.2)
        self.assertAlmostEqual(m["machine FMA peak 2 threads (GFLOP/s)"]["ratios"][0], 1.0)
        self.assertIn("verdict: no slowdown", text)
        self.assertNotIn("control(s) moved", text)

    def test_slower_in_every_round_is_a_slowdown(self):
        # decode 10% slower in all three rounds, prefill unchanged
        write_rounds(self.dir, [(all_json(2.0, 10.0), all_json(2.0, 9.0)),
                                (all_json(2.1, 11.0), all_json(2.1, 9.9)),
                                (all_json(1.9, 10.0), all_json(1.9, 9.0))])
        rc, s, text = self.summarise(tol=0.05)
        self.assertEqual(rc, 3, text)
        self.assertEqual(s["slower"], ["decode bf16_tp2x1 (tokens/s)"])
        self.assertAlmostEqual(s["metrics"]["decode bf16_tp2x1 (tokens/s)"]["median"], 0.9)
        self.assertIn("SLOWDOWN", text)
        # the machine's figures are controls: shown, never a slowdown
        write_rounds(self.dir, [(all_json(2.0, 10.0), all_json(2.0, 10.0).replace("300.0", "100.0"))])
        for r in (2, 3):
            for side in ("old", "new"):
                os.remove(os.path.join(self.dir, f"r{r}-all-{side}.out"))
        rc, s, text = self.summarise(tol=0.05)
        self.assertEqual(rc, 0, text)
        self.assertAlmostEqual(s["metrics"]["machine FMA peak 2 threads (GFLOP/s)"]["ratios"][0], 1 / 3)
        self.assertIn("(control)", text)
        self.assertIn("warning: 1 control(s) moved beyond the tolerance (machine FMA peak 2 threads", text)
        write_rounds(self.dir, [(all_json(2.0, 10.0), all_json(2.0, 9.0)),
                                (all_json(2.1, 11.0), all_json(2.1, 9.9)),
                                (all_json(1.9, 10.0), all_json(1.9, 9.0))])
        # the same figures within a 15 % tolerance pass
        rc, s, text = self.summarise(tol=0.15)
        self.assertEqual(rc, 0, text)
        self.assertEqual(s["slower"], [])

    def test_one_round_reaching_one_makes_it_suspect_only(self):
        # decode ratios 0.8, 0.8, 1.0: median below 0.95, range reaches it
        write_rounds(self.dir, [(all_json(2.0, 10.0), all_json(2.0, 8.0)),
                                (all_json(2.0, 10.0), all_json(2.0, 8.0)),
                                (all_json(2.0, 10.0), all_json(2.0, 10.0))])
        rc, s, text = self.summarise()
        self.assertEqual(rc, 0, text)
        self.assertEqual(s["suspect"], ["decode bf16_tp2x1 (tokens/s)"])
        m = s["metrics"]["decode bf16_tp2x1 (tokens/s)"]
        self.assertAlmostEqual(min(m["ratios"]), 0.8)
        self.assertAlmostEqual(max(m["ratios"]), 1.0)
        self.assertIn("suspect", text)

    def test_a_round_with_one_build_only_does_not_count(self):
        write_rounds(self.dir, [(all_json(2.0, 10.0), all_json(1.0, 10.0))])
        with open(os.path.join(self.dir, "r2-all-old.out"), "w") as f:
            f.write(all_json(9.0, 1.0))
        rc, s, _ = self.summarise()
        self.assertEqual(s["metrics"]["prefill f32_tp1x2 (s)"]["ratios"], [2.0])

    def test_parsers(self):
        fw = cb.parse_forward(json.dumps({"dtype": "f32", "seq": 64,
                                          "tp1": {"tp": 1, "threads": 2, "seconds": 0.5},
                                          "tpN": {"tp": 2, "threads": 1, "seconds": 0.25}}))
        self.assertEqual(fw, {"forward f32 seq 64 TP=1x2 (s)": (0.5, "time"),
                              "forward f32 seq 64 TP=2x1 (s)": (0.25, "time")})
        dc = cb.parse_decode(json.dumps({"dtype": "bf16", "tp1": {"tp": 1, "threads": 2, "tokens_per_s": 20.0},
                                         "tpN": {"tp": 2, "threads": 1, "tokens_per_s": 21.0}}))
        self.assertEqual(dc["decode bf16 TP=2x1 (tokens/s)"], (21.0, "rate"))
        cm = cb.parse_comm('{"op": "all_reduce", "backend": "shm", "ranks": 2, "bytes": 4096, "median_us": 1.5}\n'
                           '{"op": "memcpy", "backend": "none", "ranks": 1, "bytes": 4096, "median_us": 0.06}\n')
        self.assertEqual(cm, {"comm all_reduce shm x2 4096 B (us)": (1.5, "time")})
        k = cb.parse_kernels(KERNELS_TEXT)
        self.assertEqual(k["kernels compute peak 1 thread"], (70.8, "rate"))
        self.assertEqual(k["kernels read bandwidth 2 threads"], (8.3, "rate"))
        self.assertEqual(k["kernels GEMM GFLOP/s q_proj avx2 f32"], (2.3, "rate"))
        self.assertEqual(k["kernels GEMM GFLOP/s q_proj avx2 f32 #2"], (4.5, "rate"))
        self.assertEqual(k["kernels GEMM GFLOP/s gate/up avx2 bf16"], (0.9895, "rate"))
        self.assertEqual(k["kernels GEMV cold gate/up T=1 threads: 2"], (7.2, "rate"))
        self.assertNotIn("kernels GEMM GFLOP/s q_proj avx512 bf16-dot", k)   # "-": not measured
        self.assertFalse([n for n in k if "share" in n])
        self.assertEqual(len(k), 4 + 3 + 2 + 2)


class Script(unittest.TestCase):
    @unittest.skipIf(os.environ.get("TENSORPAR_SANITIZED") == "1",
                     "in the plain build's suite (bash and Python; its CLI runs are test_bench's)")
    def test_bins_end_to_end(self):
        work = tempfile.mkdtemp(prefix="tp-e2e-cmp-run-")
        try:
            model = os.path.join(work, "tiny")
            run("make-model", "--arch", "llama", "--preset", "tiny", "--out", model)
            p = subprocess.run(["bash", os.path.join(ROOT, "bench", "compare-builds.sh"), "--bins",
                                "--rounds", "2", "--parts", "forward,decode", "--seq", "16",
                                "--new-tokens", "4", "--tol", "0.99", "--model", model,
                                "--work", work, BIN, BIN],
                               capture_output=True, text=True, timeout=600)
            self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
            runs = [d for d in os.listdir(work) if d.startswith("run-")]
            self.assertEqual(len(runs), 1)
            raw = os.path.join(work, runs[0])
            with open(os.path.join(raw, "order.txt")) as f:
                order = f.read().split("\n")[:-1]
            self.assertEqual(order, ["r1 forward old", "r1 forward new", "r1 decode old", "r1 decode new",
                                     "r2 forward new", "r2 forward old", "r2 decode new", "r2 decode old"])
            with open(os.path.join(raw, "summary.json")) as f:
                s = json.load(f)
            names = sorted(s["metrics"])
            self.assertEqual(len(names), 4, names)
            self.assertTrue(any(n.startswith("forward f32 seq 16 TP=2x1") for n in names), names)
            self.assertTrue(any(n.startswith("decode bf16 TP=1x") for n in names), names)
            for n, m in s["metrics"].items():
                self.assertEqual(len(m["ratios"]), 2, n)
                self.assertTrue(all(r > 0 for r in m["ratios"]), n)
            self.assertIn("verdict: no slowdown (tolerance 99%", p.stdout)
            # a part that does not exist is a usage error, before anything runs
            p = subprocess.run(["bash", os.path.join(ROOT, "bench", "compare-builds.sh"), "--bins",
                                "--parts", "forward,bogus", BIN, BIN], capture_output=True, text=True)
            self.assertEqual(p.returncode, 2)
            self.assertIn("unknown part 'bogus'", p.stderr)
            # a build that fails to run stops the compare with its error, no verdict
            p = subprocess.run(["bash", os.path.join(ROOT, "bench", "compare-builds.sh"), "--bins",
                                "--model", os.path.join(work, "missing"), "--work", work, BIN, BIN],
                               capture_output=True, text=True, timeout=120)
            self.assertEqual(p.returncode, 1)
            self.assertIn("the warm-up of", p.stderr)
            self.assertIn("config.json", p.stderr)
            self.assertNotIn("verdict", p.stdout)
        finally:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    unittest.main()
