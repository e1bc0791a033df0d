/* ZeRO-3's embedding and lm_head in row blocks (dp_internal.h): the
 * tp_module_row_hooks of a dp_shard model.
 *
 * A block of rows [row0, row0 + n) is the flat range [row0·w, (row0+n)·w)
 * of the TP-local tensor, which the chunks (torch.chunk of the flat
 * tensor, in rank order) cover in rank order: each rank's part of the range
 * is the intersection with its chunk, so an all-gatherv of those parts
 * gives the block, and a reduce-scatterv of the block's gradient with the
 * same counts lands each rank's part of the sum on it — the same values
 * and, per element, the same sum over ranks as the whole tensor's gather
 * and reduce-scatter.
 *
 * An embedding's gradient reaches few rows (the sequences' ids), added to
 * by a tied lm_head's gradient first.  The whole gradient summed the two
 * on each rank before the reduction; to keep that order the rows any rank
 * of dp_shard looks up this sequence are kept out of lm_head's reductions
 * (dp_kept: their gradient held, zeros sent instead), the lookup's
 * gradient is added to them, and they are all-reduced at the end. */
#include "train/dp_internal.h"
#include "tensorpar/comm.h"
#include "tensorpar/kernels.h"

#include <stdlib.h>
#include <string.h>

/* A block's rows are a multiple of the packed GEMM's KC (256 on the AVX2
 * and AVX-512 paths), so that lm_head's input gradient adds the same
 * pieces as the whole GEMM (head_blocks.c); at most a sixteenth of the
 * table and 64 MiB of f32, so a block's value, gradient and logits stay
 * small beside the chunks. */
#define BLOCK_ALIGN 256
#define BLOCK_MIN_COUNT 16
#define BLOCK_MAX_BYTES ((int64_t)64 << 20)

static tp_group *group(const tp_dp *dp) { return tp_mesh_group(dp->shard, 0); }

static int64_t round_up(int64_t a, int64_t b) { return (a + b - 1) / b * b; }

int64_t tp_dp_block_rows(const tp_dp *dp, int i, int j)
{
    const tp_model *m = dp->m;
    const tp_module *mod = &m->modules[i];
    const tp_module_param *p = &mod->params[j];
    int tp = tp_mesh_dim_index(dp->grid, "tp");
    if (j != TP_MODULE_WEIGHT || p->local.ndim != 2 || m->lora || dp->frozen || tp_mesh_size(dp->grid, tp) != 1)
        return 0;
    /* lm_head's weight, or the embedding a tied lm_head borrows */
    int head = m->lm_head >= 0 && (i == m->lm_head || m->modules[m->lm_head].params[j].tied_to == i);
    /* (lm_head's bias, if any, is chunked after its weight: still whole here) */
    if (head && m->modules[m->lm_head].n_params > TP_MODULE_BIAS &&
        m->modules[m->lm_head].params[TP_MODULE_BIAS].local.data)
        return 0;
    if (!head && mod->type != TP_MT_EMBEDDING) return 0;
    int64_t rows = p->local.shape[0], width = p->local.shape[1] > 0 ? p->local.shape[1] : 1;
    int64_t cap = BLOCK_MAX_BYTES / (width * (int64_t)sizeof(float)) / BLOCK_ALIGN * BLOCK_ALIGN;
    int64_t want = round_up((rows + BLOCK_MIN_COUNT - 1) / BLOCK_MIN_COUNT, BLOCK_ALIGN);
    if (cap < BLOCK_ALIGN) cap = BLOCK_ALIGN;
    return want < cap ? want : cap;
}

/* The dp parameter behind parameter j of module i (a tied one: its
 * owner's), if it is kept in blocks. */
static dp_param *blocked(tp_dp *dp, int i, int j)
{
    const tp_module_param *mp = &dp->m->modules[i].params[j];
    if (mp->tied_to >= 0) i = mp->tied_to;
    for (int k = 0; k < dp->n; k++)
        if (dp->ps[k].module == i && dp->ps[k].j == j) return dp->ps[k].block ? &dp->ps[k] : NULL;
    return NULL;
}

static int64_t width_of(const tp_dp *dp, const dp_param *p)
{
    return dp->m->modules[p->module].params[p->j].local.shape[1];
}

