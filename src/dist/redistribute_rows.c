/* redistribute_rows: Partial -> Shard(rows) -> Replicate with a row-wise
 * epilogue on each rank's own rows in between (dist.h).  The fast path is
 * the single collective tp_comm_all_reduce_rows, which does the same two
 * moves without materialising the Shard(rows) buffer. */
#include "dist_internal.h"
#include "tensorpar/comm.h"

#include <stdlib.h>
#include <string.h>

static tp_status check_args(const tp_mesh *mesh, const int64_t gshape[2], const tp_redist_epilogue *ep)
{
    if (tp_mesh_ndim(mesh) != 1)
        return tp_fail(TP_ERR_UNSUPPORTED, "redistribute with a row epilogue: a %d-D mesh (1-D only)",
                       tp_mesh_ndim(mesh));
    if (gshape[0] < 0 || gshape[1] < 0) return tp_fail(TP_ERR_INVALID, "redistribute with a row epilogue: bad shape");
    if (ep && !ep->fn) return tp_fail(TP_ERR_INVALID, "redistribute with a row epilogue: no function");
    return TP_OK;
}

/* The single collective: src and dst must not overlap. */
static tp_status fused(const tp_mesh *mesh, const int64_t gshape[2], const float *src, float *dst,
                       const tp_redist_epilogue *ep)
{
    tp_group *g = tp_mesh_group(mesh, 0);
    int P = tp_group_size(g);
    size_t *counts = malloc((size_t)P * sizeof *counts);
    if (!counts) return tp_fail(TP_ERR_NOMEM, "out of memory");
    for (int p = 0; p < P; p++) {
        int64_t start, size;
        tp_chunk_range(gshape[0], P, p, &start, &size);
        counts[p] = (size_t)size;
    }
    tp_status st = tp_comm_all_reduce_rows(g, src, dst, counts, (size_t)gshape[1], ep ? ep->fn : NULL,
                                           ep ? ep->ctx : NULL);
    free(counts);
    return st;
}

/* The two moves through tp_redistribute_local, the epilogue between. */
static tp_status two_moves(const tp_mesh *mesh, const int64_t gshape[2], const float *src, float *dst,
                           const tp_redist_epilogue *ep)
{
    int64_t start, rows;
    tp_chunk_range(gshape[0], tp_mesh_sizes(mesh)[0], tp_mesh_coords(mesh)[0], &start, &rows);
    size_t n = (size_t)(rows * gshape[1]);
    float *own = tp_alloc((n ? n : 1) * sizeof *own);
    if (!own) return tp_fail(TP_ERR_NOMEM, "out of memory");
    tp_placement partial = tp_partial(), shard = tp_shard(0), rep = tp_replicate();
    tp_status st = tp_redistribute_local(mesh, TP_F32, 2, gshape, &partial, src, &shard, own);
    if (!st && ep && rows > 0) ep->fn(ep->ctx, start, rows, own);
    if (!st) st = tp_redistribute_local(mesh, TP_F32, 2, gshape, &shard, own, &rep, dst);
    tp_free(own);
    return st;
}

tp_status tp_redistribute_rows(const tp_mesh *mesh, const int64_t gshape[2], const float *src_partial,
                               float *dst_replicated, const tp_redist_epilogue *ep)
{
    tp_status st = check_args(mesh, gshape, ep);
    if (st) return st;
    size_t bytes = (size_t)(gshape[0] * gshape[1]) * sizeof(float);
    const char *s = (const char *)src_partial, *d = (const char *)dst_replicated;
    int apart = s + bytes <= d || d + bytes <= s;
    st = apart ? fused(mesh, gshape, src_partial, dst_replicated, ep)
               : two_moves(mesh, gshape, src_partial, dst_replicated, ep);
    return st ? tp_fail_context(st, "redistribute with a row epilogue") : TP_OK;
}
