#!/usr/bin/python3
"""End-to-end: `tensorpar plan` on make-model directories (reads config.json only).

Checks the text and --json reports (placements, local shapes, uneven shards,
KV-head replication, bytes per rank, collectives per token), the warnings, and
that invalid plans exit 1 with the exact messages of tp-semantics.md §4.7.

    TENSORPAR_BIN=build/tensorpar /usr/bin/python3 tests/e2e/test_plan_cli.py [-v]
"""

import json
import os
import re
import shutil
import subprocess
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
CRASH = re.compile(r"Sanitizer|Segmentation|runtime error:|core dumped|Aborted", re.I)
BIN = os.environ.get("TENSORPAR_BIN") or os.path.join(HERE, "..", "..", "build", "tensorpar")
WORK = None


def run(*args):
    p = subprocess.run([BIN, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=60)
    assert not CRASH.search(p.stderr), p.stderr
    return p


def make(name, arch="llama", *sets):
    d = os.path.join(WORK, name)
    args = ["make-model", "--arch", arch, "--preset", "tiny", "--out", d]
    for s in sets:
        args += ["--set", s]
    p = run(*args)
    if p.returncode != 0:
        raise RuntimeError(f"make-model failed: {p.stderr}")
    return d


def plan_file(name, obj):
    path = os.path.join(WORK, name)
    with open(path, "w") as f:
        f.write(obj if isinstance(obj, str) else json.dumps(obj))
    return path


def setUpModule():
    global WORK
    if not os.path.exists(BIN):
        raise RuntimeError(f"tensorpar CLI not found (TENSORPAR_BIN={BIN!r})")
    WORK = tempfile.mkdtemp(prefix="tp-e2e-plan-")


def tearDownModule():
    if WORK:
        shutil.rmtree(WORK, ignore_errors=True)


class PlanCli(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.llama = make("llama")

    def plan_json(self, *args):
        p = run("plan", "--model", self.llama, "--json", *args)
        self.assertEqual(p.returncode, 0, p.stderr)
        return json.loads(p.stdout), p.stderr

    def test_auto_text(self):
        p = run("plan", "--model", self.llama, "--tp", "2")
        self.assertEqual(p.returncode, 0, p.stderr)
        out = p.stdout
        self.assertIn("supported (built-in plan)", out)
        self.assertIn("model.layers.0.mlp.down_proj.weight", out)
        self.assertRegex(out, r"rule model\.layers\.\*\.mlp\.down_proj \(module\)\s+style rowwise\s+Shard\(1\)")
        self.assertIn("all-reduce", out)
        self.assertIn("all-gather", out)
        # 2 layers x (o_proj + down_proj) all-reduce of 64 f32, lm_head all-gather of 512 f32
        self.assertIn("total: 5 collectives, %d bytes per token" % (4 * 64 * 4 + 512 * 4), out)
        self.assertIn("The following layers were not sharded: model.embed_tokens.weight, "
                      "model.layers.*.input_layernorm.weight, model.layers.*.post_attention_layernorm.weight, "
                      "model.norm.weight", p.stderr)
        self.assertNotIn("were not applied", p.stderr)
        self.assertNotIn("Layer pattern", p.stderr)

    def test_auto_json(self):
        doc, _ = self.plan_json("--tp", "2")
        self.assertTrue(doc["supports_tp"])
        self.assertEqual(doc["tp_size"], 2)
        self.assertEqual(list(doc["plan"].keys())[0], "lm_head")
        self.assertEqual(len(doc["plan"]), 8)
        params = {p["name"]: p for p in doc["parameters"]}
        q = params["model.layers.0.self_attn.q_proj.weight"]
        self.assertEqual((q["style"], q["placement"], q["local_shape"]), ("colwise", "Shard(0)", [32, 64]))
        self.assertEqual(q["ranks"][1]["ranges"], [[32, 64]])
        self.assertEqual(params["model.norm.weight"]["rule"], None)
        self.assertEqual(params["lm_head.weight"]["local_shape"], [256, 64])
        self.assertEqual(doc["collectives_per_token"]["count"], 5)
        self.assertEqual(len(doc["bytes_per_rank"]), 2)
        self.assertEqual(doc["heads"]["kv_heads_per_rank"], 1)
        mods = {m["name"]: m for m in doc["modules"]}
        self.assertEqual(mods["model.layers.1.self_attn.o_proj"]["local_output"], "Partial(sum)")

    def test_uneven_vocab(self):
        d = make("vocab10", "llama", "vocab_size=10")
        p = run("plan", "--model", d, "--tp", "3", "--json", "--tp-plan",
                plan_file("uneven.json", {"model.embed_tokens": "embedding_rowwise", "lm_head": "colwise_gather_output"}))
        self.assertEqual(p.returncode, 0, p.stderr)
        doc = json.loads(p.stdout)
        emb = next(x for x in doc["parameters"] if x["name"] == "model.embed_tokens.weight")
        self.assertEqual([r["local_shape"][0] for r in emb["ranks"]], [4, 4, 2])
        self.assertEqual([r["ranges"] for r in emb["ranks"]], [[[0, 4]], [[4, 8]], [[8, 10]]])
        self.assertTrue(emb["ranks_differ"])
        t = run("plan", "--model", d, "--tp", "3", "--tp-plan", plan_file("uneven.json", {"lm_head": "colwise_gather_output"}))
        self.assertIn("ranks differ: 0=[4, 64] 1=[4, 64] 2=[2, 64]", t.stdout)

    def test_kv_replication(self):
        d = make("kv", "llama", "num_attention_heads=8", "num_key_value_heads=2", "head_dim=8")
        p = run("plan", "--model", d, "--tp", "4", "--json")
        self.assertEqual(p.returncode, 0, p.stderr)
        doc = json.loads(p.stdout)
        self.assertEqual(doc["heads"]["kv_replication"], 2)
        self.assertEqual(doc["heads"]["kv_heads_by_rank"], [[0, 1], [0, 1], [1, 2], [1, 2]])
        k = next(x for x in doc["parameters"] if x["name"] == "model.layers.0.self_attn.k_proj.weight")
        self.assertEqual([r["ranges"] for r in k["ranks"]], [[[0, 8]], [[0, 8]], [[8, 16]], [[8, 16]]])

    def test_heads_error(self):
        d = make("kv3", "llama", "num_attention_heads=4", "num_key_value_heads=2", "vocab_size=510")
        p = run("plan", "--model", d, "--tp", "3")
        self.assertEqual(p.returncode, 1)
        self.assertIn("Cannot use tensor parallelism with tp_size=3 for a model with num_attention_heads=4: "
                      "`num_attention_heads` must be divisible by `tp_size`.", p.stderr)

    def test_invalid_styles(self):
        path = plan_file("bad.json", {"model.layers.*.self_attn.q_proj": "colwise",
                                      "model.layers.*.mlp.up_proj": "invalid_style",
                                      "model.layers.*.mlp.down_proj": "bad_style_2"})
        p = run("plan", "--model", self.llama, "--tp", "2", "--tp-plan", path)
        self.assertEqual(p.returncode, 1)
        self.assertEqual(p.stdout, "")
        self.assertEqual(p.stderr.count("\n"), 1)
        self.assertIn("Unsupported tensor parallel styles 'invalid_style' for layer 'model.layers.*.mlp.up_proj', "
                      "'bad_style_2' for layer 'model.layers.*.mlp.down_proj'. Supported styles are "
                      "['embedding_rowwise', 'embedding_colwise', 'colwise_gather_output', ", p.stderr)
        one = plan_file("bad1.json", {"model.layers.*.mlp.up_proj": "invalid_style"})
        p = run("plan", "--model", self.llama, "--tp", "2", "--tp-plan", one)
        self.assertEqual(p.returncode, 1)
        self.assertIn("Unsupported tensor parallel style 'invalid_style' for layer 'model.layers.*.mlp.up_proj'. "
                      "Supported styles are [", p.stderr)
        # tp_size 1 still validates the names
        p = run("plan", "--model", self.llama, "--tp", "1", "--tp-plan", one)
        self.assertEqual(p.returncode, 1)

    def test_not_a_dict(self):
        p = run("plan", "--model", self.llama, "--tp", "2", "--tp-plan", plan_file("arr.json", '["colwise"]'))
        self.assertEqual(p.returncode, 1)
        self.assertIn("Can only set a dictionary as `tp_plan`", p.stderr)
        p = run("plan", "--model", self.llama, "--tp", "2", "--tp-plan", plan_file("broken.json", '{"a": '))
        self.assertEqual(p.returncode, 1)
        p = run("plan", "--model", self.llama, "--tp", "2", "--tp-plan", os.path.join(WORK, "missing.json"))
        self.assertEqual(p.returncode, 1)

    def test_pattern_warning(self):
        base = {"lm_head": "colwise_gather_output", "model.layers.*.self_attn.q_proj": "colwise",
                "model.layers.*.self_attn.k_proj": "colwise", "model.layers.*.self_attn.v_proj": "colwise",
                "model.layers.*.self_attn.o_proj": "rowwise"}
        path = plan_file("warn.json", dict(base, **{"nonexistent.*.layer": "colwise"}))
        p = run("plan", "--model", self.llama, "--tp", "2", "--tp-plan", path)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(p.stderr.count("Layer pattern 'nonexistent.*.layer' does not match any parameters in the "
                                        "model. This rule may not be applied during tensor parallelization, or may "
                                        "lead to dimension mismatches"), 1)
        self.assertIn("The following TP rules were not applied on any of the layers: "
                      "{'nonexistent.*.layer': 'colwise'}", p.stderr)
        p = run("plan", "--model", self.llama, "--tp", "2", "--tp-plan", plan_file("nowarn.json", base))
        self.assertNotIn("Layer pattern", p.stderr)
        self.assertNotIn("were not applied", p.stderr)

    def test_gather_any_size(self):
        # B1 / §10.10: a gathered lm_head of 99 rows is split by the chunk rule
        d = make("vocab99", "llama", "vocab_size=99")
        for tp, rows in ((2, [50, 49]), (4, [25, 25, 25, 24])):
            p = run("plan", "--model", d, "--tp", str(tp), "--json")
            self.assertEqual(p.returncode, 0, p.stderr)
            self.assertNotIn("must be divisible", p.stderr)
            head = [x for x in json.loads(p.stdout)["parameters"] if x["name"] == "lm_head.weight"][0]
            self.assertEqual([r["local_shape"] for r in head["ranks"]], [[n, 64] for n in rows])

    def test_tp1_and_tied(self):
        p = run("plan", "--model", self.llama, "--tp", "1")
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn("validated but not applied", p.stdout)
        d = make("qwen3tied", "qwen3", "tie_word_embeddings=true")
        doc = json.loads(run("plan", "--model", d, "--tp", "2", "--json").stdout)
        self.assertEqual(doc["plan"]["model.embed_tokens"], "embedding_rowwise")
        self.assertEqual(list(doc["plan"].keys())[-1], "model.embed_tokens")
        self.assertEqual(doc["tied_lm_head"]["placement"], "Shard(0)")
        p = run("plan", "--model", d, "--tp", "2", "--tp-plan", plan_file("tied.json", {"lm_head": "colwise_gather_output"}))
        self.assertEqual(p.returncode, 1)
        self.assertIn("Tied parameters `model.embed_tokens.weight` and `lm_head.weight` resolve to different", p.stderr)

    def test_usage(self):
        self.assertEqual(run("plan").returncode, 2)
        self.assertEqual(run("plan", "--model", self.llama, "--tp", "0").returncode, 2)
        self.assertEqual(run("plan", "--help").returncode, 0)


if __name__ == "__main__":
    unittest.main()
