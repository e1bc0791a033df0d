/* lm_head and the causal-LM loss in vocabulary blocks, for a head weight
 * kept in row blocks (tp_module_row_hooks: ZeRO-3 under --dp-shard), so
 * that no rank holds the [V, H] weight, its gradient or the [T, V] logits.
 *
 * The loss is tp_cross_entropy's, bit for bit: a row's maximum, its sum of
 * exponentials and its gradient need the whole row, so the blocks are
 * visited three times, each time fetched and their logits recomputed
 * (the same GEMM on the same rows gives the same bits):
 *   pass 0: each row's maximum, scanned in column order;
 *   pass 1: Σ exp(z − max) continued in double across the blocks in column
 *           order (tp_cross_entropy's one sum), and the label's logit;
 *           then logsumexp and the row losses;
 *   pass 2: the logits' gradient, then lm_head's backward on the block:
 *           dW rows = dzᵀ·h handed to rows_grad, dh += dz·W.
 * The pieces are tp_cross_entropy's own (tp_cross_entropy_max, _sum_exp,
 * _grad).  dW's rows and the logits are each sums over h's width or T
 * alone, so a block gives the whole GEMM's bits.  dh sums over the
 * vocabulary: the packed GEMM adds KC-column pieces to dh in order, so
 * blocks of a multiple of KC rows add the same pieces in the same order
 * (the scalar and OpenBLAS paths sum differently: there, within rounding).
 * The cost: two more forward GEMMs of lm_head and three fetches of the
 * weight per sequence, against ~2 × V × H floats of memory. */
#include "tp_module.h"

#include "tensorpar/kernels.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

int64_t tp_module_rows_block(const tp_model *m, int module, int j)
{
    const tp_module_hooks *h = m->hooks;
    if (!h || !h->rows.rows_block || m->modules[module].params[j].local.data) return 0;
    return h->rows.rows_block(h->ctx, m, module, j);
}

/* One block's rows of the loss, split over the pool's threads by row. */
typedef struct {
    const int64_t *labels;
    float *z;               /* [T, n]: the block's logits, then their gradient */
    int64_t T, n, v0;
    int first;              /* the vocabulary's first block */
    float *mx, *zy;         /* [T]: running maximum, the label's logit */
    double *sum, *lse;      /* [T] */
    double inv_count;
} blk_job;

static int in_block(const blk_job *j, int64_t y) { return y >= j->v0 && y < j->v0 + j->n; }

static void blk_max(void *p, int ti, int nt)
{
    const blk_job *j = p;
    int64_t b, e;
    tp_split_range(j->T, ti, nt, &b, &e);
    for (int64_t t = b; t < e; t++) {
        if (j->labels[t] == TP_IGNORE_INDEX) continue;
        const float *z = j->z + t * j->n;
        j->mx[t] = j->first ? tp_cross_entropy_max(z + 1, j->n - 1, z[0]) : tp_cross_entropy_max(z, j->n, j->mx[t]);
    }
}

static void blk_sum(void *p, int ti, int nt)
{
    const blk_job *j = p;
    int64_t b, e;
    tp_split_range(j->T, ti, nt, &b, &e);
    for (int64_t t = b; t < e; t++) {
        int64_t y = j->labels[t];
        if (y == TP_IGNORE_INDEX) continue;
        const float *z = j->z + t * j->n;
        j->sum[t] = tp_cross_entropy_sum_exp(z, j->n, j->mx[t], j->first ? 0 : j->sum[t]);
        if (in_block(j, y)) j->zy[t] = z[y - j->v0];
    }
}

static void blk_grad(void *p, int ti, int nt)
{
    const blk_job *j = p;
    int64_t b, e;
    tp_split_range(j->T, ti, nt, &b, &e);
    for (int64_t t = b; t < e; t++) {
        int64_t y = j->labels[t];
        float *z = j->z + t * j->n;
        if (y == TP_IGNORE_INDEX) memset(z, 0, (size_t)j->n * sizeof(float));
        else tp_cross_entropy_grad(z, z, j->n, j->lse[t], j->inv_count, in_block(j, y) ? y - j->v0 : -1);
    }
}

static tp_parallel_fn const phase[3] = {blk_max, blk_sum, blk_grad};

/* The pass over the vocabulary; h NULL: idle (fetches and zero gradients
 * only).  w, dw: one block of the weight (its dtype) and of its gradient. */
typedef struct {
    tp_model *m;
    const tp_tensor *W;     /* lm_head's local weight: shape and dtype, no data */
    int64_t B;
    void *w;
    float *dw, *dh;
    const float *h;
    blk_job job;
} head_pass;

