/* Training LoRA adapters on a frozen base (tp-semantics.md §9.6): their
 * initialisation from a seed shared by all ranks, the optimizer's view of
 * them, and their backward inside a Linear's.
 *
 * The backward follows the forward of lora.c.  With a = x·Aᵀ and
 * y += s·a·Bᵀ:  dB += s·dyᵀ·a,  g = s·dy·B,  dA += gᵀ·x,  dx += g·A.
 * Colwise base (B split on its rows): each rank's g is a partial sum, made
 * whole by an all-reduce for dA (then identical on every rank, as A is
 * replicated); dx takes the partial g, and the base's post_backward
 * all-reduce completes it.  Rowwise base (A split on its columns): a is a
 * partial sum, made whole by an all-reduce for dB (identical on every
 * rank, as B is replicated); g is whole and dA, dx are this rank's
 * columns.  With lora_dropout, x above is the masked input and dx goes
 * through the same mask (lora_dropout.c). */
#include "lora_internal.h"

#include "tensorpar/dist.h"
#include "tensorpar/kernels.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* A [r, in] whole from the module's own stream, this rank's columns kept. */
static tp_status init_entry(const tp_module *lin, int64_t r, uint64_t seed, int a_split, int b_split,
                            lora_entry *e)
{
    const tp_module_param *w = &lin->params[TP_MODULE_WEIGHT];
    int64_t in = w->shape[1], out = w->shape[0];
    float *full = malloc((size_t)(r * in) * sizeof(float));
    if (!full) return tp_fail(TP_ERR_NOMEM, "out of memory");
    tp_rng rng;
    tp_rng_seed(&rng, seed);
    double bound = 1.0 / sqrt((double)in);
    for (int64_t i = 0; i < r * in; i++) full[i] = (float)((2.0 * tp_rng_uniform(&rng) - 1.0) * bound);
    e->a_slice = w->slice;
    e->b_slice = w->slice;
    if (!a_split) e->a_slice.dim = -1;
    if (!b_split) e->b_slice.dim = -1;
    int64_t a_cols = in, b_rows = out;
    if (a_split) { a_cols = 0; for (int i = 0; i < w->slice.n; i++) a_cols += w->slice.len[i]; }
    if (b_split) { b_rows = 0; for (int i = 0; i < w->slice.n; i++) b_rows += w->slice.len[i]; }
    int64_t as[2] = {r, a_cols}, bs[2] = {b_rows, r};
    tp_status s = tp_tensor_init(&e->A, TP_F32, 2, as);
    if (!s) s = tp_tensor_init(&e->B, TP_F32, 2, bs);
    if (!s) {
        float *A = e->A.data;
        memset(e->B.data, 0, tp_tensor_nbytes(&e->B));
        for (int64_t k = 0; k < r; k++) {
            if (!a_split) { memcpy(A + k * in, full + k * in, (size_t)in * sizeof(float)); continue; }
            int64_t at = 0;
            for (int i = 0; i < w->slice.n; at += w->slice.len[i], i++)
                memcpy(A + k * a_cols + at, full + k * in + w->slice.start[i], (size_t)w->slice.len[i] * sizeof(float));
        }
    }
    free(full);
    snprintf(e->a_name, sizeof e->a_name, "base_model.model.%s.lora_A.weight", lin->name);
    snprintf(e->b_name, sizeof e->b_name, "base_model.model.%s.lora_B.weight", lin->name);
    return s;
}

/* An embedding's adapter as PEFT initialises lora_embedding_A/B: A zeros
 * (so the adapter starts as the identity), B N(0, 1), whole [H, r] from
 * the module's own stream on every rank (B is replicated). */
static tp_status init_embedding_entry(const tp_model *m, const tp_module *emb, int64_t r, uint64_t seed,
                                      lora_entry *e)
{
    tp_status s = tp_lora_embedding_placement(m, emb, e);
    if (s) return s;
    const tp_module_param *w = &emb->params[TP_MODULE_WEIGHT];
    int64_t cols = w->shape[0];
    if (e->vocab.dim >= 0) { cols = 0; for (int i = 0; i < e->vocab.n; i++) cols += e->vocab.len[i]; }
    int64_t as[2] = {r, cols}, bs[2] = {w->shape[1], r};
    if ((s = tp_tensor_init(&e->A, TP_F32, 2, as)) || (s = tp_tensor_init(&e->B, TP_F32, 2, bs))) return s;
    memset(e->A.data, 0, tp_tensor_nbytes(&e->A));
    tp_rng rng;
    tp_rng_seed(&rng, seed);
    float *B = e->B.data;
    for (int64_t i = 0; i < bs[0] * r; i++) B[i] = (float)tp_rng_normal(&rng);
    return TP_OK;
}

