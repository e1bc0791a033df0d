/* The Linear module, y = x·Wᵀ + b, run under its TP style: the style's
 * pre_forward brings the input into the layout the local computation
 * needs, the module computes on its local shards, and post_forward reduces
 * or gathers the output (tp-semantics.md §3.2).  A module without a style
 * runs plainly.  Also the output of a block (self_attn, mlp) through the
 * block's own rule, and the Linear's ops table.  Backward: the three
 * GEMMs of tp_matmul_backward through the style's backward hooks. */
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

tp_module_ctx tp_module_ctx_of(const tp_model *m, const struct tp_module_tp *mt, const tp_tensor *bias)
{
    tp_module_ctx c = {mt->name, mt->kind, m->tp->size, m->tp->rank, &m->cfg, m->tp->mesh, bias};
    return c;
}

/* Takes the local buffer of a DTensor as an owned activation.  When the
 * style's hook left the result in *mine (a local computation's output that
 * needed no collective, or an all-reduce done in place), that buffer is
 * handed over as it is and *mine becomes NULL: no copy of a [T, width]
 * activation per module. */
tp_status tp_act_take_local(tp_model *m, tp_dtensor *d, int64_t gwidth, float **mine, tp_act *y)
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

/* Under KV-head replication a rank's k/v output is one whole head: it is a
 * shard of the heads repeated kv_rep times, a tensor P times as wide. */
static int64_t output_width(const tp_model *m, const struct tp_module_tp *mt, const tp_module *lin)
{
    return mt->kv_rep > 1 ? tp_module_weight(lin)->shape[0] * m->tp->size : mt->out_features;
}

int64_t tp_module_out_width(const tp_model *m, const tp_module *lin)
{
    const struct tp_module_tp *mt = lin->tp;
    if (!mt || !mt->plan || !mt->plan->fwd.installed || !m->tp->mesh) return tp_module_weight(lin)->shape[0];
    tp_placement out = mt->plan->fwd.output;
    int64_t global = output_width(m, mt, lin), start, size;
    if (out.kind == TP_REPLICATE) return global;
    tp_chunk_range(global, m->tp->size, m->tp->rank, &start, &size);
    return size;
}

/* ---- Linear modules ---------------------------------------------------
 * A group of modules reads one input (q, k, v; gate, up).  Each runs its
 * own style's hooks; the local computations of all whose pre_forward left
 * x where it was go to one tp_matmul_group call, which packs x once for all
 * of them.  One module is a group of one. */

#define GROUP_MAX 4

typedef struct {
    const tp_module *lin;
    const struct tp_module_tp *mt;  /* NULL when the module runs plainly */
    tp_module_ctx ctx;
    tp_dtensor xd;                  /* TP: the input after pre_forward   */
    int have_xd, entered;
    void *state;
    float *y;                       /* the local output                  */
    float *into;                    /* RUN_LOCAL: the caller's buffer for y, or NULL */
} module_run;

static int runs_plainly(const tp_model *m, const struct tp_module_tp *mt)
{
    return !mt || !mt->plan || !mt->plan->fwd.installed || !m->tp->mesh;
}

static const char *module_name(const module_run *r)
{
    return r->mt ? r->mt->name : "a Linear module";
}

/* Up to the local computation: pre_forward and the context (TP), the input
 * width check, the output buffer.  *input is what the GEMM reads. */