static tp_status block(head_pass *c, int pass, int64_t v0, int64_t n)
{
    tp_model *m = c->m;
    int64_t H = c->W->shape[1];
    const tp_module_row_hooks *rh = &m->hooks->rows;
    tp_status st = rh->rows_fetch(m->hooks->ctx, m, m->lm_head, TP_MODULE_WEIGHT, v0, n, c->w);
    tp_tensor Wb = {c->W->dtype, 2, {n, H}, c->w, 0};
    blk_job *j = &c->job;
    j->n = n, j->v0 = v0, j->first = v0 == 0;
    if (!st && c->h && j->T > 0) {
        st = tp_matmul_ex(j->z, c->h, j->T, &Wb, NULL, m->pool, &m->matmul);
        if (!st) tp_parallel_run(m->pool, phase[pass], j);
    }
    if (st || pass < 2) return st;
    memset(c->dw, 0, (size_t)(n * H) * sizeof(float));
    if (c->h && j->T > 0) st = tp_matmul_backward_ex(c->dh, c->dw, NULL, j->z, c->h, j->T, &Wb, m->pool, &m->matmul);
    if (!st) st = rh->rows_grad(m->hooks->ctx, m, m->lm_head, TP_MODULE_WEIGHT, v0, n, c->dw);
    return st;
}

/* The row losses from the maxima and sums of pass 1, as ce_row forms them. */
static void row_losses(const blk_job *j, double *row_loss)
{
    for (int64_t t = 0; t < j->T; t++) {
        if (j->labels[t] == TP_IGNORE_INDEX) { row_loss[t] = 0; continue; }
        j->lse[t] = j->mx[t] + log(j->sum[t]);
        row_loss[t] = j->lse[t] - j->zy[t];
    }
}

static tp_status passes(head_pass *c, double *row_loss)
{
    int64_t V = c->W->shape[0];
    tp_status st = TP_OK;
    for (int pass = 0; !st && pass < 3; pass++) {
        for (int64_t v0 = 0; !st && v0 < V; v0 += c->B) st = block(c, pass, v0, V - v0 < c->B ? V - v0 : c->B);
        if (!st && pass == 1 && c->h) row_losses(&c->job, row_loss);
    }
    return st;
}

/* The block buffers (and with T > 0 the per-row state) for c. */
static tp_status pass_init(head_pass *c, tp_model *m, int64_t T)
{
    memset(c, 0, sizeof *c);
    c->m = m;
    c->W = &m->modules[m->lm_head].params[TP_MODULE_WEIGHT].local;
    c->B = tp_module_rows_block(m, m->lm_head, TP_MODULE_WEIGHT);
    int64_t H = c->W->shape[1], rows = T > 0 ? T : 1;
    if (c->B <= 0 || c->W->ndim != 2)
        return tp_fail(TP_ERR_INTERNAL, "lm_head's weight is not kept in row blocks");
    c->w = tp_alloc((size_t)(c->B * H) * tp_dtype_size(c->W->dtype));
    c->dw = tp_alloc((size_t)(c->B * H) * sizeof(float));
    c->job.mx = malloc((size_t)rows * 2 * sizeof(float));
    c->job.sum = malloc((size_t)rows * 2 * sizeof(double));
    if (!c->w || !c->dw || !c->job.mx || !c->job.sum)
        return tp_fail(TP_ERR_NOMEM, "out of memory for a block of lm_head (%lld rows)", (long long)c->B);
    c->job.zy = c->job.mx + rows;
    c->job.lse = c->job.sum + rows;
    c->job.T = T;
    return TP_OK;
}

static void pass_free(head_pass *c)
{
    tp_free(c->w);
    tp_free(c->dw);
    free(c->job.mx);
    free(c->job.sum);
}

tp_status tp_head_blocks(tp_model *m, const float *h, const int64_t *labels, int64_t T, double count,
                         double *loss_sum, float *dh, float *z)
{
    int64_t V = m->cfg.vocab_size, counted = 0;
    tp_status st = tp_cross_entropy_check_labels(labels, T, V, count, "tp_cross_entropy", &counted);
    if (st) return st;
    head_pass c;
    double *row_loss = malloc((size_t)(T > 0 ? T : 1) * sizeof(double));
    st = pass_init(&c, m, T);
    if (!st && !row_loss) st = tp_fail(TP_ERR_NOMEM, "out of memory");
    if (!st && c.W->shape[0] != V) st = tp_fail(TP_ERR_INTERNAL, "lm_head's rows are not the vocabulary");
    if (!st) {
        c.h = h, c.dh = dh;
        c.job.labels = labels, c.job.z = z;
        c.job.inv_count = counted > 0 ? 1.0 / count : 0.0;
        st = passes(&c, row_loss);
    }
    if (!st) *loss_sum = tp_cross_entropy_sum(row_loss, T);
    pass_free(&c);
    free(row_loss);
    return st ? tp_fail_context(st, "lm_head in vocabulary blocks") : TP_OK;
}

tp_status tp_model_head_blocks_idle(tp_model *m)
{
    head_pass c;
    tp_status st = pass_init(&c, m, 0);
    if (!st) st = passes(&c, NULL);
    pass_free(&c);
    return st ? tp_fail_context(st, "lm_head in vocabulary blocks (idle)") : TP_OK;
}
