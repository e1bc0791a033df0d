/* Built-in plans (§7) and their merge into a causal-LM plan (§4.2).  The
 * tables are const: every model gets a fresh copy, so changing one model's
 * plan never reaches another or the table. */
#include "parallel_internal.h"

#include <string.h>

typedef struct { const char *key, *style; } rule;

/* §7.2: llama, qwen2, mistral. */
static const rule dense_plan[] = {
    {"layers.*.self_attn.q_proj", "colwise"}, {"layers.*.self_attn.k_proj", "colwise"},
    {"layers.*.self_attn.v_proj", "colwise"}, {"layers.*.self_attn.o_proj", "rowwise"},
    {"layers.*.mlp.gate_proj", "colwise"},    {"layers.*.mlp.up_proj", "colwise"},
    {"layers.*.mlp.down_proj", "rowwise"},    {NULL, NULL},
};

/* §7.3: qwen3 adds the per-head norms, which see only the rank's heads. */
static const rule qwen3_plan[] = {
    {"layers.*.self_attn.q_proj", "colwise"}, {"layers.*.self_attn.k_proj", "colwise"},
    {"layers.*.self_attn.v_proj", "colwise"},
    {"layers.*.self_attn.q_norm", "replicated_with_grad_allreduce"},
    {"layers.*.self_attn.k_norm", "replicated_with_grad_allreduce"},
    {"layers.*.self_attn.o_proj", "rowwise"}, {"layers.*.mlp.gate_proj", "colwise"},
    {"layers.*.mlp.up_proj", "colwise"},      {"layers.*.mlp.down_proj", "rowwise"},
    {NULL, NULL},
};

/* §7.4: qwen3_moe.  Every rank holds a slice of I of every expert; the
 * router stays replicated; the last three rules serve the dense layers. */
static const rule qwen3_moe_plan[] = {
    {"layers.*.self_attn.q_proj", "colwise"}, {"layers.*.self_attn.k_proj", "colwise"},
    {"layers.*.self_attn.v_proj", "colwise"},
    {"layers.*.self_attn.q_norm", "replicated_with_grad_allreduce"},
    {"layers.*.self_attn.k_norm", "replicated_with_grad_allreduce"},
    {"layers.*.self_attn.o_proj", "rowwise"},
    {"layers.*.mlp.experts.gate_up_proj", "packed_colwise"}, {"layers.*.mlp.experts.down_proj", "rowwise"},
    {"layers.*.mlp.experts", "moe_tp_experts"},
    {"layers.*.mlp.gate_proj", "colwise"},    {"layers.*.mlp.up_proj", "colwise"},
    {"layers.*.mlp.down_proj", "rowwise"},    {NULL, NULL},
};

/* §7.5: mixtral (every layer sparse). */
static const rule mixtral_plan[] = {
    {"layers.*.self_attn.q_proj", "colwise"}, {"layers.*.self_attn.k_proj", "colwise"},
    {"layers.*.self_attn.v_proj", "colwise"}, {"layers.*.self_attn.o_proj", "rowwise"},
    {"layers.*.mlp.experts.gate_up_proj", "packed_colwise"}, {"layers.*.mlp.experts.down_proj", "rowwise"},
    {"layers.*.mlp.experts", "moe_tp_experts"}, {NULL, NULL},
};

/* §7.7: deepseek_v2.  q_proj (q_lora_rank null) or q_b_proj and kv_b_proj
 * split the heads; kv_a_proj_with_mqa stays whole (mla_kv_a_proj);
 * q_a_proj and the latent norms are replicated; the plain mlp rules serve
 * the dense layers before first_k_dense_replace. */
