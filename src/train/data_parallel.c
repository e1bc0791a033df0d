/* Data parallelism in training: what data_parallel.h describes.  The
 * parameter chunks, the gathers and reduce-scatters of ZeRO-3 driven by
 * the model's module hooks, and the dp reductions of a step. */
#include "train/data_parallel.h"
#include "train/dp_internal.h"
#include "tensorpar/comm.h"
#include "tensorpar/module.h"
#include "tensorpar/lora.h"

#include <stdlib.h>
#include <string.h>

int tp_dp_index(const tp_dp *dp) { return dp->index; }
int tp_dp_count(const tp_dp *dp) { return dp->R * dp->S; }
int tp_dp_sharded(const tp_dp *dp) { return dp->opt_chunks; }

const tp_train_param *tp_dp_params(const tp_dp *dp, int *n)
{
    *n = dp->n;
    return dp->train;
}

static tp_module_param *param_of(tp_dp *dp, const dp_param *p)
{
    return &dp->m->modules[p->module].params[p->j];
}

/* The decoder layer a module belongs to, or -1. */
static int unit_of(const tp_model *m, int i)
{
    for (; i >= 0; i = m->modules[i].parent)
        if (m->modules[i].type == TP_MT_DECODER_LAYER) return i;
    return -1;
}

/* Points the parameter (and every parameter tied to it) at `data`. */
static void set_data(tp_dp *dp, const dp_param *p, void *data)
{
    tp_model *m = dp->m;
    param_of(dp, p)->local.data = data;
    param_of(dp, p)->local.owns_data = 0;
    for (size_t i = 0; i < m->n_modules; i++)
        if (p->j < m->modules[i].n_params && m->modules[i].params[p->j].tied_to == p->module)
            m->modules[i].params[p->j].local.data = data;
}

/* Shard(0) -> Replicate over dp_shard: the whole TP-local tensor.  A bf16
 * weight's chunk is its master rounded first (what the model without dp
 * holds after a step), and moves as bf16. */
static tp_status gather(tp_dp *dp, dp_param *p)
{
    if (p->full) return TP_OK;
    size_t es = tp_dtype_size(p->dtype);
    void *src = p->value.data;
    if (p->dtype != TP_F32 && (src = tp_alloc((size_t)(p->len ? p->len : 1) * es)))
        tp_convert(src, p->dtype, p->value.data, TP_F32, (size_t)p->len);
    p->full = src ? tp_alloc((size_t)(p->numel ? p->numel : 1) * es) : NULL;
    if (!p->full) {
        if (src != p->value.data) tp_free(src);
        return tp_fail(TP_ERR_NOMEM, "out of memory gathering a parameter of %s", dp->m->modules[p->module].name);
    }
    tp_placement sh = tp_shard(0), rep = tp_replicate();
    tp_status s = tp_redistribute_local(dp->shard, p->dtype, 1, &p->numel, &sh, src, &rep, p->full);
    if (src != p->value.data) tp_free(src);
    if (s) return tp_fail_context(s, "gathering %s.%s over dp_shard", dp->m->modules[p->module].name,
                                  param_of(dp, p)->suffix);
    set_data(dp, p, p->full);
    return TP_OK;
}

static void release(tp_dp *dp, dp_param *p)
{
    tp_free(p->full);
    p->full = NULL;
    set_data(dp, p, NULL);
}

/* A zeroed whole gradient for the backward to add into. */
static tp_status grad_begin(tp_dp *dp, dp_param *p)
{
    tp_module_param *mp = param_of(dp, p);
    tp_tensor_release(&mp->grad);
    tp_status s = tp_tensor_init(&mp->grad, TP_F32, mp->local.ndim, mp->local.shape);
    return s ? tp_fail(s, "out of memory for the gradient of %s.%s", dp->m->modules[p->module].name, mp->suffix)
             : TP_OK;
}

/* Partial -> Shard(0) over dp_shard, added into the chunk's gradient; the
 * whole gradient freed.  idle: this rank has no gradient (zeros).  The
 * reduced chunk lands in a buffer of its own for the moment of the add
 * (a persistent one would keep the largest chunk resident at the peak). */
