#!/usr/bin/python3
"""End-to-end: every registered style on every module kind of the built-in
models (qwen3_moe's and llama4_text's routers, experts and expert tensors
among them; gpt_oss's sinks, router, expert tensors and biases), at TP = 2
and 3 (tp-semantics.md §2, §4.7).

Each case is the model type's built-in plan with one module kind's rule set
to one style, on all layers.  It must either give the logits of TP = 1
(within float tolerance, finite, every rank the same) or be refused cleanly
before any weight is read: exit status 1 or 2, a message that names the
module and the style (or one of the verbatim §4.7 texts, which name the
tensors and head counts instead), no signal, no sanitizer report.  Never a
crash, never wrong or non-finite logits with exit status 0.

`tensorpar plan` resolves every case (the same resolution and layout check
that loading runs, in one process); every case it accepts, and a third of the
refused cases of the first model at P = 2 (every style and every kind among
them), then run as `tensorpar logits --tp P`, which must refuse the same way.

The cases are dealt round-robin into shards (`--shard K/N`, case i to shard
i mod N, the combined-rule patterns to shard 1) that CTest runs as separate
tests, in parallel.  The plain build's suite runs every case at both sizes,
so every assertion here runs there.  The sanitized build's suite
(TENSORPAR_SANITIZED=1), where each process costs three times as much, runs
each (model type, module kind, style) at one of the two sizes, alternating
(P = 2 where the kind's and the style's indices sum to an even number, P = 3
where odd), so that every style and every kind meets both sizes there, and
every combined-rule pattern (the former SIGSEGV and double free among them)
at its size: the same code paths under the sanitizer, half the processes.

    TENSORPAR_BIN=build/tensorpar /usr/bin/python3 tests/e2e/test_every_style.py [--shard K/N]
"""

import ast
import concurrent.futures
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tpe2e  # noqa: E402

CRASH = re.compile(r"Sanitizer|Segmentation|runtime error:|core dumped|Aborted|Traceback|killed by signal|"
                   r"double free|invalid pointer|munmap_chunk", re.I)
# Verbatim §4.7 refusals: they name tensors and head counts, not a style.
SPEC_REFUSALS = ("Cannot use tensor parallelism with tp_size=", "Tied parameters `",
                 "The packed dimension of `", "Global number of experts must be divisible by number of devices: ")
TOKENS = "3,17,42,99,5,150,7"
SIZES = (2, 3)

# 6 query heads and an intermediate size of 96 divide by 2 and 3; qwen2
# (q/k/v biases) has 2 KV heads, which P = 3 cannot split (refusals);
# qwen3 ties its embeddings and norms q and k per head.
COMMON = {"hidden_size": 48, "head_dim": 8, "num_attention_heads": 6, "intermediate_size": 96,
          "vocab_size": 200, "num_hidden_layers": 2}
MODELS = [
    ("llama", {"num_key_value_heads": 6}),
    ("qwen2", {"num_key_value_heads": 2}),
    ("qwen3", {"num_key_value_heads": 6, "tie_word_embeddings": True}),
    ("qwen3_moe", {"num_key_value_heads": 6, "moe_intermediate_size": 48}),
    # layer 0 dense, layer 1 Llama 4's MoE block (bmm-style experts, router, shared expert)
    ("llama4_text", {"num_key_value_heads": 6, "intermediate_size_mlp": 96}),
    # sinks, the biased router and experts in Transformers' layout; a window shorter than TOKENS
    ("gpt_oss", {"num_key_value_heads": 6, "intermediate_size": 48, "sliding_window": 4}),
]


def sh(*args, timeout=120):
    p = subprocess.run([tpe2e.BIN, *map(str, args)], capture_output=True, text=True, timeout=timeout,
                       env=tpe2e.job_env())
    return p


def make_model(work, arch, sets):
    d = os.path.join(work, arch)
    # routers (MoE only) with a wide spread: top-k choices that rounding cannot flip
    args = ["make-model", "--arch", arch, "--preset", "tiny", "--dtype", "f32", "--seed", "3", "--router-std", "0.3",
            "--out", d]
    for k, v in dict(COMMON, **sets).items():
        args += ["--set", f"{k}={json.dumps(v)}"]
    p = sh(*args)
    assert p.returncode == 0, p.stderr
    return d


