/* Hugging Face config.json and generation_config.json.
 *
 * Reading is strict where a wrong value would silently change the numbers
 * (an unknown rope_scaling kind, a key of the wrong type) and lenient where
 * Transformers is (absent keys take the model type's defaults). */
#include "tensorpar/io.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static const struct { const char *name; tp_arch arch; } arch_names[] = {
    {"llama", TP_ARCH_LLAMA}, {"mistral", TP_ARCH_MISTRAL},
    {"qwen2", TP_ARCH_QWEN2}, {"qwen3", TP_ARCH_QWEN3},
    {"qwen3_moe", TP_ARCH_QWEN3_MOE}, {"mixtral", TP_ARCH_MIXTRAL},
    {"deepseek_v2", TP_ARCH_DEEPSEEK_V2}, {"deepseek_v3", TP_ARCH_DEEPSEEK_V3},
    {"gpt_oss", TP_ARCH_GPT_OSS},
    {"llama4_text", TP_ARCH_LLAMA4_TEXT},
};
#define N_ARCH (sizeof arch_names / sizeof arch_names[0])

tp_status tp_arch_parse(const char *s, tp_arch *out)
{
    for (size_t i = 0; i < N_ARCH; i++)
        if (!strcmp(s, arch_names[i].name)) { *out = arch_names[i].arch; return TP_OK; }
    /* The multimodal Llama 4 nests its text model under text_config and
     * language_model.*; tensorpar runs the text model only (docs/llama4.md). */
    if (!strcmp(s, "llama4"))
        return tp_fail(TP_ERR_UNSUPPORTED, "model type 'llama4' (Llama4ForConditionalGeneration, text and vision) is "
                       "not supported; tensorpar runs its text model, model type 'llama4_text' (Llama4ForCausalLM: "
                       "the text_config as config.json, the language_model.model.* tensors as model.*)");
    return tp_fail(TP_ERR_UNSUPPORTED,
                   "model type '%s' is not supported (supported: llama, mistral, qwen2, qwen3, qwen3_moe, mixtral, "
                   "deepseek_v2, deepseek_v3, llama4_text, gpt_oss)", s);
}

const char *tp_arch_name(tp_arch a)
{
    for (size_t i = 0; i < N_ARCH; i++)
        if (arch_names[i].arch == a) return arch_names[i].name;
    return "?";
}

const char *tp_arch_class_name(tp_arch a)
{
    switch (a) {
    case TP_ARCH_LLAMA: return "LlamaForCausalLM";
    case TP_ARCH_MISTRAL: return "MistralForCausalLM";
    case TP_ARCH_QWEN2: return "Qwen2ForCausalLM";
    case TP_ARCH_QWEN3: return "Qwen3ForCausalLM";
    case TP_ARCH_QWEN3_MOE: return "Qwen3MoeForCausalLM";
    case TP_ARCH_MIXTRAL: return "MixtralForCausalLM";
    case TP_ARCH_DEEPSEEK_V2: return "DeepseekV2ForCausalLM";
    case TP_ARCH_DEEPSEEK_V3: return "DeepseekV3ForCausalLM";
    case TP_ARCH_GPT_OSS: return "GptOssForCausalLM";
    case TP_ARCH_LLAMA4_TEXT: return "Llama4ForCausalLM";
    }
    return "CausalLM";
}

/* Transformers' defaults for each model type's config class. */
static void set_defaults(tp_model_config *c, tp_arch arch)
{
    memset(c, 0, sizeof *c);
    c->arch = arch;
    snprintf(c->model_type, sizeof c->model_type, "%s", tp_arch_name(arch));
    c->rms_norm_eps = 1e-6;
    c->rope_theta = 10000.0;
    c->num_hidden_layers = 32;
    c->num_attention_heads = 32;
    c->hidden_size = 4096;
    c->dtype = TP_F32;
    c->bos_token_id = -1;
    switch (arch) {
    case TP_ARCH_LLAMA:
        c->vocab_size = 32000; c->intermediate_size = 11008; c->max_position_embeddings = 2048;
        c->bos_token_id = 1; c->eos_token_ids[0] = 2; c->n_eos = 1;
        break;
    case TP_ARCH_MISTRAL:
        c->vocab_size = 32000; c->intermediate_size = 14336; c->max_position_embeddings = 4096 * 32;
        c->num_key_value_heads = 8; c->sliding_window = 4096;
        c->bos_token_id = 1; c->eos_token_ids[0] = 2; c->n_eos = 1;
        break;
    case TP_ARCH_QWEN2:
        c->vocab_size = 151936; c->intermediate_size = 22016; c->max_position_embeddings = 32768;
        c->qkv_bias = 1;
        break;
    case TP_ARCH_QWEN3:
        c->vocab_size = 151936; c->intermediate_size = 22016; c->max_position_embeddings = 32768;
        c->head_dim = 128; c->qk_norm = 1;
        break;
    case TP_ARCH_QWEN3_MOE:   /* Qwen3MoeConfig */
        c->vocab_size = 151936; c->hidden_size = 2048; c->intermediate_size = 6144; c->num_hidden_layers = 24;
        c->num_key_value_heads = 4; c->max_position_embeddings = 32768; c->qk_norm = 1;
        c->num_experts = 128; c->num_experts_per_tok = 8; c->moe_intermediate_size = 768;
        c->decoder_sparse_step = 1;
        break;
    case TP_ARCH_MIXTRAL:     /* MixtralConfig */
        c->vocab_size = 32000; c->intermediate_size = 14336; c->max_position_embeddings = 4096 * 32;
        c->num_key_value_heads = 8; c->rope_theta = 1e6; c->rms_norm_eps = 1e-5;
        c->bos_token_id = 1; c->eos_token_ids[0] = 2; c->n_eos = 1;
        c->num_experts = 8; c->num_experts_per_tok = 2; c->decoder_sparse_step = 1; c->norm_topk_prob = 1;
        break;
    case TP_ARCH_DEEPSEEK_V2:   /* DeepseekV2Config */
        c->vocab_size = 32000; c->intermediate_size = 11008; c->max_position_embeddings = 2048;
        c->bos_token_id = 1; c->eos_token_ids[0] = 2; c->n_eos = 1;
        break;
    case TP_ARCH_DEEPSEEK_V3:   /* DeepseekV3Config */
        c->vocab_size = 129280; c->hidden_size = 7168; c->intermediate_size = 18432; c->num_hidden_layers = 61;
        c->num_attention_heads = 128; c->max_position_embeddings = 4096; c->first_k_dense_replace = 3;
        c->bos_token_id = 0; c->eos_token_ids[0] = 1; c->n_eos = 1; c->rope_interleave = 1;
        break;
    case TP_ARCH_GPT_OSS:       /* GptOssConfig */
        c->vocab_size = 201088; c->hidden_size = 2880; c->intermediate_size = 2880; c->num_hidden_layers = 36;
        c->num_attention_heads = 64; c->num_key_value_heads = 8; c->head_dim = 64; c->sliding_window = 128;
        c->max_position_embeddings = 131072; c->rms_norm_eps = 1e-5; c->rope_theta = 150000.0;
        c->attention_bias = 1; c->num_experts = 128; c->num_experts_per_tok = 4; c->decoder_sparse_step = 1;
        c->swiglu_alpha = 1.702; c->swiglu_limit = 7.0;
        c->rope_scaling = (tp_rope_scaling){.kind = TP_ROPE_YARN, .factor = 32.0, .beta_fast = 32.0, .beta_slow = 1.0,
                                            .original_max_position_embeddings = 4096, .yarn_factor = 32.0,
                                            .yarn_original = 4096, .yarn_truncate = 0};
        break;
    case TP_ARCH_LLAMA4_TEXT:   /* Llama4TextConfig */
        c->llama4 = 1;
        c->vocab_size = 202048; c->hidden_size = 5120; c->intermediate_size = 8192; c->intermediate_size_mlp = 16384;
        c->num_hidden_layers = 48; c->num_attention_heads = 40; c->num_key_value_heads = 8; c->head_dim = 128;
        c->max_position_embeddings = 4096 * 32; c->rms_norm_eps = 1e-5; c->rope_theta = 500000.0;
        c->bos_token_id = 1; c->eos_token_ids[0] = 2; c->n_eos = 1;
        c->num_experts = 16; c->num_experts_per_tok = 1; c->interleave_moe_layer_step = 1;
        c->l2_qk_norm = 1; c->no_rope_layer_interval = 4; c->attention_chunk_size = 8192;
        c->attn_temperature_tuning = 1; c->floor_scale = 8192; c->attn_scale = 0.1;
        c->n_moe_layers = c->n_rope_layers = -1;
        break;
    }
    if (arch == TP_ARCH_DEEPSEEK_V2 || arch == TP_ARCH_DEEPSEEK_V3) {
        c->mla = 1;
        c->q_lora_rank = 1536; c->kv_lora_rank = 512;
        c->qk_nope_head_dim = 128; c->qk_rope_head_dim = 64; c->v_head_dim = 128;
    }
}