static tp_status grad_end(tp_dp *dp, dp_param *p, int idle)
{
    tp_module_param *mp = param_of(dp, p);
    tp_status s = idle ? grad_begin(dp, p) : TP_OK;
    float *part_sum = s ? NULL : tp_alloc((size_t)(p->len ? p->len : 1) * sizeof(float));
    if (!s && !part_sum) s = TP_ERR_NOMEM;
    tp_placement part = tp_partial(), sh = tp_shard(0);
    if (!s) s = tp_redistribute_local(dp->shard, TP_F32, 1, &p->numel, &part, mp->grad.data, &sh, part_sum);
    if (!s) {
        float *g = p->grad.data;
        for (int64_t i = 0; i < p->len; i++) g[i] += part_sum[i];
    }
    tp_free(part_sum);
    tp_tensor_release(&mp->grad);
    return s ? tp_fail_context(s, "reduce-scattering the gradient of %s.%s", dp->m->modules[p->module].name,
                               mp->suffix) : TP_OK;
}

/* Gather (and with grads, zeroed whole gradients) every parameter of unit
 * u; those kept in row blocks only when whole (eval, not training rows). */
static tp_status unit_gather(tp_dp *dp, int u, int grads, int whole)
{
    grads = grads && !dp->frozen;
    for (int k = 0; k < dp->n; k++) {
        if (dp->ps[k].unit != u || (dp->ps[k].block && !whole)) continue;
        tp_status s = gather(dp, &dp->ps[k]);
        if (!s && grads) s = grad_begin(dp, &dp->ps[k]);
        if (s) return s;
    }
    return TP_OK;
}

/* Reduce-scatter (with grads) and free every parameter of unit u. */
static tp_status unit_release(tp_dp *dp, int u, int grads, int idle)
{
    grads = grads && !dp->frozen;
    for (int k = 0; k < dp->n; k++) {
        if (dp->ps[k].unit != u || (dp->ps[k].block && !dp->ps[k].full)) continue;
        tp_status s = grads ? grad_end(dp, &dp->ps[k], idle) : TP_OK;
        release(dp, &dp->ps[k]);
        if (s) return s;
    }
    return TP_OK;
}

static int is_layer(const tp_model *m, int c) { return m->modules[c].type == TP_MT_DECODER_LAYER; }

static tp_status pre_forward(void *ctx, tp_model *m, int c)
{
    return is_layer(m, c) ? unit_gather(ctx, c, 0, 0) : TP_OK;
}

static tp_status post_forward(void *ctx, tp_model *m, int c)
{
    return is_layer(m, c) ? unit_release(ctx, c, 0, 0) : TP_OK;
}

static tp_status pre_backward(void *ctx, tp_model *m, int c)
{
    return is_layer(m, c) ? unit_gather(ctx, c, 1, 0) : TP_OK;
}

static tp_status post_backward(void *ctx, tp_model *m, int c)
{
    return is_layer(m, c) ? unit_release(ctx, c, 1, 0) : TP_OK;
}

/* Parameter j of module i as this rank's chunk: copied out of the whole
 * TP-local tensor, which is then freed (its shape kept), and entered in
 * the optimizer's list with the flags trainer.c gives a whole shard. */
static tp_status chunk_one(tp_dp *dp, int i, int j, int shard_rank)
{
    tp_model *m = dp->m;
    tp_module_param *mp = &m->modules[i].params[j];
    if (mp->local.dtype != TP_F32 && mp->local.dtype != TP_BF16)
        return tp_fail(TP_ERR_UNSUPPORTED, "%s.%s is %s: --dp-shard trains f32 or bf16 weights", m->modules[i].name,
                       mp->suffix, tp_dtype_name(mp->local.dtype));
    dp_param *p = &dp->ps[dp->n];
    p->module = i, p->j = j, p->unit = unit_of(m, i), p->dtype = mp->local.dtype;
    p->numel = tp_tensor_numel(&mp->local);
    p->block = tp_dp_block_rows(dp, i, j);
    tp_chunk_range(p->numel, dp->S, shard_rank, &p->start, &p->len);
    tp_status s = tp_tensor_init(&p->value, TP_F32, 1, &p->len);
    if (!s && !dp->frozen) s = tp_tensor_init(&p->grad, TP_F32, 1, &p->len);
    if (s) return tp_fail(s, "out of memory for the chunk of %s.%s", m->modules[i].name, mp->suffix);
    dp->n++;
    s = tp_convert(p->value.data, TP_F32, (const char *)mp->local.data + (size_t)p->start * tp_dtype_size(p->dtype),
                   p->dtype, (size_t)p->len);
    if (s) return s;
    tp_tensor whole = mp->local;
    tp_tensor_release(&mp->local);
    mp->local = whole;
    set_data(dp, p, NULL);
    tp_tensor_release(&mp->grad);
    int reps = tp_model_param_replicas(m, &m->modules[i], j);
    unsigned flags = (mp->kind == TP_PARAM_BIAS || mp->kind == TP_PARAM_NORM) ? TP_PARAM_NO_DECAY : 0;
    if (reps != 1) flags |= TP_PARAM_COUNTED_ONCE;
    dp->train[dp->n - 1] = (tp_train_param){m->modules[i].name, &p->value, &p->grad, flags, reps == 1 ? 0 : reps};
    return TP_OK;
}

