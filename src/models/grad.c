/* Parameter gradients: one f32 tensor beside each parameter's local shard
 * (tp_module_param.grad), allocated by the first tp_model_zero_grad.  A
 * tied parameter (lm_head borrowing the embedding) has none of its own:
 * both uses add into the owner's, which is the gradient of the one shared
 * tensor. */
#include "tp_module.h"

#include "tensorpar/dist.h"
#include "tensorpar/lora.h"

#include <string.h>

tp_status tp_model_zero_grad(tp_model *m)
{
    /* LoRA training: the adapters alone have gradients, the base none */
    if (tp_model_base_frozen(m)) return tp_lora_zero_grad(m);
    for (size_t i = 0; i < m->n_modules; i++)
        for (int j = 0; j < m->modules[i].n_params; j++) {
            tp_module_param *p = &m->modules[i].params[j];
            if (p->tied_to >= 0 || !p->local.data) continue;
            if (p->grad.data) { memset(p->grad.data, 0, tp_tensor_nbytes(&p->grad)); continue; }
            tp_status s = tp_tensor_init(&p->grad, TP_F32, p->local.ndim, p->local.shape);
            if (s) return tp_fail(s, "out of memory for the gradient of %s.%s", m->modules[i].name, p->suffix);
        }
    return TP_OK;
}

tp_status tp_module_grad(const tp_model *m, const tp_module *mod, int j, float **g)
{
    const tp_module_param *p = &mod->params[j];
    *g = NULL;
    if (tp_model_base_frozen(m) && !tp_lora_param_trained(m, mod, j)) return TP_OK;
    if (p->tied_to >= 0) p = &m->modules[p->tied_to].params[j];
    if (!p->grad.data)
        return tp_fail(TP_ERR_INVALID, "%s.%s has no gradient buffer (tp_model_zero_grad allocates them)",
                       mod->name, mod->params[j].suffix);
    *g = p->grad.data;
    return TP_OK;
}

/* Copies the local shard (the concatenation of the slice's ranges along
 * its dimension) into its places in the zeroed global tensor. */
static void place_shard(float *global, const float *local, const tp_module_param *p)
{
    const tp_param_slice *sl = &p->slice;
    int64_t outer = 1, inner = 1, gdim = p->shape[sl->dim], ldim = 0;
    for (int i = 0; i < sl->dim; i++) outer *= p->shape[i];
    for (int i = sl->dim + 1; i < p->ndim; i++) inner *= p->shape[i];
    for (int r = 0; r < sl->n; r++) ldim += sl->len[r];
    for (int64_t o = 0; o < outer; o++) {
        int64_t at = 0;
        for (int r = 0; r < sl->n; r++) {
            memcpy(global + (o * gdim + sl->start[r]) * inner, local + (o * ldim + at) * inner,
                   (size_t)(sl->len[r] * inner) * sizeof(float));
            at += sl->len[r];
        }
    }
}

/* The whole tensor of the f32 shards `local` of parameter j on every rank
 * (what = "gradient" or "value", for messages). */
static tp_status gather_full(tp_model *m, const tp_module *mod, int j, const float *local, float *out,
                             const char *what)
{
    const tp_module_param *p = &mod->params[j];
    size_t n = 1;
    for (int i = 0; i < p->ndim; i++) n *= (size_t)p->shape[i];
    if (p->slice.dim < 0 || !m->tp || !m->tp->mesh) {   /* whole on every rank */
        memcpy(out, local, n * sizeof(float));
        return TP_OK;
    }
    /* Each rank's shard in its place, zeros elsewhere: the sum over the
     * ranks (Partial -> Replicate) is the whole tensor.  A k/v head
     * replicated over a KV subgroup (kv_rep) is held whole by each of its
     * ranks (the backward summed its gradient there): only the first one
     * adds it. */
    memset(out, 0, n * sizeof(float));
    int kv_rep = mod->tp ? mod->tp->kv_rep : 1;
    if (kv_rep <= 1 || m->tp->rank % kv_rep == 0) place_shard(out, local, p);
    tp_status s = tp_sum_partial(m, p->ndim, p->shape, out);
    return s ? tp_fail_context(s, "gathering the %s of %s.%s", what, mod->name, p->suffix) : TP_OK;
}

tp_status tp_model_grad_full(tp_model *m, const tp_module *mod, int j, float *out)
{
    const tp_module_param *p = &mod->params[j];
    if (!p->grad.data) return tp_fail(TP_ERR_INVALID, "%s.%s has no gradient", mod->name, p->suffix);
    return gather_full(m, mod, j, p->grad.data, out, "gradient");
}

tp_status tp_model_param_full(tp_model *m, const tp_module *mod, int j, float *out)
{
    const tp_module_param *p = &mod->params[j];
    if (p->tied_to >= 0) p = &m->modules[p->tied_to].params[j];
    if (!p->local.data || p->local.dtype != TP_F32)
        return tp_fail(TP_ERR_INVALID, "%s.%s: gathering needs an f32 local shard", mod->name, mod->params[j].suffix);
    return gather_full(m, mod, j, p->local.data, out, "value");
}

int tp_model_param_replicas(const tp_model *m, const tp_module *mod, int j)
{
    if (!m->tp || !m->tp->mesh || m->tp->size <= 1) return 1;
    if (mod->params[j].slice.dim < 0) return 0;          /* whole on every rank */
    int kv_rep = mod->tp ? mod->tp->kv_rep : 1;
    return kv_rep > 1 ? kv_rep : 1;
}
