"""PEFT LoRA in NumPy float64: writes adapters in PEFT's save_pretrained layout
and gives the reference logits of a base model with an adapter.

The math is PEFT's LoraLayer (peft/tuners/lora/layer.py, Linear.forward):
    y = base(x) + scale * lora_B(lora_A(dropout(x))),
    scale = lora_alpha / r, or lora_alpha / sqrt(r) with use_rslora,
with lora_A.weight [r, in] and lora_B.weight [out, r]; keys are
base_model.model.<module>.lora_A.weight / .lora_B.weight.  Without dropout
(inference) that equals x @ (W + scale * B @ A).T + b, which is how the
reference applies it: the merged weights go through hf_reference's model.
With dropout (training) the reference computes tensorpar's masks itself, from
the same counter-based hash of (seed, step, row, module, element) as
src/models/lora_dropout.c, and adds the adapter's term to each projection."""

import json
import math
import os
import re

import numpy as np

import hf_reference as ref

PROJ = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def targeted(names, targets):
    """The module names PEFT targets: a list matches a name or a dotted suffix,
    a string is a regex that must match the whole name (re.fullmatch)."""
    if isinstance(targets, str):
        return [n for n in names if re.fullmatch(targets, n)]
    return [n for n in names if any(n == t or n.endswith("." + t) for t in targets)]


def scale_of(cfg):
    r, alpha = cfg["r"], cfg["lora_alpha"]
    return alpha / math.sqrt(r) if cfg.get("use_rslora") else alpha / r


def linear_modules(tensors):
    """Names of the Linear modules of a model's tensors (2-D weights but the embedding)."""
    return sorted(n[:-len(".weight")] for n, a in tensors.items()
                  if n.endswith(".weight") and a.ndim == 2 and "embed_tokens" not in n)