/* Every owned parameter of the model (a tied one borrows its owner's) as
 * a chunk; under LoRA training the frozen ones only (a base parameter that
 * trains with the adapter stays whole, a dp copy like the adapters). */
static tp_status make_chunks(tp_dp *dp)
{
    tp_model *m = dp->m;
    size_t cap = m->n_modules * TP_MODULE_MAX_PARAMS;
    int shard_rank = tp_mesh_coord(dp->shard, 0);
    dp->ps = calloc(cap ? cap : 1, sizeof *dp->ps);
    dp->train = calloc(cap ? cap : 1, sizeof *dp->train);
    if (!dp->ps || !dp->train) return tp_fail(TP_ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < m->n_modules; i++)
        for (int j = 0; j < m->modules[i].n_params; j++) {
            const tp_module_param *mp = &m->modules[i].params[j];
            if (mp->tied_to >= 0 || !mp->local.data) continue;
            if (dp->frozen && !tp_model_param_frozen(m, &m->modules[i], j)) continue;
            tp_status s = chunk_one(dp, (int)i, j, shard_rank);
            if (s) return s;
            const dp_param *p = &dp->ps[dp->n - 1];
            if (p->block)
                tp_log(TP_LOG_DEBUG, "dp_shard: %s.%s kept in row blocks of %lld rows (%lld blocks)",
                       m->modules[i].name, mp->suffix, (long long)p->block,
                       (long long)((mp->local.shape[0] + p->block - 1) / p->block));
        }
    return TP_OK;
}

tp_status tp_dp_new(tp_model *m, const tp_mesh *grid, tp_dp **out)
{
    *out = NULL;
    tp_dp *dp = calloc(1, sizeof *dp);
    if (!dp) return tp_fail(TP_ERR_NOMEM, "out of memory");
    dp->m = m;
    dp->grid = grid;
    dp->rep = tp_mesh_sub(grid, "dp_replicate");
    dp->shard = tp_mesh_sub(grid, "dp_shard");
    if (!dp->rep || !dp->shard || tp_mesh_dim_index(grid, "tp") < 0) {
        free(dp);
        return tp_fail(TP_ERR_INVALID, "data parallelism needs a mesh with dimensions \"dp_replicate\", "
                       "\"dp_shard\" and \"tp\"");
    }
    tp_clear_error();
    dp->R = tp_mesh_size(dp->rep, 0);
    dp->S = tp_mesh_size(dp->shard, 0);
    dp->index = tp_mesh_coord(dp->rep, 0) * dp->S + tp_mesh_coord(dp->shard, 0);
    dp->chunked = dp->S > 1;
    dp->frozen = tp_model_base_frozen(m);
    dp->opt_chunks = dp->chunked && !dp->frozen;
    *out = dp;
    if (!dp->chunked) return TP_OK;
    dp->hooks = (tp_module_hooks){.pre_forward = pre_forward, .post_forward = post_forward,
                                  .pre_backward = pre_backward, .post_backward = post_backward, .ctx = dp};
    tp_dp_row_hooks(dp);
    tp_status s = make_chunks(dp);
    if (!s) m->hooks = &dp->hooks;
    return s;
}

/* Every parameter whole again, owned by the model: the f32 values the
 * optimizer stepped (a bf16 weight's master, as the trainer's
 * adopt_masters leaves it without dp). */
