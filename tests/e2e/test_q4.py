#!/usr/bin/python3
"""End-to-end: `--dtype q4_0` (4-bit weights, llama.cpp's Q4_0 blocks of 32).

Each model is loaded as f32 and as q4_0 (its Linear weights quantized at load,
each rank its own shard) under TP = 1, 2 and 4:
  - the q4_0 logits against the f32 model's: 4 bits per weight move them far
    more than q8_0 does (measured max |diff| / max |f32| 0.19 llama, 0.13
    qwen3 at every TP; q8_0 0.016 and 0.011), so the bound is 0.3;
  - the quantization itself is checked exactly instead: a copy of the
    checkpoint whose Linear weights are replaced by their Q4_0 values as
    bench/llamacpp/gguf.py computes them (ggml's reference rule) gives,
    loaded as q4_0, the same logits bit for bit (re-quantizing Q4_0 values
    gives the same blocks, so the C and Python quantizers agree on every
    block), and, loaded as f32, logits within 2e-2 of the q4_0 ones (what is
    left is the 8-bit quantization of the activations);
  - a prompt of 40 tokens (from 32 on the prefill's products are the f32 ones
    of the dequantized weights) gives, bit for bit, the logits of that copy
    loaded as f32, and TP = 2 TP = 1's up to f32 rounding;
  - TP = 2 and 4 give the TP = 1 q4_0 logits up to the order of the
    row-parallel sums (bound 5e-3 as for q8_0) and the same greedy tokens;
  - greedy generation over 64 tokens is compared with f32 and q8_0 (printed);
  - `bench decode --dtype q4_0` streams 18/128 of the f32 weight bytes;
  - a shard whose rows are not whole blocks, and training, are refused.
The measured figures are printed (run with -v)."""

import json
import os
import shutil
import struct
import sys
import unittest

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tpe2e import ROOT, rel, tp_logits  # noqa: E402
import quant_e2e  # noqa: E402
from quant_e2e import MODELS, TOKENS, agree, generate, work  # noqa: E402

sys.path.insert(0, os.path.join(ROOT, "bench", "llamacpp"))
import gguf  # noqa: E402


def q4_values_copy(src, dst):
    """dst: src (an f32 checkpoint) with every 2-D weight but the embedding
    replaced by its Q4_0 values (gguf.py's quantizer and dequantizer)."""
    shutil.copytree(src, dst)
    path = os.path.join(dst, "model.safetensors")
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        blob = bytearray(f.read())
    changed = 0
    for name, e in header.items():
        if name == "__metadata__" or len(e["shape"]) != 2 or "embed_tokens" in name:
            continue
        assert e["dtype"] == "F32", e["dtype"]
        a, b = e["data_offsets"]
        w = np.frombuffer(bytes(blob[a:b]), dtype=np.float32).reshape(e["shape"])
        v = gguf.dequantize_q4_0(gguf.quantize_q4_0(w), w.shape[1]).astype(np.float32)
        blob[a:b] = v.tobytes()
        changed += 1
    text = json.dumps(header, separators=(",", ":")).encode()
    assert len(text) <= n, "the header grew"
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", n) + text.ljust(n) + bytes(blob))
    return changed


def setUpModule():
    quant_e2e.setup("tp-e2e-q4-")


def tearDownModule():
    quant_e2e.teardown()


