/* The RMSNorm modules of the residual stream (input_layernorm,
 * post_attention_layernorm, model.norm): each adds the pending block output
 * to the stream and norms it, fused in one pass; under a sequence_parallel
 * rule each rank norms its own rows.  (Qwen3's per-head q_norm/k_norm run
 * inside the attention module.)  Backward: the norm's
 * gradient into the stream's (and the rules' param_grad). */
#include "tp_module.h"

#include "tensorpar/kernels.h"

#include <stdlib.h>
#include <string.h>

/* ---- sequence-parallel norms ------------------------------------------ */

const tp_module_plan *tp_module_norm_rule(const tp_model *m, const tp_module *norm)
{
    if (!m->tp || !m->tp->mesh) return NULL;
    return norm->plan;
}

tp_status tp_module_norm_sp(tp_model *m, const tp_module_plan *rule, const float *x, const tp_tensor *w,
                            int64_t T, int64_t width, float *h)
{
    const tp_forward_desc *d = &rule->fwd;
    tp_module_ctx ctx = {rule->name, rule->kind, m->tp->size, m->tp->rank, &m->cfg, m->tp->mesh, NULL};
    int64_t g[2] = {T, width};
    tp_placement rep = tp_replicate();
    tp_dtensor xd, own, yd, out;
    /* The stream is a handle whose layout is known (Replicate): it is
     * redistributed to the declared input, not relabelled (§2.10). */
    tp_status s = tp_dtensor_from_local(&xd, m->tp->mesh, &rep, TP_F32, 2, g, (void *)x);
    if (s) return s;
    double t0 = tp_now();
    s = tp_redistribute(&xd, &d->input, &own);
    tp_dtensor_release(&xd);
    if (!s) s = tp_style_pre_forward(rule->style, &ctx, d, &own);
    m->comm_seconds += tp_now() - t0;
    if (s) return s;
    int64_t rows = own.local.shape[0];
    float *y = tp_act_alloc(m, rows * width > 0 ? rows * width : 1);
    if (!y) { tp_dtensor_release(&own); return tp_fail(TP_ERR_NOMEM, "out of memory"); }
    tp_rmsnorm(y, own.local.data, w, rows, width, m->cfg.rms_norm_eps);
    tp_dtensor_release(&own);
    s = tp_dtensor_from_local(&yd, m->tp->mesh, &d->local_output, TP_F32, 2, g, y);
    if (s) { tp_act_free(m, y); return s; }
    t0 = tp_now();
    s = tp_style_post_forward(rule->style, &ctx, d, &yd);
    /* the consumers declare Replicate: the gather is theirs (§1.5) */
    if (!s) s = tp_redistribute(&yd, &rep, &out);
    m->comm_seconds += tp_now() - t0;
    tp_dtensor_release(&yd);
    tp_act_free(m, y);
    if (s) return s;
    memcpy(h, out.local.data, (size_t)(T * width) * sizeof(float));
    tp_dtensor_release(&out);
    return TP_OK;
}


/* ---- the residual add and norm under TP --------------------------------
 * o_proj and down_proj are rowwise: each rank holds a partial sum of the
 * block's output, which the plan all-reduces; then every rank adds it to
 * the residual stream and norms all T rows, the same work on each.  For a
 * prompt, the block output is instead moved as a DTensor Partial ->
 * Shard(rows) -> Replicate with the add and norm as the row-wise epilogue
 * between (tp_redistribute_rows): each rank reduces its own rows (its share
 * of the all-reduce anyway), adds and norms them while they are in its
 * cache, and what every rank receives is the next block's normed input.
 * Each rank then keeps only its own rows of the residual stream.  The bits
 * are the all-reduce's: every row sums the same terms in rank order, and
 * add and norm are row-wise.  forward.c decides per pass (sc->fused). */

typedef struct {
    float *x;
    const tp_tensor *w;
    int64_t H;
    double eps, seconds;   /* seconds: time in the add and norm */
} add_norm_rows_ctx;

static void add_norm_rows(void *p, int64_t first, int64_t nrows, float *rows)
{
    add_norm_rows_ctx *c = p;
    double t0 = tp_now();
    tp_add_rmsnorm(c->x + first * c->H, rows, rows, c->w, nrows, c->H, c->eps);
    c->seconds += tp_now() - t0;
}

/* x += y, then sc->h = norm(x): the next block's input, whole on every
 * rank.  Under the fused norm y is partial and x keeps this rank's rows;
 * the collective counts as communication, the add and norm in it do not. */
