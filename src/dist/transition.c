/* The 1-D layout transitions of §1.5, each over one group.
 *
 * Every sharded layout is described as "pieces" of F (the local tensor with
 * this mesh dimension replicated): piece q is what group rank q holds, made
 * of 1 block (Shard) or s blocks (StridedShard) along one tensor dim.  The
 * collectives move pieces in rank order; when a piece is not a contiguous
 * run of F (sharding a dim other than the outermost, or strided) it is
 * packed before / unpacked after the collective.  The fast paths (all-reduce,
 * gather/scatter along the outermost dim) touch no scratch memory. */
#include "dist_internal.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
    int d;
    int64_t nb, m, start, size;   /* blocks, block length in F, chunk */
} piece;

static piece piece_of(const tp_dist_step_ctx *c, tp_placement p, int q)
{
    piece x;
    x.d = p.dim;
    x.nb = p.kind == TP_STRIDED_SHARD ? p.split : 1;
    x.m = c->F[x.d] / x.nb;
    tp_chunk_range(x.m, c->P, q, &x.start, &x.size);
    return x;
}

/* The element count of `shape` with dimension d set to v. */
static size_t numel_with(int ndim, const int64_t *shape, int d, int64_t v)
{
    int64_t t[TP_MAX_DIMS];
    memcpy(t, shape, sizeof t);
    t[d] = v;
    return (size_t)tp_dist_numel(ndim, t);
}

static size_t piece_numel(const tp_dist_step_ctx *c, piece x)
{
    return numel_with(c->ndim, c->F, x.d, x.nb * x.size);
}

/* Copies between F-shaped `full` and the piece buffer, either way. */
static void piece_copy(const tp_dist_step_ctx *c, piece x, void *full, void *pbuf, int to_full)
{
    int64_t pshape[TP_MAX_DIMS], box[TP_MAX_DIMS], foff[TP_MAX_DIMS] = {0}, poff[TP_MAX_DIMS] = {0};
    memcpy(pshape, c->F, sizeof pshape);
    memcpy(box, c->F, sizeof box);
    pshape[x.d] = x.nb * x.size;
    box[x.d] = x.size;
    for (int64_t b = 0; b < x.nb; b++) {
        foff[x.d] = b * x.m + x.start;
        poff[x.d] = b * x.size;
        if (to_full)
            tp_dist_copy_box(full, c->F, foff, pbuf, pshape, poff, box, c->ndim, c->es);
        else
            tp_dist_copy_box(pbuf, pshape, poff, full, c->F, foff, box, c->ndim, c->es);
    }
}

/* Pieces are consecutive runs of F in rank order: collectives can read or
 * write F directly. */
static int pieces_contiguous(const tp_dist_step_ctx *c, piece x)
{
    for (int i = 0; i < x.d; i++)
        if (c->F[i] != 1) return 0;
    return x.nb == 1;
}

static int all_equal(const size_t *v, int n)
{
    for (int i = 1; i < n; i++)
        if (v[i] != v[0]) return 0;
    return 1;
}

static void piece_counts(const tp_dist_step_ctx *c, tp_placement p, size_t *counts, size_t *total)
{
    *total = 0;
    for (int q = 0; q < c->P; q++) {
        counts[q] = piece_numel(c, piece_of(c, p, q));
        *total += counts[q];
    }
}

/* Uneven shards need the "v" forms; even ones use the plain collective. */
static tp_status gather(const tp_dist_step_ctx *c, const void *in, void *out, const size_t *counts)
{
    if (all_equal(counts, c->P)) return tp_comm_all_gather(c->group, in, out, counts[0], c->dtype);
    return tp_comm_all_gatherv(c->group, in, out, counts, c->dtype);
}

static tp_status scatter(const tp_dist_step_ctx *c, const void *in, void *out, const size_t *counts)
{
    if (all_equal(counts, c->P))
        return tp_comm_reduce_scatter(c->group, in, out, counts[0], c->dtype, TP_REDUCE_SUM);
    return tp_comm_reduce_scatterv(c->group, in, out, counts, c->dtype, TP_REDUCE_SUM);
}

/* Shard/StridedShard -> Replicate: all-gather, then put the pieces in place. */
static tp_status all_gather(const tp_dist_step_ctx *c, tp_placement p, const void *in, void *out,
                            size_t *counts)
{
    size_t total;
    piece_counts(c, p, counts, &total);
    if (pieces_contiguous(c, piece_of(c, p, 0))) return gather(c, in, out, counts);
    char *buf = tp_alloc(total * c->es);
    if (!buf) return TP_ERR_NOMEM;
    tp_status st = gather(c, in, buf, counts);
    size_t off = 0;
    for (int q = 0; st == TP_OK && q < c->P; q++) {
        piece_copy(c, piece_of(c, p, q), out, buf + off * c->es, 1);
        off += counts[q];
    }
    tp_free(buf);
    return st;
}

/* Partial -> Shard/StridedShard: lay the pieces out in rank order, then
 * reduce-scatter. */
