"""Which checkpoint tensors make which GGUF tensor, per model type, with the
shape each checkpoint tensor must have (from config.json) — the one place
that spells llama.cpp's tensor names.

A GGUF tensor comes from its checkpoint tensor(s) in one of three ways:
  - as stored, or with its rows reordered (llama's q/k rotary pairs);
  - stacked: one checkpoint tensor per expert, stacked along a new first
    dimension (llama.cpp's ffn_{gate,up,down}_exps: [E, I, H] / [E, H, I]);
  - rearranged whole by a function (deepseek2's k_b / v_b, cut from
    kv_b_proj).
Each is a Piece; its kind says which type it takes in the file (norms,
biases and MoE routers stay F32, as llama.cpp's converter keeps them)."""
import numpy as np

from checkpoint import ConvertError

# llama.cpp's architecture name of each Hugging Face model type
ARCH = {"llama": "llama", "qwen3": "qwen3", "qwen3_moe": "qwen3moe", "mixtral": "llama",
        "deepseek_v2": "deepseek2", "deepseek_v3": "deepseek2"}


class Piece:
    """One GGUF tensor: name, its checkpoint sources and their expected
    shapes, how it is made from them (rows, stacked, view), the shape it
    has in numpy order (outermost first) and its kind: "matrix" (takes the
    chosen type), "expert" (a stacked expert tensor: the chosen type, or
    the stored one with --experts stored), "f32" (norms, routers, biases)."""

    def __init__(self, name, srcs, shapes, kind="matrix", rows=None, stacked=False, view=None, shape=None):
        self.name, self.srcs, self.shapes, self.kind = name, list(srcs), [tuple(s) for s in shapes], kind
        self.rows, self.stacked, self.view = rows, stacked, view
        if shape is not None:
            self.shape = tuple(shape)
        elif stacked:
            self.shape = (len(self.srcs),) + self.shapes[0]
        else:
            self.shape = self.shapes[0]