static tp_status module_begin(tp_model *m, module_run *r, const float *x, int64_t T, int64_t x_width,
                              const float **input)
{
    int64_t in = tp_module_weight(r->lin)->shape[1], out = tp_module_weight(r->lin)->shape[0];
    *input = x;
    if (r->mt) {
        const tp_forward_desc *d = &r->mt->plan->fwd;
        int64_t gin[2] = {T, r->mt->in_features};
        tp_status s = tp_dtensor_from_local(&r->xd, m->tp->mesh, &d->input, TP_F32, 2, gin, (void *)x);
        if (s) return tp_fail_context(s, "%s: its input does not have the layout its style declares", r->mt->name);
        r->have_xd = 1;
        /* All placement changes happen inside the two hooks, so the time
         * spent there is the module's communication (including waiting). */
        double t0 = tp_now();
        s = tp_style_pre_forward(r->mt->plan->style, &r->ctx, d, &r->xd);
        m->comm_seconds += tp_now() - t0;
        if (s || (s = tp_style_context_enter(r->mt->plan->style, &r->ctx, &r->state))) return s;
        r->entered = 1;
        *input = r->xd.local.data;
        x_width = r->xd.local.shape[1];
        if (x_width != in)
            return tp_fail(TP_ERR_INVALID, "%s: its style gives the local computation %lld input features, "
                           "its weight shard has %lld", r->mt->name, (long long)x_width, (long long)in);
    } else if (x_width != in) {
        return tp_fail(TP_ERR_INVALID, "%s expects %lld input features on this rank but gets %lld "
                       "(the plan leaves its input in another layout)", module_name(r), (long long)in,
                       (long long)x_width);
    }
    r->y = r->into ? r->into : tp_act_alloc(m, T * out);
    return r->y ? TP_OK : tp_fail(TP_ERR_NOMEM, "out of memory");
}

/* The local bias: a plain module's, or a style's that does not add it
 * after its reduction. */
static const tp_tensor *local_bias(const module_run *r)
{
    if (!tp_module_bias(r->lin)->data || (r->mt && r->mt->plan->fwd.bias_after_reduce)) return NULL;
    return tp_module_bias(r->lin);
}

static void module_leave(module_run *r)
{
    if (r->entered) tp_style_context_leave(r->mt->plan->style, &r->ctx, r->state);
    r->entered = 0;
    if (r->have_xd) tp_dtensor_release(&r->xd);
    r->have_xd = 0;
}

/* post_forward and the output activation. */
static tp_status module_finish(tp_model *m, module_run *r, int64_t T, tp_act *y)
{
    int64_t out = tp_module_weight(r->lin)->shape[0];
    if (!r->mt) {
        /* No hooks: the layout is what its shards give (a parameter rule
         * alone may shard them), which plan resolution checked. */
        const struct tp_module_tp *mt = r->lin->tp;
        int split = mt && m->tp->res->applied;
        *y = (tp_act){r->y, T, out, split ? output_width(m, mt, r->lin) : out, split ? mt->out_pl : tp_replicate()};
        r->y = NULL;
        return TP_OK;
    }
    const tp_forward_desc *d = &r->mt->plan->fwd;
    int64_t gout[2] = {T, output_width(m, r->mt, r->lin)};
    tp_dtensor yd;
    tp_status s = tp_dtensor_from_local(&yd, m->tp->mesh, &d->local_output, TP_F32, 2, gout, r->y);
    if (s) return s;
    double t0 = tp_now();
    s = tp_style_post_forward(r->mt->plan->style, &r->ctx, d, &yd);
    m->comm_seconds += tp_now() - t0;
    if (!s) return tp_act_take_local(m, &yd, gout[1], &r->y, y);
    tp_dtensor_release(&yd);
    return s;
}

/* The local computations: the modules reading x itself in one group call,
 * any other alone. */
static tp_status compute_local(tp_model *m, module_run *runs, const float *const *inputs, int count,
                               const float *x, int64_t T)
{
    tp_matmul_opts opts = m->matmul;
    tp_matmul_out outs[GROUP_MAX];
    memset(outs, 0, sizeof outs);
    int n = 0;
    tp_status s = TP_OK;
    for (int i = 0; i < count && !s; i++) {
        if (inputs[i] == x) outs[n++] = (tp_matmul_out){runs[i].y, tp_module_weight(runs[i].lin), local_bias(&runs[i])};
        else s = tp_matmul_ex(runs[i].y, inputs[i], T, tp_module_weight(runs[i].lin), local_bias(&runs[i]), m->pool, &opts);
    }
    if (!s) s = tp_matmul_group(outs, n, x, T, m->pool, &opts);
    /* a LoRA adapter's term joins the local output before post_forward */
    for (int i = 0; i < count && !s; i++) s = tp_lora_apply(m, runs[i].lin, inputs[i], T, runs[i].y);
    return s;
}

