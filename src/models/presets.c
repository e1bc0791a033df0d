/* Model presets for make-model.  tiny and small are for tests and the demo;
 * the others copy the published configs of real models, so that benchmarks
 * and memory figures speak of the shapes people actually run. */
#include "tensorpar/models.h"

#include <string.h>

typedef struct {
    const char *name;
    int64_t hidden, intermediate, layers, heads, kv_heads, head_dim, vocab, max_pos;
    double eps, theta;
    int tied;
    int llama3_rope;            /* rope_scaling llama3, factor 32, original 8192 */
    tp_dtype dtype;
    int64_t bos, eos;
    /* qwen3_moe / mixtral (0: the tiny MoE shape for these types) */
    int64_t experts, top_k, moe_inter;
} preset;

static const preset presets[] = {
    {"tiny", 64, 160, 2, 4, 2, 16, 512, 2048, 1e-6, 10000.0, 0, 0, TP_F32, 1, 2, 0, 0, 0},
    {"small", 256, 704, 4, 8, 4, 32, 4096, 4096, 1e-6, 10000.0, 0, 0, TP_F32, 1, 2, 0, 0, 0},
    {"qwen3-0.6b", 1024, 3072, 28, 16, 8, 128, 151936, 40960, 1e-6, 1000000.0, 1, 0, TP_BF16, 151643, 151645, 0, 0, 0},
    {"llama-3.2-1b", 2048, 8192, 16, 32, 8, 64, 128256, 131072, 1e-5, 500000.0, 1, 1, TP_BF16, 128000, 128001, 0, 0, 0},
    {"llama-3-8b", 4096, 14336, 32, 32, 8, 128, 128256, 8192, 1e-5, 500000.0, 0, 0, TP_BF16, 128000, 128001, 0, 0, 0},
    /* Qwen/Qwen3-30B-A3B and mistralai/Mixtral-8x7B-v0.1 (use with --set num_hidden_layers=2) */
    {"qwen3-30b-a3b", 2048, 6144, 48, 32, 4, 128, 151936, 40960, 1e-6, 1000000.0, 0, 0, TP_BF16, 151643, 151645,
     128, 8, 768},
    {"mixtral-8x7b", 4096, 14336, 32, 32, 8, 128, 32000, 32768, 1e-5, 1000000.0, 0, 0, TP_BF16, 1, 2, 8, 2, 14336},
    /* deepseek-ai/DeepSeek-V2-Lite and deepseek-ai/DeepSeek-V3 (use with --set num_hidden_layers=2;
     * the MLA dimensions, YaRN rope and MoE keys in set_mla) */
    {"deepseek-v2-lite", 2048, 10944, 27, 16, 16, 64, 102400, 163840, 1e-6, 10000.0, 0, 0, TP_BF16, 100000, 100001,
     64, 6, 1408},
    {"deepseek-v3", 7168, 18432, 61, 128, 128, 64, 129280, 163840, 1e-6, 10000.0, 0, 0, TP_BF16, 0, 1, 256, 8, 2048},
    /* openai/gpt-oss-20b as published, its experts dequantized to bf16 (use with --set num_hidden_layers=2) */
    {"gpt-oss-20b", 2880, 2880, 24, 64, 8, 64, 201088, 131072, 1e-5, 150000.0, 0, 0, TP_BF16, -1, 200002, 32, 4,
     2880},
    /* meta-llama/Llama-4-Scout-17B-16E's text_config (use with --set num_hidden_layers=2; the Llama 4 keys in
     * set_llama4) */
    {"llama-4-scout", 5120, 8192, 48, 40, 8, 128, 202048, 262144, 1e-5, 500000.0, 0, 0, TP_BF16, 200000, 200001,
     16, 1, 8192},
};

/* gpt_oss: attention biases, sinks, alternating sliding / full layers,
 * YaRN (factor 32 over 4096 positions, not truncated), every layer sparse.
 * The real preset's window is 128; tiny and small get 8 experts top-4 of a
 * quarter of the dense width and a window of 6, shorter than the tests'
 * prompts, at gpt-oss's 131072 positions so that the YaRN factor is 32 in
 * every Transformers version. */