int tp_config_layer_is_sparse(const tp_model_config *c, int64_t l)
{
    if (c->num_experts <= 0) return 0;
    if (c->llama4) return l >= 0 && l < TP_MAX_LAYER_FLAGS && c->moe_layer[l];
    if (c->mla) return l >= c->first_k_dense_replace;   /* DeepseekV2DecoderLayer's rule */
    for (int i = 0; i < c->n_mlp_only; i++)
        if (c->mlp_only_layers[i] == l) return 0;
    return c->decoder_sparse_step > 0 && (l + 1) % c->decoder_sparse_step == 0;
}

int tp_config_layer_uses_rope(const tp_model_config *c, int64_t l)
{
    return !c->llama4 || (l >= 0 && l < TP_MAX_LAYER_FLAGS && c->rope_layer[l]);
}

int64_t tp_config_layer_window(const tp_model_config *c, int64_t l)
{
    if (c->arch == TP_ARCH_GPT_OSS) {
        int sliding = l < c->n_layer_types ? c->layer_sliding[l] : (l + 1) % 2;   /* GptOssConfig's default */
        return sliding ? c->sliding_window : 0;
    }
    if (!c->llama4) return c->sliding_window;
    /* Llama4TextConfig: layer_types "chunked_attention" on the RoPE layers */
    return tp_config_layer_uses_rope(c, l) && c->attention_chunk_size > 0 ? -c->attention_chunk_size : 0;
}

/* ---- typed getters that name the file and key on error ----------------- */

typedef struct { const char *path; cJSON *root; } json_doc;

/* JSON numbers are doubles: integers beyond 2^53 are not exact, and
 * converting a double outside int64's range is undefined behaviour (a
 * fuzzed "hidden_size": 5e84 did that). */
#define MAX_JSON_INT 9007199254740992.0
/* Sizes (hidden_size, heads, vocab, ...) stay below 2^31, as in every real
 * config, so that products of two of them cannot overflow int64. */
#define MAX_SIZE INT32_MAX

static int json_int(const cJSON *v, int64_t *out)
{
    if (!cJSON_IsNumber(v)) return 0;
    double x = v->valuedouble;
    if (!(x >= -MAX_JSON_INT && x <= MAX_JSON_INT) || x != floor(x)) return 0;
    *out = (int64_t)x;
    return 1;
}

static tp_status get_int(const json_doc *d, const char *key, int64_t *out)
{
    cJSON *v = cJSON_GetObjectItemCaseSensitive(d->root, key);
    if (!v || cJSON_IsNull(v)) return TP_OK;
    if (!json_int(v, out))
        return tp_fail(TP_ERR_FORMAT, "%s: key '%s' must be an integer (at most 2^53 in magnitude)", d->path, key);
    return TP_OK;
}

/* An integer size that may be absent or non-positive (0 or less: derive it). */
static tp_status get_size(const json_doc *d, const char *key, int64_t *out)
{
    tp_status s = get_int(d, key, out);
    if (s) return s;
    if (*out > MAX_SIZE) return tp_fail(TP_ERR_FORMAT, "%s: key '%s' = %lld is too large (at most %d)",
                                        d->path, key, (long long)*out, MAX_SIZE);
    return TP_OK;
}

static tp_status get_positive(const json_doc *d, const char *key, int64_t *out)
{
    tp_status s = get_size(d, key, out);
    if (s) return s;
    if (*out <= 0) return tp_fail(TP_ERR_FORMAT, "%s: key '%s' must be a positive integer, got %lld",
                                  d->path, key, (long long)*out);
    return TP_OK;
}

/* A size whose null means "none" (0): sliding_window, attention_chunk_size,
 * n_shared_experts, q_lora_rank; when given, positive if `positive`. */
static tp_status get_size_or_null(const json_doc *d, const char *key, int positive, int64_t *out)
{
    cJSON *v = cJSON_GetObjectItemCaseSensitive(d->root, key);
    if (v && cJSON_IsNull(v)) {
        *out = 0;
        return TP_OK;
    }
    return positive ? get_positive(d, key, out) : get_size(d, key, out);
}

/* The routed experts of gpt_oss and llama4_text: num_local_experts >= 1 and
 * 1 <= num_experts_per_tok <= num_local_experts, and at most max_k (0: no
 * cap of its own). */
static tp_status check_local_experts(const tp_model_config *c, const json_doc *d, int64_t max_k)
{
    int64_t E = c->num_experts, k = c->num_experts_per_tok;
    if (E >= 1 && k >= 1 && k <= E && (!max_k || k <= max_k)) return TP_OK;
    char cap[40] = "";
    if (max_k) snprintf(cap, sizeof cap, ", at most %lld", (long long)max_k);
    return tp_fail(TP_ERR_FORMAT, "%s: %s needs num_local_experts >= 1 and 1 <= num_experts_per_tok <= "
                   "num_local_experts%s (got %lld of %lld)", d->path, c->model_type, cap, (long long)k, (long long)E);
}

static tp_status get_double(const json_doc *d, const char *key, double *out)
{
    cJSON *v = cJSON_GetObjectItemCaseSensitive(d->root, key);
    if (!v || cJSON_IsNull(v)) return TP_OK;
    if (!cJSON_IsNumber(v)) return tp_fail(TP_ERR_FORMAT, "%s: key '%s' must be a number", d->path, key);
    *out = v->valuedouble;
    return TP_OK;
}

static tp_status get_bool(const json_doc *d, const char *key, int *out)
{
    cJSON *v = cJSON_GetObjectItemCaseSensitive(d->root, key);
    if (!v || cJSON_IsNull(v)) return TP_OK;
    if (!cJSON_IsBool(v)) return tp_fail(TP_ERR_FORMAT, "%s: key '%s' must be true or false", d->path, key);
    *out = cJSON_IsTrue(v);
    return TP_OK;
}

/* eos_token_id is an integer or a list of integers. */
static tp_status get_eos(const json_doc *d, int64_t *ids, int *n)
{
    cJSON *v = cJSON_GetObjectItemCaseSensitive(d->root, "eos_token_id");
    if (!v || cJSON_IsNull(v)) return TP_OK;
    if (cJSON_IsNumber(v)) {
        if (!json_int(v, &ids[0])) return tp_fail(TP_ERR_FORMAT, "%s: key 'eos_token_id' is not an integer", d->path);
        *n = 1;
        return TP_OK;
    }
    if (!cJSON_IsArray(v) || cJSON_GetArraySize(v) > TP_MAX_EOS)
        return tp_fail(TP_ERR_FORMAT, "%s: key 'eos_token_id' must be an integer or a list of at most %d integers",
                       d->path, TP_MAX_EOS);
    int k = 0;
    cJSON *e;
    cJSON_ArrayForEach(e, v) {
        if (!json_int(e, &ids[k++]))
            return tp_fail(TP_ERR_FORMAT, "%s: key 'eos_token_id' holds a non-integer", d->path);
    }
    *n = k;
    return TP_OK;
}

/* mlp_only_layers: a list of layer indices (null or absent: none). */
static tp_status get_layer_list(const json_doc *d, const char *key, int64_t *ids, int *n)
{
    cJSON *v = cJSON_GetObjectItemCaseSensitive(d->root, key);
    *n = 0;
    if (!v || cJSON_IsNull(v)) return TP_OK;
    if (!cJSON_IsArray(v) || cJSON_GetArraySize(v) > TP_MAX_MLP_ONLY)
        return tp_fail(TP_ERR_FORMAT, "%s: key '%s' must be a list of at most %d layer indices", d->path, key,
                       TP_MAX_MLP_ONLY);
    cJSON *e;
    cJSON_ArrayForEach(e, v) {
        if (!json_int(e, &ids[*n]) || ids[*n] < 0)
            return tp_fail(TP_ERR_FORMAT, "%s: key '%s' holds something other than a layer index", d->path, key);
        (*n)++;
    }
    return TP_OK;
}