/* Legacy `local`: x · (W/P)ᵀ + b/P, i.e. the output divided by P, which a
 * parent summing P copies (gather) restores; the stored weights stay as
 * read. */
static void divide_output(const tp_model *m, module_run *r, int64_t T)
{
    int64_t n = T * tp_module_weight(r->lin)->shape[0];
    float P = (float)m->tp->size;
    for (int64_t i = 0; i < n; i++) r->y[i] /= P;
}

/* What run_group leaves: each output through its post_forward, the rank's
 * partial sum (the caller reduces it: tp_module_linear_partial), or the
 * local computation's output in its style's local_output layout (the
 * caller moves it: tp_module_linear_local). */
typedef enum { RUN_FINISH, RUN_PARTIAL, RUN_LOCAL } run_mode;

static tp_status run_group(tp_model *m, const tp_module *const *lins, int count, const float *x, int64_t T,
                           int64_t x_width, tp_act *ys, run_mode mode, float *into)
{
    if (count < 1 || count > GROUP_MAX)
        return tp_fail(TP_ERR_INTERNAL, "tp_module_linear_group: %d modules (1..%d)", count, GROUP_MAX);
    module_run runs[GROUP_MAX];
    const float *inputs[GROUP_MAX] = {0};
    memset(runs, 0, sizeof runs);
    memset(ys, 0, (size_t)count * sizeof *ys);
    tp_status s = TP_OK;
    for (int i = 0; i < count && !s; i++) {
        runs[i].lin = lins[i];
        runs[i].into = mode == RUN_LOCAL ? into : NULL;
        runs[i].mt = runs_plainly(m, lins[i]->tp) ? NULL : lins[i]->tp;
        if (runs[i].mt)
            runs[i].ctx = tp_module_ctx_of(m, runs[i].mt, runs[i].mt->plan->fwd.bias_after_reduce && tp_module_bias(lins[i])->data
                                                        ? tp_module_bias(lins[i]) : NULL);
        s = module_begin(m, &runs[i], x, T, x_width, &inputs[i]);
    }
    if (!s) s = compute_local(m, runs, inputs, count, x, T);
    for (int i = 0; i < count && !s; i++)
        if (runs[i].mt && runs[i].mt->plan->fwd.divide_params_by_p) divide_output(m, &runs[i], T);
    for (int i = count - 1; i >= 0; i--) module_leave(&runs[i]);   /* contexts nest */
    for (int i = 0; i < count && !s; i++) {
        int64_t out = tp_module_weight(lins[i])->shape[0];
        if (mode == RUN_FINISH) {
            s = module_finish(m, &runs[i], T, &ys[i]);
        } else if (mode == RUN_LOCAL) {
            runs[i].y = NULL;   /* the caller's */
        } else {
            ys[i] = (tp_act){runs[i].y, T, out, out, tp_partial()};
            runs[i].y = NULL;
        }
    }
    for (int i = 0; i < count; i++) {
        if (runs[i].y != runs[i].into) tp_act_free(m, runs[i].y);
        if (s) tp_act_release(m, &ys[i]);
    }
    return s;
}

tp_status tp_module_linear_group(tp_model *m, const tp_module *const *lins, int count, const float *x, int64_t T,
                                 int64_t x_width, tp_act *ys)
{
    return run_group(m, lins, count, x, T, x_width, ys, RUN_FINISH, NULL);
}

tp_status tp_module_linear(tp_model *m, const tp_module *lin, const float *x, int64_t T, int64_t x_width,
                           tp_act *y)
{
    return run_group(m, &lin, 1, x, T, x_width, y, RUN_FINISH, NULL);
}

