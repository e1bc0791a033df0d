/* Which collectives turn one list of placements into another.
 *
 * A step changes the placement of one mesh dimension g, communicating over
 * g's group only.  Such a step is a plain 1-D transition (§1.5) as long as no
 * mesh dimension *inside* g (h > g) shards the same tensor dimension: then
 * the data that g's group exchanges is a contiguous chunk of what the outer
 * dimensions left.  The plan keeps that true in two phases:
 *
 *   1. innermost first, every changing dimension that is sharded is brought
 *      to Replicate (all-gather), or straight to its target shard when both
 *      are plain Shards of tensor dims no other mesh dim shards (all-to-all);
 *   2. outermost first, every changing dimension goes from Replicate or
 *      Partial to its target (slice, zero, all-reduce, reduce-scatter).
 *
 * A dimension h > g that shards a tensor dimension touched by a changing g
 * is treated as changing too (it is gathered and re-sliced), which is what
 * keeps every step a plain 1-D transition. */
#include "tensorpar/dist.h"

static int is_sharded(tp_placement p) { return p.kind == TP_SHARD || p.kind == TP_STRIDED_SHARD; }

const char *tp_collective_name(tp_collective c)
{
    switch (c) {
    case TP_COLL_NONE: return "none";
    case TP_COLL_LOCAL_SLICE: return "local_slice";
    case TP_COLL_ZERO_NONROOT: return "zero_nonroot";
    case TP_COLL_ALL_REDUCE: return "all_reduce";
    case TP_COLL_REDUCE_SCATTER: return "reduce_scatter";
    case TP_COLL_ALL_GATHER: return "all_gather";
    case TP_COLL_ALL_TO_ALL: return "all_to_all";
    }
    return "?";
}

/* Marks the dimensions that must move (see the file comment). */
static void mark_dirty(int mesh_ndim, const tp_placement *src, const tp_placement *dst, int ndim, int *dirty)
{
    for (int g = 0; g < mesh_ndim; g++) dirty[g] = !tp_placement_equal(src[g], dst[g], ndim);
    for (int g = 0; g < mesh_ndim; g++) {
        if (!dirty[g]) continue;
        for (int h = g + 1; h < mesh_ndim; h++) {
            int touches = 0;
            for (int k = 0; k < 2; k++) {
                tp_placement a = k ? dst[g] : src[g];
                if (!is_sharded(a)) continue;
                touches |= (is_sharded(src[h]) && src[h].dim == a.dim) ||
                           (is_sharded(dst[h]) && dst[h].dim == a.dim);
            }
            if (touches) dirty[h] = 1;
        }
    }
}

/* Shard(i) -> Shard(j) in one all-to-all, when no other mesh dimension ever
 * shards i or j (otherwise the nesting would change under it: gather and
 * re-slice instead). */
static int can_all_to_all(int mesh_ndim, const tp_placement *src, const tp_placement *dst, int g)
{
    if (src[g].kind != TP_SHARD || dst[g].kind != TP_SHARD || src[g].dim == dst[g].dim) return 0;
    for (int h = 0; h < mesh_ndim; h++) {
        if (h == g) continue;
        for (int k = 0; k < 2; k++) {
            tp_placement p = k ? dst[h] : src[h];
            if (is_sharded(p) && (p.dim == src[g].dim || p.dim == dst[g].dim)) return 0;
        }
    }
    return 1;
}

static tp_collective transition(tp_placement from, tp_placement to)
{
    if (is_sharded(from)) return TP_COLL_ALL_GATHER;          /* to Replicate */
    if (from.kind == TP_PARTIAL)
        return to.kind == TP_REPLICATE ? TP_COLL_ALL_REDUCE : TP_COLL_REDUCE_SCATTER;
    return to.kind == TP_PARTIAL ? TP_COLL_ZERO_NONROOT : TP_COLL_LOCAL_SLICE;
}

tp_status tp_redistribute_plan(int mesh_ndim, const tp_placement *src, const tp_placement *dst,
                               int ndim, tp_redist_step *steps, int *nsteps)
{
    *nsteps = 0;
    if (mesh_ndim < 1 || mesh_ndim > TP_MESH_MAX_DIMS)
        return tp_fail(TP_ERR_INVALID, "a mesh has 1 to %d dimensions, not %d", TP_MESH_MAX_DIMS, mesh_ndim);
    int dirty[TP_MESH_MAX_DIMS];
    tp_placement cur[TP_MESH_MAX_DIMS];
    mark_dirty(mesh_ndim, src, dst, ndim, dirty);
    for (int g = 0; g < mesh_ndim; g++) cur[g] = src[g];
    int n = 0;
    for (int g = mesh_ndim - 1; g >= 0; g--) {
        if (!dirty[g] || !is_sharded(cur[g])) continue;
        tp_placement to = tp_replicate();
        tp_collective c = TP_COLL_ALL_GATHER;
        if (can_all_to_all(mesh_ndim, src, dst, g)) {
            to = dst[g];
            c = TP_COLL_ALL_TO_ALL;
        }
        steps[n++] = (tp_redist_step){g, c, cur[g], to};
        cur[g] = to;
    }
    /* A dimension gathered only to let an outer one through matches dst
     * again after phase 2 re-slices it. */
    for (int g = 0; g < mesh_ndim; g++) {
        if (!dirty[g] || tp_placement_equal(cur[g], dst[g], ndim)) continue;
        steps[n++] = (tp_redist_step){g, transition(cur[g], dst[g]), cur[g], dst[g]};
        cur[g] = dst[g];
    }
    *nsteps = n;
    return TP_OK;
}
