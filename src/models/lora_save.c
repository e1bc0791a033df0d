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

void tp_lora_global_shape(const tp_model *m, size_t module, const lora_entry *e, int is_a, int64_t shape[2])
{
    const int64_t *w = m->modules[module].params[TP_MODULE_WEIGHT].shape;
    /* Linear: A [r, in], B [out, r]; embedding: A [r, V], B [H, r] */
    int64_t a_cols = e->embedding ? w[0] : w[1], b_rows = e->embedding ? w[1] : w[0];
    shape[0] = is_a ? m->lora->r : b_rows;
    shape[1] = is_a ? a_cols : m->lora->r;
}

tp_status tp_model_lora_save_tensor(const tp_model *m, size_t k, const char *name, const float *local,
                                    tp_save_tensor *out)
{
    size_t i, adapters = tp_model_lora_count(m) - tp_lora_saved_count(m);
    int is_a;
    if (k >= adapters && k < tp_model_lora_count(m)) {
        tp_lora_saved_describe(m, k - adapters, name, local, out);
        return TP_OK;
    }
    const lora_entry *e = tp_lora_entry_at(m->lora, k, &i, &is_a);
    if (!e) return tp_fail(TP_ERR_INVALID, "no adapter tensor %zu", k);
    int64_t shape[2];
    tp_lora_global_shape(m, i, e, is_a, shape);
    tp_tensor view = is_a ? e->A : e->B;
    view.data = (void *)local;
    describe(m, &m->modules[i], name, &view, is_a ? &e->a_slice : &e->b_slice, shape[0], shape[1], out);
    return TP_OK;
}

static tp_status tensors(const tp_model *m, tp_save_tensor **out, size_t *n)
{
    size_t count = tp_model_lora_count(m);
    tp_save_tensor *t = calloc(count + 1, sizeof *t);
    if (!t) return tp_fail(TP_ERR_NOMEM, "out of memory");
    for (size_t k = 0; k < count; k++) {
        const char *name;
        tp_tensor *value, *grad;
        int reps;
        /* the adapters' A and B, then the base parameters saved with them */
        tp_status s = tp_model_lora_tensor((tp_model *)m, k, &name, &value, &grad, &reps);
        if (!s) s = tp_model_lora_save_tensor(m, k, name, value->data, &t[k]);
        if (s) { free(t); return s; }
    }
    *out = t;
    *n = count;
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

tp_status tp_model_save_adapter_files(tp_model *m, const char *dir)
{
    if (!m->lora) return tp_fail(TP_ERR_INVALID, "the model has no adapter to save");
    tp_group *g = tp_model_group(m);
    int me = g ? tp_group_rank(g) : 0;
    tp_save_tensor *t = NULL;
    size_t n = 0;
    tp_status s = tp_comm_agree(g, tensors(m, &t, &n));
    if (!s) s = tp_save_tensors(g, 0, dir, "adapter_model", t, n, 0);
    if (!s && me == 0) s = write_config(&m->lora->cfg, dir);
    free(t);
    return s;
}

tp_status tp_model_save_adapter(tp_model *m, const char *out_dir)
{
    if (!m->lora) return tp_fail(TP_ERR_INVALID, "the model has no adapter to save");
    tp_group *g = tp_model_group(m);
    struct stat st;
    int existing = stat(out_dir, &st) == 0 && S_ISDIR(st.st_mode);
    char tmp[4096];
    tp_status s = tp_save_dir_begin(g, 0, out_dir, tmp, sizeof tmp);
    if (s) return tp_fail_context(s, "saving the adapter to %s", out_dir);
    s = tp_model_save_adapter_files(m, tmp);
    return tp_save_dir_end(g, 0, tmp, out_dir, existing, s);
}
