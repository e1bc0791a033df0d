/* Running one module's forward under its TP style: the style's pre_forward
 * brings the input into the layout the local computation needs, the module
 * computes on its local shards, and post_forward reduces or gathers the
 * output (tp-semantics.md §3.2).  A module without a style runs plainly. */
#include "tp_module.h"

#include "tensorpar/kernels.h"

#include <stdlib.h>
#include <string.h>

int64_t tp_act_offset(const tp_model *m, const tp_act *a)
{
    if (a->pl.kind != TP_SHARD || !m->tp) return 0;
    int64_t start, size;
    tp_chunk_range(a->gwidth, m->tp->size, m->tp->rank, &start, &size);
    return start;
}

static tp_module_ctx module_ctx(const tp_model *m, const struct tp_module_tp *mt, const tp_tensor *bias)
{
    tp_module_ctx c = {mt->name, mt->kind, m->tp->size, m->tp->rank, &m->cfg, m->tp->mesh, bias};
    return c;
}

/* Takes the local buffer of a DTensor as an owned activation.  When the
 * style's hook left the result in *mine (a local computation's output that
 * needed no collective, or an all-reduce done in place), that buffer is
 * handed over as it is and *mine becomes NULL: no copy of a [T, width]
 * activation per module. */
static tp_status take_local(tp_model *m, tp_dtensor *d, int64_t gwidth, float **mine, tp_act *y)
{
    int64_t T = d->local.shape[0], width = d->local.shape[1];
    if (mine && *mine && d->local.data == *mine && !d->local.owns_data) {
        *y = (tp_act){*mine, T, width, gwidth, d->placements[0]};
        *mine = NULL;
        tp_dtensor_release(d);
        return TP_OK;
    }
    float *data = tp_act_alloc(m, T * width);
    if (!data) { tp_dtensor_release(d); return tp_fail(TP_ERR_NOMEM, "out of memory"); }
    memcpy(data, d->local.data, (size_t)(T * width) * sizeof(float));
    *y = (tp_act){data, T, width, gwidth, d->placements[0]};
    tp_dtensor_release(d);
    return TP_OK;
}

static tp_status linear_plain(tp_model *m, const tp_linear *lin, const char *name, const float *x, int64_t T,
                              int64_t x_width, tp_act *y)
{
    int64_t in = lin->weight.shape[1], out = lin->weight.shape[0];
    if (x_width != in)
        return tp_fail(TP_ERR_INVALID, "%s expects %lld input features on this rank but gets %lld "
                       "(the plan leaves its input in another layout)", name, (long long)in, (long long)x_width);
    y->data = tp_act_alloc(m, T * out);
    if (!y->data) return tp_fail(TP_ERR_NOMEM, "out of memory");
    y->T = T;
    y->width = y->gwidth = out;
    y->pl = tp_replicate();
    tp_status s = tp_matmul(y->data, x, T, &lin->weight, lin->bias.data ? &lin->bias : NULL, m->pool);
    if (s) tp_act_release(m, y);
    return s;
}

/* The local computation between the hooks: y = x·Wᵀ (+ b unless the style
 * adds the bias after its reduction). */
static tp_status linear_local(tp_model *m, const tp_linear *lin, const struct tp_module_tp *mt,
                              const tp_dtensor *xd, float **y)
{
    int64_t T = xd->local.shape[0], in = lin->weight.shape[1], out = lin->weight.shape[0];
    if (xd->local.shape[1] != in)
        return tp_fail(TP_ERR_INVALID, "%s: its style gives the local computation %lld input features, "
                       "its weight shard has %lld", mt->name, (long long)xd->local.shape[1], (long long)in);
    *y = tp_act_alloc(m, T * out);
    if (!*y) return tp_fail(TP_ERR_NOMEM, "out of memory");
    const tp_tensor *bias = lin->bias.data && !mt->plan->fwd.bias_after_reduce ? &lin->bias : NULL;
    return tp_matmul(*y, xd->local.data, T, &lin->weight, bias, m->pool);
}

/* Under KV-head replication a rank's k/v output is one whole head: it is a
 * shard of the heads repeated kv_rep times, a tensor P times as wide. */
static int64_t output_width(const tp_model *m, const struct tp_module_tp *mt, const tp_linear *lin)
{
    return mt->kv_rep > 1 ? lin->weight.shape[0] * m->tp->size : mt->out_features;
}

int64_t tp_module_out_width(const tp_model *m, const tp_linear *lin)
{
    const struct tp_module_tp *mt = lin->tp;
    if (!mt || !mt->plan || !mt->plan->fwd.installed || !m->tp->mesh) return lin->weight.shape[0];
    tp_placement out = mt->plan->fwd.output;
    int64_t global = output_width(m, mt, lin), start, size;
    if (out.kind == TP_REPLICATE) return global;
    tp_chunk_range(global, m->tp->size, m->tp->rank, &start, &size);
    return size;
}

