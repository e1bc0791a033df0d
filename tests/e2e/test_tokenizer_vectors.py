"""The tokenizer against the reference vectors in tests/data/tokenizers.

Every line of <name>/vectors.jsonl must encode to exactly its ids (with its
add_special_tokens), and decoding those ids must give back the text (or the
"decoded" field where "roundtrip" is false).  Inputs go through
--input-jsonl so that each tokenizer is loaded once.  A few error cases
check that failures are reported clearly with a non-zero exit.
"""
import glob
import json
import os
import subprocess
import sys
import tempfile

BIN = os.environ.get("TENSORPAR_BIN", "build/tensorpar")
TOKDIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "tokenizers")

failures = []


def run(args, input_lines=None):
    with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False, encoding="utf-8") as f:
        for obj in input_lines or []:
            f.write(json.dumps(obj, ensure_ascii=False) + "\n")
        path = f.name
    try:
        argv = [BIN] + [a if a != "@IN" else path for a in args]
        return subprocess.run(argv, capture_output=True, timeout=300)
    finally:
        os.unlink(path)


def check(cond, msg):
    if not cond:
        failures.append(msg)
        print("FAIL:", msg, file=sys.stderr)


def check_vectors(name):
    folder = os.path.join(TOKDIR, name)
    with open(os.path.join(folder, "vectors.jsonl"), encoding="utf-8") as f:
        vectors = [json.loads(line) for line in f if line.strip()]
    enc = run(["tokenize", "--tokenizer", folder, "--input-jsonl", "@IN"],
              [{"text": v["text"], "add_special_tokens": v["add_special_tokens"]} for v in vectors])
    check(enc.returncode == 0, f"{name}: tokenize failed: {enc.stderr.decode()}")
    got = [json.loads(line)["ids"] for line in enc.stdout.decode().splitlines()]
    check(len(got) == len(vectors), f"{name}: {len(got)} outputs for {len(vectors)} inputs")
    for v, ids in zip(vectors, got):
        check(ids == v["ids"], f"{name} [{v['tag']}] {v['text'][:60]!r}: ids {ids} != {v['ids']}")
    dec = run(["detokenize", "--tokenizer", folder, "--input-jsonl", "@IN"], [{"ids": v["ids"]} for v in vectors])
    check(dec.returncode == 0, f"{name}: detokenize failed: {dec.stderr.decode()}")
    texts = [json.loads(line)["text"] for line in dec.stdout.decode("utf-8").splitlines()]
    check(len(texts) == len(vectors), f"{name}: {len(texts)} decoded for {len(vectors)} inputs")
    for v, text in zip(vectors, texts):
        want = v["text"] if v["roundtrip"] else v["decoded"]
        check(text == want, f"{name} [{v['tag']}] decode {text[:60]!r} != {want[:60]!r}")
    print(f"{name}: {len(vectors)} vectors checked")


def check_errors():
    folder = os.path.join(TOKDIR, "qwen3")
    r = run(["tokenize", "--tokenizer", "/nonexistent/tokenizer.json", "--text", "x"])
    check(r.returncode != 0 and b"/nonexistent/tokenizer.json" in r.stderr, f"missing file: {r.stderr!r}")
    r = run(["detokenize", "--tokenizer", folder, "--ids", "1,999999999"])
    check(r.returncode != 0 and b"999999999" in r.stderr, f"bad id: {r.stderr!r}")
    r = run(["detokenize", "--tokenizer", folder, "--ids", "1,x"])
    check(r.returncode != 0, "non-numeric ids accepted")
    with tempfile.TemporaryDirectory() as d:
        bad = os.path.join(d, "tokenizer.json")
        with open(bad, "w") as f:
            json.dump({"model": {"type": "Unigram", "vocab": [["a", 0.0]]}}, f)
        r = run(["tokenize", "--tokenizer", d, "--text", "a"])
        check(r.returncode != 0 and b"Unigram" in r.stderr and b"model.type" in r.stderr,
              f"Unigram: {r.stderr!r}")
        with open(bad, "w") as f:
            f.write('{"model": {"type": "BPE", "vocab": {"a": 0}, ')
        r = run(["tokenize", "--tokenizer", bad, "--text", "a"])
        check(r.returncode != 0 and b"JSON" in r.stderr and bad.encode() in r.stderr, f"bad JSON: {r.stderr!r}")
    # Plain CLI forms.
    r = run(["tokenize", "--tokenizer", folder, "--text", "Hello world"])
    check(r.returncode == 0 and json.loads(r.stdout) == [9707, 1879], f"--text: {r.stdout!r}")
    r = run(["detokenize", "--tokenizer", folder, "--ids", "151644,9707", "--skip-special"])
    check(r.returncode == 0 and r.stdout == b"Hello\n", f"--skip-special: {r.stdout!r}")


def main():
    names = sorted(os.path.basename(os.path.dirname(p)) for p in glob.glob(os.path.join(TOKDIR, "*", "vectors.jsonl")))
    if not names:
        print(f"no vectors under {TOKDIR}", file=sys.stderr)
        return 1
    for name in names:
        check_vectors(name)
    check_errors()
    print(f"{len(failures)} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