/* The mixture-of-experts keys (§7.1: the expert count under either name). */
static tp_status parse_moe(tp_model_config *c, const json_doc *d)
{
    tp_status s;
    if ((s = get_size(d, "num_experts", &c->num_experts)) ||
        (s = get_size(d, "num_local_experts", &c->num_experts)) ||
        (s = get_size(d, "num_experts_per_tok", &c->num_experts_per_tok)) ||
        (s = get_size(d, "moe_intermediate_size", &c->moe_intermediate_size)) ||
        (s = get_size(d, "decoder_sparse_step", &c->decoder_sparse_step)) ||
        (s = get_bool(d, "norm_topk_prob", &c->norm_topk_prob)) ||
        (s = get_bool(d, "output_router_logits", &c->output_router_logits)) ||
        (s = get_layer_list(d, "mlp_only_layers", c->mlp_only_layers, &c->n_mlp_only)))
        return s;
    /* Mixtral's experts are intermediate_size wide and always renormalised. */
    if (c->arch == TP_ARCH_MIXTRAL) { c->moe_intermediate_size = c->intermediate_size; c->norm_topk_prob = 1; }
    /* each key on its own, so that the message names the one that is wrong */
    const char *key = c->num_experts < 1 ? (c->arch == TP_ARCH_MIXTRAL ? "num_local_experts" : "num_experts")
                    : c->num_experts_per_tok < 1 || c->num_experts_per_tok > c->num_experts ? "num_experts_per_tok"
                    : c->moe_intermediate_size < 1 ? "moe_intermediate_size"
                    : c->decoder_sparse_step < 1 ? "decoder_sparse_step" : NULL;
    if (key)
        return tp_fail(TP_ERR_FORMAT, "%s: %s: key '%s' is out of range: needs num_experts >= 1, "
                       "1 <= num_experts_per_tok <= num_experts (got %lld of %lld), moe_intermediate_size >= 1 "
                       "(got %lld) and decoder_sparse_step >= 1 (got %lld)", d->path, c->model_type, key,
                       (long long)c->num_experts_per_tok, (long long)c->num_experts,
                       (long long)c->moe_intermediate_size, (long long)c->decoder_sparse_step);
    /* Transformers would ignore an index past the last layer; it can only be
     * a mistake (a config cut to fewer layers), so it is named instead. */
    for (int i = 0; i < c->n_mlp_only; i++)
        if (c->mlp_only_layers[i] >= c->num_hidden_layers)
            return tp_fail(TP_ERR_FORMAT, "%s: key 'mlp_only_layers' holds layer %lld, but num_hidden_layers is %lld",
                           d->path, (long long)c->mlp_only_layers[i], (long long)c->num_hidden_layers);
    return TP_OK;
}

/* YaRN's keys with _compute_yarn_parameters' defaults.  When the config
 * names original_max_position_embeddings, Transformers takes the factor
 * of the frequencies and of the attention factor as
 * max_position_embeddings over it (DeepSeek-V3's configs), so do we. */
static tp_status parse_yarn(const json_doc *sub, tp_rope_scaling *rs, int64_t max_pos)
{
    rs->kind = TP_ROPE_YARN;
    rs->beta_fast = 32.0;
    rs->beta_slow = 1.0;
    rs->original_max_position_embeddings = 0;
    rs->yarn_truncate = 1;
    tp_status s;
    if ((s = get_double(sub, "beta_fast", &rs->beta_fast)) || (s = get_double(sub, "beta_slow", &rs->beta_slow)) ||
        (s = get_double(sub, "mscale", &rs->mscale)) || (s = get_double(sub, "mscale_all_dim", &rs->mscale_all_dim)) ||
        (s = get_double(sub, "attention_factor", &rs->attention_factor)) ||
        (s = get_size(sub, "original_max_position_embeddings", &rs->original_max_position_embeddings)) ||
        (s = get_bool(sub, "truncate", &rs->yarn_truncate)))
        return tp_fail_context(s, "in rope_scaling");
    int64_t orig = rs->original_max_position_embeddings;
    rs->yarn_factor = orig > 0 ? (double)max_pos / (double)orig : rs->factor;
    rs->yarn_original = orig > 0 ? orig : max_pos;
    if (!(rs->beta_fast > rs->beta_slow) || !(rs->beta_slow > 0) || rs->attention_factor < 0)
        return tp_fail(TP_ERR_FORMAT, "%s: rope_scaling 'yarn' needs beta_fast > beta_slow > 0 and a non-negative "
                       "attention_factor", sub->path);
    return TP_OK;
}

/* DeepSeek's MoE keys with DeepseekV2Config's / DeepseekV3Config's
 * defaults; num_experts stays 0 for a model whose layers are all dense.
 * moe_layer_freq (DeepSeek's own modeling code) is not read: Transformers'
 * decoder layer makes every layer from first_k_dense_replace on sparse. */
static tp_status parse_deepseek_moe(tp_model_config *c, const json_doc *d)
{
    int v3 = c->arch == TP_ARCH_DEEPSEEK_V3;
    c->num_experts = v3 ? 256 : 64;
    c->num_experts_per_tok = v3 ? 8 : 0;
    c->moe_intermediate_size = v3 ? 2048 : 1407;
    c->n_shared_experts = v3 ? 1 : 2;
    c->routed_scaling_factor = v3 ? 2.5 : 1.0;
    c->n_group = v3 ? 8 : 1;
    c->topk_group = v3 ? 4 : 1;
    c->norm_topk_prob = v3;
    tp_status s;
    if ((s = get_size_or_null(d, "n_shared_experts", 0, &c->n_shared_experts)) ||
        (s = get_size(d, "n_routed_experts", &c->num_experts)) ||
        (s = get_size(d, "num_experts_per_tok", &c->num_experts_per_tok)) ||
        (s = get_size(d, "moe_intermediate_size", &c->moe_intermediate_size)) ||
        (s = get_double(d, "routed_scaling_factor", &c->routed_scaling_factor)) ||
        (s = get_size(d, "n_group", &c->n_group)) || (s = get_size(d, "topk_group", &c->topk_group)) ||
        (s = get_bool(d, "norm_topk_prob", &c->norm_topk_prob)))
        return s;
    cJSON *method = cJSON_GetObjectItemCaseSensitive(d->root, "topk_method");
    c->group_limited = 0;
    if (!v3 && method && !cJSON_IsNull(method)) {
        if (!cJSON_IsString(method) ||
            (strcmp(method->valuestring, "greedy") && strcmp(method->valuestring, "group_limited_greedy")))
            return tp_fail(TP_ERR_UNSUPPORTED, "%s: key 'topk_method' must be \"greedy\" or "
                           "\"group_limited_greedy\"", d->path);
        c->group_limited = !strcmp(method->valuestring, "group_limited_greedy");
    }
    if (!v3) c->norm_topk_prob = 0;   /* DeepseekV2Moe does not renormalise */
    int64_t E = c->num_experts, G = c->n_group > 0 ? c->n_group : 1;
    int grouped = v3 || c->group_limited;
    if (E < 1 || c->num_experts_per_tok < 1 || c->num_experts_per_tok > E || c->moe_intermediate_size < 1 ||
        (grouped && (E % G || c->topk_group < 1 || c->topk_group > G ||
                     c->num_experts_per_tok > c->topk_group * (E / G))))
        return tp_fail(TP_ERR_FORMAT, "%s: %s's MoE layers need n_routed_experts >= 1, 1 <= num_experts_per_tok <= "
                       "the experts of the topk_group groups chosen (got %lld of %lld, n_group %lld, topk_group %lld) "
                       "and n_group dividing n_routed_experts", d->path, c->model_type,
                       (long long)c->num_experts_per_tok, (long long)E, (long long)c->n_group, (long long)c->topk_group);
    if (v3 && E / G < 2)
        return tp_fail(TP_ERR_FORMAT, "%s: deepseek_v3 scores a group by its two best experts: n_group must leave at "
                       "least 2 experts a group", d->path);
    return TP_OK;
}

/* gpt_oss's layer_types: each "sliding_attention" or "full_attention",
 * one per layer (Transformers checks the count). */