/* Each rank's part of the flat range [a, b) (counts, in elements) and
 * where this rank's part starts in its chunk (*off) and in the range
 * (*at). */
static void range_parts(const tp_dp *dp, const dp_param *p, int64_t a, int64_t b, size_t *counts, int64_t *off,
                        int64_t *at)
{
    int me = tp_mesh_coord(dp->shard, 0);
    *off = *at = 0;
    for (int q = 0; q < dp->S; q++) {
        int64_t s0, len;
        tp_chunk_range(p->numel, dp->S, q, &s0, &len);
        int64_t lo = a > s0 ? a : s0, hi = b < s0 + len ? b : s0 + len;
        counts[q] = hi > lo ? (size_t)(hi - lo) : 0;
        if (q == me && hi > lo) *off = lo - s0, *at = lo - a;
    }
}

/* Rows [row0, row0 + n) of p's value into out (p's dtype: a bf16 weight's
 * master rounded, as gather() does). */
static tp_status fetch(tp_dp *dp, const dp_param *p, int64_t row0, int64_t n, void *out)
{
    int64_t w = width_of(dp, p), off, at;
    size_t *counts = malloc((size_t)dp->S * sizeof *counts);
    if (!counts) return tp_fail(TP_ERR_NOMEM, "out of memory");
    range_parts(dp, p, row0 * w, (row0 + n) * w, counts, &off, &at);
    size_t mine = counts[tp_mesh_coord(dp->shard, 0)];
    const float *src = (const float *)p->value.data + off;
    void *send = (void *)src;
    tp_status s = TP_OK;
    if (p->dtype != TP_F32) {
        send = tp_alloc((mine ? mine : 1) * tp_dtype_size(p->dtype));
        s = send ? tp_convert(send, p->dtype, src, TP_F32, mine) : TP_ERR_NOMEM;
    }
    if (!s) s = tp_comm_all_gatherv(group(dp), send, out, counts, p->dtype);
    if (send != src) tp_free(send);
    free(counts);
    return s ? tp_fail_context(s, "gathering rows %lld..%lld of %s over dp_shard", (long long)row0,
                               (long long)(row0 + n), dp->m->modules[p->module].name) : TP_OK;
}

/* The sum over dp_shard of dw (rows [row0, row0 + n)) added into p's
 * gradient chunk. */
static tp_status reduce(tp_dp *dp, dp_param *p, int64_t row0, int64_t n, const float *dw)
{
    int64_t w = width_of(dp, p), off, at;
    size_t *counts = malloc((size_t)dp->S * sizeof *counts);
    if (!counts) return tp_fail(TP_ERR_NOMEM, "out of memory");
    range_parts(dp, p, row0 * w, (row0 + n) * w, counts, &off, &at);
    size_t mine = counts[tp_mesh_coord(dp->shard, 0)];
    float *part = tp_alloc((mine ? mine : 1) * sizeof(float));
    tp_status s = part ? tp_comm_reduce_scatterv(group(dp), dw, part, counts, TP_F32, TP_REDUCE_SUM) : TP_ERR_NOMEM;
    if (!s) {
        float *g = (float *)p->grad.data + off;
        for (size_t i = 0; i < mine; i++) g[i] += part[i];
    }
    tp_free(part);
    free(counts);
    return s ? tp_fail_context(s, "reduce-scattering rows %lld..%lld of the gradient of %s", (long long)row0,
                               (long long)(row0 + n), dp->m->modules[p->module].name) : TP_OK;
}

/* ---- the rows kept for the lookup's gradient --------------------------- */

void tp_dp_kept_free(tp_dp *dp)
{
    free(dp->kept.rows);
    tp_free(dp->kept.grad);
    memset(&dp->kept, 0, sizeof dp->kept);
    dp->kept.k = -1;
}

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* The index of row r among the kept rows, -1 if absent. */
static int64_t kept_index(const dp_kept *kp, int64_t r)
{
    const int64_t *hit = bsearch(&r, kp->rows, (size_t)kp->n, sizeof r, cmp_i64);
    return hit ? hit - kp->rows : -1;
}

/* The ids every rank of dp_shard looks up (T of them here), sorted and
 * distinct, with a zeroed gradient each. */
