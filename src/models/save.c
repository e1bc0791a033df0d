/* Saving a (trained) model as a Hugging Face model directory: the
 * parameters under their HF names in the checkpoint's dtype through the
 * collective writer (save_shards.c: each rank writes its own shards'
 * bytes), beside the source directory's config, generation config and
 * tokenizer files, the whole directory replaced atomically (save_dir.c). */
#include "tp_module.h"

#include "tensorpar/comm.h"
#include "tensorpar/dist.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* The files copied unchanged from the source directory when present
 * (config.json must be). */
static const char *const copied[] = {
    "config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
    "special_tokens_map.json", "vocab.json", "merges.txt", "tokenizer.model", "added_tokens.json",
    "chat_template.jinja",
};

static tp_status copy_files(const char *src, const char *dst)
{
    char from[4096], to[4096];
    for (size_t i = 0; i < sizeof copied / sizeof *copied; i++) {
        snprintf(from, sizeof from, "%s/%s", src, copied[i]);
        snprintf(to, sizeof to, "%s/%s", dst, copied[i]);
        struct stat st;
        if (stat(from, &st) != 0) {
            if (i == 0) return tp_fail(TP_ERR_IO, "%s: %s", from, strerror(errno));
            continue;
        }
        char *data;
        size_t len;
        tp_status s = tp_read_file(from, &data, &len);
        if (!s) s = tp_write_file_synced(to, data, len);
        free(data);
        if (s) return s;
    }
    return TP_OK;
}

tp_group *tp_model_group(const tp_model *m)
{
    return m->tp && m->tp->mesh && m->tp->size > 1 ? tp_mesh_group(m->tp->mesh, 0) : NULL;
}

void tp_model_save_tensor(const tp_model *m, const tp_module *mod, int j, const char *name, tp_dtype dtype,
                          const void *local, tp_dtype local_dtype, tp_save_tensor *out)
{
    const tp_module_param *p = &mod->params[j];
    memset(out, 0, sizeof *out);
    snprintf(out->name, sizeof out->name, "%s", name);
    out->dtype = dtype;
    out->ndim = p->ndim;
    memcpy(out->shape, p->shape, sizeof p->shape);
    out->local = local;
    out->local_dtype = local_dtype;
    out->slice = p->slice;
    /* One rank writes each copy: rank 0 a replicated tensor, the first
     * rank of its KV subgroup a replicated k/v head. */
    int reps = tp_model_param_replicas(m, mod, j), rank = m->tp ? m->tp->rank : 0;
    if (reps == 0) out->slice.dim = -1;
    out->writes = reps == 0 ? rank == 0 : rank % reps == 0;
}

tp_dtype tp_model_save_dtype(const tp_model *m)
{
    return m->cfg.dtype == TP_BF16 || m->cfg.dtype == TP_F16 ? m->cfg.dtype : TP_F32;
}

/* The saved parameters in state-dict order (a tied lm_head is not saved,
 * as save_pretrained drops tied weights). */
static tp_status model_tensors(const tp_model *m, tp_save_tensor **out, size_t *n)
{
    tp_dtype dt = tp_model_save_dtype(m);
    size_t cap = m->n_modules * TP_MODULE_MAX_PARAMS + 1;
    for (size_t i = 0; i < m->n_modules; i++)
        if (m->modules[i].type == TP_MT_EXPERTS && tp_moe_stored_per_expert(&m->cfg)) cap += (size_t)(3 * m->modules[i].params[0].shape[0]);
    tp_save_tensor *t = calloc(cap, sizeof *t);
    if (!t) return tp_fail(TP_ERR_NOMEM, "out of memory");
    size_t k = 0;
    char raw[160], name[160];
    for (size_t i = 0; i < m->n_modules; i++) {
        const tp_module *mod = &m->modules[i];
        /* the stacked experts go back to the checkpoint's per-expert tensors (§6.1) */
        if (mod->type == TP_MT_EXPERTS && tp_moe_stored_per_expert(&m->cfg)) { k += tp_moe_save_tensors(m, mod, dt, t + k); continue; }
        for (int j = 0; j < mod->n_params; j++) {
            const tp_module_param *p = &mod->params[j];
            if (p->tied_to >= 0 || !p->local.data) continue;
            snprintf(raw, sizeof raw, "%s.%s", mod->name, p->suffix);
            tp_checkpoint_name_of(&m->cfg, raw, name, sizeof name);   /* Mixtral's router */
            tp_model_save_tensor(m, mod, j, name, dt, p->local.data, p->local.dtype, &t[k++]);
        }
    }
    *out = t;
    *n = k;
    return TP_OK;
}

tp_status tp_model_save_list(tp_group *g, const tp_save_tensor *t, size_t n, const char *src_dir, const char *dir,
                             uint64_t max_shard_bytes)
{
    int me = g ? tp_group_rank(g) : 0;
    tp_status s = tp_save_tensors(g, 0, dir, "model", t, n, max_shard_bytes);
    if (!s && me == 0) s = copy_files(src_dir, dir);
    return s;
}

tp_status tp_model_save_files(tp_model *m, const char *src_dir, const char *dir, uint64_t max_shard_bytes)
{
    tp_group *g = tp_model_group(m);
    tp_save_tensor *t = NULL;
    size_t n = 0;
    tp_status s = tp_comm_agree(g, model_tensors(m, &t, &n));
    if (!s) s = tp_model_save_list(g, t, n, src_dir, dir, max_shard_bytes);
    free(t);
    return s;
}

tp_status tp_model_save_ex(tp_model *m, const char *src_dir, const char *out_dir, const tp_save_options *o)
{
    tp_save_options def = {0};
    if (!o) o = &def;
    tp_group *g = tp_model_group(m);
    char tmp[4096];
    tp_status s = tp_save_dir_begin(g, 0, out_dir, tmp, sizeof tmp);
    if (s) return tp_fail_context(s, "saving the model to %s", out_dir);
    s = tp_model_save_files(m, src_dir, tmp, o->max_shard_bytes);
    return tp_save_dir_end(g, 0, tmp, out_dir, o->into_existing, s);
}

tp_status tp_save_group_active(tp_group *g, int writer, int *active)
{
    int64_t mine = writer != 0, any = mine;
    tp_status s = g ? tp_comm_all_reduce(g, &mine, &any, 1, TP_I64, TP_REDUCE_MAX) : TP_OK;
    *active = any != 0;
    return s;
}

tp_status tp_model_save(tp_model *m, const char *src_dir, const char *out_dir, int writer)
{
    int active = 0;
    tp_status s = tp_save_group_active(tp_model_group(m), writer, &active);
    if (s || !active) return s;
    tp_save_options o = {.into_existing = 1};
    return tp_model_save_ex(m, src_dir, out_dir, &o);
}