static const rule deepseek_v2_plan[] = {
    {"layers.*.self_attn.q_proj", "colwise"}, {"layers.*.self_attn.q_b_proj", "colwise"},
    {"layers.*.self_attn.kv_a_proj_with_mqa", "mla_kv_a_proj"}, {"layers.*.self_attn.kv_b_proj", "colwise"},
    {"layers.*.self_attn.o_proj", "rowwise"},
    {"layers.*.mlp.experts.gate_up_proj", "packed_colwise"}, {"layers.*.mlp.experts.down_proj", "rowwise"},
    {"layers.*.mlp.experts", "moe_tp_experts"},
    {"layers.*.mlp.shared_experts.gate_proj", "colwise"}, {"layers.*.mlp.shared_experts.up_proj", "colwise"},
    {"layers.*.mlp.shared_experts.down_proj", "rowwise"},
    {"layers.*.mlp.gate_proj", "colwise"}, {"layers.*.mlp.up_proj", "colwise"},
    {"layers.*.mlp.down_proj", "rowwise"}, {NULL, NULL},
};

/* §7.8: deepseek_v3 shards the MLPs only; MLA is replicated on every rank. */
static const rule deepseek_v3_plan[] = {
    {"layers.*.mlp.experts.gate_up_proj", "packed_colwise"}, {"layers.*.mlp.experts.down_proj", "rowwise"},
    {"layers.*.mlp.experts", "moe_tp_experts"},
    {"layers.*.mlp.shared_experts.gate_proj", "colwise"}, {"layers.*.mlp.shared_experts.up_proj", "colwise"},
    {"layers.*.mlp.shared_experts.down_proj", "rowwise"},
    {"layers.*.mlp.gate_proj", "colwise"}, {"layers.*.mlp.up_proj", "colwise"},
    {"layers.*.mlp.down_proj", "rowwise"}, {NULL, NULL},
};

/* §7.6: llama4 (text model).  The bmm-style experts split I: gate_up_proj
 * [E, H, 2I] on its packed last dimension, down_proj [E, I, H] on dim 1;
 * no rule on the container, whose module sums its own output (§10.6). */
static const rule llama4_plan[] = {
    {"layers.*.self_attn.q_proj", "colwise"}, {"layers.*.self_attn.k_proj", "colwise"},
    {"layers.*.self_attn.v_proj", "colwise"}, {"layers.*.self_attn.o_proj", "rowwise"},
    {"layers.*.feed_forward.shared_expert.gate_proj", "colwise"},
    {"layers.*.feed_forward.shared_expert.up_proj", "colwise"},
    {"layers.*.feed_forward.shared_expert.down_proj", "rowwise"},
    {"layers.*.feed_forward.experts.gate_up_proj", "packed_rowwise"},
    {"layers.*.feed_forward.experts.down_proj", "colwise"},
    {"layers.*.feed_forward.gate_proj", "colwise"}, {"layers.*.feed_forward.up_proj", "colwise"},
    {"layers.*.feed_forward.down_proj", "rowwise"}, {NULL, NULL},
};

/* §7.6: Llama 4's EP plan also splits the attention and the dense layers;
 * the shared expert stays replicated. */
static const rule llama4_ep_plan[] = {
    {"layers.*.self_attn.q_proj", "colwise"}, {"layers.*.self_attn.k_proj", "colwise"},
    {"layers.*.self_attn.v_proj", "colwise"}, {"layers.*.self_attn.o_proj", "rowwise"},
    {"layers.*.feed_forward.experts.gate_up_proj", "grouped_gemm"},
    {"layers.*.feed_forward.experts.down_proj", "grouped_gemm"},
    {"layers.*.feed_forward.gate_proj", "colwise"}, {"layers.*.feed_forward.up_proj", "colwise"},
    {"layers.*.feed_forward.down_proj", "rowwise"}, {"layers.*.feed_forward.router", "ep_router"},
    {NULL, NULL},
};

/* §7.4, §7.5, §7.7, §7.8: the EP plan of the MoE types covers the experts
 * only; the attention (and DeepSeek's shared experts) stay replicated. */
static const rule moe_ep_plan[] = {
    {"layers.*.mlp.gate", "ep_router"},
    {"layers.*.mlp.experts.gate_up_proj", "grouped_gemm"}, {"layers.*.mlp.experts.down_proj", "grouped_gemm"},
    {"layers.*.mlp.experts", "moe_tp_experts"}, {NULL, NULL},
};

