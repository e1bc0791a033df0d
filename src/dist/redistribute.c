/* redistribute: the one entry point through which tensor-parallel data moves.
 * plan.c decides the steps, transition.c runs each; this file walks the plan,
 * keeping track of the local shape after every step and of the scratch
 * buffers between steps. */
#include "dist_internal.h"

#include <string.h>

/* The walk's state: placements and local data so far. */
typedef struct {
    const tp_mesh *mesh;
    tp_dtype dtype;
    size_t es;
    int ndim;
    const int64_t *gshape;
    tp_placement cur[TP_MESH_MAX_DIMS];
} walk;

static tp_status local_shape(const walk *w, const tp_placement *pl, int64_t *out)
{
    return tp_placement_local_shape(tp_mesh_ndim(w->mesh), tp_mesh_sizes(w->mesh), tp_mesh_coords(w->mesh),
                                    pl, w->ndim, w->gshape, out);
}

static tp_status step_ctx(const walk *w, const tp_redist_step *s, tp_dist_step_ctx *c)
{
    tp_placement pl[TP_MESH_MAX_DIMS];
    memcpy(pl, w->cur, sizeof pl);
    memset(c, 0, sizeof *c);
    c->group = tp_mesh_group(w->mesh, s->mesh_dim);
    c->P = tp_group_size(c->group);
    c->r = tp_group_rank(c->group);
    c->dtype = w->dtype;
    c->es = w->es;
    c->ndim = w->ndim;
    tp_status st = local_shape(w, pl, c->in_shape);
    pl[s->mesh_dim] = tp_replicate();
    if (!st) st = local_shape(w, pl, c->F);
    pl[s->mesh_dim] = s->to;
    if (!st) st = local_shape(w, pl, c->out_shape);
    return st;
}

/* Runs the steps from src to dst: intermediate results live in scratch
 * buffers; the last step writes dst.  A step that cannot run in place gets
 * a scratch output when dst is its input. */
static tp_status run_steps(walk *w, const tp_redist_step *steps, int n, const void *src, void *dst)
{
    const void *in = src;
    void *owned_in = NULL;
    tp_status st = TP_OK;
    for (int k = 0; k < n && st == TP_OK; k++) {
        tp_dist_step_ctx c;
        st = step_ctx(w, &steps[k], &c);
        if (st) break;
        size_t bytes = (size_t)tp_dist_numel(c.ndim, c.out_shape) * c.es;
        int last = k == n - 1;
        void *out = last ? dst : tp_alloc(bytes), *tmp = NULL;
        if (out && out == in && !tp_dist_step_in_place_ok(steps[k].coll)) out = tmp = tp_alloc(bytes);
        if (!out) { st = TP_ERR_NOMEM; break; }
        st = tp_dist_run_step(&c, &steps[k], in, out);
        if (tmp) {
            if (!st) memcpy(dst, tmp, bytes);
            tp_free(tmp);
            out = dst;
        }
        tp_free(owned_in);
        owned_in = last ? NULL : out;
        in = out;
        w->cur[steps[k].mesh_dim] = steps[k].to;
    }
    /* On failure the last scratch output was never handed on. */
    if (st && in != src && in != dst) tp_free((void *)in);
    return st;
}

tp_status tp_redistribute_local(const tp_mesh *mesh, tp_dtype dtype, int ndim, const int64_t *gshape,
                                const tp_placement *src_pl, const void *src_local,
                                const tp_placement *dst_pl, void *dst_local)
{
    int mnd = tp_mesh_ndim(mesh);
    tp_placement dst[TP_MESH_MAX_DIMS];
    walk w = {mesh, dtype, tp_dtype_size(dtype), ndim, gshape, {{0, 0, 0}}};
    tp_status st = tp_placements_normalize(mnd, src_pl, ndim, gshape, w.cur);
    if (!st) st = tp_placements_normalize(mnd, dst_pl, ndim, gshape, dst);
    if (st) return tp_fail_context(st, "redistribute");
    tp_redist_step steps[TP_REDIST_MAX_STEPS];
    int n;
    st = tp_redistribute_plan(mnd, w.cur, dst, ndim, steps, &n);
    if (st) return st;
    if (n == 0) {
        int64_t shape[TP_MAX_DIMS];
        st = local_shape(&w, w.cur, shape);
        if (!st && dst_local != src_local)
            memcpy(dst_local, src_local, (size_t)tp_dist_numel(ndim, shape) * w.es);
        return st;
    }
    st = run_steps(&w, steps, n, src_local, dst_local);
    return st ? tp_fail_context(st, "redistribute") : TP_OK;
}

tp_status tp_redistribute(const tp_dtensor *src, const tp_placement *dst_pl, tp_dtensor *out)
{
    if (out == src) return tp_fail(TP_ERR_INVALID, "redistribute: out must not be src");
    tp_status st = tp_dtensor_init(out, src->mesh, dst_pl, src->local.dtype, src->ndim, src->shape);
    if (st) return st;
    st = tp_redistribute_local(src->mesh, src->local.dtype, src->ndim, src->shape, src->placements,
                               src->local.data, out->placements, out->local.data);
    if (st) tp_dtensor_release(out);
    return st;
}