static tp_status get_layer_types(tp_model_config *c, const json_doc *d)
{
    cJSON *v = cJSON_GetObjectItemCaseSensitive(d->root, "layer_types");
    c->n_layer_types = 0;
    if (!v || cJSON_IsNull(v)) return TP_OK;
    int n = cJSON_IsArray(v) ? cJSON_GetArraySize(v) : -1;
    if (n < 0 || n > TP_MAX_LAYER_FLAGS || n != c->num_hidden_layers)
        return tp_fail(TP_ERR_FORMAT, "%s: key 'layer_types' must be a list of one type per layer (%lld layers, "
                       "at most %d)", d->path, (long long)c->num_hidden_layers, TP_MAX_LAYER_FLAGS);
    for (int i = 0; i < n; i++) {
        cJSON *t = cJSON_GetArrayItem(v, i);
        int sliding = cJSON_IsString(t) && !strcmp(t->valuestring, "sliding_attention");
        if (!sliding && !(cJSON_IsString(t) && !strcmp(t->valuestring, "full_attention")))
            return tp_fail(TP_ERR_UNSUPPORTED, "%s: layer_types[%d] must be \"sliding_attention\" or "
                           "\"full_attention\"", d->path, i);
        c->layer_sliding[i] = (unsigned char)sliding;
    }
    c->n_layer_types = n;
    return TP_OK;
}

/* GptOssConfig's keys: the experts are intermediate_size wide, every layer
 * sparse, the window per layer type. */
static tp_status parse_gpt_oss(tp_model_config *c, const json_doc *d)
{
    tp_status s;
    if ((s = get_size_or_null(d, "sliding_window", 0, &c->sliding_window)) ||
        (s = get_size(d, "num_local_experts", &c->num_experts)) ||
        (s = get_size(d, "num_experts_per_tok", &c->num_experts_per_tok)) ||
        (s = get_bool(d, "output_router_logits", &c->output_router_logits)) ||
        (s = get_double(d, "swiglu_alpha", &c->swiglu_alpha)) ||
        (s = get_double(d, "swiglu_limit", &c->swiglu_limit)) || (s = get_layer_types(c, d)))
        return s;
    /* Published gpt-oss config.json files carry OpenAI's own key
     * experts_per_token next to num_experts_per_tok.  GptOssConfig has no
     * attribute_map entry for it (only num_experts -> num_local_experts): the
     * model reads num_experts_per_tok (default 4) and ignores the other.  We
     * read the same key, and refuse a file whose two keys disagree, since
     * OpenAI's reference code would route with the other one. */
    int64_t ept = c->num_experts_per_tok;
    if ((s = get_int(d, "experts_per_token", &ept))) return s;
    if (ept != c->num_experts_per_tok) {
        cJSON *k = cJSON_GetObjectItemCaseSensitive(d->root, "num_experts_per_tok");
        return tp_fail(TP_ERR_FORMAT, "%s: key 'experts_per_token' (%lld) disagrees with key 'num_experts_per_tok' "
                       "(%lld%s), which Transformers routes with: make the two equal", d->path, (long long)ept,
                       (long long)c->num_experts_per_tok, k && !cJSON_IsNull(k) ? "" : ", GptOssConfig's default");
    }
    c->moe_intermediate_size = c->intermediate_size;
    c->decoder_sparse_step = 1;
    if ((s = check_local_experts(c, d, 256))) return s;   /* the router's backward keeps k weights on the stack */
    if (!(c->swiglu_limit > 0)) return tp_fail(TP_ERR_FORMAT, "%s: key 'swiglu_limit' must be positive", d->path);
    return TP_OK;
}

/* The multi-head latent attention keys (DeepseekV2Config, DeepseekV3Config). */
static tp_status parse_mla(tp_model_config *c, const json_doc *d)
{
    tp_status s;
    if ((s = get_size_or_null(d, "q_lora_rank", 1, &c->q_lora_rank)) ||
        (s = get_positive(d, "kv_lora_rank", &c->kv_lora_rank)) ||
        (s = get_positive(d, "qk_nope_head_dim", &c->qk_nope_head_dim)) ||
        (s = get_positive(d, "qk_rope_head_dim", &c->qk_rope_head_dim)) ||
        (s = get_positive(d, "v_head_dim", &c->v_head_dim)) ||
        (s = get_size(d, "first_k_dense_replace", &c->first_k_dense_replace)) ||
        (s = get_bool(d, "rope_interleave", &c->rope_interleave)))
        return s;
    if (c->arch == TP_ARCH_DEEPSEEK_V2) c->rope_interleave = 1;   /* V2 rotates pairs, whatever the key says */
    /* DeepseekV2Config: head_dim = qk_rope_head_dim, the rotary width. */
    c->head_dim = c->qk_rope_head_dim;
    if (c->attention_bias)
        return tp_fail(TP_ERR_UNSUPPORTED, "%s: key 'attention_bias' = true is not supported for %s", d->path,
                       c->model_type);
    return c->first_k_dense_replace < c->num_hidden_layers ? parse_deepseek_moe(c, d) : TP_OK;
}

/* A list of 0/1 or layer indices (Llama 4's no_rope_layers, moe_layers):
 * *n its length, -1 when null or absent; at most TP_MAX_LAYER_FLAGS. */
static tp_status get_int_list(const json_doc *d, const char *key, int64_t *vals, int *n)
{
    cJSON *v = cJSON_GetObjectItemCaseSensitive(d->root, key);
    *n = -1;
    if (!v || cJSON_IsNull(v)) return TP_OK;
    if (!cJSON_IsArray(v) || cJSON_GetArraySize(v) > TP_MAX_LAYER_FLAGS)
        return tp_fail(TP_ERR_FORMAT, "%s: key '%s' must be a list of at most %d integers", d->path, key,
                       TP_MAX_LAYER_FLAGS);
    int k = 0;
    cJSON *e;
    cJSON_ArrayForEach(e, v) {
        if (!json_int(e, &vals[k]) || vals[k] < 0)
            return tp_fail(TP_ERR_FORMAT, "%s: key '%s' holds something other than a non-negative integer", d->path,
                           key);
        k++;
    }
    *n = k;
    return TP_OK;
}

/* attn_temperature_tuning: true/false, or a number (the published configs
 * say 4), which Transformers takes for its truth value. */
static tp_status get_truth(const json_doc *d, const char *key, int *out)
{
    cJSON *v = cJSON_GetObjectItemCaseSensitive(d->root, key);
    if (v && cJSON_IsNumber(v)) { *out = v->valuedouble != 0; return TP_OK; }
    return get_bool(d, key, out);
}

/* Llama4TextConfig's keys and __post_init__'s derived lists: moe_layers
 * (default every interleave_moe_layer_step-th layer, indices past the
 * last layer ignored as Transformers does), no_rope_layers (1: RoPE; an
 * empty or absent list: a NoPE layer every no_rope_layer_interval-th),
 * layer_types (must be what no_rope_layers implies). */
static tp_status parse_llama4(tp_model_config *c, const json_doc *d)
{
    int64_t vals[TP_MAX_LAYER_FLAGS];
    int64_t L = c->num_hidden_layers;
    tp_status s;
    if ((s = get_size_or_null(d, "attention_chunk_size", 0, &c->attention_chunk_size)) ||
        (s = get_size(d, "num_local_experts", &c->num_experts)) ||
        (s = get_size(d, "num_experts_per_tok", &c->num_experts_per_tok)) ||
        (s = get_positive(d, "intermediate_size_mlp", &c->intermediate_size_mlp)) ||
        (s = get_positive(d, "interleave_moe_layer_step", &c->interleave_moe_layer_step)) ||
        (s = get_positive(d, "no_rope_layer_interval", &c->no_rope_layer_interval)) ||
        (s = get_bool(d, "use_qk_norm", &c->l2_qk_norm)) ||
        (s = get_truth(d, "attn_temperature_tuning", &c->attn_temperature_tuning)) ||
        (s = get_double(d, "floor_scale", &c->floor_scale)) || (s = get_double(d, "attn_scale", &c->attn_scale)) ||
        (s = get_bool(d, "output_router_logits", &c->output_router_logits)))
        return s;
    if (L > TP_MAX_LAYER_FLAGS)
        return tp_fail(TP_ERR_UNSUPPORTED, "%s: llama4_text with more than %d layers is not supported", d->path,
                       TP_MAX_LAYER_FLAGS);
    if ((s = check_local_experts(c, d, 0))) return s;
    if (!(c->floor_scale > 0) || c->attention_chunk_size < 0)
        return tp_fail(TP_ERR_FORMAT, "%s: llama4_text needs a positive floor_scale and attention_chunk_size",
                       d->path);
    c->moe_intermediate_size = c->intermediate_size;   /* Llama4TextExperts: intermediate_size wide */
    if (c->attention_bias)
        return tp_fail(TP_ERR_UNSUPPORTED, "%s: key 'attention_bias' = true is not supported for llama4_text", d->path);
    memset(c->moe_layer, 0, sizeof c->moe_layer);
    if ((s = get_int_list(d, "moe_layers", vals, &c->n_moe_layers))) return s;
    for (int64_t l = 0; l < L; l++) c->moe_layer[l] = c->n_moe_layers < 0 && (l + 1) % c->interleave_moe_layer_step == 0;
    for (int i = 0; i < c->n_moe_layers; i++)
        if (vals[i] < L) c->moe_layer[vals[i]] = 1;
    memset(c->rope_layer, 0, sizeof c->rope_layer);
    if ((s = get_int_list(d, "no_rope_layers", vals, &c->n_rope_layers))) return s;
    if (c->n_rope_layers == 0) c->n_rope_layers = -1;   /* an empty list: the default, as `if no_rope_layers` */
    if (c->n_rope_layers >= 0 && c->n_rope_layers < L)
        return tp_fail(TP_ERR_FORMAT, "%s: key 'no_rope_layers' has %d entries for %lld layers", d->path,
                       c->n_rope_layers, (long long)L);
    for (int64_t l = 0; l < L; l++)
        c->rope_layer[l] = c->n_rope_layers < 0 ? (l + 1) % c->no_rope_layer_interval != 0 : vals[l] != 0;
    cJSON *types = cJSON_GetObjectItemCaseSensitive(d->root, "layer_types"), *e;
    if (types && !cJSON_IsNull(types)) {
        int64_t l = 0;
        int ok = cJSON_IsArray(types) && cJSON_GetArraySize(types) >= L;
        cJSON_ArrayForEach(e, types) {
            if (!ok || l >= L) break;
            const char *want = c->rope_layer[l++] ? "chunked_attention" : "full_attention";
            ok = cJSON_IsString(e) && !strcmp(e->valuestring, want);
        }
        if (!ok)
            return tp_fail(TP_ERR_UNSUPPORTED, "%s: key 'layer_types' must be \"chunked_attention\" on the RoPE layers "
                           "and \"full_attention\" on the NoPE layers (no_rope_layers), as Llama4TextConfig derives "
                           "it", d->path);
    }
    return TP_OK;
}

