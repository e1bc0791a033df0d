/* Row-parallel cross-entropy: Hugging Face's loss, bit for bit what
 * tp_cross_entropy computes on the whole [T, V] logits, when each rank holds
 * only its vocabulary shard [T, V_local] (Shard(1): lm_head's column split
 * before its gather) — without any rank ever holding [T, V].
 *
 * The rows go by blocks of ROWS_PER_RANK·P: each block moves Shard(1) ->
 * Shard(0) (one all-to-all, tp_redistribute_local), so each rank holds whole
 * rows of the vocabulary for its chunk of the block; it runs
 * tp_cross_entropy_rows on them — the same row function as on one rank, so
 * each row's loss and gradient are the same bits — the row losses go
 * Shard(0) -> Replicate (an all-gather of doubles, in row order) and the row
 * gradients back Shard(0) -> Shard(1) into the caller's buffer.  At the end
 * every rank adds the T row losses with tp_cross_entropy_sum, in the order
 * tp_cross_entropy adds them.
 *
 * Memory: one block's rows, ROWS_PER_RANK·V floats, and the all-to-all's
 * send and receive copies of the same size, plus T doubles: O(V), not
 * O(T·V).  Three collectives per block. */
#include "tensorpar/train.h"
#include "tensorpar/kernels.h"

#include <stdlib.h>

/* 64 rows of a 152k vocabulary are 39 MB: small next to the [T, V/P] shard,
 * and T = 512 over 2 ranks is 4 blocks. */
#define ROWS_PER_RANK 64

typedef struct {
    const tp_mesh *mesh;
    int64_t V, Vl;
    double inv_count;
    float *rows;            /* [ROWS_PER_RANK, V]: this rank's whole rows */
    double *row_loss;       /* [ROWS_PER_RANK] */
    tp_threadpool *pool;
} rp_ctx;

/* Rows [row0, row0 + Tb) of the batch; shard points at their [Tb, Vl]. */
static tp_status block(const rp_ctx *c, float *shard, const int64_t *labels, int64_t Tb, double *loss_out)
{
    tp_placement col = tp_shard(1), row = tp_shard(0), rep = tp_replicate();
    int64_t g2[2] = {Tb, c->V}, g1[1] = {Tb}, r0, n;
    tp_chunk_range(Tb, tp_mesh_size(c->mesh, 0), tp_mesh_coord(c->mesh, 0), &r0, &n);
    tp_status st = tp_redistribute_local(c->mesh, TP_F32, 2, g2, &col, shard, &row, c->rows);
    if (!st) st = tp_cross_entropy_rows(c->row_loss, c->rows, c->rows, labels + r0, n, c->V, c->inv_count, c->pool);
    if (!st) st = tp_redistribute_local(c->mesh, TP_F64, 1, g1, &row, c->row_loss, &rep, loss_out);
    if (!st) st = tp_redistribute_local(c->mesh, TP_F32, 2, g2, &row, c->rows, &col, shard);
    return st;
}

tp_status tp_cross_entropy_row_parallel(double *loss_sum, float *logits_local, const int64_t *labels, int64_t T,
                                        int64_t V, double count, const tp_mesh *mesh, tp_threadpool *pool)
{
    int64_t counted = 0;
    tp_status st = tp_cross_entropy_check_labels(labels, T, V, count, "row-parallel cross-entropy", &counted);
    if (st) return st;
    if (!mesh || tp_mesh_ndim(mesh) != 1)
        return tp_fail(TP_ERR_INVALID, "row-parallel cross-entropy: needs a 1-D mesh");
    int P = tp_mesh_size(mesh, 0);
    int64_t v0;
    rp_ctx c = {mesh, V, 0, counted > 0 ? 1.0 / count : 0.0, NULL, NULL, pool};
    tp_chunk_range(V, P, tp_mesh_coord(mesh, 0), &v0, &c.Vl);
    c.rows = tp_alloc((size_t)(ROWS_PER_RANK * V) * sizeof(float));
    c.row_loss = malloc(ROWS_PER_RANK * sizeof(double));
    double *loss = malloc((size_t)(T > 0 ? T : 1) * sizeof(double));
    if (!c.rows || !c.row_loss || !loss) st = tp_fail(TP_ERR_NOMEM, "row-parallel cross-entropy: out of memory");
    int64_t step = (int64_t)ROWS_PER_RANK * P;
    for (int64_t row0 = 0; !st && row0 < T; row0 += step) {
        int64_t Tb = T - row0 < step ? T - row0 : step;
        st = block(&c, logits_local + row0 * c.Vl, labels + row0, Tb, loss + row0);
    }
    if (!st) *loss_sum = tp_cross_entropy_sum(loss, T);
    tp_free(c.rows);
    free(c.row_loss);
    free(loss);
    return st ? tp_fail_context(st, "row-parallel cross-entropy") : TP_OK;
}
