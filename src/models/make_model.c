/* make-model: a random-weight model directory in exactly the layout
 * Transformers writes, so every other command can be tested on real files.
 *
 * Each tensor draws from its own generator, seeded by (seed, tensor index):
 * the values do not depend on how the checkpoint is split into shards. */
#include "tensorpar/models.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define DEFAULT_MAX_SHARD_BYTES 5000000000ull   /* save_pretrained's 5GB */

static double init_std(const tp_param_desc *p, const tp_make_options *o)
{
    if (strstr(p->name, "q_proj.weight") || strstr(p->name, "k_proj.weight")) return o->qk_std;
    /* MLA's query and key paths (the rotary key comes from kv_a_proj_with_mqa unnormed) */
    if (strstr(p->name, "q_b_proj.weight") || strstr(p->name, "kv_b_proj.weight") ||
        strstr(p->name, "kv_a_proj_with_mqa.weight"))
        return o->qk_std;
    /* MoE routers (Llama 4's feed_forward.router) */
    if (o->router_std > 0 && (strstr(p->name, ".gate.weight") || strstr(p->name, ".router.weight")))
        return o->router_std;
    return o->std;
}

static int64_t numel(const tp_param_desc *p)
{
    int64_t n = 1;
    for (int i = 0; i < p->ndim; i++) n *= p->shape[i];
    return n;
}

static tp_status fill_param(const tp_param_desc *p, size_t index, const tp_make_options *o, void **data)
{
    int64_t n = numel(p);
    float *f = malloc((size_t)n * sizeof(float));
    if (!f) return tp_fail(TP_ERR_NOMEM, "out of memory generating %s", p->name);
    tp_rng rng;
    tp_rng_seed(&rng, o->seed * 1000003ull + index);
    /* Norm weights near 1 keep activations sane while still being checked:
     * a missing norm multiplication moves the logits visibly. */
    double std = p->kind == TP_PARAM_NORM ? 0.05 : init_std(p, o);
    double mean = p->kind == TP_PARAM_NORM ? 1.0 : 0.0;
    /* gpt_oss's attention sinks: logits of the order of the scores, some
     * above and some below, so that each moves the softmax visibly */
    if (strstr(p->name, ".self_attn.sinks")) std = 0.5, mean = 0.0;
    for (int64_t i = 0; i < n; i++) f[i] = (float)(mean + std * tp_rng_normal(&rng));
    if (o->dtype == TP_F32) { *data = f; return TP_OK; }
    void *conv = malloc((size_t)n * tp_dtype_size(o->dtype));
    if (!conv) { free(f); return tp_fail(TP_ERR_NOMEM, "out of memory generating %s", p->name); }
    tp_status s = tp_convert(conv, o->dtype, f, TP_F32, (size_t)n);
    free(f);
    *data = conv;
    return s;
}

static uint64_t param_bytes(const tp_param_desc *p, tp_dtype dt)
{
    return (uint64_t)numel(p) * tp_dtype_size(dt);
}

static void shard_name(char *buf, size_t cap, int k, int K)
{
    if (K == 1) snprintf(buf, cap, "model.safetensors");
    else snprintf(buf, cap, "model-%05d-of-%05d.safetensors", k + 1, K);
}

/* Writes params [b, e) into one file, generating them just before. */
static tp_status write_shard(const char *dir, const char *file, const tp_param_desc *params,
                             size_t b, size_t e, const tp_make_options *o, tp_progress *bar)
{
    size_t n = e - b;
    tp_st_entry *entries = calloc(n ? n : 1, sizeof *entries);
    void **data = calloc(n ? n : 1, sizeof *data);
    tp_status s = entries && data ? TP_OK : tp_fail(TP_ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < n && !s; i++) {
        s = fill_param(&params[b + i], b + i, o, &data[i]);
        entries[i] = (tp_st_entry){params[b + i].name, o->dtype, params[b + i].ndim, params[b + i].shape, data[i]};
        tp_progress_advance(bar, 1);
    }
    if (!s) {
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, file);
        const char *meta[] = {"format", "pt"};
        s = tp_safetensors_write(path, entries, n, meta, 1);
    }
    for (size_t i = 0; data && i < n; i++) free(data[i]);
    free(data);
    free(entries);
    return s;
}

static tp_status write_index(const char *dir, const tp_param_desc *params, size_t n,
                             const size_t *bounds, int K, uint64_t total)
{
    cJSON *root = cJSON_CreateObject();
    cJSON *meta = cJSON_AddObjectToObject(root, "metadata");
    cJSON_AddNumberToObject(meta, "total_size", (double)total);
    cJSON *map = cJSON_AddObjectToObject(root, "weight_map");
    for (int k = 0; k < K; k++) {
        char file[64];
        shard_name(file, sizeof file, k, K);
        for (size_t i = bounds[k]; i < bounds[k + 1] && i < n; i++)
            cJSON_AddStringToObject(map, params[i].name, file);
    }
    char *text = cJSON_Print(root);
    cJSON_Delete(root);
    if (!text) return tp_fail(TP_ERR_NOMEM, "out of memory");
    char path[4096];
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    tp_status s = tp_write_file_atomic(path, text, strlen(text));
    free(text);
    return s;
}