tp_status tp_config_check_training(const tp_model_config *c)
{
    /* Transformers' loss would then include the router's auxiliary loss;
     * tensorpar's does not, so it refuses rather than train toward another
     * objective. */
    if (c->num_experts > 0 && c->output_router_logits)
        return tp_fail(TP_ERR_UNSUPPORTED, "model type %s: config.json sets output_router_logits, with which "
                       "Transformers adds router_aux_loss_coef times the router's load-balancing loss to the "
                       "training loss; tensorpar does not compute that loss: set output_router_logits to false",
                       c->model_type);
    return TP_OK;
}

static tp_status parse_rope_scaling(const json_doc *d, tp_rope_scaling *rs, int64_t max_pos)
{
    cJSON *v = cJSON_GetObjectItemCaseSensitive(d->root, "rope_scaling");
    /* absent: the model type's default (set_defaults; gpt_oss's is YaRN) */
    if (!v || cJSON_IsNull(v)) return TP_OK;
    rs->kind = TP_ROPE_DEFAULT;
    if (!cJSON_IsObject(v)) return tp_fail(TP_ERR_FORMAT, "%s: key 'rope_scaling' must be an object or null", d->path);
    cJSON *type = cJSON_GetObjectItemCaseSensitive(v, "rope_type");
    if (!type) type = cJSON_GetObjectItemCaseSensitive(v, "type");   /* older configs */
    if (!cJSON_IsString(type))
        return tp_fail(TP_ERR_FORMAT, "%s: key 'rope_scaling' has no string 'rope_type'", d->path);
    json_doc sub = {d->path, v};
    rs->factor = 1.0;
    tp_status s = get_double(&sub, "factor", &rs->factor);
    if (s) return tp_fail_context(s, "in rope_scaling");
    const char *t = type->valuestring;
    if (!strcmp(t, "default")) return TP_OK;
    if (!strcmp(t, "linear")) {
        rs->kind = TP_ROPE_LINEAR;
    } else if (!strcmp(t, "llama3")) {
        rs->kind = TP_ROPE_LLAMA3;
        rs->low_freq_factor = 1.0;
        rs->high_freq_factor = 4.0;
        rs->original_max_position_embeddings = max_pos;
        if ((s = get_double(&sub, "low_freq_factor", &rs->low_freq_factor)) ||
            (s = get_double(&sub, "high_freq_factor", &rs->high_freq_factor)) ||
            (s = get_size(&sub, "original_max_position_embeddings", &rs->original_max_position_embeddings)))
            return s;
        if (!(rs->high_freq_factor > rs->low_freq_factor) || rs->original_max_position_embeddings <= 0)
            return tp_fail(TP_ERR_FORMAT, "%s: rope_scaling 'llama3' needs high_freq_factor > low_freq_factor "
                           "and a positive original_max_position_embeddings", d->path);
    } else if (!strcmp(t, "yarn")) {
        if ((s = parse_yarn(&sub, rs, max_pos))) return s;
    } else {
        return tp_fail(TP_ERR_UNSUPPORTED, "%s: rope_scaling type '%s' is not supported "
                       "(supported: none, \"llama3\", \"linear\", \"yarn\")", d->path, t);
    }
    if (!(rs->factor > 0)) return tp_fail(TP_ERR_FORMAT, "%s: rope_scaling factor must be positive", d->path);
    return TP_OK;
}

static tp_status parse_dtype(const json_doc *d, tp_dtype *out)
{
    cJSON *v = cJSON_GetObjectItemCaseSensitive(d->root, "torch_dtype");
    if (!v || cJSON_IsNull(v)) v = cJSON_GetObjectItemCaseSensitive(d->root, "dtype");
    if (!v || cJSON_IsNull(v)) return TP_OK;
    if (!cJSON_IsString(v) || tp_dtype_parse(v->valuestring, out) != TP_OK)
        return tp_fail(TP_ERR_FORMAT, "%s: key 'torch_dtype' must be \"float32\", \"bfloat16\" or \"float16\"", d->path);
    return TP_OK;
}

static tp_status parse_config(tp_model_config *c, const json_doc *d)
{
    cJSON *mt = cJSON_GetObjectItemCaseSensitive(d->root, "model_type");
    if (!cJSON_IsString(mt)) return tp_fail(TP_ERR_FORMAT, "%s: key 'model_type' is missing or not a string", d->path);
    tp_arch arch = TP_ARCH_LLAMA;
    if (tp_arch_parse(mt->valuestring, &arch)) return tp_fail_context(TP_ERR_UNSUPPORTED, "%s", d->path);
    set_defaults(c, arch);
    c->num_key_value_heads = 0;
    int use_sliding = 0, mlp_bias = 0;
    tp_status s;
    if ((s = get_positive(d, "hidden_size", &c->hidden_size)) ||
        (s = get_positive(d, "intermediate_size", &c->intermediate_size)) ||
        (s = get_positive(d, "num_hidden_layers", &c->num_hidden_layers)) ||
        (s = get_positive(d, "num_attention_heads", &c->num_attention_heads)) ||
        (s = get_size(d, "num_key_value_heads", &c->num_key_value_heads)) ||
        (s = get_size(d, "head_dim", &c->head_dim)) ||
        (s = get_positive(d, "vocab_size", &c->vocab_size)) ||
        (s = get_positive(d, "max_position_embeddings", &c->max_position_embeddings)) ||
        (s = get_double(d, "rms_norm_eps", &c->rms_norm_eps)) ||
        (s = get_double(d, "rope_theta", &c->rope_theta)) ||
        (s = get_bool(d, "tie_word_embeddings", &c->tie_word_embeddings)) ||
        (s = get_bool(d, "attention_bias", &c->attention_bias)) ||
        (s = get_bool(d, "mlp_bias", &mlp_bias)) ||
        (s = get_bool(d, "use_sliding_window", &use_sliding)) ||
        (s = get_int(d, "bos_token_id", &c->bos_token_id)) ||
        (s = get_eos(d, c->eos_token_ids, &c->n_eos)) ||
        (s = parse_dtype(d, &c->dtype)) ||
        (s = parse_rope_scaling(d, &c->rope_scaling, c->max_position_embeddings)))
        return s;
    if (mlp_bias) return tp_fail(TP_ERR_UNSUPPORTED, "%s: key 'mlp_bias' = true is not supported", d->path);
    cJSON *hidden_act = cJSON_GetObjectItemCaseSensitive(d->root, "hidden_act");
    if (hidden_act && !(cJSON_IsString(hidden_act) && !strcmp(hidden_act->valuestring, "silu")))
        return tp_fail(TP_ERR_UNSUPPORTED, "%s: key 'hidden_act' must be \"silu\"", d->path);
    if (arch == TP_ARCH_QWEN3_MOE || arch == TP_ARCH_MIXTRAL) {
        if ((s = parse_moe(c, d))) return s;
    } else if (arch == TP_ARCH_GPT_OSS) {
        if ((s = parse_gpt_oss(c, d))) return s;
    } else if (arch == TP_ARCH_LLAMA4_TEXT) {
        if ((s = parse_llama4(c, d))) return s;
    } else {
        c->num_experts = 0;
    }
    if (c->mla && (s = parse_mla(c, d))) return s;
    /* The dense attention's rope table has no attention factor: YaRN is
     * built for MLA (module_mla.c) only. */
    if (c->rope_scaling.kind == TP_ROPE_YARN && !c->mla && arch != TP_ARCH_GPT_OSS)
        return tp_fail(TP_ERR_UNSUPPORTED, "%s: rope_scaling type 'yarn' is supported for deepseek_v2, deepseek_v3 "
                       "and gpt_oss only, not %s", d->path, c->model_type);
    if (arch == TP_ARCH_MISTRAL || arch == TP_ARCH_MIXTRAL) {
        cJSON *sw = cJSON_GetObjectItemCaseSensitive(d->root, "sliding_window");
        if (sw && cJSON_IsNull(sw)) c->sliding_window = 0;
        else if ((s = get_size(d, "sliding_window", &c->sliding_window))) return s;
    } else if (use_sliding) {
        /* Qwen's per-layer windows (max_window_layers) are not implemented;
         * refusing beats computing something else. */
        return tp_fail(TP_ERR_UNSUPPORTED, "%s: key 'use_sliding_window' = true is not supported for %s",
                       d->path, c->model_type);
    }
    /* Transformers builds Mistral without attention biases and Qwen2 with
     * q/k/v biases only, whatever attention_bias says. */
    if (arch == TP_ARCH_QWEN2) c->qkv_bias = 1;
    if (arch == TP_ARCH_QWEN2 || arch == TP_ARCH_MISTRAL || arch == TP_ARCH_MIXTRAL) c->attention_bias = 0;
    return tp_config_validate(c, d->path);
}