def write_adapter(out_dir, model_dir, r=4, alpha=8, targets=("q_proj", "v_proj"), use_rslora=False, seed=0,
                  b_std=0.05, extra_config=None, modules_to_save=None, save_std=0.05, bias="none"):
    """A PEFT LoRA adapter for the model in model_dir with random A and
    non-zero B (PEFT initialises B to zeros; a test adapter must matter).
    modules_to_save: their trained copies, the base weight plus noise, under
    the keys PEFT's get_peft_model_state_dict gives them on disk
    (`<module>.modules_to_save.default.weight` without "modules_to_save."
    and ".default": base_model.model.<module>.weight).  bias "all" / "lora_only":
    the trained biases of every module / of the targeted ones, base plus
    noise, under base_model.model.<module>.base_layer.bias for an adapted
    module (PEFT wraps it: its bias is the base layer's, the key fixed for
    "lora_only" in PEFT issue #3306) and base_model.model.<module>.bias for
    any other."""
    t = dict(ref.load_model_tensors(model_dir))
    if "lm_head.weight" not in t:   # tied: PEFT still wraps lm_head as a Linear of its own
        t["lm_head.weight"] = t["model.embed_tokens.weight"]
    rng = np.random.default_rng(seed)
    tlist = list(targets) if not isinstance(targets, str) else targets
    names = targeted(linear_modules(t) + ["model.embed_tokens"], tlist)
    arrays = {}
    for n in names:
        out, inp = t[n + ".weight"].shape
        if n.endswith("embed_tokens"):   # PEFT's Embedding: A [r, V], B [H, r], no ".weight"
            arrays[f"base_model.model.{n}.lora_embedding_A"] = rng.normal(0, 1.0, (r, out))
            arrays[f"base_model.model.{n}.lora_embedding_B"] = rng.normal(0, b_std, (inp, r))
            continue
        arrays[f"base_model.model.{n}.lora_A.weight"] = rng.normal(0, 1 / math.sqrt(inp), (r, inp))
        arrays[f"base_model.model.{n}.lora_B.weight"] = rng.normal(0, b_std, (out, r))
    for n in targeted(linear_modules(t) + ["model.embed_tokens"], list(modules_to_save or [])):
        w = t[n + ".weight"]
        arrays[f"base_model.model.{n}.weight"] = w + rng.normal(0, save_std, w.shape)
    biased = sorted(k[:-len(".bias")] for k in t if k.endswith(".bias"))
    for n in biased if bias == "all" else [n for n in biased if n in names] if bias == "lora_only" else []:
        b = t[n + ".bias"]
        arrays[f"base_model.model.{n}.{'base_layer.' if n in names else ''}bias"] = b + rng.normal(0, save_std, b.shape)
    os.makedirs(out_dir, exist_ok=True)
    ref.write_safetensors(os.path.join(out_dir, "adapter_model.safetensors"), arrays, "F32",
                          metadata={"format": "pt"})
    cfg = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": r, "lora_alpha": alpha, "lora_dropout": 0.0,
           "bias": bias, "use_rslora": use_rslora, "fan_in_fan_out": False,
           "modules_to_save": list(modules_to_save) if modules_to_save else None,
           "target_modules": list(targets) if not isinstance(targets, str) else targets,
           "base_model_name_or_path": model_dir, "inference_mode": True}
    cfg.update(extra_config or {})
    with open(os.path.join(out_dir, "adapter_config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    return names


def merged_tensors(model_dir, adapter_dir):
    """The base tensors with scale * B @ A added to each targeted weight
    (float64), lm_head.weight always its own (a tied head starts as the base
    table: PEFT's embedding adapter changes the lookup only, and an lm_head
    adapter is a Linear adapter on the head alone)."""
    t = dict(ref.load_model_tensors(model_dir))
    t.setdefault("lm_head.weight", t["model.embed_tokens.weight"])
    with open(os.path.join(adapter_dir, "adapter_config.json")) as f:
        cfg = json.load(f)
    a = ref.read_safetensors(os.path.join(adapter_dir, "adapter_model.safetensors"))
    s = scale_of(cfg)
    for key in a:   # modules_to_save and trained biases: the saved copy replaces the base's
        if ".lora_" not in key:
            t[key[len("base_model.model."):].replace(".base_layer.", ".")] = a[key]
    for key in a:
        if key.endswith(".lora_embedding_A"):
            mod = key[len("base_model.model."):-len(".lora_embedding_A")]
            B = a[f"base_model.model.{mod}.lora_embedding_B"]
            # F.embedding(ids, A.T) @ B.T: the table gains (B @ A).T
            t[mod + ".weight"] = t[mod + ".weight"] + s * (B @ a[key]).T
        if key.endswith(".lora_A.weight"):
            mod = key[len("base_model.model."):-len(".lora_A.weight")]
            B = a[f"base_model.model.{mod}.lora_B.weight"]
            t[mod + ".weight"] = t[mod + ".weight"] + s * (B @ a[key])
    return t


def reference_logits(model_dir, adapter_dir, tokens):
    merged = merged_tensors(model_dir, adapter_dir)
    model = ref.HFReference(model_dir, tensors=merged)
    model.tied = False   # merged_tensors gave lm_head its own weight
    return model.forward(tokens)


# ---- dropout masks: tensorpar's counter-based ones (src/models/lora_dropout.c) ----

M64 = (1 << 64) - 1
GOLD = 0x9E3779B97F4A7C15
DROPOUT_STREAM = 0x6C6F72615F64726F


def _finalise(z):
    with np.errstate(over="ignore"):
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def rng_hash(key, counter):
    """tp_rng_hash: splitmix64's finaliser of key + (counter + 1) * golden, on uint64 arrays or ints."""
    with np.errstate(over="ignore"):
        z = np.uint64(key) + (np.asarray(counter, dtype=np.uint64) + np.uint64(1)) * np.uint64(GOLD)
    return _finalise(z)


def fnv1a(name):
    h = 0xCBF29CE484222325
    for c in name.encode():
        h = ((h ^ c) * 0x100000001B3) & M64
    return h


def dropout_keep(seed, step, row, module, T, width, p):
    """The keep mask [T, width] of module's adapter input for sequence `row` at optimizer
    step `step` (from 0): what tensorpar's trainer draws with --seed seed at any TP size."""
    key = int(rng_hash(int(rng_hash(int(rng_hash(seed, DROPOUT_STREAM)), step)), row))
    key = int(rng_hash(key, fnv1a(module)))
    h = rng_hash(key, np.arange(T * width, dtype=np.uint64)).reshape(T, width)
    return (h >> np.uint64(11)).astype(np.float64) * 2.0 ** -53 >= p


def lora_reference_train(model_dir, adapter_dir, data_path, seed=0, **opts):
    """hf_reference_train's Trainer steps with PEFT's LoRA: the base frozen
    (no gradient, no optimizer state), the adapter's A and B the only
    parameters, y = base(x) + scale * B(A(dropout(x))) on each targeted
    Linear, dropout's masks tensorpar's (dropout_keep, with the trainer's
    --seed `seed`).  Returns (log, {PEFT key: float64 array}) after
    opts["steps"]."""
    import torch
    import hf_reference_grad as gref
    import hf_reference_train as tref

    o = dict(tref.DEFAULTS)
    o.update(opts)
    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = json.load(f)
    with open(os.path.join(adapter_dir, "adapter_config.json")) as f:
        acfg = json.load(f)
    s = scale_of(acfg)
    base = {k: torch.tensor(v, dtype=torch.float64) for k, v in gref.load_weights(model_dir).items()}
    if cfg.get("tie_word_embeddings"):
        # the head reads lm_head.weight below: PEFT's embedding adapter changes the lookup only
        base["lm_head.weight"] = base["model.embed_tokens.weight"]
        cfg = dict(cfg, tie_word_embeddings=False)
    start = ref.read_safetensors(os.path.join(adapter_dir, "adapter_model.safetensors"))
    params = {k: torch.tensor(v, dtype=torch.float64, requires_grad=True) for k, v in start.items()}
    pre = "base_model.model."
    mods = sorted({k[len(pre):-len(".lora_A.weight")] for k in params if k.endswith(".lora_A.weight")})
    embs = sorted({k[len(pre):-len(".lora_embedding_A")] for k in params if k.endswith(".lora_embedding_A")})
    # modules_to_save: PEFT saves the trained copy under the module's own key
    saved = sorted(k for k in params if ".lora_" not in k)

    def weights():
        # x·(W + s·B·A)ᵀ = x·Wᵀ + s·(x·Aᵀ)·Bᵀ: the same function, so the same gradients of A and B;
        # PEFT's Embedding: W[ids] + s·embedding(ids, Aᵀ)·Bᵀ = (W + s·(B·A)ᵀ)[ids]
        w = dict(base)
        for key in saved:   # an adapted module's bias is its base layer's
            w[key[len(pre):].replace(".base_layer.", ".")] = params[key]
        for mname in mods:
            A = params[f"{pre}{mname}.lora_A.weight"]
            B = params[f"{pre}{mname}.lora_B.weight"]
            w[mname + ".weight"] = w[mname + ".weight"] + s * (B @ A)
        for mname in embs:
            A = params[f"{pre}{mname}.lora_embedding_A"]
            B = params[f"{pre}{mname}.lora_embedding_B"]
            w[mname + ".weight"] = w[mname + ".weight"] + s * (B @ A).T
        return w

    p = acfg.get("lora_dropout") or 0.0

    def forward(q, step, row):
        if not p:
            return gref.forward_logits(cfg, weights(), q)

        def adapter(name, x):
            if name not in mods:
                return None
            keep = torch.tensor(dropout_keep(seed, step, row, name, x.shape[0], x.shape[1], p))
            xd = torch.where(keep, x / (1 - p), torch.zeros_like(x))
            A = params[f"base_model.model.{name}.lora_A.weight"]
            B = params[f"base_model.model.{name}.lora_B.weight"]
            return s * ((xd @ A.T) @ B.T)
        return gref.forward_logits(cfg, base, q, adapter)

    seqs = tref.read_sequences(data_path, o["seq_len"])
    log = tref.train_steps(params, seqs, o, forward, cfg["vocab_size"])
    return log, {k: v.detach().numpy().copy() for k, v in params.items()}
