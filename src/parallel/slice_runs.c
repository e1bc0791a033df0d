/* Where a rank's elements sit in the whole tensor: a range of the flat,
 * row-major local shard (all of it, or a dp_shard chunk of it) as runs
 * that are contiguous both in the shard and in the global tensor.  The
 * checkpoint writer pwrite()s each run at its offset in the file, and the
 * resume reads each run back, so neither ever holds more than its range.
 *
 * Along the slice dimension the shard concatenates the ranges of
 * tp_param_slice, so for each index of the dimensions before it (an
 * "outer row") each range is one piece of len * inner elements; the
 * requested range cuts the first and last pieces.  Pieces that touch in
 * both spaces (the ranges of a Shard(0) shard, or whole rows when the
 * slice covers the dimension) merge into one run. */
#include "tensorpar/parallel.h"

typedef struct {
    int64_t local, global, count;   /* count 0: nothing pending */
    tp_slice_run_fn fn;
    void *ctx;
} pending_run;

static tp_status emit(pending_run *p, int64_t local, int64_t global, int64_t count)
{
    if (p->count && p->local + p->count == local && p->global + p->count == global) {
        p->count += count;
        return TP_OK;
    }
    tp_status s = p->count ? p->fn(p->ctx, p->local, p->global, p->count) : TP_OK;
    p->local = local, p->global = global, p->count = count;
    return s;
}

tp_status tp_slice_runs(int ndim, const int64_t *shape, const tp_param_slice *sl, int64_t first, int64_t n,
                        tp_slice_run_fn fn, void *ctx)
{
    if (n <= 0) return TP_OK;
    if (sl->dim < 0) return fn(ctx, first, first, n);
    if (sl->dim >= ndim || sl->n < 1 || sl->n > TP_PLAN_MAX_RANGES)
        return tp_fail(TP_ERR_INVALID, "a slice along dimension %d with %d ranges of a %d-dimensional tensor",
                       sl->dim, sl->n, ndim);
    int64_t outer = 1, inner = 1, ldim = 0, gdim = shape[sl->dim];
    for (int i = 0; i < sl->dim; i++) outer *= shape[i];
    for (int i = sl->dim + 1; i < ndim; i++) inner *= shape[i];
    for (int r = 0; r < sl->n; r++) ldim += sl->len[r];
    int64_t row = ldim * inner, end = first + n;
    if (first < 0 || row <= 0 || end > outer * row)
        return tp_fail(TP_ERR_INVALID, "elements [%lld, %lld) of a shard of %lld", (long long)first, (long long)end,
                       (long long)(outer * row));
    pending_run p = {0, 0, 0, fn, ctx};
    tp_status s = TP_OK;
    for (int64_t o = first / row; !s && o < outer && o * row < end; o++) {
        int64_t at = o * row;
        for (int r = 0; !s && r < sl->n; r++) {
            int64_t piece = sl->len[r] * inner, lo = at > first ? at : first;
            int64_t hi = at + piece < end ? at + piece : end;
            if (lo < hi) s = emit(&p, lo, (o * gdim + sl->start[r]) * inner + (lo - at), hi - lo);
            at += piece;
        }
    }
    if (!s && p.count) s = fn(ctx, p.local, p.global, p.count);
    return s;
}