tp_status tp_config_validate(tp_model_config *c, const char *origin)
{
    if (c->num_key_value_heads <= 0) c->num_key_value_heads = c->num_attention_heads;
    if (c->head_dim <= 0) {
        if (c->hidden_size % c->num_attention_heads)
            return tp_fail(TP_ERR_FORMAT, "%s: hidden_size %lld is not divisible by num_attention_heads %lld",
                           origin, (long long)c->hidden_size, (long long)c->num_attention_heads);
        c->head_dim = c->hidden_size / c->num_attention_heads;
    }
    if (c->head_dim % 2)
        return tp_fail(TP_ERR_FORMAT, "%s: head_dim %lld must be even for rotary embeddings", origin, (long long)c->head_dim);
    if (c->num_attention_heads % c->num_key_value_heads)
        return tp_fail(TP_ERR_FORMAT, "%s: num_attention_heads %lld is not divisible by num_key_value_heads %lld",
                       origin, (long long)c->num_attention_heads, (long long)c->num_key_value_heads);
    if (!(c->rms_norm_eps > 0) || !(c->rope_theta > 0))
        return tp_fail(TP_ERR_FORMAT, "%s: rms_norm_eps and rope_theta must be positive", origin);
    if (c->sliding_window < 0)
        return tp_fail(TP_ERR_FORMAT, "%s: sliding_window must be positive or null", origin);
    /* MLA's keys have a head per query head after kv_b_proj (repeat_kv
     * would not fit another count). */
    if (c->mla && (c->num_key_value_heads != c->num_attention_heads || c->head_dim != c->qk_rope_head_dim))
        return tp_fail(TP_ERR_FORMAT, "%s: %s needs num_key_value_heads = num_attention_heads (%lld, got %lld)",
                       origin, c->model_type, (long long)c->num_attention_heads, (long long)c->num_key_value_heads);
    return TP_OK;
}

tp_status tp_config_load(tp_model_config *cfg, const char *model_dir)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", model_dir);
    char *text;
    tp_status s = tp_read_file(path, &text, NULL);
    if (s) return s;
    cJSON *root = cJSON_Parse(text);
    free(text);
    if (!root || !cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return tp_fail(TP_ERR_FORMAT, "%s: not a valid JSON object", path);
    }
    json_doc d = {path, root};
    s = parse_config(cfg, &d);
    cJSON_Delete(root);
    return s;
}

/* ---- writing ----------------------------------------------------------- */

static cJSON *rope_scaling_json(const tp_rope_scaling *rs)
{
    if (rs->kind == TP_ROPE_DEFAULT) return cJSON_CreateNull();
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "factor", rs->factor);
    if (rs->kind == TP_ROPE_YARN) {
        cJSON_AddNumberToObject(o, "beta_fast", rs->beta_fast);
        cJSON_AddNumberToObject(o, "beta_slow", rs->beta_slow);
        if (rs->attention_factor > 0) cJSON_AddNumberToObject(o, "attention_factor", rs->attention_factor);
        if (rs->mscale != 0) cJSON_AddNumberToObject(o, "mscale", rs->mscale);
        if (rs->mscale_all_dim != 0) cJSON_AddNumberToObject(o, "mscale_all_dim", rs->mscale_all_dim);
        if (rs->original_max_position_embeddings > 0)
            cJSON_AddNumberToObject(o, "original_max_position_embeddings", (double)rs->original_max_position_embeddings);
        cJSON_AddStringToObject(o, "rope_type", "yarn");
        if (!rs->yarn_truncate) cJSON_AddBoolToObject(o, "truncate", 0);
    } else if (rs->kind == TP_ROPE_LLAMA3) {
        cJSON_AddNumberToObject(o, "high_freq_factor", rs->high_freq_factor);
        cJSON_AddNumberToObject(o, "low_freq_factor", rs->low_freq_factor);
        cJSON_AddNumberToObject(o, "original_max_position_embeddings", (double)rs->original_max_position_embeddings);
        cJSON_AddStringToObject(o, "rope_type", "llama3");
    } else {
        cJSON_AddStringToObject(o, "rope_type", "linear");
    }
    return o;
}

static const char *torch_dtype_name(tp_dtype t)
{
    return t == TP_BF16 ? "bfloat16" : t == TP_F16 ? "float16" : "float32";
}

static cJSON *eos_json(const int64_t *ids, int n)
{
    if (n == 0) return cJSON_CreateNull();
    if (n == 1) return cJSON_CreateNumber((double)ids[0]);
    cJSON *a = cJSON_CreateArray();
    for (int i = 0; i < n; i++) cJSON_AddItemToArray(a, cJSON_CreateNumber((double)ids[i]));
    return a;
}

static tp_status save_json(cJSON *root, const char *path)
{
    char *text = cJSON_Print(root);
    cJSON_Delete(root);
    if (!text) return tp_fail(TP_ERR_NOMEM, "%s: out of memory", path);
    size_t n = strlen(text);
    char *with_nl = realloc(text, n + 2);
    if (!with_nl) { free(text); return tp_fail(TP_ERR_NOMEM, "%s: out of memory", path); }
    with_nl[n] = '\n';
    with_nl[n + 1] = '\0';
    tp_status s = tp_write_file_atomic(path, with_nl, n + 1);
    free(with_nl);
    return s;
}

/* The expert keys as each model type's config class names them. */
static void moe_json(cJSON *o, const tp_model_config *c)
{
    int mixtral = c->arch == TP_ARCH_MIXTRAL;
    cJSON_AddNumberToObject(o, mixtral ? "num_local_experts" : "num_experts", (double)c->num_experts);
    cJSON_AddNumberToObject(o, "num_experts_per_tok", (double)c->num_experts_per_tok);
    cJSON_AddBoolToObject(o, "output_router_logits", c->output_router_logits);
    cJSON_AddNumberToObject(o, "router_aux_loss_coef", 0.001);
    if (mixtral) { cJSON_AddNumberToObject(o, "router_jitter_noise", 0.0); return; }
    cJSON_AddNumberToObject(o, "moe_intermediate_size", (double)c->moe_intermediate_size);
    cJSON_AddNumberToObject(o, "decoder_sparse_step", (double)c->decoder_sparse_step);
    cJSON_AddBoolToObject(o, "norm_topk_prob", c->norm_topk_prob);
    cJSON *a = cJSON_AddArrayToObject(o, "mlp_only_layers");
    for (int i = 0; i < c->n_mlp_only; i++) cJSON_AddItemToArray(a, cJSON_CreateNumber((double)c->mlp_only_layers[i]));
}