int tp_module_output_summed(const tp_model *m, const tp_module *lin)
{
    const struct tp_module_tp *mt = lin->tp;
    if (runs_plainly(m, mt) || tp_mesh_ndim(m->tp->mesh) != 1 || mt->kv_rep > 1) return 0;
    const tp_forward_desc *d = &mt->plan->fwd;
    return d->post_forward_moves && d->local_output.kind == TP_PARTIAL &&
           d->output.kind == TP_REPLICATE && !(d->bias_after_reduce && tp_module_bias(lin)->data) &&
           output_width(m, mt, lin) == tp_module_weight(lin)->shape[0];
}

tp_status tp_module_linear_partial(tp_model *m, const tp_module *lin, const float *x, int64_t T, int64_t x_width,
                                   tp_act *y)
{
    if (!tp_module_output_summed(m, lin))
        return tp_fail(TP_ERR_INTERNAL, "%s: its output is not a plain sum over the ranks",
                       lin->tp ? lin->tp->name : "a Linear module");
    return run_group(m, &lin, 1, x, T, x_width, y, RUN_PARTIAL, NULL);
}

int tp_module_output_gathers_columns(const tp_model *m, const tp_module *lin)
{
    const struct tp_module_tp *mt = lin->tp;
    if (runs_plainly(m, mt) || tp_mesh_ndim(m->tp->mesh) != 1 || mt->kv_rep > 1) return 0;
    const tp_forward_desc *d = &mt->plan->fwd;
    int64_t start, size;
    tp_chunk_range(mt->out_features, m->tp->size, m->tp->rank, &start, &size);
    return d->post_forward_moves && !mt->plan->style->transform_grad_output_pre_backward &&
           d->local_output.kind == TP_SHARD && (d->local_output.dim == 1 || d->local_output.dim == -1) &&
           d->output.kind == TP_REPLICATE && !d->divide_params_by_p &&
           !(d->bias_after_reduce && tp_module_bias(lin)->data) &&
           output_width(m, mt, lin) == mt->out_features && tp_module_weight(lin)->shape[0] == size;
}

tp_status tp_module_linear_local(tp_model *m, const tp_module *lin, const float *x, int64_t T, int64_t x_width,
                                 float *y)
{
    if (!tp_module_output_gathers_columns(m, lin))
        return tp_fail(TP_ERR_INTERNAL, "%s: its output is not a gathered column split",
                       lin->tp ? lin->tp->name : "a Linear module");
    tp_act unused;
    return run_group(m, &lin, 1, x, T, x_width, &unused, RUN_LOCAL, y);
}

/* ---- blocks (self_attn, mlp) ----------------------------------------- */

const tp_module_plan *tp_module_block(const tp_model *m, const tp_module *block)
{
    if (!m->tp || !m->tp->mesh) return NULL;
    return block->plan;
}

tp_status tp_module_block_output(tp_model *m, const tp_module_plan *block, tp_act *y)
{
    if (!block || !block->fwd.installed || !m->tp || !m->tp->mesh) return TP_OK;
    const tp_forward_desc *d = &block->fwd;
    tp_module_ctx ctx = {block->name, block->kind, m->tp->size, m->tp->rank, &m->cfg, m->tp->mesh, NULL};
    int64_t g[2] = {y->T, y->gwidth};
    tp_dtensor yd;
    tp_status s = tp_dtensor_from_local(&yd, m->tp->mesh, &d->local_output, TP_F32, 2, g, y->data);
    if (s) return s;
    double t0 = tp_now();
    s = tp_style_post_forward(block->style, &ctx, d, &yd);
    m->comm_seconds += tp_now() - t0;
    if (s) { tp_dtensor_release(&yd); return s; }
    float *mine = y->data;
    tp_act out;
    if ((s = tp_act_take_local(m, &yd, g[1], &mine, &out))) return s;
    if (mine) tp_act_free(m, mine);
    *y = out;
    return TP_OK;
}