static tp_status reduce_scatter(const tp_dist_step_ctx *c, tp_placement p, const void *in, void *out,
                                size_t *counts)
{
    size_t total;
    piece_counts(c, p, counts, &total);
    if (pieces_contiguous(c, piece_of(c, p, 0))) return scatter(c, in, out, counts);
    char *buf = tp_alloc(total * c->es);
    if (!buf) return TP_ERR_NOMEM;
    size_t off = 0;
    for (int q = 0; q < c->P; q++) {
        piece_copy(c, piece_of(c, p, q), (void *)in, buf + off * c->es, 0);
        off += counts[q];
    }
    tp_status st = scatter(c, buf, out, counts);
    tp_free(buf);
    return st;
}

/* Shard(i) -> Shard(j): rank q gets, from my Shard(i) piece, the part in
 * q's chunk of dim j; I receive from each p its chunk of dim i in mine of j. */
static tp_status all_to_all(const tp_dist_step_ctx *c, tp_placement from, tp_placement to,
                            const void *in, void *out, size_t *scount)
{
    int i = from.dim, j = to.dim, P = c->P;
    size_t *rcount = scount + P, stotal = 0, rtotal = 0;
    int64_t zero[TP_MAX_DIMS] = {0}, box[TP_MAX_DIMS], off[TP_MAX_DIMS];
    for (int q = 0; q < P; q++) {
        piece pi = piece_of(c, from, q), pj = piece_of(c, to, q);
        scount[q] = numel_with(c->ndim, c->in_shape, j, pj.size);
        rcount[q] = numel_with(c->ndim, c->out_shape, i, pi.size);
        stotal += scount[q];
        rtotal += rcount[q];
    }
    char *sbuf = tp_alloc(stotal * c->es), *rbuf = tp_alloc(rtotal * c->es);
    tp_status st = sbuf && rbuf ? TP_OK : TP_ERR_NOMEM;
    size_t so = 0, ro = 0;
    for (int q = 0; st == TP_OK && q < P; q++) {
        piece pj = piece_of(c, to, q);
        memcpy(box, c->in_shape, sizeof box);
        memset(off, 0, sizeof off);
        box[j] = pj.size;
        off[j] = pj.start;
        tp_dist_copy_box(sbuf + so * c->es, box, zero, in, c->in_shape, off, box, c->ndim, c->es);
        so += scount[q];
    }
    if (st == TP_OK) {
        if (all_equal(scount, P) && all_equal(rcount, P))
            st = tp_comm_all_to_all(c->group, sbuf, rbuf, scount[0], c->dtype);
        else
            st = tp_comm_all_to_allv(c->group, sbuf, scount, rbuf, rcount, c->dtype);
    }
    for (int p = 0; st == TP_OK && p < P; p++) {
        piece pi = piece_of(c, from, p);
        memcpy(box, c->out_shape, sizeof box);
        memset(off, 0, sizeof off);
        box[i] = pi.size;
        off[i] = pi.start;
        tp_dist_copy_box(out, c->out_shape, off, rbuf + ro * c->es, box, zero, box, c->ndim, c->es);
        ro += rcount[p];
    }
    tp_free(sbuf);
    tp_free(rbuf);
    return st;
}

int tp_dist_step_in_place_ok(tp_collective c)
{
    return c == TP_COLL_NONE || c == TP_COLL_ALL_REDUCE || c == TP_COLL_ZERO_NONROOT;
}

static tp_status run(const tp_dist_step_ctx *c, const tp_redist_step *s, const void *in, void *out,
                     size_t *counts)
{
    size_t n = (size_t)tp_dist_numel(c->ndim, c->out_shape);
    switch (s->coll) {
    case TP_COLL_NONE:
        if (in != out) memcpy(out, in, n * c->es);
        return TP_OK;
    case TP_COLL_ZERO_NONROOT:
        /* The sum over the group must be the value: group rank 0 keeps it
         * and the others hold zeros.  (PyTorch's DTensor divides by P
         * instead, which is not exact; this split is, in every dtype.) */
        if (c->r != 0) memset(out, 0, n * c->es);
        else if (in != out) memcpy(out, in, n * c->es);
        return TP_OK;
    case TP_COLL_ALL_REDUCE:
        return tp_comm_all_reduce(c->group, in, out, n, c->dtype, TP_REDUCE_SUM);
    case TP_COLL_LOCAL_SLICE:
        piece_copy(c, piece_of(c, s->to, c->r), (void *)in, out, 0);
        return TP_OK;
    case TP_COLL_ALL_GATHER:
        return all_gather(c, s->from, in, out, counts);
    case TP_COLL_REDUCE_SCATTER:
        return reduce_scatter(c, s->to, in, out, counts);
    case TP_COLL_ALL_TO_ALL:
        return all_to_all(c, s->from, s->to, in, out, counts);
    }
    return tp_fail(TP_ERR_INTERNAL, "unknown redistribution step %d", (int)s->coll);
}

tp_status tp_dist_run_step(const tp_dist_step_ctx *c, const tp_redist_step *s,
                           const void *in, void *out)
{
    /* Per-rank counts only for the gathers and scatters: the per-layer
     * all-reduce allocates nothing. */
    if (tp_dist_step_in_place_ok(s->coll) || s->coll == TP_COLL_LOCAL_SLICE) return run(c, s, in, out, NULL);
    size_t *counts = malloc(2 * (size_t)c->P * sizeof *counts);
    if (!counts) return tp_fail(TP_ERR_NOMEM, "out of memory");
    tp_status st = run(c, s, in, out, counts);
    free(counts);
    return st;
}