static void set_gpt_oss(tp_model_config *c, const preset *p)
{
    int real = p->experts > 0;
    c->attention_bias = 1;
    c->num_experts = real ? p->experts : 8;
    c->num_experts_per_tok = real ? p->top_k : 4;
    c->moe_intermediate_size = c->intermediate_size = real ? p->moe_inter : c->intermediate_size / 4;
    c->decoder_sparse_step = 1;
    c->sliding_window = real ? 128 : 6;
    c->swiglu_alpha = 1.702, c->swiglu_limit = 7.0;
    c->max_position_embeddings = 131072;
    c->rope_scaling = (tp_rope_scaling){.kind = TP_ROPE_YARN, .factor = 32.0, .beta_fast = 32.0, .beta_slow = 1.0,
                                        .original_max_position_embeddings = 4096, .yarn_factor = 32.0,
                                        .yarn_original = 4096, .yarn_truncate = 0};
    if (real) c->rope_theta = 150000.0;
}

/* Llama 4's keys: Llama-4-Scout-17B-16E's (every layer MoE, every fourth
 * NoPE, chunks of 8192, llama3 rope factor 8 over 8192 positions), or for
 * the other shapes three layers — 0 dense with RoPE, 1 MoE with RoPE, 2
 * MoE without — 4 experts top-1 of the dense width, chunks of 8 positions
 * and a temperature floor of 4, so that short test prompts reach every
 * path. */
static void set_llama4(tp_model_config *c, const preset *p)
{
    int real = p->experts > 0;
    c->llama4 = 1;
    c->num_experts = real ? p->experts : 4;
    c->num_experts_per_tok = real ? p->top_k : 1;
    c->moe_intermediate_size = c->intermediate_size;
    c->intermediate_size_mlp = real ? 16384 : c->intermediate_size * 2;
    c->interleave_moe_layer_step = 1;
    c->no_rope_layer_interval = 4;
    c->l2_qk_norm = 1;
    c->attn_temperature_tuning = 1;
    c->attn_scale = 0.1;
    c->floor_scale = real ? 8192 : 4;
    c->attention_chunk_size = real ? 8192 : 8;
    if (!real) c->num_hidden_layers = 3;
    c->n_moe_layers = c->n_rope_layers = (int)c->num_hidden_layers;
    for (int64_t l = 0; l < c->num_hidden_layers; l++) {
        c->moe_layer[l] = real || l > 0;
        c->rope_layer[l] = real ? (l + 1) % 4 != 0 : l < 2;
    }
    if (real) {
        c->eos_token_ids[1] = 200007, c->eos_token_ids[2] = 200008, c->n_eos = 3;
        tp_rope_scaling *rs = &c->rope_scaling;
        rs->kind = TP_ROPE_LLAMA3;
        rs->factor = 8.0, rs->low_freq_factor = 1.0, rs->high_freq_factor = 4.0;
        rs->original_max_position_embeddings = 8192;
    }
}

/* The multi-head latent attention and MoE blocks of a deepseek_v2 /
 * deepseek_v3 preset: the published ones (YaRN rope, factor 40 over 4096
 * positions; DeepSeek-V2-Lite's first layer dense, V3's first three), or
 * for the other shapes attention scaled to head_dim with a value head
 * narrower than the query/key head (v2: q_proj, q_lora_rank null; v3: the
 * low-rank query) and, from layer 1 on, 8 routed experts of a quarter of
 * the dense width (top-2; v3: 4 groups of which 2 are chosen) beside the
 * shared ones. */