tp_status tp_module_block_output_backward(tp_model *m, const tp_module_plan *block, const float *dy, int64_t T,
                                          int64_t width, tp_dtensor *gy, int *have)
{
    *have = 0;
    if (!block || !block->fwd.installed || !m->tp || !m->tp->mesh) return TP_OK;
    const tp_forward_desc *d = &block->fwd;
    tp_module_ctx ctx = {block->name, block->kind, m->tp->size, m->tp->rank, &m->cfg, m->tp->mesh, NULL};
    int64_t g[2] = {T, width};
    tp_status s = tp_dtensor_from_local(gy, m->tp->mesh, &d->output, TP_F32, 2, g, (void *)dy);
    if (s) return s;
    *have = 1;
    double t0 = tp_now();
    s = tp_style_pre_backward(block->style, &ctx, d, gy);
    m->comm_seconds += tp_now() - t0;
    /* the block's last projection produced [T, width] on every rank (a
     * partial sum or the whole): its backward reads that much */
    if (!s && (gy->ndim != 2 || gy->local.shape[0] != T || gy->local.shape[1] != width))
        s = tp_fail(TP_ERR_UNSUPPORTED, "%s: its rule's pre_backward leaves a [%lld, %lld] output gradient on "
                    "this rank, not the [%lld, %lld] its last projection produced", block->name,
                    (long long)gy->local.shape[0], (long long)(gy->ndim > 1 ? gy->local.shape[1] : 1),
                    (long long)T, (long long)width);
    return s;
}

/* A module's output joins the residual stream, which every rank holds in
 * full: the output must have come back replicated. */
static tp_status check_replicated(const tp_act *y, int64_t H, const tp_module *lin)
{
    if (y->width != H || y->pl.kind != TP_REPLICATE) {
        const char *last = strrchr(lin->name, '.'), *what = last ? last + 1 : lin->name;   /* "o_proj" */
        return tp_fail(TP_ERR_INVALID, "the output of %s is not replicated (%lld of %lld features on this rank); "
                       "the plan must reduce it before the residual add", what, (long long)y->width, (long long)H);
    }
    return TP_OK;
}

tp_status tp_module_linear_to_stream(tp_model *m, const tp_forward_pass *f, const tp_module *lin,
                                     const tp_module *block, const float *in, int64_t T, int64_t width, tp_act *y)
{
    if (f->sc.fused) return tp_module_linear_partial(m, lin, in, T, width, y);
    tp_status st = tp_module_linear(m, lin, in, T, width, y);
    if (!st) st = tp_module_block_output(m, tp_module_block(m, block), y);
    return st ? st : check_replicated(y, m->cfg.hidden_size, lin);
}

/* ---- the ops table ------------------------------------------------------ */

/* A Linear on its own (lm_head): f->in [rows, in_width] -> f->out. */
static tp_status linear_forward(tp_model *m, const tp_module *mod, tp_forward_pass *f)
{
    return tp_module_linear(m, mod, f->in, f->rows, f->in_width, &f->out);
}

/* ---- backward ------------------------------------------------------------
 * y = x·Wᵀ + b: dW += dyᵀ·x, db += Σ_t dy, dx += dy·W, three GEMMs in
 * tp_matmul_backward.  Under a style the hooks run in reverse (§3.4):
 * pre_backward brings dy to what the local computation produced,
 * post_backward brings the local input gradient (Partial after a
 * replicated input: the all-reduce of AllReduceBackward) to the declared
 * input layout, param_grad reduces a weight gradient that is a partial sum.
 * Every move is a redistribute inside those hooks. */

static tp_status plain_backward(tp_model *m, const tp_module *lin, const float *dy, const float *x, int64_t T,
                                float *dx)
{
    float *dw, *db = NULL;
    tp_status st = tp_module_grad(m, lin, TP_MODULE_WEIGHT, &dw);
    if (!st && tp_module_bias(lin)->data) st = tp_module_grad(m, lin, TP_MODULE_BIAS, &db);
    if (!st) st = tp_matmul_backward_ex(dx, dw, db, dy, x, T, tp_module_weight(lin), m->pool, &m->matmul);
    if (!st) st = tp_lora_backward(m, lin, x, dy, T, dx);
    return st;
}