/* Splits the tensors into K contiguous groups of about equal bytes. */
static void plan_shards(const tp_param_desc *params, size_t n, tp_dtype dt, int K, size_t *bounds)
{
    uint64_t total = 0, acc = 0;
    for (size_t i = 0; i < n; i++) total += param_bytes(&params[i], dt);
    int k = 1;
    bounds[0] = 0;
    for (size_t i = 0; i < n && k < K; i++) {
        acc += param_bytes(&params[i], dt);
        if (acc * (uint64_t)K >= total * (uint64_t)k && n - (i + 1) >= (size_t)(K - k)) bounds[k++] = i + 1;
    }
    while (k <= K) bounds[k++] = n;
}

static tp_status write_weights(const tp_model_config *cfg, const tp_make_options *o, const char *dir)
{
    tp_param_desc *params;
    size_t n;
    tp_status s = tp_model_checkpoint_params(cfg, &params, &n);
    if (s) return s;
    uint64_t total = 0;
    for (size_t i = 0; i < n; i++) total += param_bytes(&params[i], o->dtype);
    int K = o->shards > 0 ? o->shards : (int)((total + DEFAULT_MAX_SHARD_BYTES - 1) / DEFAULT_MAX_SHARD_BYTES);
    if (K < 1) K = 1;
    if ((size_t)K > n) { free(params); return tp_fail(TP_ERR_INVALID, "--shards %d exceeds the %zu tensors", K, n); }
    size_t *bounds = calloc((size_t)K + 1, sizeof *bounds);
    if (!bounds) { free(params); return tp_fail(TP_ERR_NOMEM, "out of memory"); }
    plan_shards(params, n, o->dtype, K, bounds);
    tp_progress bar;
    tp_progress_begin(&bar, "writing", n);
    for (int k = 0; k < K && !s; k++) {
        char file[64];
        shard_name(file, sizeof file, k, K);
        s = write_shard(dir, file, params, bounds[k], bounds[k + 1], o, &bar);
    }
    tp_progress_end(&bar);
    if (!s && K > 1) s = write_index(dir, params, n, bounds, K, total);
    free(bounds);
    free(params);
    return s;
}

/* ---- tokenizer files ----------------------------------------------------- */

static tp_status copy_file(const char *src, const char *dst)
{
    char *text;
    size_t len;
    tp_status s = tp_read_file(src, &text, &len);
    if (s) return s;
    s = tp_write_file_atomic(dst, text, len);
    free(text);
    return s;
}

/* The id of the added token whose text is `text`, or -1. */
static int64_t added_token_id(const cJSON *added, const char *text)
{
    const cJSON *e;
    cJSON_ArrayForEach(e, added) {
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(e, "content");
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(e, "id");
        if (cJSON_IsString(content) && cJSON_IsNumber(id) && !strcmp(content->valuestring, text))
            return (int64_t)id->valuedouble;
    }
    return -1;
}

/* The number of ids the tokenizer can produce (vocab plus added tokens), and
 * the ids of bos/eos named in tokenizer_config.json when present. */
static tp_status tokenizer_facts(const char *tok_json, const char *tok_config, int64_t *n_ids,
                                 int64_t *bos, int64_t *eos, int64_t *extra, int *n_extra)
{
    char *text;
    tp_status s = tp_read_file(tok_json, &text, NULL);
    if (s) return s;
    cJSON *root = cJSON_Parse(text);
    free(text);
    if (!root) return tp_fail(TP_ERR_FORMAT, "%s: not valid JSON", tok_json);
    int64_t max_id = -1;
    cJSON *vocab = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(root, "model"), "vocab");
    cJSON *e;
    cJSON_ArrayForEach(e, vocab) if (cJSON_IsNumber(e) && e->valuedouble > (double)max_id) max_id = (int64_t)e->valuedouble;
    cJSON *added = cJSON_GetObjectItemCaseSensitive(root, "added_tokens");
    cJSON_ArrayForEach(e, added) {
        cJSON *id = cJSON_GetObjectItemCaseSensitive(e, "id");
        if (cJSON_IsNumber(id) && id->valuedouble > (double)max_id) max_id = (int64_t)id->valuedouble;
    }
    if (max_id < 0) { cJSON_Delete(root); return tp_fail(TP_ERR_FORMAT, "%s: no vocabulary found", tok_json); }
    *n_ids = max_id + 1;
    char *ctext;
    if (tok_config && tp_read_file(tok_config, &ctext, NULL) == TP_OK) {
        cJSON *cfg = cJSON_Parse(ctext);
        free(ctext);
        const char *keys[2] = {"bos_token", "eos_token"};
        int64_t *outs[2] = {bos, eos};
        for (int k = 0; k < 2 && cfg; k++) {
            cJSON *t = cJSON_GetObjectItemCaseSensitive(cfg, keys[k]);
            if (cJSON_IsObject(t)) t = cJSON_GetObjectItemCaseSensitive(t, "content");
            if (cJSON_IsString(t)) *outs[k] = added_token_id(added, t->valuestring);
        }
        cJSON_Delete(cfg);
    }
    /* Chat models end a turn with an end-of-turn token; generation_config
     * lists it beside eos, as the published instruct models do. */
    static const char *end_of_turn[] = {"<|eot_id|>", "<|im_end|>", "<|endoftext|>"};
    for (size_t k = 0; k < sizeof end_of_turn / sizeof end_of_turn[0]; k++) {
        int64_t id = added_token_id(added, end_of_turn[k]);
        if (id >= 0 && *n_extra < TP_MAX_EOS - 1) extra[(*n_extra)++] = id;
    }
    tp_clear_error();
    cJSON_Delete(root);
    return TP_OK;
}

