/* PEFT's modules_to_save on a TP base model: the modules an adapter trains
 * in full and carries whole in adapter_model.safetensors.
 *
 * PEFT wraps each such module in a ModulesToSaveWrapper holding a trained
 * copy (`<module>.modules_to_save.default.weight` in memory), and its
 * get_peft_model_state_dict drops "modules_to_save." and ".default": on
 * disk the copy is `base_model.model.<module>.weight`.  tensorpar keeps no
 * second copy: the base model is not used without the adapter, so the
 * module's own shard becomes the copy — read over the base values when an
 * adapter is loaded (shard-on-read with the module's own placement), and
 * given gradients and optimizer state while the rest of the base is
 * frozen.  Tied embeddings are refused: PEFT's copy would untie the head
 * from the lookup, which share one shard here. */
#include "lora_internal.h"

#include <stdlib.h>
#include <string.h>

int tp_lora_module_trained(const tp_model *m, const tp_module *mod)
{
    return m->lora && m->lora->saved && m->lora->saved[mod - m->modules];
}

/* The module can be a saved copy: a weight-only Linear or Embedding (the
 * modules people list: lm_head, embed_tokens, a classifier head), untied. */
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

/* The on-disk key of a saved module's parameter j. */
static void key_of(const tp_module *mod, int j, char *out, size_t n)
{
    snprintf(out, n, "base_model.model.%s.%s", mod->name, mod->params[j].suffix);
}

/* The saved weight over the module's shard, read with its own slice. */
static tp_status read_saved(tp_checkpoint *ck, tp_module *mod)
{
    tp_module_param *p = &mod->params[TP_MODULE_WEIGHT];
    char key[200];
    key_of(mod, TP_MODULE_WEIGHT, key, sizeof key);
    tp_tensor t = {0};
    tp_status s = tp_lora_read_shard(ck, key, p->shape[0], p->shape[1], &p->slice, p->slice.dim >= 0, &t);
    if (!s && tp_tensor_numel(&t) != tp_tensor_numel(&p->local))
        s = tp_fail(TP_ERR_INTERNAL, "%s: the shard read is not the module's", key);
    if (!s) s = tp_convert(p->local.data, p->local.dtype, t.data, TP_F32, (size_t)tp_tensor_numel(&t));
    tp_tensor_release(&t);
    return s;
}

tp_status tp_lora_saved_attach(tp_model *m, struct tp_lora *l, tp_checkpoint *ck, size_t *used)
{
    if (!l->cfg.n_save) return TP_OK;
    free(l->saved);
    if (!(l->saved = calloc(l->n ? l->n : 1, 1))) return tp_fail(TP_ERR_NOMEM, "out of memory");
    size_t found = 0;
    for (size_t i = 0; i < l->n; i++) {
        tp_module *mod = &m->modules[i];
        if (!tp_lora_config_saves(&l->cfg, mod->name)) continue;
        tp_status s = check_module(m, mod, tp_lora_config_matches(&l->cfg, mod->name) > 0);
        if (!s && ck) s = read_saved(ck, mod);
        if (s) return tp_fail_context(s, "the adapter's copy of %s", mod->name);
        l->saved[i] = 1;
        found++;
    }
    if (!found) return tp_fail(TP_ERR_INVALID, "modules_to_save matches no module of the model");
    if (used) *used += found;
    return TP_OK;
}

tp_status tp_lora_saved_check_training(const tp_model *m)
{
    for (size_t i = 0; m->lora->saved && i < m->lora->n; i++) {
        const tp_tensor *w = &m->modules[i].params[TP_MODULE_WEIGHT].local;
        if (m->lora->saved[i] && w->dtype != TP_F32)
            return tp_fail(TP_ERR_UNSUPPORTED, "modules_to_save: %s is %s; training it needs f32 weights "
                           "(--dtype f32)", m->modules[i].name, tp_dtype_name(w->dtype));
    }
    return TP_OK;
}

size_t tp_lora_saved_count(const tp_model *m)
{
    size_t n = 0;
    for (size_t i = 0; m->lora && m->lora->saved && i < m->lora->n; i++) n += m->lora->saved[i];
    return n;
}

/* The k-th saved module's index, or -1. */
static int64_t nth_saved(const tp_model *m, size_t k)
{
    for (size_t i = 0; m->lora->saved && i < m->lora->n; i++)
        if (m->lora->saved[i] && k-- == 0) return (int64_t)i;
    return -1;
}

tp_status tp_lora_saved_tensor(tp_model *m, size_t k, const char **name, tp_tensor **value, tp_tensor **grad,
                               int *replicas)
{
    int64_t i = nth_saved(m, k);
    if (i < 0) return tp_fail(TP_ERR_INVALID, "no saved module %zu", k);
    tp_module *mod = &m->modules[i];
    *name = mod->name;
    *value = &mod->params[TP_MODULE_WEIGHT].local;
    *grad = &mod->params[TP_MODULE_WEIGHT].grad;
    *replicas = tp_model_param_replicas(m, mod, TP_MODULE_WEIGHT);
    return TP_OK;
}

tp_status tp_lora_saved_zero_grad(tp_model *m)
{
    for (size_t k = 0; k < tp_lora_saved_count(m); k++) {
        tp_module_param *p = &m->modules[nth_saved(m, k)].params[TP_MODULE_WEIGHT];
        if (!p->grad.data) {
            tp_status s = tp_tensor_init(&p->grad, TP_F32, p->local.ndim, p->local.shape);
            if (s) return s;
        }
        memset(p->grad.data, 0, tp_tensor_nbytes(&p->grad));
    }
    return TP_OK;
}

void tp_lora_saved_describe(const tp_model *m, size_t k, tp_save_tensor *t)
{
    const tp_module *mod = &m->modules[nth_saved(m, k)];
    const tp_module_param *p = &mod->params[TP_MODULE_WEIGHT];
    memset(t, 0, sizeof *t);
    key_of(mod, TP_MODULE_WEIGHT, t->name, sizeof t->name);
    t->dtype = p->local.dtype;
    t->ndim = p->ndim;
    memcpy(t->shape, p->shape, sizeof t->shape);
    t->local = p->local.data;
    t->local_dtype = p->local.dtype;
    t->slice = p->slice;
    /* one rank per copy: rank 0 for a whole tensor, the first of each KV
     * subgroup for a replicated head, every rank for its own shard */
    int reps = tp_model_param_replicas(m, mod, TP_MODULE_WEIGHT), rank = m->tp ? m->tp->rank : 0;
    if (reps == 0 || !m->tp || !m->tp->mesh || m->tp->size <= 1) { t->slice.dim = -1; t->writes = rank == 0; }
    else t->writes = rank % reps == 0;
}
