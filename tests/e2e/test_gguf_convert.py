"""bench/llamacpp/convert.py, the GGUF converter of the llama.cpp harness,
without llama.cpp: tiny llama and qwen3 checkpoints (f32 and bf16, the real
Llama 3 and Qwen3 tokenizers) are converted to F32, BF16, Q8_0 and Q4_0, and
the files are read back — the fixed header bytes by hand, the rest with the
harness's own GGUF reader — and compared with the checkpoint read here from
the safetensors bytes: every key llama.cpp needs, every tensor's name,
shape, type and values (F32 and BF16 exact, Q8_0 within half a step of its
block, Q4_0 within half a step, a step where the top nibble was clamped;
Q4_0's embedding as stored and its output.weight written for a tied model
too, as tensorpar --dtype q4_0 holds them), the llama q/k row order, the
vocabulary, and the encodings against values worked out by hand.

The sanitized build's suite (TENSORPAR_SANITIZED=1) runs tensorpar's half
only, make-model and the tokenizer (check_cli_half): the rest is Python, the
same whatever build made the checkpoints, and the plain build's suite runs it."""

import json
import os
import struct
import subprocess
import sys
import tempfile

import numpy as np

from tpe2e import ROOT, TOKENIZERS, Checks, run

sys.path.insert(0, os.path.join(ROOT, "bench", "llamacpp"))
import gguf  # noqa: E402

CONVERT = os.path.join(ROOT, "bench", "llamacpp", "convert.py")
DTYPES = {"f32": gguf.F32, "bf16": gguf.BF16, "q8_0": gguf.Q8_0, "q4_0": gguf.Q4_0}
ck = Checks()


