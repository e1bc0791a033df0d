/* The check that replicated parameters stay bitwise identical on the ranks
 * that hold them (tp-semantics.md §9.1).  Each rank digests the value and
 * the gradient of each of its TP_PARAM_COUNTED_ONCE parameters; the digests
 * are this rank's row of a [P, 2m] table whose Shard(0) -> Replicate move
 * (an all-gather, through tp_redistribute_local) gives every rank the whole
 * table, so every rank reaches the same verdict. */
#include "tensorpar/train.h"

#include <stdlib.h>
#include <string.h>

/* FNV-1a over 32-bit words: any flipped bit changes the digest. */
static uint64_t digest(const tp_tensor *t)
{
    const uint32_t *w = t->data;
    int64_t n = tp_tensor_numel(t);
    uint64_t h = 0xcbf29ce484222325ull ^ (uint64_t)n;
    for (int64_t i = 0; i < n; i++) h = (h ^ w[i]) * 0x100000001b3ull;
    return h;
}

/* The first parameter whose copies differ in the gathered table, as an error. */
static tp_status compare(const tp_train_param *params, const int *idx, int m, const uint64_t *table, int P)
{
    for (int j = 0; j < m; j++) {
        const tp_train_param *p = &params[idx[j]];
        int R = p->replicas ? p->replicas : P;
        if (R > P || P % R)
            return tp_fail(TP_ERR_INVALID, "%s: %d replicas do not divide the mesh of %d ranks", p->name, R, P);
        for (int r = 0; r < P; r++) {
            int first = r / R * R;
            for (int k = 0; k < 2; k++)
                if (table[(size_t)r * 2 * m + 2 * j + k] != table[(size_t)first * 2 * m + 2 * j + k])
                    return tp_fail(TP_ERR_INTERNAL, "replicated parameter %s: its %s differs between ranks %d and %d",
                                   p->name, k ? "gradient" : "value", first, r);
        }
    }
    return TP_OK;
}

tp_status tp_check_replicated(const tp_train_param *params, int n, const tp_mesh *mesh)
{
    tp_status st = tp_train_params_check(params, n);
    if (st || !mesh) return st;
    if (tp_mesh_ndim(mesh) != 1)
        return tp_fail(TP_ERR_INVALID, "replica check: takes a 1-D mesh (the TP sub-mesh), not %d-D",
                       tp_mesh_ndim(mesh));
    int P = tp_mesh_size(mesh, 0), m = 0;
    int *idx = malloc((size_t)(n ? n : 1) * sizeof *idx);
    if (!idx) return tp_fail(TP_ERR_NOMEM, "replica check: out of memory");
    for (int i = 0; i < n; i++)
        if (params[i].flags & TP_PARAM_COUNTED_ONCE) idx[m++] = i;
    if (m == 0 || P == 1) {
        free(idx);
        return TP_OK;
    }
    uint64_t *row = malloc((size_t)2 * m * sizeof *row);
    uint64_t *table = malloc((size_t)P * 2 * m * sizeof *table);
    if (!row || !table) st = tp_fail(TP_ERR_NOMEM, "replica check: out of memory");
    for (int j = 0; !st && j < m; j++) {
        row[2 * j] = digest(params[idx[j]].value);
        row[2 * j + 1] = digest(params[idx[j]].grad);
    }
    int64_t gshape[2] = {P, 2 * (int64_t)m};
    tp_placement sharded = tp_shard(0), replicate = tp_replicate();
    if (!st) st = tp_redistribute_local(mesh, TP_I64, 2, gshape, &sharded, row, &replicate, table);
    if (st) st = tp_fail_context(st, "replica check");
    else st = compare(params, idx, m, table, P);
    free(row), free(table), free(idx);
    return st;
}
