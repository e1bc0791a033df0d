#!/usr/bin/python3
"""End-to-end: text generation and chat on a small Llama with the real Llama 3
tokenizer.  Text mode must produce exactly the text of the ids that id mode
produces for the same prompt; stop strings, eos, seeds and chat history must
behave as a user expects."""

import json
import os
import shutil
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tpe2e import TOKENIZERS, run  # noqa: E402

WORK = None
MODEL = None
TOKENIZER = os.path.join(TOKENIZERS, "llama3")


def setUpModule():
    global WORK, MODEL
    WORK = tempfile.mkdtemp(prefix="tp-e2e-gen-")
    MODEL = os.path.join(WORK, "llama")
    run("make-model", "--arch", "llama", "--preset", "tiny", "--qk-std", "0.25", "--seed", "5",
        "--tokenizer", TOKENIZER, "--out", MODEL)


def tearDownModule():
    shutil.rmtree(WORK, ignore_errors=True)


def ids_of(text, special=True):
    args = ["tokenize", "--tokenizer", MODEL, "--text", text] + (["--special"] if special else [])
    return json.loads(run(*args).stdout)


def detok(ids):
    out = run("detokenize", "--tokenizer", MODEL, "--ids", ",".join(map(str, ids)), "--skip-special").stdout
    assert out.endswith("\n")
    return out[:-1]


def gen_ids(ids, *extra):
    return json.loads(run("generate", "--model", MODEL, "--tokens", ",".join(map(str, ids)), *extra).stdout)


def gen_text(prompt, *extra):
    out = run("generate", "--model", MODEL, "--prompt", prompt, *extra).stdout
    assert out.endswith("\n")
    return out[:-1]


class TextGeneration(unittest.TestCase):
    def test_text_equals_ids(self):
        prompt = "The quick brown fox"
        ids = gen_ids(ids_of(prompt), "--max-new-tokens", "12", "--greedy")
        self.assertEqual(len(ids), 12)
        self.assertEqual(gen_text(prompt, "--max-new-tokens", "12", "--greedy"), detok(ids))

    def test_chat_prompt_uses_template(self):
        messages = os.path.join(WORK, "m.json")
        with open(messages, "w") as f:
            json.dump([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi!"}], f)
        rendered = run("chat-template", "--tokenizer", MODEL, "--messages", messages,
                       "--add-generation-prompt").stdout
        self.assertIn("<|start_header_id|>assistant<|end_header_id|>", rendered)
        ids = gen_ids(ids_of(rendered, special=False), "--max-new-tokens", "8", "--greedy")
        text = gen_text("Hi!", "--chat", "--system", "Be brief.", "--max-new-tokens", "8", "--greedy")
        self.assertEqual(text, detok(ids))

    def test_seed_reproducible(self):
        a = gen_text("Once upon", "--do-sample", "--seed", "11", "--max-new-tokens", "10")
        b = gen_text("Once upon", "--do-sample", "--seed", "11", "--max-new-tokens", "10")
        c = gen_text("Once upon", "--do-sample", "--seed", "12", "--max-new-tokens", "10")
        self.assertEqual(a, b)
        self.assertNotEqual(a, c)
        greedy = gen_text("Once upon", "--greedy", "--max-new-tokens", "10")
        self.assertEqual(greedy, gen_text("Once upon", "--do-sample", "--top-k", "1", "--max-new-tokens", "10"))

    def test_stop_string(self):
        full = gen_text("Hello", "--greedy", "--max-new-tokens", "16")
        stop = full[5:8]
        self.assertTrue(stop)
        cut = gen_text("Hello", "--greedy", "--max-new-tokens", "16", "--stop", stop)
        self.assertEqual(cut, full[:full.index(stop)])

    def test_eos_stops(self):
        first = gen_ids(ids_of("Hello"), "--max-new-tokens", "4", "--greedy")
        eos_model = os.path.join(WORK, "eos")
        shutil.copytree(MODEL, eos_model)
        with open(os.path.join(eos_model, "generation_config.json"), "w") as f:
            json.dump({"eos_token_id": first[1]}, f)
        out = json.loads(run("generate", "--model", eos_model, "--tokens", ",".join(map(str, ids_of("Hello"))),
                             "--max-new-tokens", "4", "--greedy").stdout)
        self.assertEqual(out, first[:2])

    def test_chat_history(self):
        p = run("chat", "--model", MODEL, "--max-new-tokens", "6", "--greedy",
                input="Hello there\nAnd a second question?\n")
        stats = [line for line in p.stderr.splitlines() if "prompt tokens" in line]
        self.assertEqual(len(stats), 2, p.stderr)
        self.assertIn("(0 reused)", stats[0])
        self.assertNotIn("(0 reused)", stats[1])   # the first turn stays in the KV cache
        self.assertIn("tokens/s", stats[1])

    def test_tensor_parallel_text_and_chat(self):
        # rank 0 samples and broadcasts: the same text with sampling on, split or not
        args = ("--do-sample", "--seed", "3", "--max-new-tokens", "10")
        self.assertEqual(gen_text("Once upon", *args, "--tp", "2"), gen_text("Once upon", *args))
        one = run("chat", "--model", MODEL, "--max-new-tokens", "6", "--greedy", input="Hi\nMore?\n")
        two = run("chat", "--model", MODEL, "--max-new-tokens", "6", "--greedy", "--tp", "2", input="Hi\nMore?\n")
        self.assertEqual(one.stdout, two.stdout)
        self.assertEqual(len([l for l in two.stderr.splitlines() if "prompt tokens" in l]), 2)

    def test_errors(self):
        bare = os.path.join(WORK, "bare")
        run("make-model", "--arch", "llama", "--preset", "tiny", "--out", bare)
        p = run("generate", "--model", bare, "--prompt", "hi", check=False)
        self.assertEqual(p.returncode, 1)
        self.assertIn("tokenizer.json", p.stderr)
        p = run("generate", "--model", MODEL, "--prompt", "hi", "--top-p", "0", "--do-sample", check=False)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("top_p", p.stderr)
        p = run("generate", "--model", MODEL, "--tokens", "1,2", "--prompt", "x", check=False)
        self.assertEqual(p.returncode, 2)


if __name__ == "__main__":
    unittest.main()
