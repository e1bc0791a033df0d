/* The base parameters a PEFT LoRA adapter trains in full and carries in
 * adapter_model.safetensors: the weights of modules_to_save, and the
 * biases that `bias` ("all", "lora_only") makes trainable.
 *
 * PEFT wraps each modules_to_save module in a ModulesToSaveWrapper holding
 * a trained copy (`<module>.modules_to_save.default.weight` in memory), and
 * its get_peft_model_state_dict drops "modules_to_save." and ".default": on
 * disk the copy is `base_model.model.<module>.weight`.  Biases: every one
 * with "all", those of the adapted modules with "lora_only"; an adapted
 * module's bias is its wrapped base layer's, saved as
 * `base_model.model.<module>.base_layer.bias` (the key PEFT's
 * "lora_only" missed until its issue #3306 was fixed; a plain
 * `<module>.bias` is read as well), any other as
 * `base_model.model.<module>.bias`.
 *
 * tensorpar keeps no second copy: the base model is not used without the
 * adapter, so the parameter's own shard becomes the copy — read over the
 * base values when an adapter is loaded (shard-on-read with the
 * parameter's own placement), and given gradients and optimizer state
 * while the rest of the base is frozen.  Tied embeddings are refused as
 * modules_to_save: PEFT's copy would untie the head from the lookup, which
 * share one shard here. */
#include "lora_internal.h"

#include <stdlib.h>
#include <string.h>

int tp_lora_param_trained(const tp_model *m, const tp_module *mod, int j)
{
    return m->lora && m->lora->saved && (m->lora->saved[mod - m->modules] >> j & 1);
}

/* The module can be a saved copy: a weight-only Linear or Embedding (the
 * modules people list: lm_head, embed_tokens, a classifier head), untied,
 * not adapted. */
static tp_status check_module(const tp_model *m, const tp_module *mod, int adapted)
{
    if (mod->type != TP_MT_LINEAR && mod->type != TP_MT_EMBEDDING)
        return tp_fail(TP_ERR_UNSUPPORTED, "modules_to_save: %s is not a Linear or an Embedding", mod->name);
    if (adapted)
        return tp_fail(TP_ERR_UNSUPPORTED, "modules_to_save: %s is a LoRA target as well", mod->name);
    if (mod->n_params > 1 && mod->params[TP_MODULE_BIAS].local.data)
        return tp_fail(TP_ERR_UNSUPPORTED, "modules_to_save: %s has a bias; only weight-only modules are "
                       "supported", mod->name);
    int tied = m->cfg.tie_word_embeddings &&
               (mod == &m->modules[m->lm_head] || mod == &m->modules[m->embed_tokens]);
    if (tied)
        return tp_fail(TP_ERR_UNSUPPORTED, "modules_to_save: %s shares its weight with the tied %s; a copy of "
                       "its own is not supported", mod->name, mod == &m->modules[m->lm_head] ? "embed_tokens"
                                                                                            : "lm_head");
    return TP_OK;
}

/* The on-disk key of parameter j of mod (adapted: it has a LoRA adapter). */
static void key_of(const tp_module *mod, int j, int adapted, char *out, size_t n)
{
    snprintf(out, n, "base_model.model.%s.%s%s", mod->name, adapted ? "base_layer." : "", mod->params[j].suffix);
}

/* A 1-D tensor (a bias) whole, or the ranges of sl when split. */
static tp_status read_vector(tp_checkpoint *ck, const char *key, const tp_module_param *p, float *dst)
{
    tp_status s = tp_checkpoint_expect_weight(ck, key, 1, p->shape);
    if (s || p->slice.dim < 0) return s ? s : tp_checkpoint_read(ck, key, TP_F32, dst);
    int64_t off = 0;
    for (int i = 0; i < p->slice.n && !s; off += p->slice.len[i], i++)
        s = tp_checkpoint_read_slice(ck, key, 0, p->slice.start[i], p->slice.len[i], TP_F32, dst + off);
    return s;
}

