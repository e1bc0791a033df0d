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
};

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
                       "qwen3-30b-a3b, mixtral-8x7b)", name);
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
    if (p->llama3_rope) {
        c->rope_scaling.kind = TP_ROPE_LLAMA3;
        c->rope_scaling.factor = 32.0;
        c->rope_scaling.low_freq_factor = 1.0;
        c->rope_scaling.high_freq_factor = 4.0;
        c->rope_scaling.original_max_position_embeddings = 8192;
    }
    return tp_config_validate(c, name);
}