static int is_dir(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

static int exists(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0;
}

/* Copies tokenizer files and makes the config's vocabulary cover them. */
static tp_status add_tokenizer(tp_model_config *cfg, const char *tok, int vocab_given, const char *dir)
{
    static const char *files[] = {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"};
    char src_json[4096], src_cfg[4096], src[4096], dst[4096];
    int folder = is_dir(tok);
    if (folder) snprintf(src_json, sizeof src_json, "%s/tokenizer.json", tok);
    else snprintf(src_json, sizeof src_json, "%s", tok);
    if (folder) snprintf(src_cfg, sizeof src_cfg, "%s/tokenizer_config.json", tok);
    int64_t n_ids = 0, bos = -1, eos = -1, extra[TP_MAX_EOS];
    int n_extra = 0;
    tp_status s = tokenizer_facts(src_json, folder ? src_cfg : NULL, &n_ids, &bos, &eos, extra, &n_extra);
    if (s) return s;
    if (cfg->vocab_size < n_ids && vocab_given)
        return tp_fail(TP_ERR_INVALID, "vocab_size %lld (from --set) is smaller than the %lld ids of the tokenizer %s",
                       (long long)cfg->vocab_size, (long long)n_ids, src_json);
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        if (i == 0) snprintf(src, sizeof src, "%s", src_json);
        else if (folder) snprintf(src, sizeof src, "%s/%s", tok, files[i]);
        else continue;
        if (!exists(src)) continue;
        snprintf(dst, sizeof dst, "%s/%s", dir, files[i]);
        if ((s = copy_file(src, dst))) return s;
    }
    if (cfg->vocab_size < n_ids) {
        /* The extra rows are random like the rest: published models have
         * untrained padding rows too, and no tokenizer id reaches them. */
        int64_t padded = (n_ids + TP_VOCAB_PAD - 1) / TP_VOCAB_PAD * TP_VOCAB_PAD;
        tp_log(TP_LOG_INFO, "vocab_size raised from %lld to %lld: the tokenizer's %lld ids, padded to a multiple of %d",
               (long long)cfg->vocab_size, (long long)padded, (long long)n_ids, TP_VOCAB_PAD);
        cfg->vocab_size = padded;
    }
    if (bos >= 0) cfg->bos_token_id = bos;
    if (eos >= 0) { cfg->eos_token_ids[0] = eos; cfg->n_eos = 1; }
    for (int i = 0; i < n_extra && cfg->n_eos < TP_MAX_EOS; i++) {
        int dup = 0;
        for (int j = 0; j < cfg->n_eos; j++) dup |= cfg->eos_token_ids[j] == extra[i];
        if (!dup) cfg->eos_token_ids[cfg->n_eos++] = extra[i];
    }
    return TP_OK;
}

tp_status tp_make_model(const tp_model_config *cfg_in, const tp_make_options *o, const char *dir)
{
    if (o->dtype != TP_F32 && o->dtype != TP_BF16)
        return tp_fail(TP_ERR_INVALID, "make-model writes f32 or bf16 weights, not %s", tp_dtype_name(o->dtype));
    if (mkdir(dir, 0755) != 0 && errno != EEXIST) return tp_fail(TP_ERR_IO, "%s: %s", dir, strerror(errno));
    tp_model_config cfg = *cfg_in;
    tp_status s;
    if (o->tokenizer && (s = add_tokenizer(&cfg, o->tokenizer, o->vocab_size_given, dir))) return s;
    cfg.dtype = o->dtype;
    if ((s = tp_config_validate(&cfg, "make-model"))) return s;
    if ((s = write_weights(&cfg, o, dir))) return s;
    tp_generation_config g;
    memset(&g, 0, sizeof g);
    g.bos_token_id = cfg.bos_token_id;
    memcpy(g.eos_token_ids, cfg.eos_token_ids, sizeof g.eos_token_ids);
    g.n_eos = cfg.n_eos;
    if ((s = tp_generation_config_save(&g, dir))) return s;
    /* config.json last: a directory with a config is a complete model. */
    return tp_config_save(&cfg, dir);
}
