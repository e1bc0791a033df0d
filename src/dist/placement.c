/* Placements and the arithmetic of who holds what (tp-semantics.md §1.2).
 * Pure functions: no mesh object, no communication, so loaders, strategies
 * and tests can ask "where is rank r's shard" for any rank. */
#include "tensorpar/dist.h"

#include <stdio.h>

void tp_chunk_range(int64_t n, int P, int r, int64_t *start, int64_t *size)
{
    /* torch.chunk: equal chunks of ceil(n/P), the tail short or empty.  Never
     * the balanced 4,3,3 split: checkpoints and vocab offsets depend on it. */
    int64_t c = P > 0 ? (n + P - 1) / P : n;
    int64_t s = (int64_t)r * c, e = s + c;
    if (s > n) s = n;
    if (e > n) e = n;
    *start = s;
    *size = e - s;
}

int tp_placement_equal(tp_placement a, tp_placement b, int ndim)
{
    if (a.kind != b.kind) return 0;
    if (a.kind == TP_REPLICATE || a.kind == TP_PARTIAL) return 1;
    int da = a.dim < 0 ? a.dim + ndim : a.dim, db = b.dim < 0 ? b.dim + ndim : b.dim;
    return da == db && (a.kind == TP_SHARD || a.split == b.split);
}

const char *tp_placement_str(tp_placement p, char *buf, size_t cap)
{
    switch (p.kind) {
    case TP_REPLICATE: snprintf(buf, cap, "Replicate()"); break;
    case TP_SHARD: snprintf(buf, cap, "Shard(%d)", p.dim); break;
    case TP_STRIDED_SHARD: snprintf(buf, cap, "StridedShard(%d, %d)", p.dim, p.split); break;
    case TP_PARTIAL: snprintf(buf, cap, "Partial(sum)"); break;
    default: snprintf(buf, cap, "<placement %d>", (int)p.kind); break;
    }
    return buf;
}

static tp_status normalize_one(tp_placement p, int ndim, const int64_t *gshape, tp_placement *out)
{
    char b[48];
    *out = p;
    if (p.kind == TP_REPLICATE || p.kind == TP_PARTIAL) {
        out->dim = 0;
        out->split = 0;
        return TP_OK;
    }
    if (p.kind != TP_SHARD && p.kind != TP_STRIDED_SHARD)
        return tp_fail(TP_ERR_INVALID, "unknown placement kind %d", (int)p.kind);
    int d = p.dim < 0 ? p.dim + ndim : p.dim;
    if (d < 0 || d >= ndim)
        return tp_fail(TP_ERR_INVALID, "%s is out of range for a %d-D tensor",
                       tp_placement_str(p, b, sizeof b), ndim);
    out->dim = d;
    if (p.kind == TP_SHARD) {
        out->split = 0;
        return TP_OK;
    }
    if (p.split < 1)
        return tp_fail(TP_ERR_INVALID, "%s: split factor must be >= 1", tp_placement_str(p, b, sizeof b));
    if (gshape && gshape[d] % p.split != 0)
        return tp_fail(TP_ERR_INVALID, "%s: dimension %d (%lld) is not divisible by %d",
                       tp_placement_str(p, b, sizeof b), d, (long long)gshape[d], p.split);
    return TP_OK;
}

/* A strided dimension is cut into s blocks first; a second mesh dimension
 * cutting it too would have no agreed meaning, so it is refused. */
static tp_status check_strided_exclusive(int mesh_ndim, const tp_placement *pl)
{
    for (int g = 0; g < mesh_ndim; g++) {
        if (pl[g].kind != TP_STRIDED_SHARD) continue;
        for (int h = 0; h < mesh_ndim; h++)
            if (h != g && (pl[h].kind == TP_SHARD || pl[h].kind == TP_STRIDED_SHARD) &&
                pl[h].dim == pl[g].dim)
                return tp_fail(TP_ERR_UNSUPPORTED,
                               "tensor dimension %d is StridedShard on mesh dimension %d and sharded again "
                               "on mesh dimension %d", pl[g].dim, g, h);
    }
    return TP_OK;
}

tp_status tp_placements_normalize(int mesh_ndim, const tp_placement *pl, int ndim,
                                  const int64_t *gshape, tp_placement *out)
{
    if (mesh_ndim < 1 || mesh_ndim > TP_MESH_MAX_DIMS)
        return tp_fail(TP_ERR_INVALID, "a mesh has 1 to %d dimensions, not %d", TP_MESH_MAX_DIMS, mesh_ndim);
    if (ndim < 0 || ndim > TP_MAX_DIMS)
        return tp_fail(TP_ERR_INVALID, "a DTensor has 0 to %d dimensions, not %d", TP_MAX_DIMS, ndim);
    tp_placement tmp[TP_MESH_MAX_DIMS];
    for (int g = 0; g < mesh_ndim; g++) {
        tp_status st = normalize_one(pl[g], ndim, gshape, &tmp[g]);
        if (st) return tp_fail_context(st, "placement of mesh dimension %d", g);
    }
    tp_status st = check_strided_exclusive(mesh_ndim, tmp);
    if (st) return st;
    for (int g = 0; g < mesh_ndim; g++) out[g] = tmp[g];
    return TP_OK;
}

tp_status tp_placement_layout(int mesh_ndim, const int *mesh_sizes, const int *coords,
                              const tp_placement *pl, int ndim, const int64_t *gshape,
                              tp_dim_layout *out)
{
    tp_placement n[TP_MESH_MAX_DIMS];
    tp_status st = tp_placements_normalize(mesh_ndim, pl, ndim, gshape, n);
    if (st) return st;
    for (int i = 0; i < ndim; i++)
        out[i] = (tp_dim_layout){1, gshape[i], 0, gshape[i]};
    /* Mesh dimensions apply in order: a later Shard of the same tensor dim
     * splits the chunk an earlier one left (DTensor's nesting). */
    for (int g = 0; g < mesh_ndim; g++) {
        if (coords[g] < 0 || coords[g] >= mesh_sizes[g])
            return tp_fail(TP_ERR_INVALID, "mesh coordinate %d out of range [0, %d)", coords[g], mesh_sizes[g]);
        tp_dim_layout *L = &out[n[g].dim];
        int64_t s, z;
        if (n[g].kind == TP_SHARD) {
            tp_chunk_range(L->size, mesh_sizes[g], coords[g], &s, &z);
            L->start += s;
            L->size = z;
        } else if (n[g].kind == TP_STRIDED_SHARD) {
            int64_t m = L->size / n[g].split;
            tp_chunk_range(m, mesh_sizes[g], coords[g], &s, &z);
            *L = (tp_dim_layout){n[g].split, m, s, z};
        }
    }
    return TP_OK;
}

tp_status tp_placement_local_shape(int mesh_ndim, const int *mesh_sizes, const int *coords,
                                   const tp_placement *pl, int ndim, const int64_t *gshape,
                                   int64_t *out)
{
    tp_dim_layout L[TP_MAX_DIMS];
    tp_status st = tp_placement_layout(mesh_ndim, mesh_sizes, coords, pl, ndim, gshape, L);
    if (st) return st;
    for (int i = 0; i < ndim; i++) out[i] = L[i].nblocks * L[i].size;
    return TP_OK;
}