/* §7.9: gpt_oss's EP plan, weights and biases of the experts (its base
 * plan is empty: no TP support; "auto" shards lm_head only). */
static const rule gpt_oss_ep_plan[] = {
    {"layers.*.mlp.router", "ep_router"},
    {"layers.*.mlp.experts.gate_up_proj", "grouped_gemm"}, {"layers.*.mlp.experts.gate_up_proj_bias", "grouped_gemm"},
    {"layers.*.mlp.experts.down_proj", "grouped_gemm"}, {"layers.*.mlp.experts.down_proj_bias", "grouped_gemm"},
    {"layers.*.mlp.experts", "moe_tp_experts"}, {NULL, NULL},
};

static const rule *base_plan(tp_arch a)
{
    switch (a) {
    case TP_ARCH_LLAMA: case TP_ARCH_MISTRAL: case TP_ARCH_QWEN2: return dense_plan;
    case TP_ARCH_QWEN3: return qwen3_plan;
    case TP_ARCH_QWEN3_MOE: return qwen3_moe_plan;
    case TP_ARCH_MIXTRAL: return mixtral_plan;
    case TP_ARCH_DEEPSEEK_V2: return deepseek_v2_plan;
    case TP_ARCH_DEEPSEEK_V3: return deepseek_v3_plan;
    case TP_ARCH_GPT_OSS: return NULL;
    case TP_ARCH_LLAMA4_TEXT: return llama4_plan;
    }
    return NULL;
}

static const rule *ep_plan(tp_arch a)
{
    /* §7.7, §7.8: deepseek_v2 and deepseek_v3 share it */
    if (a == TP_ARCH_GPT_OSS) return gpt_oss_ep_plan;
    if (a == TP_ARCH_LLAMA4_TEXT) return llama4_ep_plan;
    return a == TP_ARCH_QWEN3_MOE || a == TP_ARCH_MIXTRAL || a == TP_ARCH_DEEPSEEK_V2 || a == TP_ARCH_DEEPSEEK_V3
               ? moe_ep_plan : NULL;
}

int tp_plan_supports_tp(const tp_model_config *cfg)
{
    const rule *b = base_plan(cfg->arch);
    return b && b[0].key;
}

/* The head plan, then base plan b under "model." (§4.2).  An EP plan (ep)
 * has no head rules: lm_head stays replicated, and so the tied-embedding
 * rule is not added either. */
static tp_status merge(const tp_model_config *cfg, const rule *b, int ep, tp_plan *out)
{
    memset(out, 0, sizeof *out);
    /* 1. the head class plan */
    tp_status s = ep ? TP_OK : tp_plan_set(out, "lm_head", "colwise_gather_output");
    /* 2. + 3. the base plan under the base model's name, "model." */
    for (size_t i = 0; !s && b && b[i].key; i++) {
        char key[160];
        snprintf(key, sizeof key, "model.%s", b[i].key);
        s = tp_plan_set(out, key, b[i].style);
    }
    /* Tied embeddings share one buffer with lm_head, whose gathered colwise
     * split is Shard(0) over the vocabulary: the embedding must match (§6.3). */
    if (!s && !ep && cfg->tie_word_embeddings && tp_plan_supports_tp(cfg))
        s = tp_plan_set(out, "model.embed_tokens", "embedding_rowwise");
    if (s) tp_plan_free(out);
    return s;
}

tp_status tp_plan_builtin(const tp_model_config *cfg, tp_plan *out)
{
    return merge(cfg, base_plan(cfg->arch), 0, out);
}

tp_status tp_plan_builtin_ep(const tp_model_config *cfg, tp_plan *out)
{
    memset(out, 0, sizeof *out);
    const rule *b = ep_plan(cfg->arch);
    if (b) return merge(cfg, b, 1, out);
    return tp_fail(TP_ERR_UNSUPPORTED,
                   "Expert parallelism was requested (`enable_expert_parallel=True`), but `%s` does not define "
                   "an expert-parallel plan. Add a `base_model_ep_plan` to its config, or disable expert parallelism.",
                   tp_arch_class_name(cfg->arch));
}