/* The saved parameter j over its shard, read with its own slice. */
static tp_status read_saved(tp_checkpoint *ck, tp_module *mod, int j, int adapted)
{
    tp_module_param *p = &mod->params[j];
    char key[200];
    key_of(mod, j, adapted, key, sizeof key);
    if (adapted && !tp_checkpoint_find(ck, key)) key_of(mod, j, 0, key, sizeof key);
    tp_tensor t = {0};
    int split = p->slice.dim >= 0;
    tp_status s = p->ndim == 1 ? tp_tensor_init(&t, TP_F32, 1, p->local.shape)
                               : tp_lora_read_shard(ck, key, p->shape[0], p->shape[1], &p->slice, split, &t);
    if (!s && p->ndim == 1) s = read_vector(ck, key, p, t.data);
    if (!s && tp_tensor_numel(&t) != tp_tensor_numel(&p->local))
        s = tp_fail(TP_ERR_INTERNAL, "%s: the shard read is not the parameter's", key);
    if (!s) s = tp_convert(p->local.data, p->local.dtype, t.data, TP_F32, (size_t)tp_tensor_numel(&t));
    tp_tensor_release(&t);
    return s;
}

/* Which of mod's parameters the config trains: bit j for parameter j. */
static tp_status wanted(const tp_model *m, const tp_lora_config *c, const tp_module *mod, unsigned *bits)
{
    int adapted = tp_lora_config_matches(c, mod->name) > 0;
    int has_bias = mod->type == TP_MT_LINEAR && mod->n_params > 1 && mod->params[TP_MODULE_BIAS].local.data;
    *bits = 0;
    if (tp_lora_config_saves(c, mod->name)) {
        tp_status s = check_module(m, mod, adapted);
        if (s) return s;
        *bits |= 1u << TP_MODULE_WEIGHT;
    }
    if (has_bias && (c->bias == TP_LORA_BIAS_ALL || (c->bias == TP_LORA_BIAS_LORA_ONLY && adapted)))
        *bits |= 1u << TP_MODULE_BIAS;
    return TP_OK;
}

/* The refusal names what modules_to_save listed, so that the wrong entry
 * can be found. */
static tp_status no_saved_module(const tp_lora_config *c)
{
    char list[512] = "";
    size_t k = 0;
    for (int i = 0; i < c->n_save && k < sizeof list; i++)
        k += (size_t)snprintf(list + k, sizeof list - k, "%s'%s'", i ? ", " : "", c->save[i]);
    return tp_fail(TP_ERR_INVALID, "modules_to_save [%s] matches no module of the model", list);
}

tp_status tp_lora_saved_attach(tp_model *m, struct tp_lora *l, tp_checkpoint *ck, size_t *used)
{
    if (!l->cfg.n_save && l->cfg.bias == TP_LORA_BIAS_NONE) return TP_OK;
    free(l->saved);
    free(l->saved_keys);
    l->saved_keys = NULL;
    if (!(l->saved = calloc(l->n ? l->n : 1, 1))) return tp_fail(TP_ERR_NOMEM, "out of memory");
    size_t found = 0, modules = 0;
    for (size_t i = 0; i < l->n; i++) {
        tp_module *mod = &m->modules[i];
        unsigned bits;
        tp_status s = wanted(m, &l->cfg, mod, &bits);
        int adapted = tp_lora_config_matches(&l->cfg, mod->name) > 0;   /* a saved module is never adapted */
        for (int j = 0; !s && j < mod->n_params; j++)
            if (bits >> j & 1) {
                if (ck) s = read_saved(ck, mod, j, adapted);
                void *keys = s ? NULL : realloc(l->saved_keys, (found + 1) * sizeof *l->saved_keys);
                if (!s && !keys) s = tp_fail(TP_ERR_NOMEM, "out of memory");
                if (!s) key_of(mod, j, adapted, (l->saved_keys = keys)[found++], sizeof *l->saved_keys);
            }
        if (s) return tp_fail_context(s, "the adapter's copy of %s", mod->name);
        l->saved[i] = (unsigned char)bits;
        modules += bits >> TP_MODULE_WEIGHT & 1;
    }
    if (l->cfg.n_save && !modules) return no_saved_module(&l->cfg);
    if (used) *used += found;
    return TP_OK;
}