tp_status tp_model_lora_init(tp_model *m, tp_lora_config *cfg, uint64_t seed)
{
    if (m->lora) return tp_fail(TP_ERR_INVALID, "the model already has an adapter");
    struct tp_lora *l = NULL;
    tp_status s = tp_lora_new(m, cfg, &l);
    size_t used = 0;
    for (size_t i = 0; !s && i < m->n_modules; i++) {
        const tp_module *mod = &m->modules[i];
        int hit = tp_lora_config_matches(&l->cfg, mod->name), a_split, b_split;
        if (hit < 0) { s = TP_ERR_FORMAT; break; }
        if (!hit || (mod->type != TP_MT_LINEAR && mod->type != TP_MT_EMBEDDING)) continue;
        if (mod->type == TP_MT_LINEAR && (s = tp_lora_placement(m, mod, &a_split, &b_split))) break;
        lora_entry *e = calloc(1, sizeof *e);
        if (!e) { s = tp_fail(TP_ERR_NOMEM, "out of memory"); break; }
        l->by_module[i] = e;
        /* one stream per module, the same on every rank whatever P */
        uint64_t stream = seed * 0x9E3779B97F4A7C15ull + (uint64_t)i + 1;
        s = mod->type == TP_MT_EMBEDDING ? init_embedding_entry(m, mod, l->r, stream, e)
                                         : init_entry(mod, l->r, stream, a_split, b_split, e);
        used++;
    }
    if (!s && !used) s = tp_fail(TP_ERR_INVALID, "--lora-target matches no Linear of the model");
    if (!s) s = tp_lora_saved_attach(m, l, NULL, NULL);
    if (s) { tp_lora_free(l); return s; }
    m->lora = l;
    return TP_OK;
}

tp_status tp_model_lora_train(tp_model *m)
{
    if (!m->lora) return tp_fail(TP_ERR_INVALID, "no adapter to train");
    tp_status s = tp_lora_saved_check_training(m);
    if (s) return s;
    m->lora->training = 1;
    return TP_OK;
}

int tp_model_base_frozen(const tp_model *m)
{
    return m->lora && m->lora->training;
}

int tp_model_param_frozen(const tp_model *m, const tp_module *mod, int j)
{
    return tp_model_base_frozen(m) && !tp_lora_param_trained(m, mod, j);
}

tp_status tp_lora_zero_grad(tp_model *m)
{
    for (size_t i = 0; i < m->lora->n; i++) {
        lora_entry *e = m->lora->by_module[i];
        if (!e) continue;
        tp_tensor *pairs[2][2] = {{&e->A, &e->gA}, {&e->B, &e->gB}};
        for (int k = 0; k < 2; k++) {
            tp_tensor *v = pairs[k][0], *g = pairs[k][1];
            if (g->data) { memset(g->data, 0, tp_tensor_nbytes(g)); continue; }
            tp_status s = tp_tensor_init(g, TP_F32, v->ndim, v->shape);
            if (s) return s;
            memset(g->data, 0, tp_tensor_nbytes(g));
        }
    }
    return tp_lora_saved_zero_grad(m);
}

size_t tp_model_lora_count(const tp_model *m)
{
    size_t n = 0;
    for (size_t i = 0; m->lora && i < m->lora->n; i++) n += m->lora->by_module[i] ? 2 : 0;
    return n + tp_lora_saved_count(m);
}

lora_entry *tp_lora_entry_at(const struct tp_lora *l, size_t k, size_t *module, int *is_a)
{
    size_t at = 0;
    for (size_t i = 0; l && i < l->n; i++) {
        lora_entry *e = l->by_module[i];
        if (!e) continue;
        if (k == at || k == at + 1) {
            *module = i;
            *is_a = k == at;
            return e;
        }
        at += 2;
    }
    return NULL;
}

