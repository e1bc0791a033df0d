/* Saving a (trained) model as a Hugging Face model directory: every
 * parameter gathered whole from the ranks' shards, written by one rank in
 * the checkpoint's dtype, names and shapes as model.safetensors, beside the
 * source directory's config, generation config and tokenizer files. */
#include "tensorpar/models.h"
#include "tensorpar/module.h"

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

static tp_status make_dirs(const char *dir)
{
    char buf[4096];
    if (snprintf(buf, sizeof buf, "%s", dir) >= (int)sizeof buf) return tp_fail(TP_ERR_INVALID, "%s: path too long", dir);
    for (char *p = buf + 1;; p++) {
        char c = *p;
        if (c != '/' && c) continue;
        *p = 0;
        if (mkdir(buf, 0777) != 0 && errno != EEXIST) return tp_fail(TP_ERR_IO, "%s: %s", buf, strerror(errno));
        *p = c;
        if (!c) return TP_OK;
    }
}

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
        if (!s) s = tp_write_file_atomic(to, data, len);
        free(data);
        if (s) return s;
    }
    return TP_OK;
}

typedef struct {
    tp_st_entry *e;
    char (*names)[128];
    void **bufs;
    size_t n;
} save_table;

static tp_status gather_one(tp_model *m, const tp_module *mod, int j, tp_dtype dt, save_table *t)
{
    const tp_module_param *p = &mod->params[j];
    size_t numel = 1, k = t->n;
    for (int i = 0; i < p->ndim; i++) numel *= (size_t)p->shape[i];
    float *full = malloc(numel * sizeof(float));
    if (!full || !(t->bufs[k] = malloc(numel * tp_dtype_size(dt)))) {
        free(full);
        return tp_fail(TP_ERR_NOMEM, "out of memory saving %s.%s", mod->name, p->suffix);
    }
    t->n++;
    tp_status s = tp_model_param_full(m, mod, j, full);
    if (!s) s = tp_convert(t->bufs[k], dt, full, TP_F32, numel);
    free(full);
    snprintf(t->names[k], sizeof t->names[k], "%s.%s", mod->name, p->suffix);
    t->e[k] = (tp_st_entry){t->names[k], dt, p->ndim, p->shape, t->bufs[k]};
    return s;
}

tp_status tp_model_save(tp_model *m, const char *src_dir, const char *out_dir, int writer)
{
    tp_dtype dt = m->cfg.dtype == TP_BF16 || m->cfg.dtype == TP_F16 ? m->cfg.dtype : TP_F32;
    size_t cap = m->n_modules * TP_MODULE_MAX_PARAMS + 1;
    save_table t = {calloc(cap, sizeof *t.e), calloc(cap, sizeof *t.names), calloc(cap, sizeof *t.bufs), 0};
    tp_status s = t.e && t.names && t.bufs ? TP_OK : tp_fail(TP_ERR_NOMEM, "out of memory");
    /* Every rank gathers (a collective per parameter, in table order). */
    for (size_t i = 0; !s && i < m->n_modules; i++) {
        const tp_module *mod = &m->modules[i];
        for (int j = 0; !s && j < mod->n_params; j++)
            if (mod->params[j].tied_to < 0 && mod->params[j].local.data) s = gather_one(m, mod, j, dt, &t);
    }
    if (!s && writer) s = make_dirs(out_dir);
    if (!s && writer) s = copy_files(src_dir, out_dir);
    if (!s && writer) {
        char path[4096];
        snprintf(path, sizeof path, "%s/model.safetensors", out_dir);
        s = tp_safetensors_write(path, t.e, t.n, NULL, 0);
    }
    for (size_t i = 0; t.bufs && i < t.n; i++) free(t.bufs[i]);
    free(t.bufs); free(t.e); free(t.names);
    return s ? tp_fail_context(s, "saving the model to %s", out_dir) : TP_OK;
}
