/* Global gradient-norm clipping, torch.nn.utils.clip_grad_norm_ over
 * tensor-parallel shards (tp-semantics.md §9.3):
 *   norm² = Σ_ranks Σ_local shards ‖g‖²   with each replicated shard
 *           (TP_PARAM_COUNTED_ONCE) counted on the first rank of its copy,
 * the per-rank sums being one Partial tensor whose move to Replicate is the
 * all-reduce; no collective is called here directly.  The squares are
 * summed in double, so the norm does not depend on how the parameters are
 * split (to f32 rounding), and the all-reduce's fixed order gives every
 * rank the same bits. */
#include "tensorpar/train.h"

#include <math.h>

static double sum_squares(const tp_tensor *g)
{
    const float *x = g->data;
    int64_t n = tp_tensor_numel(g);
    /* Four running sums: the loop vectorizes and the bits stay fixed. */
    double s[4] = {0, 0, 0, 0};
    int64_t i = 0;
    for (; i + 4 <= n; i += 4)
        for (int k = 0; k < 4; k++) s[k] += (double)x[i + k] * x[i + k];
    for (; i < n; i++) s[0] += (double)x[i] * x[i];
    return (s[0] + s[1]) + (s[2] + s[3]);
}

/* Whether this rank counts parameter p: always for its own shard, for a
 * copy held by `replicas` consecutive ranks only on the first of them. */
static tp_status counts_here(const tp_train_param *p, int rank, int size, int *yes)
{
    *yes = 1;
    if (!(p->flags & TP_PARAM_COUNTED_ONCE)) return TP_OK;
    int R = p->replicas ? p->replicas : size;
    if (R > size || size % R)
        return tp_fail(TP_ERR_INVALID, "%s: %d replicas do not divide the mesh of %d ranks", p->name, R, size);
    *yes = rank % R == 0;
    return TP_OK;
}

static tp_status mesh_1d(const tp_mesh *mesh, const char *what)
{
    if (mesh && tp_mesh_ndim(mesh) != 1)
        return tp_fail(TP_ERR_INVALID, "%s: takes a 1-D mesh (the TP sub-mesh), not %d-D", what,
                       tp_mesh_ndim(mesh));
    return TP_OK;
}

tp_status tp_grad_norm(const tp_train_param *params, int n, const tp_mesh *mesh, float *norm)
{
    tp_status st = tp_train_params_check(params, n);
    if (!st) st = mesh_1d(mesh, "gradient norm");
    if (st) return st;
    int rank = mesh ? tp_mesh_coord(mesh, 0) : 0, size = mesh ? tp_mesh_size(mesh, 0) : 1;
    double local = 0;
    for (int i = 0; i < n; i++) {
        int yes = 1;
        if (mesh && (st = counts_here(&params[i], rank, size, &yes))) return st;
        if (yes) local += sum_squares(params[i].grad);
    }
    double total = local;
    if (mesh) {
        int64_t one = 1;
        tp_placement partial = tp_partial(), replicate = tp_replicate();
        st = tp_redistribute_local(mesh, TP_F64, 1, &one, &partial, &local, &replicate, &total);
        if (st) return tp_fail_context(st, "gradient norm");
    }
    *norm = (float)sqrt(total);
    return TP_OK;
}

static void scale(const tp_tensor *g, float coef)
{
    float *x = g->data;
    int64_t n = tp_tensor_numel(g);
    for (int64_t i = 0; i < n; i++) x[i] = x[i] * coef;
}

tp_status tp_clip_grad_norm(const tp_train_param *params, int n, const tp_mesh *mesh, double max_norm,
                            float *norm)
{
    float total;
    tp_status st = tp_grad_norm(params, n, mesh, &total);
    if (st) return st;
    if (norm) *norm = total;
    if (!(max_norm > 0)) return TP_OK;
    /* torch: max_norm / (total_norm + 1e-6) on an f32 tensor, which is
     * reciprocal() * max_norm; clamped to 1.  A NaN or inf norm scales the
     * gradients to NaN or 0, as torch does. */
    float coef = (1.0f / (total + 1e-6f)) * (float)max_norm;
    if (coef >= 1.0f) return TP_OK;
    for (int i = 0; i < n; i++) scale(params[i].grad, coef);
    return TP_OK;
}