tp_status tp_model_lora_tensor(tp_model *m, size_t k, const char **name, tp_tensor **value, tp_tensor **grad,
                               int *replicas)
{
    size_t i;
    int is_a;
    size_t adapters = tp_model_lora_count(m) - tp_lora_saved_count(m);
    /* after the adapters' tensors, the base parameters saved with them */
    if (k >= adapters) return tp_lora_saved_tensor(m, k - adapters, name, value, grad, replicas);
    lora_entry *e = tp_lora_entry_at(m->lora, k, &i, &is_a);
    if (!e) return tp_fail(TP_ERR_INVALID, "no adapter tensor %zu", k);
    const tp_param_slice *sl = is_a ? &e->a_slice : &e->b_slice;
    *name = is_a ? e->a_name : e->b_name;
    *value = is_a ? &e->A : &e->B;
    *grad = is_a ? &e->gA : &e->gB;
    /* a B split like a KV-replicated head lives on its kv_rep ranks */
    int kv_rep = m->modules[i].tp ? m->modules[i].tp->kv_rep : 1;
    if (!m->tp || !m->tp->mesh || m->tp->size <= 1) *replicas = 1;
    else if (sl->dim < 0) *replicas = 0;
    else *replicas = kv_rep > 1 ? kv_rep : 1;
    return TP_OK;
}

/* buf [T, w], a partial sum on each rank, made the whole sum on every rank. */
static tp_status all_reduce(tp_model *m, float *buf, int64_t T, int64_t w)
{
    if (!m->tp || !m->tp->mesh || m->tp->size <= 1) return TP_OK;
    int64_t shape[2] = {T, w};
    return tp_sum_partial(m, 2, shape, buf);
}

/* B's gradient under a KV head replicated over ranks: each rank holds its
 * query heads' part of the head's gradient, and the rows' gradient is the
 * sum over the ranks that hold them (as the base weight's is in full
 * training).  This call's part is summed alone, then added: what earlier
 * rows left in gB was summed already. */
static tp_status kv_head_grad(tp_model *m, const tp_module *lin, lora_entry *e, const float *sdy, const float *a,
                              int64_t T, float *g)
{
    int64_t r = e->B.shape[1], n = e->B.shape[0] * r, shape[2] = {lin->params[TP_MODULE_WEIGHT].shape[0], r};
    float *part = calloc((size_t)n + 1, sizeof(float)), *gB = e->gB.data;
    if (!part) return tp_fail(TP_ERR_NOMEM, "out of memory");
    tp_status s = tp_matmul_backward(g, part, NULL, sdy, a, T, &e->B, m->pool);
    if (!s) s = tp_sum_kv_rows(m, &e->b_slice, 2, shape, part, e->b_name);
    for (int64_t i = 0; !s && i < n; i++) gB[i] += part[i];
    free(part);
    return s;
}

/* The adapter's backward on its (dropped-out) input xa: the gradients of
 * A and B, and its input gradient added into dx (may be NULL). */
static tp_status adapter_backward(tp_model *m, const tp_module *lin, lora_entry *e, const float *xa, const float *dy,
                                  int64_t T, float *dx)
{
    int64_t r = e->A.shape[0], out = e->B.shape[0];
    int a_split = e->a_slice.dim >= 0, b_split = e->b_slice.dim >= 0;
    /* + 1: an empty shard (out = 0) still takes part in the collectives */
    float *a = malloc((size_t)(T * r) * sizeof(float) + 1), *g = calloc((size_t)(T * r) + 1, sizeof(float));
    float *sdy = malloc((size_t)(T * out) * sizeof(float) + 1), *gw = NULL;
    tp_status s = a && g && sdy ? TP_OK : tp_fail(TP_ERR_NOMEM, "out of memory");
    for (int64_t i = 0; !s && i < T * out; i++) sdy[i] = m->lora->scale * dy[i];
    if (!s) s = tp_matmul_ex(a, xa, T, &e->A, NULL, m->pool, &m->matmul);
    if (!s && a_split) s = all_reduce(m, a, T, r);
    int kv_head = b_split && lin->tp && lin->tp->kv_rep > 1;
    if (!s && kv_head) s = kv_head_grad(m, lin, e, sdy, a, T, g);
    else if (!s) s = tp_matmul_backward(g, e->gB.data, NULL, sdy, a, T, &e->B, m->pool);
    if (!s && b_split) {
        gw = malloc((size_t)(T * r) * sizeof(float) + 1);
        if (!gw) s = tp_fail(TP_ERR_NOMEM, "out of memory");
        if (!s) { memcpy(gw, g, (size_t)(T * r) * sizeof(float)); s = all_reduce(m, gw, T, r); }
        if (!s) s = tp_matmul_backward(NULL, e->gA.data, NULL, gw, xa, T, &e->A, m->pool);
        if (!s && dx) s = tp_matmul_backward(dx, NULL, NULL, g, xa, T, &e->A, m->pool);
    } else if (!s) {
        s = tp_matmul_backward(dx, e->gA.data, NULL, g, xa, T, &e->A, m->pool);
    }
    free(a); free(g); free(sdy); free(gw);
    return s;
}

