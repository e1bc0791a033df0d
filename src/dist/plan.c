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

/* The all-to-all that tp_placement_step picks for Shard(i) -> Shard(j) on
 * mesh dimension g is valid only when no other mesh dimension ever shards i
 * or j (otherwise the nesting would change under it: gather and re-slice
 * instead). */
static int can_all_to_all(int mesh_ndim, const tp_placement *src, const tp_placement *dst, int g)
{
    for (int h = 0; h < mesh_ndim; h++) {
        if (h == g) continue;
        for (int k = 0; k < 2; k++) {
            tp_placement p = k ? dst[h] : src[h];
            if (is_sharded(p) && (p.dim == src[g].dim || p.dim == dst[g].dim)) return 0;
        }
    }
    return 1;
}

/* The one rule (§1.5).  Per pair, on one mesh dimension:
 *
 *   from \ to     Replicate   Shard(j)            StridedShard(j,s)   Partial
 *   Replicate     none        local_slice         local_slice         zero_nonroot
 *   Partial       all_reduce  reduce_scatter      reduce_scatter      none
 *   Shard(i)      all_gather  all_to_all (i!=j)   gather, then slice  gather, then zero
 *   StridedShard  all_gather  gather, then slice  gather, then slice  gather, then zero
 *
 * (equal placements: none.)
 * Replicate -> Partial communicates nothing: group rank 0 keeps the value,
 * the others hold zeros (exact in every dtype, where DTensor's divide by P
 * is not).  StridedShard <-> Shard is gather + slice rather than one
 * all-to-all: the pieces would be strided on both sides, no built-in
 * style moves an activation between the two, and the gather + slice is
 * what every other path already runs.  A multi-dimension plan may still
 * refuse the all-to-all (see can_all_to_all) and gather instead. */
tp_collective tp_placement_step(tp_placement from, tp_placement to, int ndim, tp_placement *via)
{
    *via = to;
    if (tp_placement_equal(from, to, ndim)) return TP_COLL_NONE;
    if (from.kind == TP_REPLICATE) return to.kind == TP_PARTIAL ? TP_COLL_ZERO_NONROOT : TP_COLL_LOCAL_SLICE;
    if (from.kind == TP_PARTIAL) return to.kind == TP_REPLICATE ? TP_COLL_ALL_REDUCE : TP_COLL_REDUCE_SCATTER;
    if (from.kind == TP_SHARD && to.kind == TP_SHARD) return TP_COLL_ALL_TO_ALL;
    if (to.kind != TP_REPLICATE) *via = tp_replicate();
    return TP_COLL_ALL_GATHER;
}

int tp_collective_communicates(tp_collective c)
{
    return c != TP_COLL_NONE && c != TP_COLL_LOCAL_SLICE && c != TP_COLL_ZERO_NONROOT;
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
        tp_placement to;
        tp_collective c = tp_placement_step(cur[g], dst[g], ndim, &to);
        /* Open to Replicate unless one all-to-all lands on dst. */
        if (c != TP_COLL_ALL_TO_ALL || !can_all_to_all(mesh_ndim, src, dst, g))
            c = tp_placement_step(cur[g], tp_replicate(), ndim, &to);
        steps[n++] = (tp_redist_step){g, c, cur[g], to};
        cur[g] = to;
    }
    /* A dimension gathered only to let an outer one through matches dst
     * again after phase 2 re-slices it. */
    for (int g = 0; g < mesh_ndim; g++) {
        if (!dirty[g] || tp_placement_equal(cur[g], dst[g], ndim)) continue;
        tp_placement to;
        tp_collective c = tp_placement_step(cur[g], dst[g], ndim, &to);
        steps[n++] = (tp_redist_step){g, c, cur[g], to};
        cur[g] = to;
    }
    *nsteps = n;
    return TP_OK;
}
