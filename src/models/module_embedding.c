/* The Embedding module: the rows of the token ids, under its TP style
 * (embedding_rowwise looks up the rows this rank holds and reduces).
 * Backward: the output gradient scattered into the rows of the ids.  A
 * weight kept in row blocks (tp_module_row_hooks) is looked up and
 * scattered into by the hooks. */
#include "tp_module.h"

#include "tensorpar/kernels.h"

#include <string.h>

static tp_status check_ids(const tp_model *m, const int64_t *ids, int64_t T)
{
    int64_t V = m->cfg.vocab_size;
    for (int64_t t = 0; t < T; t++)
        if (ids[t] < 0 || ids[t] >= V)
            return tp_fail(TP_ERR_INVALID, "token id %lld at position %lld is outside the vocabulary [0, %lld)",
                           (long long)ids[t], (long long)t, (long long)V);
    return TP_OK;
}

/* Looks up the rows this rank holds; ids whose row lives on another rank
 * give zeros (the MaskPartial lookup of embedding_rowwise, §2.6). */
static void lookup_local(const tp_module *emb, const tp_param_slice *sl, const int64_t *ids, int64_t T, float *y)
{
    int64_t width = tp_module_weight(emb)->shape[1];
    for (int64_t t = 0; t < T; t++) {
        int64_t row = ids[t], base = 0, found = sl->dim != 0;
        for (int i = 0; sl->dim == 0 && i < sl->n && !found; base += sl->len[i], i++)
            if (ids[t] >= sl->start[i] && ids[t] < sl->start[i] + sl->len[i]) { row = base + ids[t] - sl->start[i]; found = 1; }
        if (found) tp_row_to_f32(y + t * width, tp_module_weight(emb), row);
        else memset(y + t * width, 0, (size_t)width * sizeof(float));
    }
}

tp_status tp_module_embedding(tp_model *m, const tp_module *emb, const int64_t *ids, int64_t T, tp_act *y)
{
    const struct tp_module_tp *mt = emb->tp;
    tp_status s = check_ids(m, ids, T);
    if (s) return s;
    int64_t width = tp_module_weight(emb)->shape[1];
    float *buf = tp_act_alloc(m, T * width);
    if (!buf) return tp_fail(TP_ERR_NOMEM, "out of memory");
    tp_param_slice whole = {.dim = -1};
    int idx = (int)(emb - m->modules);
    if (tp_module_rows_block(m, idx, TP_MODULE_WEIGHT) > 0)   /* kept in row blocks: the hooks look up */
        s = m->hooks->rows.rows_lookup(m->hooks->ctx, m, idx, TP_MODULE_WEIGHT, ids, T, buf);
    else
        lookup_local(emb, mt ? &mt->weight_slice : &whole, ids, T, buf);
    if (s) { tp_act_free(m, buf); return s; }
    if ((s = tp_lora_apply_embedding(m, emb, ids, T, buf))) { tp_act_free(m, buf); return s; }
    if (!mt || !mt->plan || !mt->plan->fwd.installed || !m->tp->mesh) {
        *y = (tp_act){buf, T, width, width, tp_replicate()};
        return TP_OK;
    }
    const tp_forward_desc *d = &mt->plan->fwd;
    tp_module_ctx ctx = tp_module_ctx_of(m, mt, NULL);
    int64_t gout[2] = {T, mt->in_features};
    tp_dtensor yd;
    s = tp_dtensor_from_local(&yd, m->tp->mesh, &d->local_output, TP_F32, 2, gout, buf);
    if (!s) {
        double t0 = tp_now();
        s = tp_style_post_forward(mt->plan->style, &ctx, d, &yd);
        m->comm_seconds += tp_now() - t0;
        if (!s) s = tp_act_take_local(m, &yd, gout[1], &buf, y);
        else tp_dtensor_release(&yd);
    }
    tp_act_free(m, buf);
    return s;
}

/* f->tokens -> f->x, the residual stream, which must come back whole. */
static tp_status embedding_forward(tp_model *m, const tp_module *mod, tp_forward_pass *f)
{
    tp_status st = tp_module_embedding(m, mod, f->tokens, f->T, &f->x);
    if (!st && (f->x.width != m->cfg.hidden_size || f->x.pl.kind != TP_REPLICATE))
        st = tp_fail(TP_ERR_INVALID, "the embedding output is not replicated; the plan must gather it");
    f->block_mark = tp_act_mark(m);   /* the stream outlives every block */
    return st;
}

/* The first vocabulary row this rank holds: its slice must be one range
 * of rows (embedding_rowwise) or the whole table. */
static tp_status first_row(const tp_module *emb, int64_t *row0)
{
    const tp_param_slice *sl = emb->tp ? &emb->tp->weight_slice : NULL;
    *row0 = 0;
    if (!sl || sl->dim < 0) return TP_OK;
    if (sl->dim != 0 || sl->n != 1)
        return tp_fail(TP_ERR_UNSUPPORTED, "%s: the backward of an embedding split other than by one range of "
                       "rows is not built yet", emb->name);
    *row0 = sl->start[0];
    return TP_OK;
}

/* The stream's gradient b->dx scattered into the rows of the tokens that
 * this rank holds (a tied lm_head adds its part to the same tensor).
 * Under embedding_rowwise, pre_backward takes dx (placed `output`) back to
 * the local lookup's layout: the conjugate of Partial -> Replicate leaves
 * the replicated gradient whole on every rank. */
static tp_status embedding_backward(tp_model *m, const tp_module *mod, tp_backward_pass *b)
{
    const tp_tensor *w = tp_module_weight(mod);
    const struct tp_module_tp *mt = mod->tp;
    const float *dy = b->dx;
    float *dw;
    int64_t row0, g[2] = {b->T, m->cfg.hidden_size};
    tp_dtensor gy;
    int styled = mt && mt->plan && mt->plan->fwd.installed && m->tp->mesh;
    int idx = (int)(mod - m->modules);
    if (!styled && tp_module_rows_block(m, idx, TP_MODULE_WEIGHT) > 0)
        return m->hooks->rows.rows_scatter(m->hooks->ctx, m, idx, TP_MODULE_WEIGHT, b->tokens, b->T, b->dx);
    tp_status st = first_row(mod, &row0);
    if (!st) st = tp_module_grad(m, mod, TP_MODULE_WEIGHT, &dw);
    if (!st && styled) {
        tp_module_ctx ctx = tp_module_ctx_of(m, mt, NULL);
        st = tp_dtensor_from_local(&gy, m->tp->mesh, &mt->plan->fwd.output, TP_F32, 2, g, b->dx);
        if (!st && (st = tp_style_pre_backward(mt->plan->style, &ctx, &mt->plan->fwd, &gy))) tp_dtensor_release(&gy);
        if (!st && gy.local.shape[0] * gy.local.shape[1] != b->T * w->shape[1]) {
            st = tp_fail(TP_ERR_UNSUPPORTED, "%s: its style gives the lookup's backward a gradient of another "
                         "width", mod->name);
            tp_dtensor_release(&gy);
        }
        if (!st) dy = gy.local.data;
    }
    if (!st && dw) tp_embedding_backward(dw, row0, w->shape[0], w->shape[1], b->tokens, dy, b->T, m->pool);
    if (!st) st = tp_lora_backward_embedding(m, mod, b->tokens, dy, b->T);
    if (!st && styled) tp_dtensor_release(&gy);
    return st;
}

const tp_module_ops tp_embedding_ops = {"embedding", embedding_forward, embedding_backward};