static void set_mla(tp_model_config *c, const preset *p)
{
    int v3 = c->arch == TP_ARCH_DEEPSEEK_V3, real = p->experts > 0;
    c->mla = 1;
    c->num_key_value_heads = c->num_attention_heads;
    c->rope_interleave = 1;
    c->num_experts = real ? p->experts : 8;
    c->num_experts_per_tok = real ? p->top_k : 2;
    c->moe_intermediate_size = real ? p->moe_inter : c->intermediate_size / 4;
    c->n_shared_experts = v3 ? 1 : 2;
    c->routed_scaling_factor = v3 ? 2.5 : 1.0;
    c->norm_topk_prob = v3;
    c->n_group = v3 ? (real ? 8 : 4) : 1;
    c->topk_group = v3 ? (real ? 4 : 2) : 1;
    c->first_k_dense_replace = v3 && real ? 3 : 1;
    if (real) {
        c->q_lora_rank = v3 ? 1536 : 0;
        c->kv_lora_rank = 512, c->qk_nope_head_dim = 128, c->qk_rope_head_dim = 64, c->v_head_dim = 128;
        tp_rope_scaling *rs = &c->rope_scaling;
        rs->kind = TP_ROPE_YARN;
        rs->factor = 40.0, rs->beta_fast = 32.0, rs->beta_slow = 1.0;
        rs->mscale = rs->mscale_all_dim = v3 ? 1.0 : 0.707;
        rs->original_max_position_embeddings = rs->yarn_original = 4096;
        rs->yarn_factor = 40.0;
        rs->yarn_truncate = 1;
    } else {
        c->q_lora_rank = v3 ? c->hidden_size * 3 / 8 : 0;
        c->kv_lora_rank = c->hidden_size / 2;
        c->qk_nope_head_dim = p->head_dim, c->qk_rope_head_dim = p->head_dim / 2, c->v_head_dim = p->head_dim * 3 / 4;
    }
    c->head_dim = c->qk_rope_head_dim;
}

/* The experts of a qwen3_moe or mixtral preset: the real model's, or for
 * tiny and small 8 experts, top-2, a quarter of the dense width each
 * (mixtral: its intermediate_size is the experts' width). */
static void set_moe(tp_model_config *c, const preset *p)
{
    c->num_experts = p->experts ? p->experts : 8;
    c->num_experts_per_tok = p->experts ? p->top_k : 2;
    c->moe_intermediate_size = p->experts ? p->moe_inter : c->intermediate_size / 4;
    if (c->arch == TP_ARCH_MIXTRAL) c->intermediate_size = c->moe_intermediate_size;
    c->decoder_sparse_step = 1;
    c->norm_topk_prob = 1;   /* Qwen3-30B-A3B's; Mixtral always */
}

tp_status tp_preset_config(tp_model_config *c, tp_arch arch, const char *name)
{
    const preset *p = NULL;
    for (size_t i = 0; i < sizeof presets / sizeof presets[0]; i++)
        if (!strcmp(presets[i].name, name)) p = &presets[i];
    if (!p)
        return tp_fail(TP_ERR_INVALID, "unknown preset '%s' (presets: tiny, small, qwen3-0.6b, llama-3.2-1b, llama-3-8b, "
                       "qwen3-30b-a3b, mixtral-8x7b, deepseek-v2-lite, deepseek-v3, llama-4-scout, gpt-oss-20b)", name);
    memset(c, 0, sizeof *c);
    c->arch = arch;
    snprintf(c->model_type, sizeof c->model_type, "%s", tp_arch_name(arch));
    c->hidden_size = p->hidden;
    c->intermediate_size = p->intermediate;
    c->num_hidden_layers = p->layers;
    c->num_attention_heads = p->heads;
    c->num_key_value_heads = p->kv_heads;
    c->head_dim = p->head_dim;
    c->vocab_size = p->vocab;
    c->max_position_embeddings = p->max_pos;
    c->rms_norm_eps = p->eps;
    c->rope_theta = p->theta;
    c->tie_word_embeddings = p->tied;
    c->dtype = p->dtype;
    c->bos_token_id = p->bos;
    c->eos_token_ids[0] = p->eos;
    c->n_eos = 1;
    c->qkv_bias = arch == TP_ARCH_QWEN2;
    c->qk_norm = arch == TP_ARCH_QWEN3 || arch == TP_ARCH_QWEN3_MOE;
    if (arch == TP_ARCH_QWEN3_MOE || arch == TP_ARCH_MIXTRAL) set_moe(c, p);
    if (arch == TP_ARCH_DEEPSEEK_V2 || arch == TP_ARCH_DEEPSEEK_V3) set_mla(c, p);
    if (arch == TP_ARCH_GPT_OSS) set_gpt_oss(c, p);
    if (arch == TP_ARCH_LLAMA4_TEXT) set_llama4(c, p);
    if (p->llama3_rope) {
        c->rope_scaling.kind = TP_ROPE_LLAMA3;
        c->rope_scaling.factor = 32.0;
        c->rope_scaling.low_freq_factor = 1.0;
        c->rope_scaling.high_freq_factor = 4.0;
        c->rope_scaling.original_max_position_embeddings = 8192;
    }
    return tp_config_validate(c, name);
}
