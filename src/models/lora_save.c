/* Saving adapters as PEFT's save_pretrained does (tp-semantics.md §9.6):
 * adapter_model.safetensors with PEFT's keys, each tensor put together
 * from the ranks' shards by the collective writer (so the bytes equal the
 * TP = 1 save), and adapter_config.json, in one atomic directory commit. */
#include "lora_internal.h"

#include "tensorpar/comm.h"
#include "tensorpar/io.h"

#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* One adapter tensor: global shape, this rank's shard and whether this
 * rank writes it (one rank per copy, as tp_model_save_tensor decides). */
static void describe(const tp_model *m, const tp_module *mod, const char *name, const tp_tensor *local,
                     const tp_param_slice *sl, int64_t rows, int64_t cols, tp_save_tensor *t)
{
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s", name);
    t->dtype = TP_F32;
    t->ndim = 2;
    t->shape[0] = rows;
    t->shape[1] = cols;
    t->local = local->data;
    t->local_dtype = TP_F32;
    t->slice = *sl;
    int rank = m->tp ? m->tp->rank : 0, single = !m->tp || !m->tp->mesh || m->tp->size <= 1;
    int reps = mod->tp && mod->tp->kv_rep > 1 ? mod->tp->kv_rep : 1;
    if (single || sl->dim < 0) { t->slice.dim = -1; t->writes = rank == 0; }
    else t->writes = rank % reps == 0;
}

static tp_status tensors(const tp_model *m, tp_save_tensor **out, size_t *n)
{
    const struct tp_lora *l = m->lora;
    tp_save_tensor *t = calloc(2 * l->n + tp_lora_saved_count(m) + 1, sizeof *t);
    if (!t) return tp_fail(TP_ERR_NOMEM, "out of memory");
    size_t k = 0;
    for (size_t i = 0; i < l->n; i++) {
        const lora_entry *e = l->by_module[i];
        if (!e) continue;
        const tp_module *mod = &m->modules[i];
        const int64_t *w = mod->params[TP_MODULE_WEIGHT].shape;
        /* Linear: A [r, in], B [out, r]; embedding: A [r, V], B [H, r] */
        int64_t a_cols = e->embedding ? w[0] : w[1], b_rows = e->embedding ? w[1] : w[0];
        describe(m, mod, e->a_name, &e->A, &e->a_slice, l->r, a_cols, &t[k++]);
        describe(m, mod, e->b_name, &e->B, &e->b_slice, b_rows, l->r, &t[k++]);
    }
    for (size_t j = 0; j < tp_lora_saved_count(m); j++) tp_lora_saved_describe(m, j, &t[k++]);
    *out = t;
    *n = k;
    return TP_OK;
}

static char *config_json(const tp_lora_config *c)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddItemToObject(o, "alpha_pattern", cJSON_CreateObject());
    cJSON_AddNullToObject(o, "base_model_name_or_path");
    static const char *const bias[] = {"none", "all", "lora_only"};
    cJSON_AddStringToObject(o, "bias", bias[c->bias]);
    cJSON_AddFalseToObject(o, "fan_in_fan_out");
    cJSON_AddTrueToObject(o, "inference_mode");
    cJSON_AddTrueToObject(o, "init_lora_weights");
    cJSON_AddNullToObject(o, "layers_pattern");
    cJSON_AddNullToObject(o, "layers_to_transform");
    cJSON_AddNumberToObject(o, "lora_alpha", c->alpha);
    cJSON_AddNumberToObject(o, "lora_dropout", c->dropout);
    if (c->n_save) {
        cJSON *a = cJSON_AddArrayToObject(o, "modules_to_save");
        for (int i = 0; i < c->n_save; i++) cJSON_AddItemToArray(a, cJSON_CreateString(c->save[i]));
    } else {
        cJSON_AddNullToObject(o, "modules_to_save");
    }
    cJSON_AddStringToObject(o, "peft_type", "LORA");
    cJSON_AddNumberToObject(o, "r", (double)c->r);
    cJSON_AddItemToObject(o, "rank_pattern", cJSON_CreateObject());
    if (c->target_regex[0]) {
        /* stored as "^(REGEX)$": PEFT's fullmatch of REGEX */
        size_t len = strlen(c->target_regex);
        char *re = strndup(c->target_regex + 2, len > 4 ? len - 4 : 0);
        cJSON_AddStringToObject(o, "target_modules", re ? re : "");
        free(re);
    } else {
        cJSON *a = cJSON_AddArrayToObject(o, "target_modules");
        for (int i = 0; i < c->n_targets; i++) cJSON_AddItemToArray(a, cJSON_CreateString(c->targets[i]));
    }
    cJSON_AddStringToObject(o, "task_type", "CAUSAL_LM");
    cJSON_AddFalseToObject(o, "use_dora");
    cJSON_AddBoolToObject(o, "use_rslora", c->use_rslora);
    char *text = cJSON_Print(o);
    cJSON_Delete(o);
    return text;
}

static tp_status write_config(const tp_lora_config *c, const char *dir)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/adapter_config.json", dir);
    char *text = config_json(c);
    if (!text) return tp_fail(TP_ERR_NOMEM, "out of memory");
    tp_status s = tp_write_file_synced(path, text, strlen(text));
    free(text);
    return s;
}

tp_status tp_model_save_adapter(tp_model *m, const char *out_dir)
{
    if (!m->lora) return tp_fail(TP_ERR_INVALID, "the model has no adapter to save");
    tp_group *g = tp_model_group(m);
    int me = g ? tp_group_rank(g) : 0;
    struct stat st;
    int existing = stat(out_dir, &st) == 0 && S_ISDIR(st.st_mode);
    char tmp[4096];
    tp_status s = tp_save_dir_begin(g, 0, out_dir, tmp, sizeof tmp);
    if (s) return tp_fail_context(s, "saving the adapter to %s", out_dir);
    tp_save_tensor *t = NULL;
    size_t n = 0;
    s = tp_comm_agree(g, tensors(m, &t, &n));
    if (!s) s = tp_save_tensors(g, 0, tmp, "adapter_model", t, n, 0);
    if (!s && me == 0) s = write_config(&m->lora->cfg, tmp);
    free(t);
    return tp_save_dir_end(g, 0, tmp, out_dir, existing, s);
}