static tp_status unshard_all(tp_dp *dp)
{
    for (int k = 0; k < dp->n; k++) {
        dp_param *p = &dp->ps[k];
        tp_module_param *mp = param_of(dp, p);
        tp_tensor whole;
        tp_status s = tp_tensor_init(&whole, TP_F32, mp->local.ndim, mp->local.shape);
        if (s) return tp_fail(s, "out of memory");
        s = tp_dp_gather_chunk(dp, k, p->value.data, whole.data);
        if (s) { tp_tensor_release(&whole); return s; }
        if (p->full) release(dp, p);
        mp->local = whole;
        set_data(dp, p, whole.data);
        mp->local.owns_data = 1;
        /* the chunk goes as its whole comes: the peak holds one chunk
         * beside the whole model, not every chunk */
        tp_tensor_release(&p->value);
        tp_tensor_release(&p->grad);
    }
    /* A tied parameter borrows its owner's tensor, dtype included. */
    tp_model *m = dp->m;
    for (size_t i = 0; i < m->n_modules; i++)
        for (int j = 0; j < m->modules[i].n_params; j++) {
            tp_module_param *t = &m->modules[i].params[j];
            if (t->tied_to < 0) continue;
            t->local = m->modules[t->tied_to].params[j].local;
            t->local.owns_data = 0;
        }
    return TP_OK;
}

tp_status tp_dp_free(tp_dp *dp, int finish)
{
    if (!dp) return TP_OK;
    tp_status s = TP_OK;
    if (dp->chunked) {
        dp->m->hooks = NULL;
        tp_dp_kept_free(dp);
        if (finish) s = unshard_all(dp);
        for (int k = 0; k < dp->n; k++) {
            if (dp->ps[k].full) release(dp, &dp->ps[k]);
            tp_tensor_release(&dp->ps[k].value);
            tp_tensor_release(&dp->ps[k].grad);
        }
    }
    free(dp->ps);
    free(dp->train);
    free(dp);
    return s;
}

tp_status tp_dp_row_begin(tp_dp *dp)
{
    return dp->chunked ? unit_gather(dp, -1, 1, 0) : TP_OK;
}

tp_status tp_dp_row_end(tp_dp *dp)
{
    return dp->chunked ? unit_release(dp, -1, 1, 0) : TP_OK;
}

tp_status tp_dp_row_idle(tp_dp *dp)
{
    if (!dp->chunked) return TP_OK;
    const tp_model *m = dp->m;
    int n = (int)m->cfg.num_hidden_layers;
    tp_status s = tp_dp_rows_idle_lookup(dp);
    for (int l = 0; !s && l < n; l++) {
        int u = unit_of(m, m->layers[l].input_layernorm);
        s = unit_gather(dp, u, 0, 0);
        if (!s) s = unit_release(dp, u, 0, 0);
    }
    if (!s) s = tp_dp_rows_idle_head(dp);
    for (int l = n - 1; !s && l >= 0; l--) {
        int u = unit_of(m, m->layers[l].input_layernorm);
        s = unit_gather(dp, u, 0, 0);
        if (!s) s = unit_release(dp, u, 1, 1);
    }
    if (!s) s = tp_dp_rows_idle_scatter(dp);
    return s;
}

tp_status tp_dp_root_gather(tp_dp *dp)
{
    return dp->chunked ? unit_gather(dp, -1, 0, 1) : TP_OK;
}

void tp_dp_root_release(tp_dp *dp)
{
    if (dp->chunked) unit_release(dp, -1, 0, 0);
}

/* One placement per dimension of the grid: `dp_rep` on dp_replicate,
 * `dp_shard` on dp_shard, `tp` on tp, Replicate elsewhere (cp). */
static void grid_placements(const tp_dp *dp, tp_placement dp_rep, tp_placement dp_shard, tp_placement tp,
                            tp_placement *out)
{
    for (int d = 0; d < tp_mesh_ndim(dp->grid); d++) {
        const char *name = tp_mesh_dim_name(dp->grid, d);
        out[d] = !strcmp(name, "dp_replicate") ? dp_rep : !strcmp(name, "dp_shard") ? dp_shard
               : !strcmp(name, "tp") ? tp : tp_replicate();
    }
}

