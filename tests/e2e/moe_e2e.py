"""Helpers shared by the mixture-of-experts model tests (test_moe_train.py,
test_deepseek[_train].py, test_gpt_oss[_train].py, test_llama4[_train].py):
the tiny models they draw, `tensorpar grads` / `train` runs read back, and the
comparisons against the torch reference and against TP = 1.  The tolerances
are the tests': TOL relative for losses, gradients and logits, PARAM_TOL for
trained parameters."""

import json
import os
import shutil
import tempfile

import numpy as np

from tpe2e import make_model, read_log, rel, run, tp_logits, vocab_size, write_token_rows
import hf_reference as ref

TOL = 1e-5
PARAM_TOL = 1e-4
TOKENS = [1, 5, 9, 42, 7, 3, 11, 200, 17, 99, 4, 8, 300, 12, 6, 77]
ADAMW = dict(seq_len=16, batch_size=2, grad_accum=2, steps=5, optim="adamw", lr=1e-3, lr_scheduler="linear",
             warmup_steps=1, weight_decay=0.1, max_grad_norm=1.0)
FLAGS = dict(seq_len="--seq-len", batch_size="--batch-size", grad_accum="--grad-accum", steps="--steps",
             optim="--optim", lr="--lr", lr_scheduler="--lr-scheduler", warmup_steps="--warmup-steps",
             weight_decay="--weight-decay", max_grad_norm="--max-grad-norm")
# TP = 2, 4 and EP = 2, 4: (tp, extra flags)
TP_EP_SPLITS = ((2, ()), (4, ()), (2, ("--ep",)), (4, ("--ep",)))


def scratch_dir(module_globals, prefix):
    """(setUpModule, tearDownModule) that make and remove the test module's WORK directory."""
    def set_up():
        module_globals["WORK"] = tempfile.mkdtemp(prefix=prefix)

    def tear_down():
        shutil.rmtree(module_globals["WORK"], ignore_errors=True)
    return set_up, tear_down


def make_tiny(work, name, arch, *extra):
    """The tiny preset, q/k drawn with std 0.25 and routers with std 0.3 (decisive
    attention and top-k choices), seed 3."""
    return make_model(work, name, arch, "--preset", "tiny", "--qk-std", "0.25", "--router-std", "0.3",
                      "--seed", "3", *extra)


def read(path):
    return ref.read_safetensors(path, np.float64)


def file_bytes(path):
    with open(path, "rb") as f:
        return f.read()


def reference_logits(model, tokens):
    """The reference's logits for tokens given as "1,2,3"."""
    return ref.reference_logits(model, [int(t) for t in tokens.split(",")])


def check_reference(tc, work, model, tokens, want):
    """The logits, whole prompt and token by token through the KV cache, within TOL of want."""
    tc.assertLessEqual(rel(tp_logits(work, model, 1, tokens=tokens), want), TOL, model)
    out = os.path.join(work, "inc.npy")
    run("logits", "--model", model, "--tokens", tokens, "--out", out, "--incremental")
    tc.assertLessEqual(rel(np.load(out), want), TOL, f"{model} token by token")


def stacked_reference(model, grads):
    """The reference's gradients under the model's names: per-expert ones stacked as
    gate_up_proj [E, 2I, H] ([gate; up]) and down_proj [E, H, I]; Mixtral's
    block_sparse_moe.gate as mlp.gate."""
    with open(os.path.join(model, "config.json")) as f:
        mixtral = json.load(f)["model_type"] == "mixtral"
    names = ("w1", "w3", "w2") if mixtral else ("gate_proj", "up_proj", "down_proj")
    out, experts = {}, {}
    for k, v in grads.items():
        parts = k.split(".")
        if "experts" in parts:
            layer, e = int(parts[2]), int(parts[parts.index("experts") + 1])
            experts.setdefault(layer, {})[(e, names.index(parts[-2]))] = v
        else:
            out[k.replace(".block_sparse_moe.gate.", ".mlp.gate.")] = v
    for layer, t in experts.items():
        E = 1 + max(e for e, _ in t)
        out[f"model.layers.{layer}.mlp.experts.gate_up_proj"] = np.stack(
            [np.concatenate([t[(e, 0)], t[(e, 1)]]) for e in range(E)])
        out[f"model.layers.{layer}.mlp.experts.down_proj"] = np.stack([t[(e, 2)] for e in range(E)])
    return out


def engine_grads(work, model, name, *extra, tokens=TOKENS):
    out = os.path.join(work, f"grads-{name}.safetensors")
    run("grads", "--model", model, "--tokens", ",".join(map(str, tokens)), "--out", out, *extra)
    return read(out)