static tp_status add_norm(tp_model *m, fwd_scratch *sc, float *x, const tp_act *y, const tp_tensor *norm,
                          const tp_module_plan *sp, int64_t T)
{
    int64_t H = m->cfg.hidden_size;
    if (!sc->fused && sp) {   /* sequence_parallel norm: the add on every row, the norm on own rows */
        for (int64_t i = 0; i < T * H; i++) x[i] += y->data[i];
        return tp_module_norm_sp(m, sp, x, norm, T, H, sc->h);
    }
    if (!sc->fused) {
        tp_par_add_rmsnorm(m, x, y->data, sc->h, norm, T, H);
        return TP_OK;
    }
    /* The fused form below already norms each rank's own rows and gathers
     * them: under a sequence_parallel norm it is that rule's effect too. */
    add_norm_rows_ctx c = {x, norm, H, m->cfg.rms_norm_eps, 0};
    double t0 = tp_now();
    tp_redist_epilogue ep = {add_norm_rows, &c};
    tp_status st = tp_redistribute_rows(m->tp->mesh, (int64_t[2]){T, H}, y->data, sc->h, &ep);
    m->comm_seconds += tp_now() - t0 - c.seconds;
    return st;
}

/* f->sc.h = norm(f->x + f->pending); the pending output is consumed.  The
 * first norm (after the embedding) has nothing pending. */
static tp_status stream_norm(tp_model *m, const tp_module *mod, tp_forward_pass *f)
{
    int64_t H = m->cfg.hidden_size;
    const tp_tensor *w = tp_module_weight(mod);
    const tp_module_plan *sp = tp_module_norm_rule(m, mod);
    if (f->pending.data) {
        tp_status st = add_norm(m, &f->sc, f->x.data, &f->pending, w, sp, f->T);
        tp_act_release(m, &f->pending);
        return st;
    }
    if (sp) return tp_module_norm_sp(m, sp, f->x.data, w, f->T, H, f->sc.h);
    tp_par_rmsnorm(m, f->sc.h, f->x.data, w, f->T, H);
    return TP_OK;
}

/* A stream norm ends a block: what the block allocated after the
 * embedding's mark (q, k, v, gate, up, their outputs) dies here, so the
 * activation arena holds one block's working set (act_arena.c). */
static tp_status norm_forward(tp_model *m, const tp_module *mod, tp_forward_pass *f)
{
    tp_status st = stream_norm(m, mod, f);
    if (!st && f->save) {   /* training: the backward reads the stream after the add and its norm */
        float **x, **h;
        int64_t n = f->T * m->cfg.hidden_size;
        tp_train_norm_slots(m, mod, f->save, &x, &h);
        if (!(*x = tp_train_save(f->save, f->x.data, n)) || !(*h = tp_train_save(f->save, f->sc.h, n)))
            st = TP_ERR_NOMEM;
    }
    tp_act_rewind(m, f->block_mark);
    return st;
}

/* ---- backward ------------------------------------------------------------ */

/* The rule on a norm whose parameter gradient a style reduces
 * (replicated_with_grad_allreduce on Qwen3's q_norm/k_norm: each rank
 * normed its own heads, so its gradient is a partial sum), or NULL. */
static const tp_module_plan *grad_rule(const tp_model *m, const tp_module *norm)
{
    if (!m->tp || !m->tp->mesh || !m->tp->res->applied) return NULL;
    const tp_module_plan *r = tp_plan_find_module(m->tp->res, norm->name);
    return r && r->fwd.installed ? r : NULL;
}

tp_status tp_norm_add_weight_grad(tp_model *m, const tp_module *norm, float *g)
{
    const tp_module_param *p = &norm->params[TP_MODULE_WEIGHT];
    int64_t n = p->local.shape[0];
    float *dst;
    tp_status s = tp_module_grad(m, norm, TP_MODULE_WEIGHT, &dst);
    if (s || !dst) return s;   /* a frozen base: no gradient (on every rank alike) */
    const tp_module_plan *r = grad_rule(m, norm);
    tp_dtensor gd;
    int have = 0;
    if (!s && r) {
        tp_module_ctx ctx = {r->name, r->kind, m->tp->size, m->tp->rank, &m->cfg, m->tp->mesh, NULL};
        s = tp_dtensor_from_local(&gd, m->tp->mesh, &p->placement, TP_F32, 1, p->shape, g);
        have = !s;
        if (!s) s = tp_style_param_grad(r->style, &ctx, &r->fwd, &gd);
        if (!s) g = gd.local.data;
    }
    for (int64_t i = 0; !s && i < n; i++) dst[i] += g[i];
    if (have) tp_dtensor_release(&gd);
    return s;
}

/* A sequence_parallel norm backward, its forward's moves in reverse
 * (tp_module_norm_sp): the whole dh back to this rank's rows (the conjugate
 * of the all-gather: a slice), pre_backward, the norm's backward on those
 * rows, post_backward, and the conjugate of Replicate -> Shard(rows): an
 * all-gather of the input gradient, added to dx.  The weight's gradient
 * from this rank's rows is a partial sum, which the rule's param_grad
 * reduces (tp_norm_add_weight_grad). */