/* g (the local gradient of parameter j, computed alone) through the
 * style's param_grad hook, then added into the parameter's gradient. */
static tp_status add_param_grad(tp_model *m, const tp_module *lin, const tp_module_ctx *ctx, int j, float *g)
{
    const tp_module_param *p = &lin->params[j];
    const tp_module_plan *plan = lin->tp->plan;
    float *dst;
    tp_status s = tp_module_grad(m, lin, j, &dst);
    size_t n = tp_tensor_nbytes(&p->local) / tp_dtype_size(p->local.dtype);
    if (s || !dst) return s;   /* a frozen base: no gradient (on every rank alike) */
    if (!plan->style->reduce_param_grad_post_backward && !plan->fwd.param_grad_allreduce) {
        for (size_t i = 0; i < n; i++) dst[i] += g[i];   /* the default hook leaves it as it is */
        return TP_OK;
    }
    tp_dtensor gd;
    s = tp_dtensor_from_local(&gd, m->tp->mesh, &p->placement, TP_F32, p->ndim, p->shape, g);
    if (s) return s;
    s = tp_style_param_grad(plan->style, ctx, &plan->fwd, &gd);
    if (!s) {
        const float *v = gd.local.data;
        for (size_t i = 0; i < n; i++) dst[i] += v[i];
    }
    tp_dtensor_release(&gd);
    return s;
}

/* Partial -> Replicate in place: buf, this rank's addend of an f32 tensor
 * of shape, becomes the sum over the model's mesh on every rank. */
tp_status tp_sum_partial(tp_model *m, int ndim, const int64_t *shape, float *buf)
{
    tp_placement part = tp_partial(), rep = tp_replicate();
    tp_dtensor src, sum;
    tp_status s = tp_dtensor_from_local(&src, m->tp->mesh, &part, TP_F32, ndim, shape, buf);
    if (s) return s;
    s = tp_redistribute(&src, &rep, &sum);
    tp_dtensor_release(&src);
    if (s) return s;
    int64_t n = 1;
    for (int d = 0; d < ndim; d++) n *= shape[d];
    memcpy(buf, sum.local.data, (size_t)n * sizeof(float));
    tp_dtensor_release(&sum);
    return TP_OK;
}

/* Under KV-head replication (P > num_key_value_heads) the kv_rep ranks of
 * a KV subgroup hold the same k/v head, each having computed its part from
 * its own query heads: the head's gradient is their sum, which every one
 * of them must hold (§9.3: so that the replicas stay identical).  Each
 * rank's part goes in its place in a zero tensor of the global shape, the
 * ranks sum it (Partial -> Replicate, the one redistribute), and each
 * takes its rows back. */
tp_status tp_sum_kv_rows(tp_model *m, const tp_param_slice *sl, int ndim, const int64_t *shape, float *g,
                         const char *what)
{
    int64_t inner = ndim > 1 ? shape[1] : 1, row0 = sl->start[0], rows = sl->len[0];
    if (sl->dim != 0 || sl->n != 1)
        return tp_fail(TP_ERR_INTERNAL, "%s: a replicated KV head is not one range of rows", what);
    float *full = calloc((size_t)(shape[0] * inner), sizeof(float));
    if (!full) return tp_fail(TP_ERR_NOMEM, "out of memory");
    memcpy(full + row0 * inner, g, (size_t)(rows * inner) * sizeof(float));
    tp_status s = tp_sum_partial(m, ndim, shape, full);
    if (!s) memcpy(g, full + row0 * inner, (size_t)(rows * inner) * sizeof(float));
    free(full);
    return s;
}