def safetensors(path):
    """{name: f32 array} of a model.safetensors, read here (not by the converter)."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        blob = f.read()
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        a, b = e["data_offsets"]
        raw = blob[a:b]
        if e["dtype"] == "F32":
            v = np.frombuffer(raw, dtype=np.float32)
        else:
            assert e["dtype"] == "BF16", e["dtype"]
            v = (np.frombuffer(raw, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)
        out[name] = v.reshape(e["shape"])
    return out


def convert(model, out, dtype, extra=()):
    p = subprocess.run([sys.executable, CONVERT, model, out, "--dtype", dtype, *extra], capture_output=True, text=True)
    if p.returncode:
        raise AssertionError(f"convert {model} --dtype {dtype} exited {p.returncode}:\n{p.stderr}")


def check_header_by_hand(path, n_tensors):
    with open(path, "rb") as f:
        head = f.read(24)
    ck(head[:4] == b"GGUF", f"{path}: magic {head[:4]!r}")
    version, nt, nkv = struct.unpack("<IQQ", head[4:])
    ck(version == 3, f"{path}: version {version}")
    ck(nt == n_tensors, f"{path}: {nt} tensors, expected {n_tensors}")
    ck(nkv > 20, f"{path}: only {nkv} key-values")


def hf_rows(g, a, arch, cfg):
    """The GGUF tensor a in Hugging Face's row order: llama's (and mixtral's)
    q/k rows are stored with each head's rotary pairs adjacent (row 2j + h
    of a head is Hugging Face row h * d/2 + j)."""
    if arch not in ("llama", "mixtral") or not g.endswith(("attn_q.weight", "attn_k.weight")):
        return a
    heads = cfg["num_attention_heads"] if g.endswith("attn_q.weight") else cfg["num_key_value_heads"]
    d = a.shape[0] // heads
    return a.reshape(heads, d // 2, 2, -1).swapaxes(1, 2).reshape(a.shape)


NAMES = {"attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
         "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj", "ffn_norm": "post_attention_layernorm",
         "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
         "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm",
         "attn_q_a": "self_attn.q_a_proj", "attn_q_a_norm": "self_attn.q_a_layernorm",
         "attn_q_b": "self_attn.q_b_proj", "attn_kv_a_mqa": "self_attn.kv_a_proj_with_mqa",
         "attn_kv_a_norm": "self_attn.kv_a_layernorm", "ffn_gate_inp": "mlp.gate",
         "ffn_gate_shexp": "mlp.shared_experts.gate_proj", "ffn_up_shexp": "mlp.shared_experts.up_proj",
         "ffn_down_shexp": "mlp.shared_experts.down_proj"}
EXPERTS = {"ffn_gate_exps": ("gate_proj", "w1"), "ffn_up_exps": ("up_proj", "w3"), "ffn_down_exps": ("down_proj", "w2")}
F32_ALWAYS = ("ffn_gate_inp", "exp_probs_b")   # routers and biases stay F32, as llama.cpp keeps them


def expected(g, w, cfg):
    """(the checkpoint tensors GGUF tensor g holds, as one f32 array in
    Hugging Face's order, the names used): experts stacked along a new
    first dimension, deepseek's k_b / v_b cut from kv_b_proj by hand; a tied
    model's output.weight (written under Q4_0) is the embedding."""
    arch = cfg["model_type"]
    top = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
           "output.weight": "model.embed_tokens.weight" if cfg.get("tie_word_embeddings") else "lm_head.weight"}
    if g in top:
        return w[top[g]], [top[g]]
    _, i, part, _ = g.split(".")
    p = f"model.layers.{i}."
    if part in EXPERTS:
        hf, mx = EXPERTS[part]
        E = cfg.get("num_local_experts") or cfg.get("num_experts") or cfg.get("n_routed_experts")
        names = [p + (f"block_sparse_moe.experts.{e}.{mx}.weight" if arch == "mixtral"
                      else f"mlp.experts.{e}.{hf}.weight") for e in range(E)]
        return np.stack([w[n] for n in names]), names
    if part in ("attn_k_b", "attn_v_b"):
        n = p + "self_attn.kv_b_proj.weight"
        heads, nope, v = cfg["num_attention_heads"], cfg["qk_nope_head_dim"], cfg["v_head_dim"]
        kv = w[n].reshape(heads, nope + v, cfg["kv_lora_rank"])
        # k_b[h, c, j] = kv_b[h (nope + v) + j, c]; v_b[h, j, c] = kv_b[h (nope + v) + nope + j, c]
        return (kv[:, :nope, :].transpose(0, 2, 1) if part == "attn_k_b" else kv[:, nope:, :]), [n]
    if part == "exp_probs_b":
        n = p + "mlp.gate.e_score_correction_bias"
    elif part == "ffn_gate_inp" and arch == "mixtral":
        n = p + "block_sparse_moe.gate.weight"
    else:
        n = p + NAMES[part] + ".weight"
    return w[n], [n]


