/* Parameter gradients: one f32 tensor beside each parameter's local shard
 * (tp_module_param.grad), allocated by the first tp_model_zero_grad.  A
 * tied parameter (lm_head borrowing the embedding) has none of its own:
 * both uses add into the owner's, which is the gradient of the one shared
 * tensor. */
#include "tp_module.h"

#include <string.h>

tp_status tp_model_zero_grad(tp_model *m)
{
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
    if (p->tied_to >= 0) p = &m->modules[p->tied_to].params[j];
    if (!p->grad.data)
        return tp_fail(TP_ERR_INVALID, "%s.%s has no gradient buffer (tp_model_zero_grad allocates them)",
                       mod->name, mod->params[j].suffix);
    *g = p->grad.data;
    return TP_OK;
}