static tp_status sum_kv_group(tp_model *m, const tp_module *lin, int j, float *g)
{
    const tp_module_param *p = &lin->params[j];
    char what[200];
    snprintf(what, sizeof what, "%s.%s", lin->name, p->suffix);
    return tp_sum_kv_rows(m, &p->slice, p->ndim, p->shape, g, what);
}

typedef struct {
    tp_dtensor gy, xd, gx;
    int have_gy, have_xd, have_gx;
    float *dw, *db, *dxl;
} lin_bwd;

static void lin_bwd_free(lin_bwd *b)
{
    if (b->have_gy) tp_dtensor_release(&b->gy);
    if (b->have_xd) tp_dtensor_release(&b->xd);
    if (b->have_gx) tp_dtensor_release(&b->gx);
    free(b->dw); free(b->db); free(b->dxl);
}

/* The local computation's input and output gradient: x through
 * pre_forward again (what the forward's GEMM read), dy through
 * pre_backward. */
static tp_status local_operands(tp_model *m, const struct tp_module_tp *mt, const tp_module_ctx *ctx,
                                const float *dy, int dy_local, const float *x, int64_t T, int64_t gout, lin_bwd *b)
{
    const tp_forward_desc *d = &mt->plan->fwd;
    int64_t gy_shape[2] = {T, gout}, gx_shape[2] = {T, mt->in_features};
    const tp_placement *gy_pl = dy_local ? &d->local_output : &d->output;
    tp_status s = tp_dtensor_from_local(&b->gy, m->tp->mesh, gy_pl, TP_F32, 2, gy_shape, (void *)dy);
    b->have_gy = !s;
    if (!s && !dy_local) s = tp_style_pre_backward(mt->plan->style, ctx, d, &b->gy);
    if (!s) s = tp_dtensor_from_local(&b->xd, m->tp->mesh, &d->input, TP_F32, 2, gx_shape, (void *)x);
    b->have_xd = !s;
    if (!s) s = tp_style_pre_forward(mt->plan->style, ctx, d, &b->xd);
    return s;
}

