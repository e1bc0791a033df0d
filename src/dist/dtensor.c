/* DTensor: a rank's local shard together with what it is a shard of
 * (mesh, one placement per mesh dimension, global shape). */
#include "dist_internal.h"

#include <string.h>

/* Fills everything but the local buffer; checks the placements. */
static tp_status describe(tp_dtensor *dt, const tp_mesh *mesh, const tp_placement *pl,
                          int ndim, const int64_t *gshape, int64_t *lshape)
{
    memset(dt, 0, sizeof *dt);
    if (ndim < 0 || ndim > TP_MAX_DIMS)
        return tp_fail(TP_ERR_INVALID, "a DTensor has 0 to %d dimensions, not %d", TP_MAX_DIMS, ndim);
    for (int i = 0; i < ndim; i++)
        if (gshape[i] < 0) return tp_fail(TP_ERR_INVALID, "negative DTensor dimension");
    tp_status st = tp_placements_normalize(tp_mesh_ndim(mesh), pl, ndim, gshape, dt->placements);
    if (st) return st;
    dt->mesh = mesh;
    dt->ndim = ndim;
    memcpy(dt->shape, gshape, (size_t)ndim * sizeof *gshape);
    return tp_placement_local_shape(tp_mesh_ndim(mesh), tp_mesh_sizes(mesh), tp_mesh_coords(mesh),
                                    dt->placements, ndim, gshape, lshape);
}

tp_status tp_dtensor_init(tp_dtensor *dt, const tp_mesh *mesh, const tp_placement *pl,
                          tp_dtype dtype, int ndim, const int64_t *gshape)
{
    int64_t ls[TP_MAX_DIMS];
    tp_status st = describe(dt, mesh, pl, ndim, gshape, ls);
    if (!st) st = tp_tensor_init(&dt->local, dtype, ndim, ls);
    return st;
}

tp_status tp_dtensor_from_local(tp_dtensor *dt, const tp_mesh *mesh, const tp_placement *pl,
                                tp_dtype dtype, int ndim, const int64_t *gshape, void *local_data)
{
    int64_t ls[TP_MAX_DIMS];
    tp_status st = describe(dt, mesh, pl, ndim, gshape, ls);
    if (st) return st;
    dt->local.dtype = dtype;
    dt->local.ndim = ndim;
    memcpy(dt->local.shape, ls, sizeof ls);
    dt->local.data = local_data;
    dt->local.owns_data = 0;
    return TP_OK;
}

tp_status tp_dtensor_distribute(tp_dtensor *dt, const tp_mesh *mesh, const tp_placement *pl,
                                const tp_tensor *full)
{
    /* A replicated view of `full`, redistributed: Replicate -> Shard is a
     * local slice and Replicate -> Partial a local zeroing, so this never
     * communicates. */
    tp_placement rep[TP_MESH_MAX_DIMS];
    for (int g = 0; g < TP_MESH_MAX_DIMS; g++) rep[g] = tp_replicate();
    tp_dtensor whole;
    tp_status st = tp_dtensor_from_local(&whole, mesh, rep, full->dtype, full->ndim, full->shape, full->data);
    if (!st) st = tp_redistribute(&whole, pl, dt);
    return st;
}

tp_status tp_dtensor_full(const tp_dtensor *dt, tp_tensor *full)
{
    tp_placement rep[TP_MESH_MAX_DIMS];
    for (int g = 0; g < TP_MESH_MAX_DIMS; g++) rep[g] = tp_replicate();
    tp_dtensor out;
    memset(full, 0, sizeof *full);
    tp_status st = tp_redistribute(dt, rep, &out);
    if (st) return st;
    *full = out.local;   /* hand over the owned buffer */
    return TP_OK;
}

tp_status tp_dtensor_layout(const tp_dtensor *dt, const int *coords, tp_dim_layout *out)
{
    const tp_mesh *m = dt->mesh;
    return tp_placement_layout(tp_mesh_ndim(m), tp_mesh_sizes(m), coords ? coords : tp_mesh_coords(m),
                               dt->placements, dt->ndim, dt->shape, out);
}

void tp_dtensor_release(tp_dtensor *dt)
{
    tp_tensor_release(&dt->local);
    memset(dt, 0, sizeof *dt);
}