static tp_status kept_begin(tp_dp *dp, dp_param *p, const int64_t *ids, int64_t T)
{
    tp_dp_kept_free(dp);
    int64_t *Ts = malloc((size_t)dp->S * sizeof *Ts), total = 0;
    size_t *counts = malloc((size_t)dp->S * sizeof *counts);
    tp_status s = Ts && counts ? tp_comm_all_gather(group(dp), &T, Ts, 1, TP_I64) : TP_ERR_NOMEM;
    for (int q = 0; !s && q < dp->S; q++) counts[q] = (size_t)Ts[q], total += Ts[q];
    dp_kept *kp = &dp->kept;
    if (!s && !(kp->rows = malloc((size_t)(total ? total : 1) * sizeof *kp->rows))) s = TP_ERR_NOMEM;
    int64_t none = 0;
    if (!s) s = tp_comm_all_gatherv(group(dp), ids ? ids : &none, kp->rows, counts, TP_I64);
    if (!s) {
        qsort(kp->rows, (size_t)total, sizeof *kp->rows, cmp_i64);
        for (int64_t i = 0; i < total; i++)
            if (kp->n == 0 || kp->rows[i] != kp->rows[kp->n - 1]) kp->rows[kp->n++] = kp->rows[i];
        kp->k = (int)(p - dp->ps);
        size_t bytes = (size_t)(kp->n ? kp->n : 1) * (size_t)width_of(dp, p) * sizeof(float);
        if (!(kp->grad = tp_alloc(bytes))) s = TP_ERR_NOMEM;
        else memset(kp->grad, 0, bytes);
    }
    free(Ts);
    free(counts);
    return s ? tp_fail_context(s, "the rows %s looks up over dp_shard", dp->m->modules[p->module].name) : TP_OK;
}

/* The kept rows among dw's (rows [row0, row0 + n)) taken into the kept
 * gradient, and zeros sent in their place. */
static void kept_take(tp_dp *dp, const dp_param *p, int64_t row0, int64_t n, float *dw)
{
    dp_kept *kp = &dp->kept;
    if (kp->k != (int)(p - dp->ps)) return;
    int64_t w = width_of(dp, p);
    for (int64_t i = 0; i < kp->n; i++) {
        int64_t r = kp->rows[i] - row0;
        if (r < 0 || r >= n) continue;
        memcpy(kp->grad + i * w, dw + r * w, (size_t)w * sizeof(float));
        memset(dw + r * w, 0, (size_t)w * sizeof(float));
    }
}

/* The kept rows' gradient (ids' part added) summed over dp_shard and each
 * rank's part of it added into its chunk. */
static tp_status kept_end(tp_dp *dp, dp_param *p, const int64_t *ids, int64_t T, const float *dy)
{
    dp_kept *kp = &dp->kept;
    int64_t w = width_of(dp, p);
    if (kp->k != (int)(p - dp->ps)) return tp_fail(TP_ERR_INTERNAL, "%s: a lookup's gradient without its lookup",
                                                   dp->m->modules[p->module].name);
    int64_t *local = malloc((size_t)(T ? T : 1) * sizeof *local);
    tp_status s = local ? TP_OK : TP_ERR_NOMEM;
    for (int64_t t = 0; !s && t < T; t++) local[t] = kept_index(kp, ids[t]);
    if (!s) tp_embedding_backward(kp->grad, 0, kp->n, w, local, dy, T, dp->m->pool);
    if (!s) s = tp_comm_all_reduce(group(dp), kp->grad, kp->grad, (size_t)(kp->n * w), TP_F32, TP_REDUCE_SUM);
    for (int64_t i = 0; !s && i < kp->n; i++) {
        int64_t a = kp->rows[i] * w, lo = a > p->start ? a : p->start;
        int64_t hi = a + w < p->start + p->len ? a + w : p->start + p->len;
        float *g = p->grad.data;
        for (int64_t e = lo; e < hi; e++) g[e - p->start] += kp->grad[i * w + (e - a)];
    }
    free(local);
    tp_dp_kept_free(dp);
    return s ? tp_fail_context(s, "the gradient of %s's looked-up rows", dp->m->modules[p->module].name) : TP_OK;
}

/* ---- the hooks -------------------------------------------------------- */

static int64_t rows_block(void *ctx, const tp_model *m, int i, int j)
{
    (void)m;
    const dp_param *p = blocked(ctx, i, j);
    return p ? p->block : 0;
}