def check_tensors(r, w, arch, cfg, dtype, tag, experts_stored=False):
    want = {v: k for k, v in DTYPES.items()}
    stored = {n for n in w if n != "lm_head.weight" or not cfg.get("tie_word_embeddings")}
    seen = set()
    if dtype == "q4_0":
        ck("output.weight" in r.tensors, f"{tag}: no output.weight")
    for g, (gtype, dims, off) in r.tensors.items():
        ck(off % 32 == 0, f"{tag} {g}: offset {off} not aligned to 32")
        src, names = expected(g, w, cfg)
        seen.update(names)
        ck(tuple(reversed(dims)) == src.shape, f"{tag} {g}: dims {dims} for shape {src.shape}")
        part = g.split(".")[-2]
        if src.ndim == 1 or part in F32_ALWAYS:
            exp_type = gguf.F32
        elif (experts_stored and part in EXPERTS) or (dtype == "q4_0" and g == "token_embd.weight"):
            exp_type = gguf.BF16 if cfg["torch_dtype"] == "bfloat16" else gguf.F32
        else:
            exp_type = DTYPES[dtype]
            if exp_type in (gguf.Q8_0, gguf.Q4_0) and src.shape[-1] % 32:
                exp_type = gguf.F32   # rows that are not whole blocks
        ck(gtype == exp_type, f"{tag} {g}: type {gguf.TYPE_NAMES.get(gtype)}, expected {want[exp_type]}")
        got = hf_rows(g, r.array(g), arch, cfg)
        if gtype in (gguf.Q4_0, gguf.Q8_0):
            # each value within half a step of its block (d = max|x| / 8 for Q4_0,
            # / 127 for Q8_0), plus what storing d as f16 moves the extreme value
            # (8 or 127 d 2^-11); Q4_0 a whole step where the nibble was clamped
            # at 15 (x / d in [7.5, 8]), so at most 5 % of values past half
            levels = 8 if gtype == gguf.Q4_0 else 127
            blocks = src.reshape(-1, 32)
            step = np.abs(blocks).max(axis=1, keepdims=True) / levels
            err = np.abs(got.reshape(-1, 32) - blocks)
            half = err <= step * (0.5 + levels * 2.0 ** -11) + 1e-12
            within = half if gtype == gguf.Q8_0 else err <= step * (1 + levels * 2.0 ** -11) + 1e-12
            ck(bool(within.all()), f"{tag} {g}: {want[gtype]} error {float((err / np.maximum(step, 1e-30)).max()):.3f} steps")
            ck(float(half.mean()) > 0.95, f"{tag} {g}: {want[gtype]} over half a step too often")
            if gtype == gguf.Q4_0:
                # and the values are those of the blocks ggml's rule gives, restated here
                ck(np.array_equal(got.reshape(-1, 32), q4_0_values(blocks)), f"{tag} {g}: not ggml's Q4_0 blocks")
        elif gtype == gguf.BF16:
            # the checkpoint's values rounded to bf16 (exact when stored as bf16)
            exp = gguf.bf16_to_f32(gguf.bf16_bits(src)).reshape(src.shape)
            ck(np.array_equal(got, exp), f"{tag} {g}: BF16 values differ")
        else:
            ck(np.array_equal(got, src), f"{tag} {g}: F32 values differ")
    ck(seen == stored, f"{tag}: tensors {sorted(stored - seen)[:4]} missing, {sorted(seen - stored)[:4]} extra")


def q4_0_values(blocks):
    """The values of ggml's Q4_0 blocks of f32 rows [n, 32], block by block
    (quantize_row_q4_0_ref): m the first value of largest magnitude, d =
    m / -8, nibble min(15, (int)(x·(1/d) + 8.5)) in f32, (nibble - 8)·d with
    d rounded to f16 — written out apart from the converter's numpy."""
    x = blocks.astype(np.float32)
    a = np.abs(x)
    # the first index where |x| reaches the block's maximum
    first = (a == a.max(axis=1, keepdims=True)).cumsum(axis=1).clip(0, 1).sum(axis=1, keepdims=True)
    m = np.take_along_axis(x, 32 - first, axis=1)
    d = (m / np.float32(-8)).astype(np.float32)
    inv = np.divide(np.float32(1), d, out=np.zeros_like(d), where=d != 0)
    q = np.minimum(15, np.trunc((x * inv).astype(np.float32) + np.float32(8.5)))
    return ((q - 8) * d.astype(np.float16).astype(np.float32)).astype(np.float32)


# llama.cpp's architecture of each model type
GGUF_ARCH = {"llama": "llama", "qwen3": "qwen3", "qwen3_moe": "qwen3moe", "mixtral": "llama",
             "deepseek_v2": "deepseek2", "deepseek_v3": "deepseek2"}