def style_names(model, work):
    """The registry's list, from the unknown-style message (§4.7)."""
    path = os.path.join(work, "unknown.json")
    with open(path, "w") as f:
        json.dump({"lm_head": "no_such_style"}, f)
    p = sh("plan", "--model", model, "--tp", "2", "--tp-plan", path)
    m = re.search(r"Supported styles are (\[.*\])", p.stderr)
    assert p.returncode != 0 and m, p.stderr
    return ast.literal_eval(m.group(1))


def builtin_plan(model):
    p = sh("plan", "--model", model, "--tp", "2", "--json")
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)["plan"]


def module_kinds(arch):
    attn = [f"model.layers.*.self_attn.{n}" for n in ("q_proj", "k_proj", "v_proj", "o_proj")]
    mlp = [f"model.layers.*.mlp.{n}" for n in ("gate_proj", "up_proj", "down_proj")]
    if arch == "qwen3_moe":   # every layer sparse: the router, the experts and their tensors
        mlp = [f"model.layers.*.mlp.{n}" for n in ("gate", "experts", "experts.gate_up_proj", "experts.down_proj")]
    if arch == "gpt_oss":     # the sinks; the router, the experts, their tensors and biases
        attn.append("model.layers.*.self_attn.sinks")
        mlp = [f"model.layers.*.mlp.{n}" for n in ("router", "experts", "experts.gate_up_proj",
                                                   "experts.gate_up_proj_bias", "experts.down_proj",
                                                   "experts.down_proj_bias")]
    if arch == "llama4_text":   # the dense layer's MLP and the MoE layer's parts
        mlp = [f"model.layers.*.feed_forward.{n}" for n in (
            "gate_proj", "up_proj", "down_proj", "router", "experts", "experts.gate_up_proj", "experts.down_proj",
            "shared_expert", "shared_expert.gate_proj", "shared_expert.up_proj", "shared_expert.down_proj")]
    norms = ["model.layers.*.input_layernorm", "model.layers.*.post_attention_layernorm", "model.norm"]
    if arch in ("qwen3", "qwen3_moe"):
        norms += ["model.layers.*.self_attn.q_norm", "model.layers.*.self_attn.k_norm"]
    ffn = "feed_forward" if arch == "llama4_text" else "mlp"
    containers = ["model.layers.*.self_attn", f"model.layers.*.{ffn}", "model.layers.*", "model"]
    return attn + mlp + ["model.embed_tokens", "lm_head"] + norms + containers


def names_module_and_style(msg, key, style):
    if any(s in msg for s in SPEC_REFUSALS):
        return True
    if f"'{style}'" not in msg:
        return False
    # the module itself (indexed or not), or the one its output reached
    short = key.replace("*", "0")
    return f"`{short}" in msg or key.split(".")[-1] in msg


class Case:
    def __init__(self, arch, model, P, key, style, plan, ref):
        self.arch, self.model, self.P, self.key, self.style, self.plan, self.ref = arch, model, P, key, style, plan, ref

    def label(self):
        return f"{self.arch} P={self.P} {self.key}: {self.style}"


def run_case(c, work, run_refused):
    """Returns (failures, 'ok'|'refused')."""
    fails = []
    tag = re.sub(r"[^a-zA-Z0-9]+", "_", f"{c.arch}_{c.P}_{c.key}_{c.style}")
    path = os.path.join(work, tag + ".json")
    with open(path, "w") as f:
        json.dump(c.plan, f)
    p = sh("plan", "--model", c.model, "--tp", c.P, "--tp-plan", path)
    if CRASH.search(p.stderr) or p.returncode < 0:
        return [f"{c.label()}: `plan` crashed ({p.returncode}): {p.stderr[-400:]}"], "crash"
    refused = p.returncode != 0
    if refused:
        msg = p.stderr.strip().splitlines()[-1] if p.stderr.strip() else ""
        if p.returncode not in (1, 2):
            fails.append(f"{c.label()}: `plan` exit status {p.returncode}")
        if not names_module_and_style(msg, c.key, c.style):
            fails.append(f"{c.label()}: refusal does not name the module and the style: {msg}")
        if not run_refused:
            return fails, "refused"
    out = os.path.join(work, tag + "-%r.npy")
    q = sh("logits", "--model", c.model, "--tokens", TOKENS, "--out", out, "--tp", c.P, "--tp-plan", path,
           "--threads", 1)
    if CRASH.search(q.stderr) or q.returncode < 0:
        return fails + [f"{c.label()}: `logits` crashed ({q.returncode}): {q.stderr[-400:]}"], "crash"
    if refused:
        if q.returncode not in (1, 2):
            fails.append(f"{c.label()}: `plan` refused but `logits` exited {q.returncode}")
        elif msg and msg.split(": error: ", 1)[-1] not in q.stderr:
            fails.append(f"{c.label()}: `logits` refused differently: {q.stderr[-300:]}")
        if os.path.exists(out.replace("%r", "0")):
            fails.append(f"{c.label()}: refused but wrote logits")
        return fails, "refused"
    if q.returncode != 0:
        return fails + [f"{c.label()}: `plan` accepted it but `logits` exited {q.returncode}: {q.stderr[-400:]}"], "bad"
    ranks = [np.load(out.replace("%r", str(r))) for r in range(c.P)]
    for r in range(c.P):
        os.unlink(out.replace("%r", str(r)))
    if not all(np.isfinite(x).all() for x in ranks):
        return fails + [f"{c.label()}: non-finite logits with exit status 0"], "bad"
    if any(not np.array_equal(ranks[0], x) for x in ranks[1:]):
        fails.append(f"{c.label()}: ranks' logits differ")
    err = tpe2e.rel(ranks[0], c.ref)
    if not err < 2e-5:
        fails.append(f"{c.label()}: logits differ from TP = 1 by {err:.3g} (relative) with exit status 0")
    return fails, "ok"