tp_status tp_dp_reduce_loss(tp_dp *dp, double *loss_sum, int64_t *tokens)
{
    double v[2] = {*loss_sum, (double)*tokens}, sum[2];
    int64_t two = 2;
    tp_placement from[TP_MESH_MAX_DIMS], to[TP_MESH_MAX_DIMS];
    grid_placements(dp, tp_partial(), tp_partial(), tp_replicate(), from);
    grid_placements(dp, tp_replicate(), tp_replicate(), tp_replicate(), to);
    tp_status s = tp_redistribute_local(dp->grid, TP_F64, 1, &two, from, v, to, sum);
    if (s) return tp_fail_context(s, "summing the loss over the data-parallel ranks");
    *loss_sum = sum[0];
    *tokens = (int64_t)sum[1];
    return TP_OK;
}

/* Partial -> Replicate of one gradient over a 1-D dp mesh, in place. */
static tp_status all_reduce(const tp_mesh *mesh, const tp_train_param *p)
{
    int64_t n = tp_tensor_numel(p->grad);
    tp_placement part = tp_partial(), rep = tp_replicate();
    tp_status s = tp_redistribute_local(mesh, TP_F32, 1, &n, &part, p->grad->data, &rep, p->grad->data);
    return s ? tp_fail_context(s, "summing the gradient of %s over the data-parallel ranks", p->name) : TP_OK;
}

tp_status tp_dp_reduce_grads(tp_dp *dp, const tp_train_param *params, int n)
{
    /* dp_shard's sums happened in the reduce-scatters (or it has size 1, or
     * holds copies): what is left is the copies over dp_replicate, and over
     * dp_shard when it does not chunk. */
    for (int i = 0; i < n; i++) {
        tp_status s = dp->R > 1 ? all_reduce(dp->rep, &params[i]) : TP_OK;
        if (!s && dp->S > 1 && !dp->opt_chunks) s = all_reduce(dp->shard, &params[i]);
        if (s) return s;
    }
    return TP_OK;
}

tp_status tp_dp_clip(tp_dp *dp, const tp_train_param *params, int n, const tp_mesh *tp_sub, tp_threadpool *pool,
                     double max_norm, float *norm)
{
    /* Copies over dp_replicate (and over dp_shard when unsharded) count
     * once: only the chunks of one replica sum, and the TP ranks' parts. */
    tp_placement sum_pl[TP_MESH_MAX_DIMS];
    grid_placements(dp, tp_replicate(), dp->opt_chunks ? tp_partial() : tp_replicate(), tp_partial(), sum_pl);
    return tp_clip_grad_norm_grid(params, n, tp_sub, dp->grid, sum_pl, pool, max_norm, norm);
}

tp_status tp_dp_check_replicas(tp_dp *dp, const tp_train_param *params, int n)
{
    /* The copies: the replicas of dp_replicate, and of dp_shard when it
     * does not shard; each parameter is one whole copy per rank there. */
    const tp_mesh *copies[2] = {dp->rep, dp->opt_chunks ? NULL : dp->shard};
    tp_train_param *all = malloc((size_t)(n ? n : 1) * sizeof *all);
    if (!all) return tp_fail(TP_ERR_NOMEM, "out of memory");
    for (int i = 0; i < n; i++) {
        all[i] = params[i];
        all[i].flags |= TP_PARAM_COUNTED_ONCE;
        all[i].replicas = 0;
    }
    tp_status s = TP_OK;
    for (int c = 0; !s && c < 2; c++)
        if (copies[c] && tp_mesh_size(copies[c], 0) > 1) s = tp_check_replicated(all, n, copies[c]);
    free(all);
    return s ? tp_fail_context(s, "data-parallel replicas") : TP_OK;
}

void tp_dp_param_at(const tp_dp *dp, int k, int *module, int *j, int64_t *start, int64_t *len)
{
    const dp_param *p = &dp->ps[k];
    *module = p->module, *j = p->j, *start = p->start, *len = p->len;
}

tp_status tp_dp_gather_chunk(tp_dp *dp, int k, const float *chunk, float *whole)
{
    dp_param *p = &dp->ps[k];
    tp_placement sh = tp_shard(0), rep = tp_replicate();
    tp_status s = tp_redistribute_local(dp->shard, TP_F32, 1, &p->numel, &sh, chunk, &rep, whole);
    return s ? tp_fail_context(s, "gathering the state of %s.%s over dp_shard", dp->m->modules[p->module].name,
                               param_of(dp, p)->suffix) : TP_OK;
}

tp_status tp_dp_agree(tp_dp *dp, tp_status s)
{
    return dp->chunked ? tp_comm_agree(tp_mesh_group(dp->shard, 0), s) : s;
}