tp_status tp_lora_backward(tp_model *m, const tp_module *lin, const float *x, const float *dy, int64_t T, float *dx)
{
    if (!m->lora || !m->lora->training) return TP_OK;
    lora_entry *e = m->lora->by_module[lin - m->modules];
    if (!e) return TP_OK;
    if (!tp_lora_dropping(m)) {
        tp_status s = adapter_backward(m, lin, e, x, dy, T, dx);
        return s ? tp_fail_context(s, "the LoRA backward of %s", lin->name) : TP_OK;
    }
    /* With dropout the adapter saw mask(x): the same mask drawn again; its
     * input gradient goes through the mask before joining dx. */
    int64_t n = T * e->A.shape[1];
    float *xd = malloc((size_t)n * sizeof(float)), *dxa = dx ? calloc((size_t)n, sizeof(float)) : NULL;
    tp_status s = xd && (!dx || dxa) ? TP_OK : tp_fail(TP_ERR_NOMEM, "out of memory");
    if (!s) s = tp_lora_dropout(m, lin, e, x, T, xd);
    if (!s) s = adapter_backward(m, lin, e, xd, dy, T, dxa);
    if (!s && dx) s = tp_lora_dropout(m, lin, e, dxa, T, dxa);
    for (int64_t i = 0; !s && dx && i < n; i++) dx[i] += dxa[i];
    free(xd);
    free(dxa);
    return s ? tp_fail_context(s, "the LoRA backward of %s", lin->name) : TP_OK;
}

/* With a[t] = A[:, ids[t]] (the whole column: the ranks' masked lookups
 * summed) and y[t] += s·a[t]·Bᵀ:  dB += s·dyᵀ·a, and column ids[t] of A
 * gains s·dy[t]·B on the rank that holds it.  dy is whole on every rank,
 * so dB comes out identical everywhere, as B is replicated. */
tp_status tp_lora_backward_embedding(tp_model *m, const tp_module *emb, const int64_t *ids, const float *dy,
                                     int64_t T)
{
    if (!m->lora || !m->lora->training) return TP_OK;
    lora_entry *e = m->lora->by_module[emb - m->modules];
    if (!e) return TP_OK;
    int64_t r = e->A.shape[0], Vl = e->A.shape[1], H = e->B.shape[0];
    float *a = calloc((size_t)(T * r) + 1, sizeof(float)), *g = calloc((size_t)(T * r) + 1, sizeof(float));
    float *sdy = malloc((size_t)(T * H) * sizeof(float) + 1);
    tp_status s = a && g && sdy ? TP_OK : tp_fail(TP_ERR_NOMEM, "out of memory");
    const float *A = e->A.data;
    for (int64_t t = 0; !s && t < T; t++) {
        int64_t col = tp_lora_vocab_column(e, ids[t]);
        for (int64_t k = 0; col >= 0 && k < r; k++) a[t * r + k] = A[k * Vl + col];
    }
    if (!s && e->vocab.dim >= 0) s = all_reduce(m, a, T, r);
    for (int64_t i = 0; !s && i < T * H; i++) sdy[i] = m->lora->scale * dy[i];
    /* g = s·dy·B [T, r] and dB += s·dyᵀ·a in one call */
    if (!s) s = tp_matmul_backward(g, e->gB.data, NULL, sdy, a, T, &e->B, m->pool);
    float *gA = e->gA.data;
    for (int64_t t = 0; !s && t < T; t++) {
        int64_t col = tp_lora_vocab_column(e, ids[t]);
        for (int64_t k = 0; col >= 0 && k < r; k++) gA[k * Vl + col] += g[t * r + k];
    }
    free(a); free(g); free(sdy);
    return s ? tp_fail_context(s, "the LoRA backward of %s", emb->name) : TP_OK;
}