def worst(got, want):
    """(max over tensors of max|got - want| / max|want|, that tensor), the same tensors asserted."""
    assert set(got) == set(want), f"tensors differ: {sorted(set(got) ^ set(want))}"
    w = (0.0, "")
    for k, v in want.items():
        assert got[k].shape == v.shape, f"{k}: shape {got[k].shape}, want {v.shape}"
        w = max(w, (float(np.max(np.abs(got[k] - v)) / max(np.max(np.abs(v)), 1e-30)), k))
    return w


def check_close(tc, got, want, tol, case, what):
    e, k = worst(got, want)
    tc.assertLessEqual(e, tol, f"{case}: {k} vs {what}: {e:.3e}")


def check_grads(tc, got, loss, want, case, what):
    """got (engine grads, its "loss" popped) has the loss within TOL of loss and each
    gradient within TOL of want's largest."""
    tc.assertLessEqual(abs(float(got.pop("loss")) - loss) / loss, TOL, case)
    check_close(tc, got, want, TOL, case, what)


def check_splits(tc, work, model, name, loss, base, splits=TP_EP_SPLITS, tokens=TOKENS):
    """Each split's grads equal TP = 1's (base) within TOL."""
    for i, (tp, extra) in enumerate(splits):
        g = engine_grads(work, model, f"{name}-split{i}", "--tp", tp, *extra, tokens=tokens)
        check_grads(tc, g, loss, base, f"{name} tp={tp} {extra}", "TP = 1")


def data_for(work, model):
    rng = np.random.default_rng(0)
    return write_token_rows(os.path.join(work, f"data-{vocab_size(model)}.jsonl"), rng, 24, vocab_size(model),
                            lambda i: int(rng.integers(6, 20)))


def train(work, model, out, opts, *extra, data=None):
    """Runs `tensorpar train` (opts: keys of FLAGS) on data (data_for's by default); its log."""
    args = ["train", "--model", model, "--data", data or data_for(work, model), "--out", out, "--threads", 1,
            "--no-shuffle", "--seed", 0, *extra]
    for k, v in opts.items():
        args += [FLAGS[k], v]
    run(*args)
    return read_log(out)


def check_losses(tc, case, log, want_log):
    for g, w in zip(log, want_log):
        tc.assertLessEqual(abs(g["loss"] - w["loss"]) / w["loss"], TOL, f"{case}: step {w['step']}")


def check_trained(tc, case, out, log, want_log, want, base):
    """A train run in out: as many steps as want_log, each loss within TOL, every parameter within
    PARAM_TOL of want (the reference's) and of base (TP = 1's, when not None); its parameters."""
    tc.assertEqual(len(log), len(want_log), case)
    check_losses(tc, case, log, want_log)
    got = read(os.path.join(out, "model.safetensors"))
    check_close(tc, got, want, PARAM_TOL, case, "the reference")
    if base is not None:
        check_close(tc, got, base, PARAM_TOL, case, "TP = 1")
    return got


def check_reload(tc, work, saved, want_logits, splits, tokens=TOKENS):
    """The saved model reloads at each split to logits within TOL of want_logits."""
    toks = ",".join(map(str, tokens))
    for tp, extra in splits:
        tc.assertLessEqual(rel(tp_logits(work, saved, tp, *extra, tokens=toks), want_logits), TOL,
                           f"{saved}: reloaded at tp={tp} {extra}")


def check_data_parallel(tc, work, model, opts, base_log, base):
    """--dp-replicate 2 and --dp-shard 2 (with TP 2 in EP mode inside) at half opts' per-replica batch
    take TP = 1's steps with opts: losses within TOL of base_log, parameters within PARAM_TOL of base."""
    half = dict(opts, batch_size=1)
    for case, args in (("dp-replicate", ("--dp-replicate", 2)),
                       ("dp-shard+ep", ("--dp-shard", 2, "--tp", 2, "--ep"))):
        out = os.path.join(work, f"dp-{case}")
        check_losses(tc, case, train(work, model, out, half, *args), base_log)
        check_close(tc, read(os.path.join(out, "model.safetensors")), base, PARAM_TOL, case, "TP = 1")


def check_same_bytes(tc, files, case):
    for i, b in enumerate(files[1:], 1):
        tc.assertEqual(b, files[0], f"{case}: save {i} differs from the first's bytes")


def check_saved_is_source(tc, saved, model, case=""):
    """The saved model.safetensors holds the source checkpoint's names and values exactly; the saved tensors."""
    got, src = read(os.path.join(saved, "model.safetensors")), read(os.path.join(model, "model.safetensors"))
    tc.assertEqual(sorted(got), sorted(src), case)
    for k in src:
        tc.assertTrue(np.array_equal(got[k], src[k]), f"{case}: {k}")
    return got
