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
#include <stdlib.h>

/* The squares are summed in blocks of a fixed size, each block's sum in
 * double, then the blocks in order: the bits do not depend on how many
 * threads shared the blocks. */
#define BLOCK ((int64_t)1 << 15)

static double sum_squares(const float *x, int64_t n)
{
    /* Four running sums: the loop vectorizes and the bits stay fixed. */
    double s[4] = {0, 0, 0, 0};
    int64_t i = 0;
    for (; i + 4 <= n; i += 4)
        for (int k = 0; k < 4; k++) s[k] += (double)x[i + k] * x[i + k];
    for (; i < n; i++) s[0] += (double)x[i] * x[i];
    return (s[0] + s[1]) + (s[2] + s[3]);
}

typedef struct {
    const tp_train_param *params;
    const int *counted;       /* the parameters this rank counts      */
    const int64_t *first;     /* [m + 1]: each one's first block      */
    int m;
    double *partial;          /* [first[m]]: each block's sum         */
} norm_ctx;

static void norm_part(void *vctx, int ti, int nt)
{
    const norm_ctx *c = vctx;
    int64_t b, e;
    tp_split_range(c->first[c->m], ti, nt, &b, &e);
    int j = 0;
    for (int64_t blk = b; blk < e; blk++) {
        while (c->first[j + 1] <= blk) j++;
        const tp_tensor *g = c->params[c->counted[j]].grad;
        int64_t off = (blk - c->first[j]) * BLOCK, n = tp_tensor_numel(g) - off;
        c->partial[blk] = sum_squares((const float *)g->data + off, n < BLOCK ? n : BLOCK);
    }
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

/* This rank's sum of squares, over the parameters it counts. */
static tp_status local_sum(const tp_train_param *params, int n, const tp_mesh *mesh, tp_threadpool *pool,
                           double *sum)
{
    int rank = mesh ? tp_mesh_coord(mesh, 0) : 0, size = mesh ? tp_mesh_size(mesh, 0) : 1;
    norm_ctx c = {params, NULL, NULL, 0, NULL};
    int *counted = malloc((size_t)(n ? n : 1) * sizeof *counted);
    int64_t *first = malloc((size_t)(n + 1) * sizeof *first);
    tp_status st = counted && first ? TP_OK : tp_fail(TP_ERR_NOMEM, "gradient norm: out of memory");
    if (first) first[0] = 0;
    for (int i = 0; !st && i < n; i++) {
        int yes = 1;
        if (mesh && (st = counts_here(&params[i], rank, size, &yes))) break;
        if (!yes) continue;
        counted[c.m] = i;
        first[c.m + 1] = first[c.m] + (tp_tensor_numel(params[i].grad) + BLOCK - 1) / BLOCK;
        c.m++;
    }
    c.counted = counted, c.first = first;
    if (!st && !(c.partial = malloc((size_t)(first[c.m] ? first[c.m] : 1) * sizeof *c.partial)))
        st = tp_fail(TP_ERR_NOMEM, "gradient norm: out of memory");
    if (!st) {
        tp_parallel_run(pool, norm_part, &c);
        double s = 0;
        for (int64_t b = 0; b < first[c.m]; b++) s += c.partial[b];
        *sum = s;
    }
    free(c.partial), free(first), free(counted);
    return st;
}

/* The norm with this rank's sum moved from sum_pl to Replicate over
 * sum_mesh (NULL: this process only); replicas counted over tp_sub. */
static tp_status grad_norm(const tp_train_param *params, int n, const tp_mesh *tp_sub, const tp_mesh *sum_mesh,
                           const tp_placement *sum_pl, tp_threadpool *pool, float *norm)
{
    tp_status st = tp_train_params_check(params, n);
    if (!st) st = mesh_1d(tp_sub, "gradient norm");
    double local = 0;
    if (!st) st = local_sum(params, n, tp_sub, pool, &local);
    if (st) return st;
    double total = local;
    if (sum_mesh) {
        int64_t one = 1;
        tp_placement replicate[TP_MESH_MAX_DIMS];
        for (int d = 0; d < TP_MESH_MAX_DIMS; d++) replicate[d] = tp_replicate();
        st = tp_redistribute_local(sum_mesh, TP_F64, 1, &one, sum_pl, &local, replicate, &total);
        if (st) return tp_fail_context(st, "gradient norm");
    }
    *norm = (float)sqrt(total);
    return TP_OK;
}

tp_status tp_grad_norm(const tp_train_param *params, int n, const tp_mesh *mesh, tp_threadpool *pool, float *norm)
{
    tp_placement partial = tp_partial();
    return grad_norm(params, n, mesh, mesh, &partial, pool, norm);
}

typedef struct {
    const tp_train_param *params;
    int n;
    float coef;
} scale_ctx;

static void scale_part(void *vctx, int ti, int nt)
{
    const scale_ctx *c = vctx;
    for (int i = 0; i < c->n; i++) {
        float *x = c->params[i].grad->data;
        int64_t b, e;
        tp_split_range(tp_tensor_numel(c->params[i].grad), ti, nt, &b, &e);
        for (int64_t k = b; k < e; k++) x[k] = x[k] * c->coef;
    }
}

/* clip_grad_norm_'s scaling of every gradient for the norm `total`. */
static void clip_to(const tp_train_param *params, int n, tp_threadpool *pool, double max_norm, float total)
{
    if (!(max_norm > 0)) return;
    /* torch: max_norm / (total_norm + 1e-6) on an f32 tensor, which is
     * reciprocal() * max_norm; clamped to 1.  A NaN or inf norm scales the
     * gradients to NaN or 0, as torch does. */
    float coef = (1.0f / (total + 1e-6f)) * (float)max_norm;
    if (coef >= 1.0f) return;
    scale_ctx c = {params, n, coef};
    tp_parallel_run(pool, scale_part, &c);
}

tp_status tp_clip_grad_norm(const tp_train_param *params, int n, const tp_mesh *mesh, tp_threadpool *pool,
                            double max_norm, float *norm)
{
    float total;
    tp_status st = tp_grad_norm(params, n, mesh, pool, &total);
    if (st) return st;
    if (norm) *norm = total;
    clip_to(params, n, pool, max_norm, total);
    return TP_OK;
}

tp_status tp_clip_grad_norm_grid(const tp_train_param *params, int n, const tp_mesh *tp_sub, const tp_mesh *grid,
                                 const tp_placement *sum_pl, tp_threadpool *pool, double max_norm, float *norm)
{
    float total;
    tp_status st = grad_norm(params, n, tp_sub, grid, sum_pl, pool, &total);
    if (st) return st;
    if (norm) *norm = total;
    clip_to(params, n, pool, max_norm, total);
    return TP_OK;
}