static tp_status styled_backward(tp_model *m, const tp_module *lin, const float *dy, int dy_local, const float *x,
                                 int64_t T, float *dx)
{
    const struct tp_module_tp *mt = lin->tp;
    const tp_forward_desc *d = &mt->plan->fwd;
    const tp_tensor *W = tp_module_weight(lin), *bias = tp_module_bias(lin);
    int64_t out = W->shape[0], in = W->shape[1];
    tp_module_ctx ctx = tp_module_ctx_of(m, mt, d->bias_after_reduce && bias->data ? bias : NULL);
    lin_bwd b = {0};
    if (d->divide_params_by_p)
        return tp_fail(TP_ERR_UNSUPPORTED, "%s: the legacy `local` style has no backward", lin->name);
    tp_status s = local_operands(m, mt, &ctx, dy, dy_local, x, T, output_width(m, mt, lin), &b);
    if (!s && (b.gy.local.shape[1] != out || b.xd.local.shape[1] != in))
        s = tp_fail(TP_ERR_INVALID, "%s: its style gives the local backward [%lld, %lld] for a weight shard "
                    "[%lld, %lld]", lin->name, (long long)b.gy.local.shape[1], (long long)b.xd.local.shape[1],
                    (long long)out, (long long)in);
    if (s) { lin_bwd_free(&b); return s; }
    /* With no hook on the weight's gradient it is added straight into the
     * parameter's, as plain_backward does: no [out, in] temporary (lm_head's
     * would be a vocabulary shard of the embedding's size).  A frozen base
     * (LoRA training) computes no weight or bias gradient at all. */
    int frozen = tp_model_base_frozen(m) && !tp_lora_param_trained(m, lin, TP_MODULE_WEIGHT);
    int bias_frozen = tp_model_base_frozen(m) && !tp_lora_param_trained(m, lin, TP_MODULE_BIAS);
    int direct = !frozen && mt->kv_rep <= 1 && !mt->plan->style->reduce_param_grad_post_backward &&
                 !d->param_grad_allreduce;
    float *dw = NULL;
    if (direct) s = tp_module_grad(m, lin, TP_MODULE_WEIGHT, &dw);
    else if (!frozen) dw = b.dw = calloc((size_t)(out * in), sizeof(float));
    b.db = bias->data && !bias_frozen ? calloc((size_t)out, sizeof(float)) : NULL;
    b.dxl = dx ? calloc((size_t)(T * in), sizeof(float)) : NULL;
    if (!s && ((!frozen && !dw) || (bias->data && !bias_frozen && !b.db) || (dx && !b.dxl)))
        s = tp_fail(TP_ERR_NOMEM, "out of memory");
    /* a bias added after the reduction sees the whole output gradient */
    if (!s && b.db && d->bias_after_reduce) s = tp_matmul_backward_ex(NULL, NULL, b.db, dy, x, T, W, m->pool, &m->matmul);
    if (!s) s = tp_matmul_backward_ex(b.dxl, dw, d->bias_after_reduce ? NULL : b.db, b.gy.local.data,
                                      b.xd.local.data, T, W, m->pool, &m->matmul);
    /* the adapter's input gradient joins the local one before post_backward */
    if (!s) s = tp_lora_backward(m, lin, b.xd.local.data, b.gy.local.data, T, b.dxl);
    if (!s && dx) {
        tp_placement pl = tp_style_local_input_grad_layout(d);
        int64_t g[2] = {T, mt->in_features};
        s = tp_dtensor_from_local(&b.gx, m->tp->mesh, &pl, TP_F32, 2, g, b.dxl);
        b.have_gx = !s;
        if (!s) s = tp_style_post_backward(mt->plan->style, &ctx, d, &b.gx);
        if (!s) {
            const float *v = b.gx.local.data;
            int64_t n = b.gx.local.shape[0] * b.gx.local.shape[1];
            for (int64_t i = 0; i < n; i++) dx[i] += v[i];
        }
    }
    if (!s && mt->kv_rep > 1 && b.dw) s = sum_kv_group(m, lin, TP_MODULE_WEIGHT, b.dw);
    if (!s && mt->kv_rep > 1 && b.db) s = sum_kv_group(m, lin, TP_MODULE_BIAS, b.db);
    if (!s && !direct && b.dw) s = add_param_grad(m, lin, &ctx, TP_MODULE_WEIGHT, b.dw);
    if (!s && b.db) s = add_param_grad(m, lin, &ctx, TP_MODULE_BIAS, b.db);
    lin_bwd_free(&b);
    return s;
}

tp_status tp_module_linear_backward(tp_model *m, const tp_module *lin, const float *dy, const float *x, int64_t T,
                                    float *dx)
{
    tp_status st = runs_plainly(m, lin->tp) ? plain_backward(m, lin, dy, x, T, dx)
                                            : styled_backward(m, lin, dy, 0, x, T, dx);
    return st ? tp_fail_context(st, "the backward of %s", lin->name) : TP_OK;
}

tp_status tp_module_linear_backward_local(tp_model *m, const tp_module *lin, const float *dy_local, const float *x,
                                          int64_t T, float *dx)
{
    if (!tp_module_output_gathers_columns(m, lin))
        return tp_fail(TP_ERR_INTERNAL, "%s: its output is not a gathered column split", lin->name);
    tp_status st = styled_backward(m, lin, dy_local, 1, x, T, dx);
    return st ? tp_fail_context(st, "the backward of %s", lin->name) : TP_OK;
}

/* A lone Linear (lm_head): b->dy [rows, out] on the saved input b->in;
 * the input gradient is added into b->dh. */
static tp_status linear_backward(tp_model *m, const tp_module *mod, tp_backward_pass *b)
{
    return tp_module_linear_backward(m, mod, b->dy, b->in, b->rows, b->dh);
}

const tp_module_ops tp_linear_ops = {"linear", linear_forward, linear_backward};