tp_status tp_module_linear(tp_model *m, const tp_linear *lin, const float *x, int64_t T, int64_t x_width,
                           tp_act *y)
{
    const struct tp_module_tp *mt = lin->tp;
    if (!mt || !mt->plan || !mt->plan->fwd.installed || !m->tp->mesh)
        return linear_plain(m, lin, mt ? mt->name : "a Linear module", x, T, x_width, y);
    const tp_forward_desc *d = &mt->plan->fwd;
    tp_module_ctx ctx = module_ctx(m, mt, d->bias_after_reduce && lin->bias.data ? &lin->bias : NULL);
    int64_t gin[2] = {T, mt->in_features}, gout[2] = {T, output_width(m, mt, lin)};
    tp_dtensor xd, yd;
    tp_status s = tp_dtensor_from_local(&xd, m->tp->mesh, &d->input, TP_F32, 2, gin, (void *)x);
    if (s) return tp_fail_context(s, "%s: its input does not have the layout its style declares", mt->name);
    (void)x_width;
    void *state = NULL;
    float *ybuf = NULL;
    /* All placement changes happen inside the two hooks, so the time spent
     * there is the module's communication (including waiting for peers). */
    double t0 = tp_now();
    s = tp_style_pre_forward(mt->plan->style, &ctx, d, &xd);
    m->comm_seconds += tp_now() - t0;
    if (!s && !(s = tp_style_context_enter(mt->plan->style, &ctx, &state))) {
        s = linear_local(m, lin, mt, &xd, &ybuf);
        tp_style_context_leave(mt->plan->style, &ctx, state);
    }
    tp_dtensor_release(&xd);
    if (!s) s = tp_dtensor_from_local(&yd, m->tp->mesh, &d->local_output, TP_F32, 2, gout, ybuf);
    if (!s) {
        t0 = tp_now();
        s = tp_style_post_forward(mt->plan->style, &ctx, d, &yd);
        m->comm_seconds += tp_now() - t0;
        if (!s) s = take_local(m, &yd, gout[1], &ybuf, y);
        else tp_dtensor_release(&yd);
    }
    tp_act_free(m, ybuf);
    return s;
}

/* ---- embedding -------------------------------------------------------- */

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
static void lookup_local(const tp_linear *emb, const tp_param_slice *sl, const int64_t *ids, int64_t T, float *y)
{
    int64_t width = emb->weight.shape[1];
    for (int64_t t = 0; t < T; t++) {
        int64_t row = ids[t], base = 0, found = sl->dim != 0;
        for (int i = 0; sl->dim == 0 && i < sl->n && !found; base += sl->len[i], i++)
            if (ids[t] >= sl->start[i] && ids[t] < sl->start[i] + sl->len[i]) { row = base + ids[t] - sl->start[i]; found = 1; }
        if (found) tp_row_to_f32(y + t * width, &emb->weight, row);
        else memset(y + t * width, 0, (size_t)width * sizeof(float));
    }
}

tp_status tp_module_embedding(tp_model *m, const int64_t *ids, int64_t T, tp_act *y)
{
    const tp_linear *emb = &m->embed_tokens;
    const struct tp_module_tp *mt = emb->tp;
    tp_status s = check_ids(m, ids, T);
    if (s) return s;
    int64_t width = emb->weight.shape[1];
    float *buf = tp_act_alloc(m, T * width);
    if (!buf) return tp_fail(TP_ERR_NOMEM, "out of memory");
    tp_param_slice whole = {.dim = -1};
    lookup_local(emb, mt ? &mt->weight_slice : &whole, ids, T, buf);
    if (!mt || !mt->plan || !mt->plan->fwd.installed || !m->tp->mesh) {
        *y = (tp_act){buf, T, width, width, tp_replicate()};
        return TP_OK;
    }
    const tp_forward_desc *d = &mt->plan->fwd;
    tp_module_ctx ctx = module_ctx(m, mt, NULL);
    int64_t gout[2] = {T, mt->in_features};
    tp_dtensor yd;
    s = tp_dtensor_from_local(&yd, m->tp->mesh, &d->local_output, TP_F32, 2, gout, buf);
    if (!s) {
        double t0 = tp_now();
        s = tp_style_post_forward(mt->plan->style, &ctx, d, &yd);
        m->comm_seconds += tp_now() - t0;
        if (!s) s = take_local(m, &yd, gout[1], &buf, y);
        else tp_dtensor_release(&yd);
    }
    tp_act_free(m, buf);
    return s;
}