class Q4Logits(unittest.TestCase):
    def test_logits_near_f32_and_tp_equal(self):
        for arch, model in MODELS.items():
            ref = tp_logits(work(), model, 1, "--dtype", "f32", tokens=TOKENS)
            q1 = tp_logits(work(), model, 1, "--dtype", "q4_0", tokens=TOKENS)
            for tp in (1, 2, 4):
                q = q1 if tp == 1 else tp_logits(work(), model, tp, "--dtype", "q4_0", tokens=TOKENS)
                err = rel(q, ref)
                print(f"\n{arch} q4_0 TP={tp}: max|q4 - f32| / max|f32| = {err:.3g}"
                      + ("" if tp == 1 else f", vs q4_0 TP=1 {rel(q, q1):.2g}"), end="")
                self.assertLess(err, 0.3, f"{arch} TP={tp}")
                self.assertLess(rel(q, q1), 5e-3, f"{arch} TP={tp} vs TP=1")
                self.assertTrue(np.array_equal(q.argmax(-1), q1.argmax(-1)), f"{arch} TP={tp}: argmax")

    def test_weights_are_ggml_q4_0_values(self):
        model = MODELS["llama"]
        copy = os.path.join(work(), "llama-q4-values")
        self.assertEqual(q4_values_copy(model, copy), 2 * 7 + 1)   # 7 Linear weights a layer and lm_head
        q = tp_logits(work(), model, 1, "--dtype", "q4_0", tokens=TOKENS)
        same = tp_logits(work(), copy, 1, "--dtype", "q4_0", tokens=TOKENS)
        self.assertTrue(np.array_equal(q, same), "re-quantized Q4_0 values give other blocks")
        f32 = tp_logits(work(), copy, 1, "--dtype", "f32", tokens=TOKENS)
        err = rel(q, f32)
        print(f"\nllama q4_0 vs f32 on the Q4_0 values: {err:.3g} (the activations' 8-bit rounding)", end="")
        self.assertLess(err, 2e-2)
        self.assertGreater(err, 0)

    def test_long_prompt_is_the_f32_product(self):
        # 40 tokens: from 32 on (TP_Q4_DEQUANT_MIN_T) every product of the
        # prefill is the f32 one with the dequantized weights, x as it is, so
        # the checkpoint holding the Q4_0 values, loaded as f32, gives the
        # q4_0 logits bit for bit (the same f32 GEMM on the same values); TP = 2
        # the TP = 1 logits up to the row-parallel sums' order.
        toks = ",".join(str((i * 37 + 5) % 500 + 1) for i in range(40))
        model = MODELS["llama"]
        copy = os.path.join(work(), "llama-q4-values-long")
        q4_values_copy(model, copy)
        q1 = tp_logits(work(), model, 1, "--dtype", "q4_0", tokens=toks)
        f32 = tp_logits(work(), copy, 1, "--dtype", "f32", tokens=toks)
        q2 = tp_logits(work(), model, 2, "--dtype", "q4_0", tokens=toks)
        print(f"\nllama q4_0 40 tokens: vs f32 on the Q4_0 values {rel(q1, f32):.3g}, "
              f"TP=2 vs TP=1 {rel(q2, q1):.2g}", end="")
        self.assertTrue(np.array_equal(q1, f32), "the q4_0 prefill is not the f32 product of its values")
        self.assertLess(rel(q2, q1), 1e-4)
        self.assertTrue(np.array_equal(q2.argmax(-1), q1.argmax(-1)))

    def test_greedy_generation(self):
        for arch, model in MODELS.items():
            ref, q8 = generate(model, 1, "f32"), generate(model, 1, "q8_0")
            q1 = generate(model, 1, "q4_0")
            for tp in (2, 4):
                self.assertEqual(generate(model, tp, "q4_0"), q1, f"{arch} TP={tp}: other tokens than TP=1")
            print(f"\n{arch} greedy 64 tokens: q4_0 agrees with f32 on the first {agree(q1, ref)} "
                  f"({sum(x == y for x, y in zip(q1, ref))} positions equal), with q8_0 on the first "
                  f"{agree(q1, q8)}; q8_0 with f32 {agree(q8, ref)}", end="")
            self.assertEqual(len(q1), 64)


class Q4Bench(quant_e2e.BenchBytes, unittest.TestCase):
    DTYPE, BLOCK_BYTES, MAX_RATIO = "q4_0", 18, 0.15


class Q4Refusals(quant_e2e.Refusals, unittest.TestCase):
    DTYPE = "q4_0"


if __name__ == "__main__":
    unittest.main()