def expected_u32(cfg):
    """The u32 hyperparameters llama.cpp reads, from config.json by hand."""
    mt = cfg["model_type"]
    exp = {"block_count": cfg["num_hidden_layers"], "context_length": cfg["max_position_embeddings"],
           "embedding_length": cfg["hidden_size"], "feed_forward_length": cfg["intermediate_size"],
           "attention.head_count": cfg["num_attention_heads"], "vocab_size": cfg["vocab_size"]}
    if mt.startswith("deepseek"):
        # MLA as llama.cpp runs it: one KV head over the latent, the heads' widths as the *_mla lengths
        kv, rope = cfg["kv_lora_rank"], cfg["qk_rope_head_dim"]
        exp.update({"attention.head_count_kv": 1, "attention.key_length": kv + rope, "attention.value_length": kv,
                    "attention.key_length_mla": cfg["qk_nope_head_dim"] + rope,
                    "attention.value_length_mla": cfg["v_head_dim"], "attention.kv_lora_rank": kv,
                    "attention.q_lora_rank": cfg.get("q_lora_rank") or 0, "rope.dimension_count": rope,
                    "leading_dense_block_count": cfg["first_k_dense_replace"],
                    "expert_feed_forward_length": cfg["moe_intermediate_size"],
                    "expert_count": cfg["n_routed_experts"], "expert_used_count": cfg["num_experts_per_tok"],
                    "expert_shared_count": cfg["n_shared_experts"],
                    "expert_gating_func": 2 if mt == "deepseek_v3" else 1})
        if cfg.get("n_group", 1) > 1:
            exp.update({"expert_group_count": cfg["n_group"], "expert_group_used_count": cfg["topk_group"]})
        return exp
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    exp.update({"attention.head_count_kv": cfg["num_key_value_heads"], "attention.key_length": head_dim,
                "attention.value_length": head_dim, "rope.dimension_count": head_dim})
    if mt == "mixtral":
        exp.update({"expert_count": cfg["num_local_experts"], "expert_used_count": cfg["num_experts_per_tok"]})
    if mt == "qwen3_moe":
        exp.update({"expert_count": cfg["num_experts"], "expert_used_count": cfg["num_experts_per_tok"],
                    "expert_feed_forward_length": cfg["moe_intermediate_size"]})
    return exp


def check_kv(r, cfg, model, dtype, tag, pre):
    arch = GGUF_ARCH[cfg["model_type"]]
    kv = r.kv
    ck(kv.get("general.architecture") == arch, f"{tag}: architecture {kv.get('general.architecture')}")
    ck(kv.get("general.file_type") == {"f32": 0, "bf16": 32, "q8_0": 7, "q4_0": 2}[dtype], f"{tag}: file_type {kv.get('general.file_type')}")
    for k, v in expected_u32(cfg).items():
        ck(kv.get(f"{arch}.{k}") == v and r.kv_types.get(f"{arch}.{k}") == gguf.UINT32,
           f"{tag}: {arch}.{k} = {kv.get(f'{arch}.{k}')}, expected {v} (u32)")
    floats = [("rope.freq_base", cfg["rope_theta"]), ("attention.layer_norm_rms_epsilon", cfg["rms_norm_eps"])]
    if arch == "deepseek2":
        floats.append(("expert_weights_scale", cfg["routed_scaling_factor"]))
        ck(kv.get(f"{arch}.expert_weights_norm") == bool(cfg["norm_topk_prob"]),
           f"{tag}: expert_weights_norm {kv.get(f'{arch}.expert_weights_norm')}")
    for k, v in floats:
        got = kv.get(f"{arch}.{k}")
        ck(got is not None and np.float32(got) == np.float32(v) and r.kv_types[f"{arch}.{k}"] == gguf.FLOAT32,
           f"{tag}: {arch}.{k} = {got}, expected {v} (f32)")
    with open(os.path.join(model, "tokenizer.json"), encoding="utf-8") as f:
        tj = json.load(f)
    toks, types = kv["tokenizer.ggml.tokens"], kv["tokenizer.ggml.token_type"]
    ck(len(toks) == cfg["vocab_size"] and len(types) == cfg["vocab_size"], f"{tag}: {len(toks)} tokens")
    bad = [t for t, i in tj["model"]["vocab"].items() if toks[i] != t or types[i] != 1]
    ck(not bad, f"{tag}: vocabulary entries differ, e.g. {bad[:3]}")
    for a in tj["added_tokens"]:
        # control: special, or named <|...|> as llama.cpp's converter reads such names
        control = a["special"] or (a["content"].startswith("<|") and a["content"].endswith("|>"))
        ck(toks[a["id"]] == a["content"] and types[a["id"]] == (3 if control else 4),
           f"{tag}: added token {a['id']} {toks[a['id']]!r} type {types[a['id']]}")
    n_known = len(tj["model"]["vocab"]) + len(tj["added_tokens"])
    ck(all(types[i] == 5 for i in range(n_known, cfg["vocab_size"])), f"{tag}: padding tokens not UNUSED")
    merges = tj["model"]["merges"]
    ck(kv["tokenizer.ggml.merges"][:3] == [m if isinstance(m, str) else " ".join(m) for m in merges[:3]]
       and len(kv["tokenizer.ggml.merges"]) == len(merges), f"{tag}: merges differ")
    ck(kv["tokenizer.ggml.model"] == "gpt2", f"{tag}: tokenizer model {kv['tokenizer.ggml.model']}")
    ck(kv["tokenizer.ggml.pre"] == pre, f"{tag}: pre {kv['tokenizer.ggml.pre']}, expected {pre}")
    # BOS as tensorpar's tokenizer adds it (it follows Hugging Face's rules)
    ids = json.loads(run("tokenize", "--tokenizer", model, "--text", "Hello world", "--special").stdout)
    bos = kv.get("tokenizer.ggml.bos_token_id")
    ck(kv["tokenizer.ggml.add_bos_token"] == (ids[0] == bos), f"{tag}: add_bos_token {kv['tokenizer.ggml.add_bos_token']}, "
                                                               f"tensorpar's ids {ids[:3]}, bos {bos}")
    eos = kv.get("tokenizer.ggml.eos_token_id")
    eos_ids = cfg["eos_token_id"] if isinstance(cfg["eos_token_id"], list) else [cfg["eos_token_id"]]
    ck(eos in eos_ids, f"{tag}: eos {eos}, config's {eos_ids}")


