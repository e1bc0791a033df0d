#!/usr/bin/python3
"""End-to-end: `tensorpar logits` refuses malformed model directories cleanly.

A valid tiny model is made with `tensorpar make-model`; each case corrupts a copy
(with the safetensors reader/writer of tests/reference/hf_reference.py) and
checks that `tensorpar logits`
  - exits with a status > 0 (an error, not a signal),
  - prints nothing that looks like a crash (Sanitizer, Segmentation fault, ...),
  - names the offending file and, where relevant, the tensor or config key.

    TENSORPAR_BIN=build/tensorpar /usr/bin/python3 tests/e2e/test_malformed_inputs.py [-v]
"""

import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "reference"))
sys.path.insert(0, HERE)
from tpe2e import BIN  # noqa: E402
import hf_reference as ref  # noqa: E402

CRASH = re.compile(r"Sanitizer|Segmentation|runtime error:|core dumped|Aborted|stack smashing|"
                   r"double free|free\(\): |malloc\(\): ", re.I)
UP = "model.layers.0.mlp.up_proj.weight"
GATE = "model.layers.0.mlp.gate_proj.weight"


WORK = GOOD = None


def setUpModule():
    global WORK, GOOD
    if not os.path.exists(BIN):
        raise RuntimeError(f"tensorpar CLI not found (TENSORPAR_BIN={BIN!r})")
    WORK = tempfile.mkdtemp(prefix="tp-e2e-bad-")
    GOOD = os.path.join(WORK, "good")
    p = subprocess.run([BIN, "make-model", "--arch", "llama", "--preset", "tiny", "--dtype", "f32",
                        "--seed", "3", "--out", GOOD], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       text=True, timeout=120)
    if p.returncode != 0:
        raise RuntimeError(f"make-model failed ({p.returncode}): {p.stderr}")


def tearDownModule():
    if WORK and not os.environ.get("TENSORPAR_KEEP_TMP"):
        shutil.rmtree(WORK, ignore_errors=True)


def st_path(d):
    return os.path.join(d, "model.safetensors")


def read_header(path):
    """(header dict incl. __metadata__, header length, whole file bytes) without validation."""
    with open(path, "rb") as f:
        data = f.read()
    (hlen,) = struct.unpack("<Q", data[:8])
    return json.loads(data[8:8 + hlen]), hlen, data


def write_with_header(path, header, body):
    """Write `body` (the original data area) behind a rewritten header."""
    hb = json.dumps(header).encode()
    hb += b" " * ((8 - len(hb) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hb)) + hb + body)