static void mla_json(cJSON *o, const tp_model_config *c)
{
    cJSON_AddNumberToObject(o, "first_k_dense_replace", (double)c->first_k_dense_replace);
    cJSON_AddNumberToObject(o, "kv_lora_rank", (double)c->kv_lora_rank);
    if (c->q_lora_rank > 0) cJSON_AddNumberToObject(o, "q_lora_rank", (double)c->q_lora_rank);
    else cJSON_AddNullToObject(o, "q_lora_rank");
    cJSON_AddNumberToObject(o, "qk_nope_head_dim", (double)c->qk_nope_head_dim);
    cJSON_AddNumberToObject(o, "qk_rope_head_dim", (double)c->qk_rope_head_dim);
    cJSON_AddNumberToObject(o, "v_head_dim", (double)c->v_head_dim);
    if (c->arch == TP_ARCH_DEEPSEEK_V3) cJSON_AddBoolToObject(o, "rope_interleave", c->rope_interleave);
    if (c->num_experts <= 0) return;
    cJSON_AddNumberToObject(o, "moe_intermediate_size", (double)c->moe_intermediate_size);
    cJSON_AddNumberToObject(o, "n_group", (double)c->n_group);
    cJSON_AddNumberToObject(o, "n_routed_experts", (double)c->num_experts);
    if (c->n_shared_experts > 0) cJSON_AddNumberToObject(o, "n_shared_experts", (double)c->n_shared_experts);
    else cJSON_AddNullToObject(o, "n_shared_experts");
    cJSON_AddBoolToObject(o, "norm_topk_prob", c->norm_topk_prob);
    cJSON_AddNumberToObject(o, "num_experts_per_tok", (double)c->num_experts_per_tok);
    cJSON_AddNumberToObject(o, "routed_scaling_factor", c->routed_scaling_factor);
    cJSON_AddNumberToObject(o, "topk_group", (double)c->topk_group);
    if (c->arch == TP_ARCH_DEEPSEEK_V2)
        cJSON_AddStringToObject(o, "topk_method", c->group_limited ? "group_limited_greedy" : "greedy");
    else
        cJSON_AddStringToObject(o, "topk_method", "noaux_tc");
}

/* gpt_oss's keys; layer_types only when it is not GptOssConfig's default
 * alternation, so that --set num_hidden_layers re-derives it. */
static void gpt_oss_json(cJSON *o, const tp_model_config *c)
{
    int alternating = 1;
    for (int i = 0; i < c->n_layer_types; i++) alternating &= c->layer_sliding[i] == (i + 1) % 2;
    if (!alternating) {
        cJSON *a = cJSON_AddArrayToObject(o, "layer_types");
        for (int i = 0; i < c->n_layer_types; i++)
            cJSON_AddItemToArray(a, cJSON_CreateString(c->layer_sliding[i] ? "sliding_attention" : "full_attention"));
    }
    cJSON_AddNumberToObject(o, "num_local_experts", (double)c->num_experts);
    cJSON_AddNumberToObject(o, "num_experts_per_tok", (double)c->num_experts_per_tok);
    cJSON_AddBoolToObject(o, "output_router_logits", c->output_router_logits);
    cJSON_AddNumberToObject(o, "router_aux_loss_coef", 0.9);
    if (c->sliding_window > 0) cJSON_AddNumberToObject(o, "sliding_window", (double)c->sliding_window);
    else cJSON_AddNullToObject(o, "sliding_window");
    cJSON_AddNumberToObject(o, "swiglu_limit", c->swiglu_limit);
    if (c->swiglu_alpha != 1.702) cJSON_AddNumberToObject(o, "swiglu_alpha", c->swiglu_alpha);
}

static void layer_list_json(cJSON *o, const char *key, const unsigned char *flags, int64_t L, int as_flags)
{
    cJSON *a = cJSON_AddArrayToObject(o, key);
    for (int64_t l = 0; l < L && l < TP_MAX_LAYER_FLAGS; l++) {
        if (as_flags) cJSON_AddItemToArray(a, cJSON_CreateNumber(flags[l]));
        else if (flags[l]) cJSON_AddItemToArray(a, cJSON_CreateNumber((double)l));
    }
}

/* Llama4TextConfig's own keys; the layer lists only when the config gave
 * them (else null: derived from the step and interval again). */
static void llama4_json(cJSON *o, const tp_model_config *c)
{
    if (c->attention_chunk_size > 0) cJSON_AddNumberToObject(o, "attention_chunk_size", (double)c->attention_chunk_size);
    else cJSON_AddNullToObject(o, "attention_chunk_size");
    cJSON_AddNumberToObject(o, "attn_scale", c->attn_scale);
    cJSON_AddBoolToObject(o, "attn_temperature_tuning", c->attn_temperature_tuning);
    cJSON_AddNumberToObject(o, "floor_scale", c->floor_scale);
    cJSON_AddNumberToObject(o, "interleave_moe_layer_step", (double)c->interleave_moe_layer_step);
    cJSON_AddNumberToObject(o, "intermediate_size_mlp", (double)c->intermediate_size_mlp);
    if (c->n_moe_layers >= 0) layer_list_json(o, "moe_layers", c->moe_layer, c->num_hidden_layers, 0);
    else cJSON_AddNullToObject(o, "moe_layers");
    if (c->n_rope_layers >= 0) layer_list_json(o, "no_rope_layers", c->rope_layer, c->num_hidden_layers, 1);
    else cJSON_AddNullToObject(o, "no_rope_layers");
    cJSON_AddNumberToObject(o, "no_rope_layer_interval", (double)c->no_rope_layer_interval);
    cJSON_AddNumberToObject(o, "num_experts_per_tok", (double)c->num_experts_per_tok);
    cJSON_AddNumberToObject(o, "num_local_experts", (double)c->num_experts);
    cJSON_AddBoolToObject(o, "output_router_logits", c->output_router_logits);
    cJSON_AddNumberToObject(o, "router_aux_loss_coef", 0.001);
    cJSON_AddNumberToObject(o, "router_jitter_noise", 0.0);
    cJSON_AddBoolToObject(o, "use_qk_norm", c->l2_qk_norm);
}

static cJSON *config_json(const tp_model_config *c)
{
    cJSON *o = cJSON_CreateObject();
    cJSON *archs = cJSON_AddArrayToObject(o, "architectures");
    cJSON_AddItemToArray(archs, cJSON_CreateString(tp_arch_class_name(c->arch)));
    if (c->arch == TP_ARCH_LLAMA || c->arch == TP_ARCH_QWEN3 || c->arch == TP_ARCH_QWEN3_MOE || c->mla || c->llama4 ||
        c->arch == TP_ARCH_GPT_OSS)
        cJSON_AddBoolToObject(o, "attention_bias", c->attention_bias);
    cJSON_AddNumberToObject(o, "attention_dropout", 0.0);
    if (c->bos_token_id >= 0) cJSON_AddNumberToObject(o, "bos_token_id", (double)c->bos_token_id);
    else cJSON_AddNullToObject(o, "bos_token_id");
    cJSON_AddItemToObject(o, "eos_token_id", eos_json(c->eos_token_ids, c->n_eos));
    /* head_dim is written when it is not implied, so that a later --set of
     * hidden_size or num_attention_heads re-derives it. */
    if (!c->mla && (c->arch == TP_ARCH_QWEN3 || c->arch == TP_ARCH_QWEN3_MOE || c->llama4 || c->arch == TP_ARCH_GPT_OSS ||
                    c->head_dim * c->num_attention_heads != c->hidden_size))
        cJSON_AddNumberToObject(o, "head_dim", (double)c->head_dim);
    cJSON_AddStringToObject(o, "hidden_act", "silu");
    cJSON_AddNumberToObject(o, "hidden_size", (double)c->hidden_size);
    cJSON_AddNumberToObject(o, "initializer_range", 0.02);
    cJSON_AddNumberToObject(o, "intermediate_size", (double)c->intermediate_size);
    cJSON_AddNumberToObject(o, "max_position_embeddings", (double)c->max_position_embeddings);
    if (c->arch == TP_ARCH_LLAMA) cJSON_AddBoolToObject(o, "mlp_bias", 0);
    cJSON_AddStringToObject(o, "model_type", c->model_type);
    cJSON_AddNumberToObject(o, "num_attention_heads", (double)c->num_attention_heads);
    cJSON_AddNumberToObject(o, "num_hidden_layers", (double)c->num_hidden_layers);
    cJSON_AddNumberToObject(o, "num_key_value_heads", (double)c->num_key_value_heads);
    cJSON_AddNumberToObject(o, "rms_norm_eps", c->rms_norm_eps);
    cJSON_AddItemToObject(o, "rope_scaling", rope_scaling_json(&c->rope_scaling));
    cJSON_AddNumberToObject(o, "rope_theta", c->rope_theta);
    if (c->arch == TP_ARCH_GPT_OSS) gpt_oss_json(o, c);
    else if (c->num_experts > 0 && !c->mla && !c->llama4) moe_json(o, c);
    if (c->llama4) llama4_json(o, c);
    if (c->mla) mla_json(o, c);
    if (c->arch == TP_ARCH_MISTRAL || c->arch == TP_ARCH_MIXTRAL) {
        if (c->sliding_window > 0) cJSON_AddNumberToObject(o, "sliding_window", (double)c->sliding_window);
        else cJSON_AddNullToObject(o, "sliding_window");
    }
    if (c->arch == TP_ARCH_QWEN2 || c->arch == TP_ARCH_QWEN3 || c->arch == TP_ARCH_QWEN3_MOE) {
        cJSON_AddNumberToObject(o, "max_window_layers", (double)c->num_hidden_layers);
        cJSON_AddBoolToObject(o, "use_sliding_window", 0);
        cJSON_AddNullToObject(o, "sliding_window");
    }
    cJSON_AddBoolToObject(o, "tie_word_embeddings", c->tie_word_embeddings);
    cJSON_AddStringToObject(o, "torch_dtype", torch_dtype_name(c->dtype));
    cJSON_AddStringToObject(o, "transformers_version", "4.56.0");
    cJSON_AddBoolToObject(o, "use_cache", 1);
    cJSON_AddNumberToObject(o, "vocab_size", (double)c->vocab_size);
    return o;
}