typedef struct {
    tp_dtensor g, own, gx;
    int have_g, have_own, have_gx;
} sp_bwd;

static void sp_bwd_free(sp_bwd *b)
{
    if (b->have_g) tp_dtensor_release(&b->g);
    if (b->have_own) tp_dtensor_release(&b->own);
    if (b->have_gx) tp_dtensor_release(&b->gx);
}

/* Replaces *d (owned) by the conjugate move of the forward's `src -> ...`. */
static tp_status move_back(tp_dtensor *d, const tp_placement *src)
{
    tp_dtensor out;
    tp_status s = tp_redistribute_backward(d, src, &out);
    if (s) return s;
    tp_dtensor_release(d);
    *d = out;
    return TP_OK;
}

static tp_status norm_sp_backward(tp_model *m, const tp_module_plan *rule, const tp_module *mod,
                                  tp_backward_pass *b, const float *x, float *dw)
{
    const tp_forward_desc *d = &rule->fwd;
    tp_module_ctx ctx = {rule->name, rule->kind, m->tp->size, m->tp->rank, &m->cfg, m->tp->mesh, NULL};
    int64_t H = m->cfg.hidden_size, g2[2] = {b->T, H};
    tp_placement rep = tp_replicate(), in_pl = tp_style_local_input_grad_layout(d);
    sp_bwd k = {0};
    tp_dtensor xd;
    tp_status s = tp_dtensor_from_local(&k.g, m->tp->mesh, &rep, TP_F32, 2, g2, b->dh);
    k.have_g = !s;
    if (!s) s = move_back(&k.g, &d->output);
    if (!s) s = tp_style_pre_backward(rule->style, &ctx, d, &k.g);
    /* this rank's rows of x, as the forward took them */
    if (!s && !(s = tp_dtensor_from_local(&xd, m->tp->mesh, &rep, TP_F32, 2, g2, (void *)x))) {
        s = tp_redistribute(&xd, &d->input, &k.own);
        tp_dtensor_release(&xd);
        k.have_own = !s;
    }
    if (!s) s = tp_style_pre_forward(rule->style, &ctx, d, &k.own);
    int64_t rows = k.have_own ? k.own.local.shape[0] : 0;
    float *dxl = s ? NULL : calloc((size_t)(rows * H > 0 ? rows * H : 1), sizeof(float));
    if (!s && !dxl) s = tp_fail(TP_ERR_NOMEM, "out of memory");
    if (!s && k.g.local.shape[0] != rows)
        s = tp_fail(TP_ERR_UNSUPPORTED, "%s: its style gives the norm's backward %lld rows of gradient for %lld "
                    "rows of input", mod->name, (long long)k.g.local.shape[0], (long long)rows);
    if (!s) s = tp_rmsnorm_backward(dxl, dw, k.g.local.data, k.own.local.data, tp_module_weight(mod), rows, H,
                                    m->cfg.rms_norm_eps);
    if (!s) s = tp_dtensor_from_local(&k.gx, m->tp->mesh, &in_pl, TP_F32, 2, g2, dxl);
    k.have_gx = !s;
    if (!s) s = tp_style_post_backward(rule->style, &ctx, d, &k.gx);
    if (!s) s = move_back(&k.gx, &rep);
    if (!s) {
        const float *v = k.gx.local.data;
        for (int64_t i = 0; i < b->T * H; i++) b->dx[i] += v[i];
    }
    free(dxl);
    sp_bwd_free(&k);
    return s;
}

/* The gradient b->dh of this norm's output, through the norm, is added to
 * b->dx: dx then is the gradient of the stream after the residual add,
 * which is also that of both addends (the stream before it, and the
 * pending block output the block's backward reads next).  Under TP the
 * stream and its norm are whole on every rank: so is the gradient. */
static tp_status norm_backward(tp_model *m, const tp_module *mod, tp_backward_pass *b)
{
    float **x, **h;
    int64_t H = m->cfg.hidden_size;
    const tp_module_plan *sp = tp_module_norm_rule(m, mod);
    tp_train_norm_slots(m, mod, (tp_train_acts *)b->saved, &x, &h);
    float *dw = calloc((size_t)H, sizeof(float));
    tp_status st = dw ? TP_OK : tp_fail(TP_ERR_NOMEM, "out of memory");
    if (!st && sp) st = norm_sp_backward(m, sp, mod, b, *x, dw);
    else if (!st)
        st = tp_rmsnorm_backward(b->dx, dw, b->dh, *x, tp_module_weight(mod), b->T, H, m->cfg.rms_norm_eps);
    if (!st) st = tp_norm_add_weight_grad(m, mod, dw);
    free(dw);
    return st;
}

const tp_module_ops tp_norm_ops = {"norm", norm_forward, norm_backward};
