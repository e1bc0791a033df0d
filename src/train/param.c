/* The training loop's parameter list (tp_train_param): its checks, and
 * zeroing the gradients.  The optimizer, the clipping and the replica
 * check all take this list, so its rules are checked once, here. */
#include "tensorpar/train.h"

#include <string.h>

static int same_shape(const tp_tensor *a, const tp_tensor *b)
{
    if (a->ndim != b->ndim) return 0;
    for (int d = 0; d < a->ndim; d++)
        if (a->shape[d] != b->shape[d]) return 0;
    return 1;
}

static tp_status check_one(const tp_train_param *p, int i)
{
    const char *name = p->name ? p->name : "";
    if (!p->name || !*p->name) return tp_fail(TP_ERR_INVALID, "parameter %d has no name", i);
    if (!p->value || !p->grad) return tp_fail(TP_ERR_INVALID, "%s: no value or no gradient tensor", name);
    if (p->value->dtype != TP_F32 || p->grad->dtype != TP_F32)
        return tp_fail(TP_ERR_UNSUPPORTED, "%s: the optimizer takes f32 values and gradients, not %s and %s",
                       name, tp_dtype_name(p->value->dtype), tp_dtype_name(p->grad->dtype));
    if (!same_shape(p->value, p->grad)) {
        char a[64], b[64];
        return tp_fail(TP_ERR_INVALID, "%s: gradient shape %s differs from the parameter's %s", name,
                       tp_shape_str(p->grad->ndim, p->grad->shape, b, sizeof b),
                       tp_shape_str(p->value->ndim, p->value->shape, a, sizeof a));
    }
    if (tp_tensor_numel(p->value) > 0 && (!p->value->data || !p->grad->data))
        return tp_fail(TP_ERR_INVALID, "%s: no data", name);
    if (p->replicas < 0) return tp_fail(TP_ERR_INVALID, "%s: replicas %d < 0", name, p->replicas);
    return TP_OK;
}

tp_status tp_train_params_check(const tp_train_param *params, int n)
{
    if (n < 0 || (n > 0 && !params)) return tp_fail(TP_ERR_INVALID, "bad parameter list (%d parameters)", n);
    for (int i = 0; i < n; i++) {
        tp_status st = check_one(&params[i], i);
        if (st) return st;
    }
    return TP_OK;
}

void tp_train_params_zero_grad(const tp_train_param *params, int n)
{
    for (int i = 0; i < n; i++)
        if (params[i].grad && params[i].grad->data)
            memset(params[i].grad->data, 0, tp_tensor_nbytes(params[i].grad));
}