def check_encodings():
    # Q8_0 by hand: one block with max |x| 127 (d = 1): halves go away from zero
    x = np.zeros(32, dtype=np.float32)
    x[:6] = [127, -0.5, 0.5, 2.5, -2.5, 0.49999997]
    q = gguf.quantize_q8_0(x[None, :])[0]
    ck(q[:2].tobytes() == struct.pack("<e", 1.0), f"Q8_0 scale bytes {q[:2].tobytes()!r}")
    ck(q[2:8].view(np.int8).tolist() == [127, -1, 1, 3, -3, 0], f"Q8_0 values {q[2:8].view(np.int8).tolist()}")
    # d = 2 / 127 as f16; q = x * (127 / 2) rounded
    y = np.linspace(-2, 2, 32, dtype=np.float32)
    q = gguf.quantize_q8_0(y[None, :])[0]
    d = np.float32(2) / np.float32(127)
    ck(q[:2].tobytes() == struct.pack("<e", float(d)), "Q8_0 scale of [-2, 2]")
    exp = [int(np.sign(v) * np.floor(abs(float(v * (np.float32(1) / d))) + 0.5)) for v in y]
    ck(q[2:].view(np.int8).tolist() == exp, "Q8_0 values of [-2, 2]")
    ck(gguf.quantize_q8_0(np.zeros((1, 32), np.float32))[0].tobytes() == bytes(34), "Q8_0 of zeros")
    # Q4_0 by hand: x[i] = i - 16, the largest magnitude x[0] = -16 (first of
    # |-16| and 15), d = -16 / -8 = 2, nibble i = floor(x / 2 + 8.5) (16 -> 15);
    # byte j holds nibble j low and nibble j + 16 high
    x = np.arange(32, dtype=np.float32) - 16
    q = gguf.quantize_q4_0(x[None, :])[0]
    ck(q[:2].tobytes() == struct.pack("<e", 2.0), f"Q4_0 scale bytes {q[:2].tobytes()!r}")
    nib = [min(15, (i + 1) // 2) for i in range(32)]
    ck(q[2:].tolist() == [nib[j] | nib[j + 16] << 4 for j in range(16)], f"Q4_0 bytes {q[2:].tolist()}")
    ck(gguf.dequantize_q4_0(q, 32)[0, [0, 1, 16, 31]].tolist() == [-16, -14, 0, 14], "Q4_0 values back")
    # a positive extreme: d negative; zeros: d = -0, nibbles 8
    y = np.zeros(32, dtype=np.float32)
    y[3], y[9] = 4, -4
    q = gguf.quantize_q4_0(y[None, :])[0]
    ck(q[:2].tobytes() == struct.pack("<e", -0.5) and q[5] & 15 == 0 and q[11] & 15 == 15, "Q4_0 of +-4")
    z = gguf.quantize_q4_0(np.zeros((1, 32), np.float32))[0]
    ck(z.tobytes() == struct.pack("<e", -0.0) + bytes([0x88] * 16), f"Q4_0 of zeros {z.tobytes()!r}")
    # bf16: nearest, ties to even; NaN stays NaN
    v = np.array([1 + 2 ** -8, 1 + 3 * 2 ** -8, 1 + 2 ** -7 + 2 ** -9, -1.5, np.nan], dtype=np.float32)
    b = gguf.bf16_bits(v)
    ck(b[:4].tolist() == [0x3F80, 0x3F82, 0x3F81, 0xBFC0], f"bf16 rounding {[hex(i) for i in b[:4]]}")
    ck(bool(np.isnan(gguf.bf16_to_f32(b[4:]))[0]), "bf16 of NaN")


def expected_count(cfg, w, dtype):
    """How many tensors the GGUF file holds: the checkpoint's, less a tied
    lm_head (kept under Q4_0), each sparse layer's E tensors per projection
    stacked into one, deepseek's kv_b_proj cut in two, plus rope_freqs under
    llama3 scaling."""
    tied = bool(cfg.get("tie_word_embeddings"))
    n = len(w) - (tied and "lm_head.weight" in w) + (tied and dtype == "q4_0") + bool(cfg.get("rope_scaling"))
    E = cfg.get("num_local_experts") or cfg.get("num_experts") or cfg.get("n_routed_experts") or 0
    sparse = len({k.split(".")[2] for k in w if ".experts." in k})
    n -= sparse * 3 * (E - 1)
    return n + sum(k.endswith("kv_b_proj.weight") for k in w)


def rewrite_header(src, dst, edit):
    """Copies a safetensors file with its header JSON changed by edit(header)."""
    with open(src, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        data = f.read()
    edit(header)
    h = json.dumps(header).encode()
    with open(dst, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + data)


def damaged_copy(work, model, name, damage):
    """A copy of the model folder with damage(folder) applied."""
    import shutil
    d = os.path.join(work, name)
    shutil.copytree(model, d)
    damage(d)
    return d


def check_refusals(work, model):
    """Damaged input is refused before anything is written: the message names
    the file, tensor or key, the exit status is not 0, an existing OUT is left
    as it was, and no temporary file is left beside it."""
    st = os.path.join("{d}", "model.safetensors")

    def truncate(d):
        p = st.format(d=d)
        os.truncate(p, os.path.getsize(p) // 2)

    def header_only(d):
        os.truncate(st.format(d=d), 5)

    def int_dtype(d):
        def edit(h):
            h["model.layers.1.self_attn.v_proj.weight"]["dtype"] = "I32"
        rewrite_header(st.format(d=d), st.format(d=d), edit)

    def wrong_shape(d):
        def edit(h):
            h["model.layers.0.mlp.experts.3.down_proj.weight"]["shape"].reverse()
        rewrite_header(st.format(d=d), st.format(d=d), edit)

    def bad_offsets(d):
        def edit(h):
            e = h["model.norm.weight"]
            e["data_offsets"][1] += 4
        rewrite_header(st.format(d=d), st.format(d=d), edit)

    def drop_key(key):
        def damage(d):
            p = os.path.join(d, "config.json")
            with open(p) as f:
                c = json.load(f)
            del c[key]
            with open(p, "w") as f:
                json.dump(c, f)
        return damage

    def drop_tensor(d):
        def edit(h):
            del h["model.layers.1.mlp.experts.5.up_proj.weight"]
        rewrite_header(st.format(d=d), st.format(d=d), edit)

    cases = [("truncated", truncate, ["model.safetensors", "truncated"]),
             ("short", header_only, ["model.safetensors", "truncated"]),
             ("i32", int_dtype, ["model.layers.1.self_attn.v_proj.weight", "I32"]),
             ("shape", wrong_shape, ["model.layers.0.mlp.experts.3.down_proj.weight", "[40, 64]"]),
             ("offsets", bad_offsets, ["model.norm.weight", "bytes"]),
             ("no-experts", drop_key("num_experts"), ["config.json", "num_experts"]),
             ("no-heads", drop_key("num_attention_heads"), ["config.json", "num_attention_heads"]),
             ("no-tensor", drop_tensor, ["model.layers.1.mlp.experts.5.up_proj.weight", "lacks"])]
    outdir = os.path.join(work, "refusals")
    os.makedirs(outdir)
    for name, damage, words in cases:
        d = damaged_copy(work, model, "damaged-" + name, damage)
        out = os.path.join(outdir, name + ".gguf")
        with open(out, "wb") as f:
            f.write(b"old")
        p = subprocess.run([sys.executable, CONVERT, d, out, "--dtype", "q8_0"], capture_output=True, text=True)
        err = p.stderr.strip()
        ck(p.returncode != 0 and all(wd in err for wd in words) and "Traceback" not in err,
           f"damaged {name}: exit {p.returncode}, message {err[-300:]!r}, expected one naming {words}")
        with open(out, "rb") as f:
            ck(f.read() == b"old", f"damaged {name}: the existing {out} was changed")
    left = sorted(set(os.listdir(outdir)) - {n + ".gguf" for n, _, _ in cases})
    ck(not left, f"damaged input left files behind: {left}")


def check_no_partial_file(work, model):
    """A failure while the file is being written (here the Q8_0 encoder
    failing on the tenth tensor) leaves no OUT and no temporary file."""
    sys.path.insert(0, os.path.dirname(CONVERT))
    import convert as cv
    real, calls = gguf.quantize_q8_0, [0]

    def failing(x):
        calls[0] += 1
        if calls[0] == 10:
            raise ValueError("injected failure")
        return real(x)

    outdir = os.path.join(work, "partial")
    os.makedirs(outdir)
    cv.gguf.quantize_q8_0 = failing
    try:
        cv.convert(model, os.path.join(outdir, "m.gguf"), "q8_0")
        ck(False, "the injected failure did not stop the conversion")
    except ValueError as e:
        ck("injected" in str(e), f"conversion failed otherwise: {e}")
    finally:
        cv.gguf.quantize_q8_0 = real
    ck(calls[0] == 10, f"the encoder ran {calls[0]} times")
    ck(os.listdir(outdir) == [], f"a failed write left {os.listdir(outdir)}")


def check_cli_half(models):
    """The sanitized build's share: the converter and every check of its
    output are Python and read files, so they give the same answers whatever
    build made the checkpoints; the plain build's suite runs them all.  What
    the sanitizer can catch here is tensorpar's half: make-model (above) and
    its tokenizer, which check_kv compares with the GGUF's BOS."""
    for arch, m, _ in models:
        with open(os.path.join(m, "config.json")) as f:
            cfg = json.load(f)
        ids = json.loads(run("tokenize", "--tokenizer", m, "--text", "Hello world", "--special").stdout)
        ck(len(ids) >= 2 and all(isinstance(i, int) and 0 <= i < cfg["vocab_size"] for i in ids),
           f"{arch}: tensorpar's ids {ids}")


def check_conversions(work, models):
    """Every model to every GGUF type, read back and compared; the converter's
    refusals and its failed writes."""
    for arch, m, pre in models:
        with open(os.path.join(m, "config.json")) as f:
            cfg = json.load(f)
        w = safetensors(os.path.join(m, "model.safetensors"))
        runs = [("f32", False), ("bf16", False), ("q8_0", False), ("q4_0", False)]
        if arch in ("mixtral", "deepseek_v2"):
            runs.append(("q8_0", True))
        for dtype, stored in runs:
            out = os.path.join(work, os.path.basename(m) + f".{dtype}{'-stored' if stored else ''}.gguf")
            convert(m, out, dtype, ["--experts", "stored"] if stored else [])
            tag = f"{os.path.basename(m)} -> {dtype}{' (experts stored)' if stored else ''}"
            check_header_by_hand(out, expected_count(cfg, w, dtype))
            r = gguf.Reader(out)
            if cfg.get("rope_scaling"):
                f = r.tensors.pop("rope_freqs.weight")
                # head_dim 16, theta 1e4, 256 original positions: the shortest
                # wavelength (2 pi) keeps 1, the longest (2 pi 1e4^(14/16)) takes
                # the factor 8, the ones between blend, rising
                v = np.frombuffer(r.buf, np.float32, count=8, offset=f[2])
                ck(f[0] == gguf.F32 and f[1] == (8,) and v[0] == 1 and v[-1] == 8 and
                   bool((np.diff(v) >= 0).all()) and 1 < v[3] < 8, f"{tag}: rope_freqs {f[:2]} {v}")
            check_kv(r, cfg, m, dtype, tag, pre)
            check_tensors(r, w, arch, cfg, dtype, tag, stored)
            r.close()
    # a model type the converter does not know is refused, naming it
    m = os.path.join(work, "mistral")
    run("make-model", "--arch", "mistral", "--preset", "tiny", "--tokenizer", os.path.join(TOKENIZERS, "llama3"),
        "--out", m)
    p = subprocess.run([sys.executable, CONVERT, m, os.path.join(work, "x.gguf")], capture_output=True, text=True)
    ck(p.returncode != 0 and "mistral" in p.stderr, f"mistral: exit {p.returncode}, {p.stderr.strip()}")
    moe = next(m for a, m, _ in models if a == "qwen3_moe")
    check_refusals(work, moe)
    check_no_partial_file(work, moe)


def main():
    sanitized = os.environ.get("TENSORPAR_SANITIZED") == "1"
    if not sanitized:
        check_encodings()
    with tempfile.TemporaryDirectory(prefix="tp-gguf-") as work:
        models = []
        llama3 = ["--set", "rope_scaling={\"rope_type\": \"llama3\", \"factor\": 8.0, \"low_freq_factor\": 1.0, "
                  "\"high_freq_factor\": 4.0, \"original_max_position_embeddings\": 256}"]
        # (model type, stored dtype, make-model options, tokenizer); the MoE
        # ones with experts of rows of 32 or 40 (40: the down projection
        # stays F32 under q8_0), deepseek_v3 with the low-rank query
        for arch, dt, extra, tok in (("llama", "f32", [], "llama3"),
                                     ("qwen3", "bf16", ["--set", "tie_word_embeddings=true"], "qwen3"),
                                     ("llama", "bf16", llama3, "llama3"),
                                     ("qwen3_moe", "f32", [], "qwen3"),
                                     ("mixtral", "bf16", ["--set", "intermediate_size=32"], "llama3"),
                                     ("deepseek_v2", "f32", [], "qwen3"),
                                     ("deepseek_v3", "bf16", [], "llama3")):
            m = os.path.join(work, f"{arch}-{dt}-{len(models)}")
            run("make-model", "--arch", arch, "--preset", "tiny", "--dtype", dt, "--tokenizer",
                os.path.join(TOKENIZERS, tok), *extra, "--out", m)
            models.append((arch, m, {"llama3": "llama-bpe", "qwen3": "qwen2"}[tok]))
        if sanitized:
            check_cli_half(models)
            print("the converter's checks: in the plain build's suite (Python only; see check_cli_half)")
        else:
            check_conversions(work, models)
    if ck.failures:
        sys.exit(f"{len(ck.failures)} failure(s)")
    print("ok")


if __name__ == "__main__":
    main()