tp_status tp_config_save(const tp_model_config *c, const char *model_dir)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", model_dir);
    return save_json(config_json(c), path);
}

/* The config.json keys parse_config reads: the only ones --set can change
 * (another key would be written and then ignored, which hides typos). */
static const char *const settable_keys[] = {
    "attention_bias", "attention_chunk_size", "attn_scale", "attn_temperature_tuning", "bos_token_id",
    "decoder_sparse_step", "floor_scale", "interleave_moe_layer_step", "intermediate_size_mlp", "layer_types",
    "moe_layers", "no_rope_layer_interval", "no_rope_layers", "use_qk_norm", "eos_token_id", "first_k_dense_replace", "head_dim",
    "hidden_act", "hidden_size", "intermediate_size", "kv_lora_rank", "max_position_embeddings", "mlp_bias",
    "mlp_only_layers", "moe_intermediate_size", "norm_topk_prob", "num_attention_heads", "num_experts",
    "num_experts_per_tok", "num_hidden_layers", "num_key_value_heads", "num_local_experts", "n_group",
    "n_routed_experts", "n_shared_experts", "q_lora_rank", "routed_scaling_factor", "topk_group", "topk_method",
    "qk_nope_head_dim", "qk_rope_head_dim", "rms_norm_eps", "rope_interleave", "rope_scaling", "rope_theta",
    "sliding_window", "swiglu_alpha", "swiglu_limit", "tie_word_embeddings", "torch_dtype", "use_sliding_window",
    "v_head_dim", "vocab_size",
};
#define N_SETTABLE (sizeof settable_keys / sizeof settable_keys[0])

static tp_status unknown_key(const char *key)
{
    char known[1536] = "";
    size_t used = 0;
    for (size_t i = 0; i < N_SETTABLE && used < sizeof known; i++)
        used += (size_t)snprintf(known + used, sizeof known - used, "%s%s", i ? ", " : "", settable_keys[i]);
    return tp_fail(TP_ERR_INVALID, "--set: unknown config key '%s' (known keys: %s)", key, known);
}

/* Puts one "key=value" into the JSON object o. */
static tp_status set_one(cJSON *o, const char *assignment)
{
    const char *eq = strchr(assignment, '=');
    if (!eq || eq == assignment)
        return tp_fail(TP_ERR_INVALID, "--set expects key=value, got '%s'", assignment);
    char key[128];
    size_t klen = (size_t)(eq - assignment);
    if (klen >= sizeof key) return tp_fail(TP_ERR_INVALID, "--set: key too long in '%s'", assignment);
    memcpy(key, assignment, klen);
    key[klen] = '\0';
    size_t i = 0;
    while (i < N_SETTABLE && strcmp(settable_keys[i], key)) i++;
    if (i == N_SETTABLE) return unknown_key(key);
    cJSON *value = cJSON_Parse(eq + 1);
    if (!value) value = cJSON_CreateString(eq + 1);   /* bare words are strings */
    cJSON_DeleteItemFromObjectCaseSensitive(o, key);
    cJSON_AddItemToObject(o, key, value);
    return TP_OK;
}

/* "key=value" pairs with JSON values, applied by writing the config as JSON,
 * replacing the keys and reading it back once: one parser for files and
 * overrides, and the checks see the final config, whatever the order. */
tp_status tp_config_set_all(tp_model_config *c, const char *const *assignments, int n)
{
    cJSON *o = config_json(c);
    if (!o) return tp_fail(TP_ERR_NOMEM, "out of memory");
    tp_status s = TP_OK;
    for (int i = 0; i < n && !s; i++) s = set_one(o, assignments[i]);
    tp_model_config updated;
    if (!s) {
        json_doc d = {"--set", o};
        s = parse_config(&updated, &d);
    }
    cJSON_Delete(o);
    if (s) return s;
    *c = updated;
    return TP_OK;
}

tp_status tp_config_set(tp_model_config *c, const char *assignment)
{
    return tp_config_set_all(c, &assignment, 1);
}

/* ---- generation_config.json -------------------------------------------- */

tp_status tp_generation_config_load(tp_generation_config *g, const char *model_dir,
                                    const tp_model_config *cfg)
{
    memset(g, 0, sizeof *g);
    g->bos_token_id = cfg ? cfg->bos_token_id : -1;
    if (cfg) { memcpy(g->eos_token_ids, cfg->eos_token_ids, sizeof g->eos_token_ids); g->n_eos = cfg->n_eos; }
    g->temperature = 1.0;
    g->top_p = 1.0;
    g->top_k = 50;
    g->repetition_penalty = 1.0;
    g->max_new_tokens = 256;
    char path[4096];
    snprintf(path, sizeof path, "%s/generation_config.json", model_dir);
    char *text;
    if (tp_read_file(path, &text, NULL) != TP_OK) { tp_clear_error(); return TP_OK; }  /* optional file */
    cJSON *root = cJSON_Parse(text);
    free(text);
    if (!root || !cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return tp_fail(TP_ERR_FORMAT, "%s: not a valid JSON object", path);
    }
    json_doc d = {path, root};
    tp_status s;
    if ((s = get_int(&d, "bos_token_id", &g->bos_token_id)) ||
        (s = get_eos(&d, g->eos_token_ids, &g->n_eos)) ||
        (s = get_bool(&d, "do_sample", &g->do_sample)) ||
        (s = get_double(&d, "temperature", &g->temperature)) ||
        (s = get_double(&d, "top_p", &g->top_p)) ||
        (s = get_double(&d, "min_p", &g->min_p)) ||
        (s = get_double(&d, "repetition_penalty", &g->repetition_penalty)) ||
        (s = get_int(&d, "top_k", &g->top_k)) ||
        (s = get_int(&d, "max_new_tokens", &g->max_new_tokens))) {
        cJSON_Delete(root);
        return s;
    }
    cJSON_Delete(root);
    return TP_OK;
}

tp_status tp_generation_config_save(const tp_generation_config *g, const char *model_dir)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/generation_config.json", model_dir);
    cJSON *o = cJSON_CreateObject();
    if (g->bos_token_id >= 0) cJSON_AddNumberToObject(o, "bos_token_id", (double)g->bos_token_id);
    cJSON_AddItemToObject(o, "eos_token_id", eos_json(g->eos_token_ids, g->n_eos));
    if (g->do_sample) {
        cJSON_AddBoolToObject(o, "do_sample", 1);
        cJSON_AddNumberToObject(o, "temperature", g->temperature);
        cJSON_AddNumberToObject(o, "top_p", g->top_p);
        cJSON_AddNumberToObject(o, "top_k", (double)g->top_k);
    }
    cJSON_AddStringToObject(o, "transformers_version", "4.56.0");
    return save_json(o, path);
}
