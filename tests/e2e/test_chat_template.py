"""Chat templates: `tensorpar chat-template` against the reference renderer.

Renders conversations with the Llama 3 and Qwen3 tokenizer_config.json
templates through our CLI and through @huggingface/jinja (the Jinja renderer
of transformers.js, tests/reference/render_chat.mjs), and asserts the two
outputs are byte-identical.  The reference's node_modules is installed on
first use (`npm ci`); without node/npm the test fails rather than skips.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

BIN = os.environ["TENSORPAR_BIN"]
SOURCE = os.environ["TENSORPAR_SOURCE"]
REFERENCE = os.path.join(SOURCE, "tests", "reference")
TOKENIZERS = os.path.join(SOURCE, "tests", "data", "tokenizers")

SYSTEM = {"role": "system", "content": "You are a helpful assistant."}

CONVERSATIONS = {
    "system_user": [SYSTEM, {"role": "user", "content": "What is the capital of France?"}],
    "user_only": [{"role": "user", "content": "  Hello!  \n"}],
    "multi_turn": [
        SYSTEM,
        {"role": "user", "content": "Hi."},
        {"role": "assistant", "content": "Hello! How can I help?"},
        {"role": "user", "content": "Tell me a joke."},
    ],
    "think_history": [
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "<think>\nAdd two and two.\n</think>\n\nIt is 4."},
        {"role": "user", "content": "And 3+3?"},
    ],
    "think_last": [
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "<think>\nAdd two and two.\n</think>\n\nIt is 4."},
    ],
    "unicode": [
        {"role": "system", "content": "Réponds en français. 日本語も大丈夫。"},
        {"role": "user", "content": "Ça va ? 🎉 Привет, мир!\u00a0\u2003"},
        {"role": "assistant", "content": "Très bien — merci ! 👍"},
        {"role": "user", "content": "Quotes: \"double\" 'single' \\ backslash {{ not a tag }}"},
    ],
}

# Qwen3's tool branch: tools list, assistant tool calls, tool responses.
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather for a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
TOOL_CONVERSATION = [
    SYSTEM,
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}}]},
    {"role": "tool", "content": "{\"temp\": 21}"},
    {"role": "tool", "content": "sunny"},
    {"role": "assistant", "content": "It is 21 degrees and sunny."},
]


def fail(msg):
    print("FAIL: " + msg)
    sys.exit(1)


def ensure_reference():
    """Installs the pinned @huggingface/jinja when node_modules is missing."""
    if shutil.which("node") is None:
        fail("node is not installed; it is needed to run the reference renderer (tests/reference)")
    if os.path.isdir(os.path.join(REFERENCE, "node_modules", "@huggingface", "jinja")):
        return
    npm = shutil.which("npm")
    if npm is None:
        fail("npm is not installed; it is needed to install tests/reference's dependencies")
    cmd = [npm, "ci"] if os.path.exists(os.path.join(REFERENCE, "package-lock.json")) else [npm, "install"]
    r = subprocess.run(cmd + ["--no-audit", "--no-fund"], cwd=REFERENCE, capture_output=True, text=True)
    if r.returncode != 0:
        fail("'%s' in %s failed:\n%s%s" % (" ".join(cmd), REFERENCE, r.stdout, r.stderr))


def render(cmd):
    r = subprocess.run(cmd, capture_output=True)
    if r.returncode != 0:
        fail("%s exited with %d:\n%s" % (" ".join(cmd), r.returncode, r.stderr.decode(errors="replace")))
    return r.stdout


def args_for(model, messages_path, add_gen, sets):
    a = ["--tokenizer", os.path.join(TOKENIZERS, model), "--messages", messages_path]
    if add_gen:
        a.append("--add-generation-prompt")
    for s in sets:
        a += ["--set", s]
    return a


def cases():
    for model in ("llama3", "qwen3"):
        for name, conv in CONVERSATIONS.items():
            for add_gen in (False, True):
                yield model, name, conv, add_gen, []
    for name, conv in CONVERSATIONS.items():
        yield "qwen3", name, conv, True, ["enable_thinking=false"]
        yield "qwen3", name, conv, True, ["enable_thinking=true"]
    yield "qwen3", "tools", TOOL_CONVERSATION, True, ["tools=" + json.dumps(TOOLS)]
    yield "qwen3", "tool_messages", TOOL_CONVERSATION, False, []
    # A tokenizer_config.json path instead of a directory.
    yield "qwen3/tokenizer_config.json", "system_user", CONVERSATIONS["system_user"], True, []


def main():
    ensure_reference()
    n = 0
    with tempfile.TemporaryDirectory() as tmp:
        for model, name, conv, add_gen, sets in cases():
            path = os.path.join(tmp, name + ".json")
            with open(path, "w", encoding="utf-8") as f:
                json.dump(conv, f, ensure_ascii=False)
            a = args_for(model, path, add_gen, sets)
            ours = render([BIN, "chat-template"] + a)
            ref = render(["node", os.path.join(REFERENCE, "render_chat.mjs")] + a)
            label = "%s %s add_generation_prompt=%s %s" % (model, name, add_gen, " ".join(sets))
            if ours != ref:
                fail("%s: output differs from the reference\n--- ours ---\n%r\n--- reference ---\n%r"
                     % (label, ours.decode(errors="replace"), ref.decode(errors="replace")))
            if not ours:
                fail("%s: empty output" % label)
            n += 1
    # Errors: a template that raises, and a bad --set value.
    with tempfile.TemporaryDirectory() as tmp:
        cfg = os.path.join(tmp, "tokenizer_config.json")
        with open(cfg, "w") as f:
            json.dump({"chat_template": "{{ raise_exception('only user turns, please') }}"}, f)
        msgs = os.path.join(tmp, "m.json")
        with open(msgs, "w") as f:
            json.dump(CONVERSATIONS["user_only"], f)
        r = subprocess.run([BIN, "chat-template", "--tokenizer", tmp, "--messages", msgs], capture_output=True, text=True)
        if r.returncode == 0 or "only user turns, please" not in r.stderr:
            fail("raise_exception: expected a failure carrying the message, got rc=%d stderr=%r" % (r.returncode, r.stderr))
        r = subprocess.run([BIN, "chat-template", "--tokenizer", tmp, "--messages", msgs, "--set", "x=nope"],
                           capture_output=True, text=True)
        if r.returncode == 0 or "not valid JSON" not in r.stderr:
            fail("--set with bad JSON: expected an error, got rc=%d stderr=%r" % (r.returncode, r.stderr))
    print("%d renders identical to the reference; error cases OK" % n)


if __name__ == "__main__":
    main()
