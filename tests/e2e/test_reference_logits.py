#!/usr/bin/python3
"""End-to-end: tensorpar's logits against the independent NumPy reference.

Run by CTest (TENSORPAR_BIN = the built `tensorpar` CLI), or by hand:
    TENSORPAR_BIN=build/tensorpar /usr/bin/python3 tests/e2e/test_reference_logits.py [-v]

For every case a model is made with `tensorpar make-model`, the engine's logits
(`tensorpar logits`) are compared with tests/reference/hf_reference.py, and the
error is  max|engine - ref| / max|ref|  which must stay <= 1e-5.
Set TENSORPAR_KEEP_TMP=1 to keep the model directories.
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "reference"))
sys.path.insert(0, HERE)
from tpe2e import BIN  # noqa: E402
import hf_reference as ref  # noqa: E402

TOL = 1e-5
ARCHS = ("llama", "mistral", "qwen2", "qwen3")
T_PROMPT = 32          # long enough that linear / llama3 RoPE scaling matter
LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 16}
# With the tiny preset's head_dim 16 and theta 1e4, LLAMA3 (original 16) smooths band 0 and divides
# bands 1.. by 8; LLAMA3_ALL (original 32) exercises all three branches: band 0 kept, band 1
# smoothed, bands 2.. divided by 8.
LLAMA3_ALL = dict(LLAMA3, original_max_position_embeddings=32)
LINEAR = {"rope_type": "linear", "factor": 2.0}


WORK = None
RESULTS = []   # (group, case, value, passed) for the summary printed at the end


def setUpModule():
    global WORK
    if not os.path.exists(BIN):
        raise RuntimeError(f"tensorpar CLI not found (TENSORPAR_BIN={BIN!r})")
    WORK = tempfile.mkdtemp(prefix="tp-e2e-ref-")


def tearDownModule():
    if RESULTS:
        print("\n%-12s %-44s %s" % ("group", "case", "max|d|/max|ref|"), file=sys.stderr)
        for g, c, e, ok in RESULTS:
            val = "" if e is None else "%.3e" % e
            print("%-12s %-44s %s%s" % (g, c, val, "" if ok else "   <-- FAIL"), file=sys.stderr)
    if WORK and not os.environ.get("TENSORPAR_KEEP_TMP"):
        shutil.rmtree(WORK, ignore_errors=True)
    elif WORK:
        print(f"model directories kept in {WORK}", file=sys.stderr)


def run(args, timeout=120):
    p = subprocess.run([BIN] + [str(a) for a in args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       timeout=timeout, text=True)
    if p.returncode != 0:
        raise AssertionError(f"`tensorpar {' '.join(map(str, args))}` exited {p.returncode}\n"
                             f"stdout: {p.stdout[-2000:]}\nstderr: {p.stderr[-2000:]}")
    return p


_made = {}


def make_model(arch, dtype="f32", seed=1, sets=None, qk_std=0.25, shards=None):
    """tensorpar make-model ... ; returns the directory (cached by arguments)."""
    sets = dict(sets or {})
    key = (arch, dtype, seed, json.dumps(sets, sort_keys=True), qk_std, shards)
    if key in _made:
        return _made[key]
    d = os.path.join(WORK, f"m{len(_made):03d}_{arch}_{dtype}")
    args = ["make-model", "--arch", arch, "--preset", "tiny", "--dtype", dtype, "--seed", seed, "--out", d]
    for k, v in sets.items():
        args += ["--set", f"{k}={json.dumps(v)}"]
    if qk_std is not None:
        args += ["--qk-std", qk_std]
    if shards:
        args += ["--shards", shards]
    run(args)
    _made[key] = d
    return d


def config(d):
    with open(os.path.join(d, "config.json")) as f:
        return json.load(f)


def prompt(d, n=T_PROMPT, seed=0):
    v = config(d)["vocab_size"]
    return [int(x) for x in np.random.default_rng(seed).integers(0, v, size=n)]


def engine_logits(d, tokens, incremental=False):
    out = os.path.join(d, "engine_inc.npy" if incremental else "engine.npy")
    if os.path.exists(out):
        os.remove(out)
    args = ["logits", "--model", d, "--tokens", ",".join(map(str, tokens)), "--out", out]
    if incremental:
        args.append("--incremental")
    run(args)
    x = np.load(out)
    return x


def rel_err(x, r):
    return float(np.max(np.abs(x.astype(np.float64) - r)) / np.max(np.abs(r)))


class Base(unittest.TestCase):
    def compare(self, group, case, got, want, tol=TOL):
        self.assertEqual(tuple(got.shape), tuple(want.shape), f"{case}: logits shape")
        self.assertTrue(np.all(np.isfinite(got)), f"{case}: non-finite logits")
        e = rel_err(got, want)
        RESULTS.append((group, case, e, e <= tol))
        self.assertLessEqual(e, tol, f"{case}: max|d|/max|ref| = {e:.3e} > {tol:g}")
        return e

    def check_against_reference(self, group, case, d, tokens=None):
        tokens = tokens or prompt(d)
        want = ref.reference_logits(d, tokens)
        got = engine_logits(d, tokens)
        self.assertEqual(got.dtype, np.float32, f"{case}: engine .npy dtype")
        return self.compare(group, case, got, want)


class TestReferenceSelfTest(unittest.TestCase):
    def test_self_test(self):
        self.assertEqual(ref.self_test(verbose=False), 0, "hf_reference self-test failed (run it with --self-test)")

    def test_reference_cli(self):
        d = make_model("qwen3", "bf16")
        toks = prompt(d, n=9)
        out = os.path.join(WORK, "ref_cli.npy")
        p = subprocess.run([sys.executable, ref.__file__, "--model", d, "--tokens", ",".join(map(str, toks)),
                            "--out", out], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=120)
        self.assertEqual(p.returncode, 0, p.stderr)
        x = np.load(out)
        self.assertEqual((x.dtype, x.shape), (np.float32, (9, config(d)["vocab_size"])))
        self.assertLess(rel_err(x, ref.reference_logits(d, toks)), 1e-6)


def heads_of(arch):
    c = config(make_model(arch))
    return int(c["num_attention_heads"]), int(c.get("num_key_value_heads") or c["num_attention_heads"])


class TestLogitsVsReference(Base):
    def _cases(self, cases):
        for case, arch, dtype, sets in cases:
            with self.subTest(case=case):
                self.check_against_reference("logits", case, make_model(arch, dtype, sets=sets))

    def test_arch_dtype(self):
        self._cases([(f"{a}/{dt}", a, dt, {}) for a in ARCHS for dt in ("f32", "bf16")])

    def test_tied_embeddings(self):
        cases = [(f"{a}/f32/tied", a, "f32", {"tie_word_embeddings": True}) for a in ARCHS]
        cases += [(f"{a}/f32/untied", a, "f32", {"tie_word_embeddings": False}) for a in ("llama", "qwen3")]
        cases.append(("qwen2/bf16/tied", "qwen2", "bf16", {"tie_word_embeddings": True}))
        self._cases(cases)
        for case, arch, dtype, sets in cases:  # the flag really reached config.json and the file
            d = make_model(arch, dtype, sets=sets)
            st = ref.read_safetensors_header(os.path.join(d, "model.safetensors"))[0]
            self.assertEqual(bool(config(d).get("tie_word_embeddings")), sets["tie_word_embeddings"], case)
            self.assertEqual("lm_head.weight" in st, not sets["tie_word_embeddings"], case)

    def test_rope_scaling(self):
        cases = []
        for a in ARCHS:
            cases.append((f"{a}/f32/llama3", a, "f32", {"rope_scaling": LLAMA3}))
            cases.append((f"{a}/f32/linear", a, "f32", {"rope_scaling": LINEAR}))
            cases.append((f"{a}/f32/llama3(orig=32)", a, "f32", {"rope_scaling": LLAMA3_ALL}))
        cases.append(("llama/bf16/llama3", "llama", "bf16", {"rope_scaling": LLAMA3}))
        cases.append(("qwen3/bf16/linear", "qwen3", "bf16", {"rope_scaling": LINEAR}))
        self._cases(cases)
        # the scaling must matter at these positions, or the cases above prove nothing
        d0 = make_model("llama")
        toks = prompt(d0)
        base = ref.reference_logits(d0, toks)
        scaled = {}
        for name, rs in (("llama3", LLAMA3), ("llama3(orig=32)", LLAMA3_ALL), ("linear", LINEAR),
                         ("linear x8", {"rope_type": "linear", "factor": 8.0})):
            scaled[name] = ref.reference_logits(make_model("llama", sets={"rope_scaling": rs}), toks)
            e = rel_err(scaled[name], base)
            RESULTS.append(("sensitivity", f"ref llama: {name} vs no scaling (want > 1e-3)", e, e > 1e-3))
            self.assertGreater(e, 1e-3, f"{name} scaling does not change the reference logits")
        # the llama3 band logic matters: it is not the same as dividing every frequency by the factor
        for name in ("llama3", "llama3(orig=32)"):
            e = rel_err(scaled[name], scaled["linear x8"])
            RESULTS.append(("sensitivity", f"ref llama: {name} vs linear x8 (want > 1e-3)", e, e > 1e-3))
            self.assertGreater(e, 1e-3, f"{name} is indistinguishable from linear x8")

    def test_gqa_mha(self):
        cases = []
        for a in ARCHS:
            nh, _ = heads_of(a)
            kvs = sorted({nh, 1} | ({nh // 2} if nh % 2 == 0 and nh >= 4 else set()))
            for kv in kvs:
                label = "mha" if kv == nh else ("mqa" if kv == 1 else "gqa")
                cases.append((f"{a}/f32/{label}(kv={kv},h={nh})", a, "f32", {"num_key_value_heads": kv}))
        cases.append(("qwen2/bf16/mha", "qwen2", "bf16", {"num_key_value_heads": heads_of("qwen2")[0]}))
        self._cases(cases)


class TestExtraConfigs(Base):
    """Beyond the required matrix: options HF honours that an engine easily gets wrong."""

    def test_extras(self):
        cases = [
            ("mistral/f32/sliding_window=8", "mistral", "f32", {"sliding_window": 8}),
            ("mistral/bf16/sliding_window=5", "mistral", "bf16", {"sliding_window": 5}),
            ("qwen2/f32/sliding_window=4,use=false", "qwen2", "f32",
             {"use_sliding_window": False, "sliding_window": 4}),
            ("llama/f32/attention_bias", "llama", "f32", {"attention_bias": True}),
            ("qwen3/f32/attention_bias", "qwen3", "f32", {"attention_bias": True}),
            ("llama/f32/rope_theta=500000", "llama", "f32", {"rope_theta": 500000.0}),
            # HF's MistralAttention has no biases and Qwen2Attention has q/k/v biases but never
            # an o_proj bias, whatever attention_bias says (extra tensors are ignored by HF)
            ("mistral/f32/attention_bias", "mistral", "f32", {"attention_bias": True}),
            ("qwen2/f32/attention_bias", "qwen2", "f32", {"attention_bias": True}),
        ]
        cases += [(f"{a}/f32/head_dim=32", a, "f32", {"head_dim": 32}) for a in ARCHS]
        for case, arch, dtype, sets in cases:
            with self.subTest(case=case):
                self.check_against_reference("extra", case, make_model(arch, dtype, sets=sets))
        for case, arch, dtype, shards in (("llama/bf16/3 shards", "llama", "bf16", 3),
                                          ("qwen3/f32/2 shards", "qwen3", "f32", 2)):
            with self.subTest(case=case):
                d = make_model(arch, dtype, shards=shards)
                self.assertTrue(os.path.exists(os.path.join(d, "model.safetensors.index.json")))
                self.check_against_reference("extra", case, d)

    def test_qwen2_use_sliding_window_config(self):
        """A Qwen2 config.json with use_sliding_window=true (layers >= max_window_layers slide):
        the engine must either match HF or refuse it by name -- never silently ignore it."""
        src = make_model("qwen2", "f32")
        d = os.path.join(WORK, "qwen2_use_sliding")
        if not os.path.exists(d):
            shutil.copytree(src, d)
            cfg = config(d)
            cfg.update(use_sliding_window=True, sliding_window=6, max_window_layers=1)
            with open(os.path.join(d, "config.json"), "w") as f:
                json.dump(cfg, f, indent=2)
        toks = prompt(d)
        want = ref.reference_logits(d, toks)
        self.assertGreater(rel_err(want, ref.reference_logits(src, toks)), 1e-3, "window does not bite")
        out = os.path.join(d, "engine.npy")
        p = subprocess.run([BIN, "logits", "--model", d, "--tokens", ",".join(map(str, toks)), "--out", out],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=120)
        if p.returncode != 0:
            ok = p.returncode > 0 and "sliding" in p.stderr
            RESULTS.append(("extra", "qwen2 use_sliding_window (config.json): refused", None, ok))
            self.assertTrue(ok, f"refused without naming the sliding window (rc={p.returncode}): {p.stderr}")
            return
        self.compare("extra", "qwen2 use_sliding_window (config.json)", np.load(out), want)


class TestIncremental(Base):
    """Decode with the KV cache (one token at a time) == the full forward at every position."""

    def test_incremental_equals_full(self):
        cases = [(f"{a}/f32", a, "f32", {}) for a in ARCHS]
        cases += [("llama/bf16/llama3", "llama", "bf16", {"rope_scaling": LLAMA3}),
                  ("qwen3/f32/linear", "qwen3", "f32", {"rope_scaling": LINEAR}),
                  ("qwen2/f32/mqa", "qwen2", "f32", {"num_key_value_heads": 1}),
                  ("mistral/f32/sliding_window=8", "mistral", "f32", {"sliding_window": 8})]
        for case, arch, dtype, sets in cases:
            with self.subTest(case=case):
                d = make_model(arch, dtype, sets=sets)
                toks = prompt(d, n=24, seed=3)
                full = engine_logits(d, toks)
                inc = engine_logits(d, toks, incremental=True)
                self.compare("incremental", case + " inc vs full", inc, full.astype(np.float64))
                self.compare("incremental", case + " inc vs ref", inc, ref.reference_logits(d, toks))


class TestGenerate(Base):
    def test_greedy_generate(self):
        d = make_model("llama", "f32", seed=7)
        m = ref.HFReference(d)
        prompt_ids, n_new = [1, 2, 3], 8
        want, gap = ref.greedy_generate(m, prompt_ids, n_new)
        eos = config(d).get("eos_token_id")
        eos = set(eos if isinstance(eos, list) else [eos]) - {None}
        for i, t in enumerate(want):  # HF generate stops after emitting EOS
            if t in eos:
                want = want[:i + 1]
                break
        if gap < 1e-4:
            self.skipTest(f"reference top-2 logit gap {gap:.2e} < 1e-4: greedy choice ambiguous")
        p = run(["generate", "--model", d, "--tokens", ",".join(map(str, prompt_ids)),
                 "--max-new-tokens", n_new])
        lines = [ln for ln in p.stdout.strip().splitlines() if ln.strip().startswith("[")]
        self.assertTrue(lines, f"no JSON array on stdout: {p.stdout!r}")
        got = json.loads(lines[-1])
        RESULTS.append(("generate", f"llama/f32 {prompt_ids}+{n_new}: engine {got} ref {want}", None, got == want))
        self.assertEqual(got, want, f"greedy ids differ (reference min top-2 gap {gap:.3e})")


class TestDiscrimination(Base):
    """The 1e-5 bound means something: changing rope_theta alone moves the reference by far more,
    and the engine follows the changed config."""

    def test_rope_theta_swap(self):
        src = make_model("llama", "f32", seed=5)
        d = os.path.join(WORK, "theta_swapped")
        shutil.copytree(src, d)
        cfg = config(d)
        theta = float(cfg.get("rope_theta", 10000.0))
        cfg["rope_theta"] = 500000.0 if theta != 500000.0 else 10000.0
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(cfg, f, indent=2)
        toks = prompt(src)
        a = ref.reference_logits(src, toks)
        b = ref.reference_logits(d, toks)
        e = rel_err(b, a)
        RESULTS.append(("discriminate", f"ref: rope_theta {theta:g} -> {cfg['rope_theta']:g} (want > 1e-2)", e,
                        e > 1e3 * TOL))
        self.assertGreater(e, 1e3 * TOL, f"rope_theta swap moved the reference by only {e:.3e}")
        # ... and the engine, reading the edited config, matches the edited reference, not the original
        got = engine_logits(d, toks)
        self.compare("discriminate", "engine(swapped) vs ref(swapped)", got, b)
        self.assertGreater(rel_err(got, a), 1e3 * TOL, "engine ignored the changed rope_theta")


if __name__ == "__main__":
    unittest.main(verbosity=2)
