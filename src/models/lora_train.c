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
        if (mod->type == TP_MT_EMBEDDING) {
            s = tp_fail(TP_ERR_UNSUPPORTED, "%s: training LoRA on an embedding is not supported yet", mod->name);
            break;
        }
        if ((s = tp_lora_placement(m, mod, &a_split, &b_split))) break;
        lora_entry *e = calloc(1, sizeof *e);
        if (!e) { s = tp_fail(TP_ERR_NOMEM, "out of memory"); break; }
        l->by_module[i] = e;
        /* one stream per module, the same on every rank whatever P */
        s = init_entry(mod, l->r, seed * 0x9E3779B97F4A7C15ull + (uint64_t)i + 1, a_split, b_split, e);
        used++;
    }
    if (!s && !used) s = tp_fail(TP_ERR_INVALID, "--lora-target matches no Linear of the model");
    if (s) { tp_lora_free(l); return s; }
    m->lora = l;
    return TP_OK;
}

tp_status tp_model_lora_train(tp_model *m)
{
    if (!m->lora) return tp_fail(TP_ERR_INVALID, "no adapter to train");
    for (size_t i = 0; i < m->lora->n; i++) {
        const lora_entry *e = m->lora->by_module[i];
        if (!e) continue;
        if (e->embedding)
            return tp_fail(TP_ERR_UNSUPPORTED, "%s: training LoRA on an embedding is not supported yet",
                           m->modules[i].name);
        if ((int64_t)i == (int64_t)m->lm_head)
            return tp_fail(TP_ERR_UNSUPPORTED, "lm_head: training LoRA on lm_head is not supported yet");
        if (m->modules[i].tp && m->modules[i].tp->kv_rep > 1)
            return tp_fail(TP_ERR_UNSUPPORTED, "%s: training LoRA on a k/v head replicated over ranks "
                           "(tp_size > num_key_value_heads) is not supported yet", m->modules[i].name);
    }
    m->lora->training = 1;
    return TP_OK;
}

int tp_model_base_frozen(const tp_model *m)
{
    return m->lora && m->lora->training;
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
    return TP_OK;
}

size_t tp_model_lora_count(const tp_model *m)
{
    size_t n = 0;
    for (size_t i = 0; m->lora && i < m->lora->n; i++) n += m->lora->by_module[i] ? 2 : 0;
    return n;
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
    lora_entry *e = tp_lora_entry_at(m->lora, k, &i, &is_a);
    if (!e) return tp_fail(TP_ERR_INVALID, "no adapter tensor %zu", k);
    const tp_param_slice *sl = is_a ? &e->a_slice : &e->b_slice;
    *name = is_a ? e->a_name : e->b_name;
    *value = is_a ? &e->A : &e->B;
    *grad = is_a ? &e->gA : &e->gB;
    *replicas = sl->dim >= 0 || !m->tp || !m->tp->mesh || m->tp->size <= 1 ? 1 : 0;
    return TP_OK;
}

/* buf [T, w], a partial sum on each rank, made the whole sum on every rank. */
static tp_status all_reduce(tp_model *m, float *buf, int64_t T, int64_t w)
{
    if (!m->tp || !m->tp->mesh || m->tp->size <= 1) return TP_OK;
    tp_placement part = tp_partial(), rep = tp_replicate();
    int64_t shape[2] = {T, w};
    tp_dtensor src, sum;
    tp_status s = tp_dtensor_from_local(&src, m->tp->mesh, &part, TP_F32, 2, shape, buf);
    if (s) return s;
    s = tp_redistribute(&src, &rep, &sum);
    tp_dtensor_release(&src);
    if (s) return s;
    memcpy(buf, sum.local.data, (size_t)(T * w) * sizeof(float));
    tp_dtensor_release(&sum);
    return TP_OK;
}

/* The adapter's backward on its (dropped-out) input xa: the gradients of
 * A and B, and its input gradient added into dx (may be NULL). */
static tp_status adapter_backward(tp_model *m, lora_entry *e, const float *xa, const float *dy, int64_t T, float *dx)
{
    int64_t r = e->A.shape[0], out = e->B.shape[0];
    int a_split = e->a_slice.dim >= 0, b_split = e->b_slice.dim >= 0;
    float *a = malloc((size_t)(T * r) * sizeof(float)), *g = calloc((size_t)(T * r), sizeof(float));
    float *sdy = malloc((size_t)(T * out) * sizeof(float)), *gw = NULL;
    tp_status s = a && g && sdy ? TP_OK : tp_fail(TP_ERR_NOMEM, "out of memory");
    for (int64_t i = 0; !s && i < T * out; i++) sdy[i] = m->lora->scale * dy[i];
    if (!s) s = tp_matmul_ex(a, xa, T, &e->A, NULL, m->pool, &m->matmul);
    if (!s && a_split) s = all_reduce(m, a, T, r);
    if (!s) s = tp_matmul_backward(g, e->gB.data, NULL, sdy, a, T, &e->B, m->pool);
    if (!s && b_split) {
        gw = malloc((size_t)(T * r) * sizeof(float));
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
        tp_status s = adapter_backward(m, e, x, dy, T, dx);
        return s ? tp_fail_context(s, "the LoRA backward of %s", lin->name) : TP_OK;
    }
    /* With dropout the adapter saw mask(x): the same mask drawn again; its
     * input gradient goes through the mask before joining dx. */
    int64_t n = T * e->A.shape[1];
    float *xd = malloc((size_t)n * sizeof(float)), *dxa = dx ? calloc((size_t)n, sizeof(float)) : NULL;
    tp_status s = xd && (!dx || dxa) ? TP_OK : tp_fail(TP_ERR_NOMEM, "out of memory");
    if (!s) s = tp_lora_dropout(m, lin, e, x, T, xd);
    if (!s) s = adapter_backward(m, e, xd, dy, T, dxa);
    if (!s && dx) s = tp_lora_dropout(m, lin, e, dxa, T, dxa);
    for (int64_t i = 0; !s && dx && i < n; i++) dx[i] += dxa[i];
    free(xd);
    free(dxa);
    return s ? tp_fail_context(s, "the LoRA backward of %s", lin->name) : TP_OK;
}