def llama_rope_rows(n_rows, n_head):
    """The source row of each GGUF row of a llama q_proj/k_proj: within each
    head of d rows, GGUF row 2j + h is Hugging Face row h * d/2 + j."""
    d = n_rows // n_head
    src = np.arange(n_rows).reshape(n_head, 2, d // 2).swapaxes(1, 2)
    return src.reshape(n_rows)


def is_sparse(cfg, i):
    """Whether layer i of a qwen3_moe / mixtral / deepseek model is an MoE layer."""
    mt = cfg.get("model_type")
    if mt == "mixtral":
        return True
    if mt == "qwen3_moe":
        step = cfg.int("decoder_sparse_step", 1)
        return i not in cfg.get("mlp_only_layers", []) and (i + 1) % step == 0
    if mt in ("deepseek_v2", "deepseek_v3"):
        return i >= cfg.int("first_k_dense_replace", 0, minimum=0)
    return False


def _attention(cfg, p, H):
    """llama / qwen3 / mixtral attention: q, k, v, o (+ q/k norms)."""
    mt = cfg.get("model_type")
    heads, hd = cfg.int("num_attention_heads"), cfg.head_dim()
    kv = cfg.int("num_key_value_heads", heads)
    rope = mt in ("llama", "mixtral")
    out = [Piece("attn_q", [p + "self_attn.q_proj.weight"], [(heads * hd, H)],
                 rows=llama_rope_rows(heads * hd, heads) if rope else None),
           Piece("attn_k", [p + "self_attn.k_proj.weight"], [(kv * hd, H)],
                 rows=llama_rope_rows(kv * hd, kv) if rope else None),
           Piece("attn_v", [p + "self_attn.v_proj.weight"], [(kv * hd, H)]),
           Piece("attn_output", [p + "self_attn.o_proj.weight"], [(H, heads * hd)])]
    if mt in ("qwen3", "qwen3_moe"):
        out += [Piece("attn_q_norm", [p + "self_attn.q_norm.weight"], [(hd,)], "f32"),
                Piece("attn_k_norm", [p + "self_attn.k_norm.weight"], [(hd,)], "f32")]
    return out


def _mla(cfg, p, H):
    """deepseek2's multi-head latent attention.  kv_b_proj [heads (nope + v),
    kv_lora] is cut into llama.cpp's k_b [heads, kv_lora, nope] (transposed,
    so that the query's nope part can be absorbed into the latent) and v_b
    [heads, v, kv_lora]."""
    heads = cfg.int("num_attention_heads")
    nope, rope, v = cfg.int("qk_nope_head_dim"), cfg.int("qk_rope_head_dim"), cfg.int("v_head_dim")
    kv_lora, q_lora = cfg.int("kv_lora_rank"), cfg.get("q_lora_rank")
    out = []
    if q_lora:
        out += [Piece("attn_q_a", [p + "self_attn.q_a_proj.weight"], [(q_lora, H)]),
                Piece("attn_q_a_norm", [p + "self_attn.q_a_layernorm.weight"], [(q_lora,)], "f32"),
                Piece("attn_q_b", [p + "self_attn.q_b_proj.weight"], [(heads * (nope + rope), q_lora)])]
    else:
        out.append(Piece("attn_q", [p + "self_attn.q_proj.weight"], [(heads * (nope + rope), H)]))
    kvb = [p + "self_attn.kv_b_proj.weight"]
    kvb_shape = [(heads * (nope + v), kv_lora)]

    def k_b(a):
        return np.ascontiguousarray(a.reshape(heads, nope + v, kv_lora)[:, :nope, :].transpose(0, 2, 1))

    def v_b(a):
        return np.ascontiguousarray(a.reshape(heads, nope + v, kv_lora)[:, nope:, :])

    out += [Piece("attn_kv_a_mqa", [p + "self_attn.kv_a_proj_with_mqa.weight"], [(kv_lora + rope, H)]),
            Piece("attn_kv_a_norm", [p + "self_attn.kv_a_layernorm.weight"], [(kv_lora,)], "f32"),
            Piece("attn_k_b", kvb, kvb_shape, view=k_b, shape=(heads, kv_lora, nope)),
            Piece("attn_v_b", kvb, kvb_shape, view=v_b, shape=(heads, v, kv_lora)),
            Piece("attn_output", [p + "self_attn.o_proj.weight"], [(H, heads * v)])]
    return out


def _dense_mlp(p, H, inter, gguf_suffix="", hf="mlp."):
    return [Piece("ffn_gate" + gguf_suffix, [p + hf + "gate_proj.weight"], [(inter, H)]),
            Piece("ffn_up" + gguf_suffix, [p + hf + "up_proj.weight"], [(inter, H)]),
            Piece("ffn_down" + gguf_suffix, [p + hf + "down_proj.weight"], [(H, inter)])]


def _moe(cfg, p, i, H):
    """The router (F32, as llama.cpp keeps ffn_gate_inp) and the experts
    stacked; deepseek's shared experts and V3's score-correction bias."""
    mt = cfg.get("model_type")
    if mt == "mixtral":
        E, inter = cfg.int("num_local_experts"), cfg.int("intermediate_size")
        router, ex = p + "block_sparse_moe.gate.weight", p + "block_sparse_moe.experts.{e}.{w}.weight"
        names = {"gate": "w1", "up": "w3", "down": "w2"}
    else:
        E = cfg.int("n_routed_experts" if mt.startswith("deepseek") else "num_experts")
        inter = cfg.int("moe_intermediate_size")
        router, ex = p + "mlp.gate.weight", p + "mlp.experts.{e}.{w}.weight"
        names = {"gate": "gate_proj", "up": "up_proj", "down": "down_proj"}
    out = [Piece("ffn_gate_inp", [router], [(E, H)], "f32")]
    for g, w in names.items():
        shape = (H, inter) if g == "down" else (inter, H)
        out.append(Piece(f"ffn_{g}_exps", [ex.format(e=e, w=w) for e in range(E)], [shape] * E, "expert",
                         stacked=True))
    if mt.startswith("deepseek"):
        shared = cfg.int("n_shared_experts", 0, minimum=0)
        if shared:
            out += _dense_mlp(p, H, inter * shared, "_shexp", "mlp.shared_experts.")
        if mt == "deepseek_v3":
            out.append(Piece("exp_probs_b", [p + "mlp.gate.e_score_correction_bias"], [(E,)], "f32"))
    return out


def pieces(cfg, st):
    """Every GGUF tensor of the checkpoint st with config cfg, in file order;
    refuses a missing checkpoint tensor or one of another shape, naming it."""
    mt = cfg.get("model_type")
    H, V = cfg.int("hidden_size"), cfg.int("vocab_size")
    out = [Piece("token_embd", ["model.embed_tokens.weight"], [(V, H)])]
    for i in range(cfg.int("num_hidden_layers")):
        p = f"model.layers.{i}."
        layer = [Piece("attn_norm", [p + "input_layernorm.weight"], [(H,)], "f32")]
        layer += _mla(cfg, p, H) if mt.startswith("deepseek") else _attention(cfg, p, H)
        layer.append(Piece("ffn_norm", [p + "post_attention_layernorm.weight"], [(H,)], "f32"))
        if is_sparse(cfg, i):
            layer += _moe(cfg, p, i, H)
        else:
            layer += _dense_mlp(p, H, cfg.int("intermediate_size"))
        for t in layer:
            t.name = f"blk.{i}.{t.name}." + ("bias" if t.name == "exp_probs_b" else "weight")
        out += layer
    out.append(Piece("output_norm", ["model.norm.weight"], [(H,)], "f32"))
    if not cfg.get("tie_word_embeddings", False) and "lm_head.weight" in st:
        out.append(Piece("output", ["lm_head.weight"], [(V, H)]))
    for t in out:
        if "." not in t.name:
            t.name += ".weight"
        for s, want in zip(t.srcs, t.shapes):
            if s not in st:
                raise ConvertError(f"the checkpoint lacks the tensor {s} (for {t.name})")
            if st.shape(s) != want:
                raise ConvertError(f"tensor {s}: shape {list(st.shape(s))}, but config.json makes it {list(want)}")
    return out