/* The k-th trained parameter: its module index and parameter, or -1. */
static int64_t nth_saved(const tp_model *m, size_t k, int *j)
{
    for (size_t i = 0; m->lora && m->lora->saved && i < m->lora->n; i++)
        for (*j = 0; *j < TP_MODULE_MAX_PARAMS; (*j)++)
            if ((m->lora->saved[i] >> *j & 1) && k-- == 0) return (int64_t)i;
    return -1;
}

size_t tp_lora_saved_count(const tp_model *m)
{
    size_t n = 0;
    for (size_t i = 0; m->lora && m->lora->saved && i < m->lora->n; i++)
        for (int j = 0; j < TP_MODULE_MAX_PARAMS; j++) n += m->lora->saved[i] >> j & 1;
    return n;
}

tp_status tp_lora_saved_check_training(const tp_model *m)
{
    for (size_t k = 0; k < tp_lora_saved_count(m); k++) {
        int j;
        const tp_module *mod = &m->modules[nth_saved(m, k, &j)];
        const tp_tensor *v = &mod->params[j].local;
        if (v->dtype != TP_F32)
            return tp_fail(TP_ERR_UNSUPPORTED, "%s.%s (trained with the adapter) is %s; training it needs f32 "
                           "weights (--dtype f32)", mod->name, mod->params[j].suffix, tp_dtype_name(v->dtype));
    }
    return TP_OK;
}

tp_status tp_lora_saved_tensor(tp_model *m, size_t k, const char **name, tp_tensor **value, tp_tensor **grad,
                               int *replicas)
{
    int j;
    int64_t i = nth_saved(m, k, &j);
    if (i < 0) return tp_fail(TP_ERR_INVALID, "no saved parameter %zu", k);
    tp_module *mod = &m->modules[i];
    *name = m->lora->saved_keys[k];
    *value = &mod->params[j].local;
    *grad = &mod->params[j].grad;
    *replicas = tp_model_param_replicas(m, mod, j);
    return TP_OK;
}

tp_status tp_lora_saved_zero_grad(tp_model *m)
{
    for (size_t k = 0; k < tp_lora_saved_count(m); k++) {
        int j;
        tp_module_param *p = &m->modules[nth_saved(m, k, &j)].params[j];
        if (!p->grad.data) {
            tp_status s = tp_tensor_init(&p->grad, TP_F32, p->local.ndim, p->local.shape);
            if (s) return s;
        }
        memset(p->grad.data, 0, tp_tensor_nbytes(&p->grad));
    }
    return TP_OK;
}

void tp_lora_saved_describe(const tp_model *m, size_t k, const char *name, const void *local, tp_save_tensor *t)
{
    int j;
    const tp_module *mod = &m->modules[nth_saved(m, k, &j)];
    const tp_module_param *p = &mod->params[j];
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s", name);
    t->dtype = p->local.dtype;
    t->ndim = p->ndim;
    memcpy(t->shape, p->shape, sizeof t->shape);
    t->local = local;
    t->local_dtype = p->local.dtype;
    t->slice = p->slice;
    /* one rank per copy: rank 0 for a whole tensor, the first of each KV
     * subgroup for a replicated head, every rank for its own shard */
    int reps = tp_model_param_replicas(m, mod, j), rank = m->tp ? m->tp->rank : 0;
    if (reps == 0 || !m->tp || !m->tp->mesh || m->tp->size <= 1) { t->slice.dim = -1; t->writes = rank == 0; }
    else t->writes = rank % reps == 0;
}

tp_status tp_lora_saved_read(const tp_model *m, size_t k, tp_checkpoint *ck, const char *name, float *dst)
{
    int j;
    int64_t i = nth_saved(m, k, &j);
    if (i < 0) return tp_fail(TP_ERR_INVALID, "no saved parameter %zu", k);
    const tp_module_param *p = &m->modules[i].params[j];
    if (p->ndim == 1) return read_vector(ck, name, p, dst);
    return tp_lora_read_into(ck, name, p->shape[0], p->shape[1], &p->slice, p->slice.dim >= 0, p->local.shape, dst);
}