L = "model.layers.*."
QKV = {L + "self_attn.q_proj": "local_colwise", L + "self_attn.k_proj": "local_colwise",
       L + "self_attn.v_proj": "local_colwise"}
# Plans that combine rules (the legacy pairs, parameter-level rules, a
# block that sums what its modules left partial): (name, rules over the
# built-in plan, P, expected "ok" or a text the refusal must contain).
PATTERNS = [
    ("local_colwise q/k/v (was SIGSEGV)", QKV, 2, "ok"),
    ("local_colwise + local_rowwise + gather (was a double free)",
     dict(QKV, **{L + "self_attn.o_proj": "local_rowwise", L + "self_attn": "gather"}), 3, "ok"),
    ("local_colwise + local_rowwise, nothing sums", dict(QKV, **{L + "self_attn.o_proj": "local_rowwise"}), 2,
     "nothing sums it"),
    ("legacy MLP under gather", {L + "mlp.gate_proj": "local_colwise", L + "mlp.up_proj": "local_colwise",
                                 L + "mlp.down_proj": "local_rowwise", L + "mlp": "gather"}, 3, "ok"),
    ("local (÷ P) under gather", {L + "mlp.gate_proj": "replicate", L + "mlp.up_proj": "replicate",
                                  L + "mlp.down_proj": "local", L + "mlp": "gather"}, 3, "ok"),
    ("packed pair under all_reduce", {L + "mlp.gate_proj": "packed_colwise", L + "mlp.up_proj": "packed_colwise",
                                      L + "mlp.down_proj": "packed_rowwise", L + "mlp": "all_reduce"}, 2, "ok"),
    ("parameter rules under all_reduce", {L + "mlp.gate_proj.weight": "colwise", L + "mlp.up_proj.weight": "colwise",
                                          L + "mlp.down_proj.weight": "rowwise", L + "mlp.down_proj": "all_reduce"},
     3, "ok"),
    ("all_reduce on down_proj (was wrong logits)", {L + "mlp.down_proj": "all_reduce"}, 2,
     "its weight is Replicate() on each rank"),
    ("replicate on down_proj (was wrong logits)", {L + "mlp.down_proj": "replicate"}, 2,
     "it declares its input Replicate, but the input it receives here is Shard(-1)"),
    ("local on down_proj (was NaN)", {L + "mlp.down_proj": "local"}, 3, "'local'"),
    ("sequence_parallel on the stream norms", {L + "input_layernorm": "sequence_parallel",
                                              L + "post_attention_layernorm": "sequence_parallel",
                                              "model.norm": "sequence_parallel"}, 3, "ok"),
    ("sequence_parallel on a block", {L + "mlp": "sequence_parallel"}, 2, "sequence-sharded"),
    ("gather on a decoder layer", {"model.layers.*": "gather"}, 2, "P copies"),
]