class TestMalformedInputs(unittest.TestCase):
    tokens = "1,2,3,4"

    def copy(self, name):
        d = os.path.join(WORK, name)
        shutil.copytree(GOOD, d)
        return d

    def logits(self, d, tokens=None):
        out = os.path.join(d, "out.npy")
        return subprocess.run([BIN, "logits", "--model", d, "--tokens", tokens or self.tokens, "--out", out],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=120)

    def expect_failure(self, d, must_name, tokens=None, any_of=None):
        """must_name: strings that must all appear in stderr; any_of: a list of
        alternatives of which at least one must appear."""
        p = self.logits(d, tokens)
        if os.environ.get("TENSORPAR_E2E_SHOW"):
            print(f"\n    [{os.path.basename(d)}] rc={p.returncode} {p.stderr.strip()}", file=sys.stderr)
        both = p.stdout + p.stderr
        info = f"\nrc={p.returncode}\nstderr: {p.stderr[-1500:]}"
        self.assertGreater(p.returncode, 0, "expected an error exit (>0), got " +
                           ("success" if p.returncode == 0 else f"signal {-p.returncode}") + info)
        self.assertIsNone(CRASH.search(both), "crash signature in output" + info)
        self.assertTrue(p.stderr.strip(), "no error message on stderr" + info)
        for s in must_name:
            self.assertIn(s, p.stderr, f"stderr does not name {s!r}" + info)
        if any_of:
            self.assertTrue(any(s in p.stderr for s in any_of), f"stderr names none of {any_of}" + info)
        return p

    # -- sanity: the untouched model works, so failures below are due to the corruption
    def test_00_good_model_runs(self):
        p = self.logits(GOOD)
        self.assertEqual(p.returncode, 0, p.stderr)

    # -- safetensors
    def test_truncated_file(self):
        d = self.copy("truncated")
        size = os.path.getsize(st_path(d))
        with open(st_path(d), "r+b") as f:
            f.truncate(size // 2)
        self.expect_failure(d, ["model.safetensors"])

    def test_truncated_inside_header(self):
        d = self.copy("truncated_header")
        _, hlen, _ = read_header(st_path(d))
        with open(st_path(d), "r+b") as f:
            f.truncate(8 + hlen // 2)
        self.expect_failure(d, ["model.safetensors"])

    def test_header_length_overflow(self):
        for i, hl in enumerate((0xFFFFFFFFFFFFFFFF, 1 << 62, 0x7FFFFFFFFFFFFFF8)):
            with self.subTest(header_length=hex(hl)):
                d = self.copy(f"hlen_overflow{i}")
                with open(st_path(d), "r+b") as f:
                    f.write(struct.pack("<Q", hl))
                self.expect_failure(d, ["model.safetensors"])

    def test_offsets_past_end(self):
        d = self.copy("offsets_past_end")
        h, hlen, data = read_header(st_path(d))
        body = data[8 + hlen:]
        a, b = h[UP]["data_offsets"]
        h[UP]["data_offsets"] = [len(body), len(body) + (b - a)]  # right size, but past the end
        write_with_header(st_path(d), h, body)
        self.expect_failure(d, ["model.safetensors", UP])

    def test_offsets_wrap_around(self):
        d = self.copy("offsets_wrap")
        h, hlen, data = read_header(st_path(d))
        a, b = h[UP]["data_offsets"]
        big = (1 << 64) - 16
        h[UP]["data_offsets"] = [big, big + (b - a)]  # end overflows 64 bits
        write_with_header(st_path(d), h, data[8 + hlen:])
        self.expect_failure(d, ["model.safetensors"], any_of=[UP, "data_offsets", "offset"])

    def test_overlapping_tensors(self):
        d = self.copy("overlap")
        h, hlen, data = read_header(st_path(d))
        self.assertEqual(h[UP]["shape"], h[GATE]["shape"])
        h[UP]["data_offsets"] = list(h[GATE]["data_offsets"])  # both claim the same bytes
        write_with_header(st_path(d), h, data[8 + hlen:])
        self.expect_failure(d, ["model.safetensors"], any_of=[UP, GATE])

    def test_wrong_dtype_string(self):
        d = self.copy("bad_dtype")
        h, hlen, data = read_header(st_path(d))
        h[UP]["dtype"] = "F33"
        write_with_header(st_path(d), h, data[8 + hlen:])
        self.expect_failure(d, ["model.safetensors", UP])

    def test_size_disagrees_with_shape(self):
        d = self.copy("size_vs_shape")
        h, hlen, data = read_header(st_path(d))
        h[UP]["shape"] = [h[UP]["shape"][0], h[UP]["shape"][1] + 1]  # offsets stay: sizes disagree
        write_with_header(st_path(d), h, data[8 + hlen:])
        self.expect_failure(d, ["model.safetensors", UP])

    def test_header_not_json(self):
        d = self.copy("header_garbage")
        _, hlen, data = read_header(st_path(d))
        bad = b"{\"model.embed_tokens.weight\": [1,2" + b" " * (hlen - 34)
        with open(st_path(d), "wb") as f:
            f.write(data[:8] + bad[:hlen] + data[8 + hlen:])
        self.expect_failure(d, ["model.safetensors"])

    def test_missing_tensor(self):
        d = self.copy("missing_tensor")
        raw = ref.read_safetensors_raw(st_path(d))
        del raw[UP]
        ref.write_safetensors_raw(st_path(d), raw)
        self.expect_failure(d, [UP], any_of=["model.safetensors", d])

    # -- sharded checkpoints (model.safetensors.index.json)
    def sharded_copy(self, name):
        d = os.path.join(WORK, name)
        p = subprocess.run([BIN, "make-model", "--arch", "llama", "--preset", "tiny", "--dtype", "f32",
                            "--seed", "3", "--shards", "2", "--out", d], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True, timeout=120)
        self.assertEqual(p.returncode, 0, p.stderr)
        with open(os.path.join(d, "model.safetensors.index.json")) as f:
            return d, json.load(f)

    def test_sharded_missing_shard_file(self):
        d, index = self.sharded_copy("shard_missing_file")
        shard = index["weight_map"][UP]
        os.remove(os.path.join(d, shard))
        self.expect_failure(d, [shard])

    def test_sharded_index_points_to_wrong_shard(self):
        d, index = self.sharded_copy("shard_wrong_map")
        shards = sorted(set(index["weight_map"].values()))
        here = index["weight_map"][UP]
        index["weight_map"][UP] = [s for s in shards if s != here][0]
        with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
            json.dump(index, f)
        self.expect_failure(d, [UP])

    # -- config.json
    def edit_config(self, d, fn):
        with open(os.path.join(d, "config.json")) as f:
            cfg = json.load(f)
        fn(cfg)
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(cfg, f, indent=2)

    def test_hidden_size_disagrees(self):
        d = self.copy("cfg_hidden")
        self.edit_config(d, lambda c: c.update(hidden_size=c["hidden_size"] * 2))
        self.expect_failure(d, [], any_of=["model.embed_tokens.weight", "model.layers.", "model.norm.weight",
                                           "lm_head.weight", "hidden_size"])

    def test_intermediate_size_disagrees(self):
        d = self.copy("cfg_inter")
        self.edit_config(d, lambda c: c.update(intermediate_size=c["intermediate_size"] + 8))
        self.expect_failure(d, [], any_of=["mlp.gate_proj", "mlp.up_proj", "mlp.down_proj", "intermediate_size"])

    def test_broken_config_json(self):
        d = self.copy("cfg_broken")
        with open(os.path.join(d, "config.json")) as f:
            text = f.read()
        with open(os.path.join(d, "config.json"), "w") as f:
            f.write(text[: len(text) // 2])
        self.expect_failure(d, ["config.json"])

    def test_missing_config_key(self):
        d = self.copy("cfg_missing_key")
        self.edit_config(d, lambda c: c.pop("num_hidden_layers"))
        # HF falls back to the config class default (32 for llama) and then lacks tensors:
        # either way the message must say what is wrong
        self.expect_failure(d, [], any_of=["num_hidden_layers", "model.layers."])

    def test_unsupported_rope_scaling(self):
        d = self.copy("cfg_yarn")
        self.edit_config(d, lambda c: c.update(rope_scaling={"rope_type": "yarn", "factor": 4.0,
                                                             "original_max_position_embeddings": 16}))
        self.expect_failure(d, ["rope_scaling"])

    # -- inputs
    def test_token_out_of_range(self):
        with open(os.path.join(GOOD, "config.json")) as f:
            vocab = json.load(f)["vocab_size"]
        for toks in (f"1,{vocab},2", f"{vocab + 1000}", "1,-1"):
            with self.subTest(tokens=toks):
                d = os.path.join(WORK, "tok_" + toks.replace(",", "_").replace("-", "m"))
                if not os.path.exists(d):
                    shutil.copytree(GOOD, d)
                self.expect_failure(d, [], tokens=toks, any_of=["token"])


if __name__ == "__main__":
    unittest.main(verbosity=2)