static tp_status rows_fetch(void *ctx, tp_model *m, int i, int j, int64_t row0, int64_t n, void *out)
{
    dp_param *p = blocked(ctx, i, j);
    if (!p) return tp_fail(TP_ERR_INTERNAL, "%s is not kept in row blocks", m->modules[i].name);
    return fetch(ctx, p, row0, n, out);
}

static tp_status rows_grad(void *ctx, tp_model *m, int i, int j, int64_t row0, int64_t n, float *dw)
{
    dp_param *p = blocked(ctx, i, j);
    if (!p) return tp_fail(TP_ERR_INTERNAL, "%s is not kept in row blocks", m->modules[i].name);
    kept_take(ctx, p, row0, n, dw);
    return reduce(ctx, p, row0, n, dw);
}

/* Whether any kept row lies in [row0, row0 + n). */
static int kept_in(const dp_kept *kp, int64_t row0, int64_t n)
{
    for (int64_t i = 0; i < kp->n; i++)
        if (kp->rows[i] >= row0 && kp->rows[i] < row0 + n) return 1;
    return 0;
}

/* y[t] = row ids[t]: the blocks that hold a row some rank of dp_shard
 * looks up (every rank knows which: the kept rows), fetched in order. */
static tp_status rows_lookup(void *ctx, tp_model *m, int i, int j, const int64_t *ids, int64_t T, float *y)
{
    tp_dp *dp = ctx;
    dp_param *p = blocked(dp, i, j);
    if (!p) return tp_fail(TP_ERR_INTERNAL, "%s is not kept in row blocks", m->modules[i].name);
    tp_status s = kept_begin(dp, p, ids, T);
    int64_t V = m->modules[p->module].params[j].local.shape[0], w = width_of(dp, p);
    void *buf = s ? NULL : tp_alloc((size_t)(p->block * w) * tp_dtype_size(p->dtype));
    if (!s && !buf) s = tp_fail(TP_ERR_NOMEM, "out of memory for a block of %s", m->modules[i].name);
    for (int64_t row0 = 0; !s && row0 < V; row0 += p->block) {
        int64_t n = V - row0 < p->block ? V - row0 : p->block;
        if (!kept_in(&dp->kept, row0, n)) continue;
        s = fetch(dp, p, row0, n, buf);
        tp_tensor blk = {p->dtype, 2, {n, w}, buf, 0};
        for (int64_t t = 0; !s && t < T; t++)
            if (ids[t] >= row0 && ids[t] < row0 + n) tp_row_to_f32(y + t * w, &blk, ids[t] - row0);
    }
    tp_free(buf);
    return s;
}

static tp_status rows_scatter(void *ctx, tp_model *m, int i, int j, const int64_t *ids, int64_t T, const float *dy)
{
    dp_param *p = blocked(ctx, i, j);
    if (!p) return tp_fail(TP_ERR_INTERNAL, "%s is not kept in row blocks", m->modules[i].name);
    return kept_end(ctx, p, ids, T, dy);
}

void tp_dp_row_hooks(tp_dp *dp)
{
    dp->kept.k = -1;
    dp->hooks.rows = (tp_module_row_hooks){rows_block, rows_fetch, rows_grad, rows_lookup, rows_scatter};
}

/* ---- an idle row ------------------------------------------------------ */

/* The blocked embedding, or NULL. */
static dp_param *blocked_embedding(tp_dp *dp, int *module)
{
    *module = dp->m->embed_tokens;
    return *module >= 0 ? blocked(dp, *module, TP_MODULE_WEIGHT) : NULL;
}

tp_status tp_dp_rows_idle_lookup(tp_dp *dp)
{
    int i;
    return blocked_embedding(dp, &i) ? rows_lookup(dp, dp->m, i, TP_MODULE_WEIGHT, NULL, 0, NULL) : TP_OK;
}

tp_status tp_dp_rows_idle_head(tp_dp *dp)
{
    tp_model *m = dp->m;
    return tp_module_rows_block(m, m->lm_head, TP_MODULE_WEIGHT) > 0 ? tp_model_head_blocks_idle(m) : TP_OK;
}

tp_status tp_dp_rows_idle_scatter(tp_dp *dp)
{
    int i;
    return blocked_embedding(dp, &i) ? rows_scatter(dp, dp->m, i, TP_MODULE_WEIGHT, NULL, 0, NULL) : TP_OK;
}