def patterns(work):
    fails = []
    model = make_model(work, "llama", dict(MODELS[0][1]))
    ref = np.load(os.path.join(work, "llama-ref.npy"))
    base = builtin_plan(model)
    for name, rules, P, want in PATTERNS:
        key = list(rules)[-1]
        c = Case("llama", model, P, key, rules[key], dict(base, **rules), ref)
        f, kind = run_case(c, work, True)
        fails += [f"{name}: {x}" for x in f]
        if (want == "ok") != (kind == "ok"):
            fails.append(f"{name}: {kind}, expected {'ok' if want == 'ok' else 'a refusal'}")
        if want != "ok":
            path = os.path.join(work, "pattern.json")
            with open(path, "w") as fp:
                json.dump(c.plan, fp)
            msg = sh("plan", "--model", model, "--tp", P, "--tp-plan", path).stderr
            if want not in msg:
                fails.append(f"{name}: the refusal does not say {want!r}: {msg[-300:]}")
    # rowwise k_proj at P = 4 with 2 KV heads: refused for what is wrong
    # with it (its input), not for KV-head replication.
    d = os.path.join(work, "kv2")
    assert sh("make-model", "--arch", "llama", "--preset", "tiny", "--out", d).returncode == 0
    path = os.path.join(work, "kv2.json")
    with open(path, "w") as f:
        json.dump({L + "self_attn.k_proj": "rowwise"}, f)
    p = sh("logits", "--model", d, "--tokens", TOKENS, "--out", os.path.join(work, "kv2-%r.npy"), "--tp", 4,
           "--tp-plan", path)
    if p.returncode != 1 or "replication" in p.stderr or "'rowwise'" not in p.stderr or "k_proj" not in p.stderr:
        fails.append(f"rowwise k_proj at P = 4, 2 KV heads: {p.returncode}: {p.stderr[-300:]}")
    return fails


def shard_arg(argv):
    """(K, N) from `--shard K/N` (1 <= K <= N); (1, 1) without it."""
    if not argv:
        return 1, 1
    m = re.fullmatch(r"(\d+)/(\d+)", argv[1]) if len(argv) == 2 and argv[0] == "--shard" else None
    if not m or not 1 <= int(m.group(1)) <= int(m.group(2)):
        raise SystemExit("usage: test_every_style.py [--shard K/N]")
    return int(m.group(1)), int(m.group(2))


def main():
    if not os.path.exists(tpe2e.BIN):
        raise SystemExit(f"tensorpar CLI not found: {tpe2e.BIN}")
    shard, shards = shard_arg(sys.argv[1:])
    sanitized = os.environ.get("TENSORPAR_SANITIZED") == "1"
    work = tempfile.mkdtemp(prefix="tp-e2e-styles-")
    failures, counts = [], {}
    try:
        cases = []
        for i, (arch, sets) in enumerate(MODELS):
            model = make_model(work, arch, sets)
            ref_path = os.path.join(work, arch + "-ref.npy")
            p = sh("logits", "--model", model, "--tokens", TOKENS, "--out", ref_path, "--threads", 1)
            assert p.returncode == 0, p.stderr
            ref = np.load(ref_path)
            styles = style_names(model, work)
            assert len(styles) == 25 and styles[0] == "embedding_rowwise" and styles[-1] == "replicate", styles
            base = builtin_plan(model)
            for P in SIZES:
                for ki, key in enumerate(module_kinds(arch)):
                    for si, style in enumerate(styles):
                        plan = dict(base)
                        plan[key] = style
                        # refusals also through `logits`: a third of the
                        # first model's at P = 2, every style and kind met
                        again = i == 0 and P == 2 and (ki + si) % 3 == 0
                        # the sanitized suite: each at one of the two sizes (see above)
                        if not sanitized or (ki + si + P) % 2 == 0:
                            cases.append((Case(arch, model, P, key, style, plan, ref), again))
        cases = cases[shard - 1::shards]
        with concurrent.futures.ThreadPoolExecutor(max_workers=3) as ex:
            for fails, kind in ex.map(lambda cr: run_case(cr[0], work, cr[1]), cases):
                failures += fails
                counts[kind] = counts.get(kind, 0) + 1
        print(f"shard {shard}/{shards}: {len(cases)} cases: " +
              ", ".join(f"{v} {k}" for k, v in sorted(counts.items())))
        if shard == 1:
            failures += patterns(work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    for f in failures:
        print("FAIL:", f, file=sys.stderr)
    if failures:
        raise SystemExit(f"{len(failures)} failures")
    print("OK")


if __name__ == "__main__":
    main()
