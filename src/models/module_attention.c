/* The attention module (self_attn): q/k/v projections as one group, Qwen3's
 * per-head q/k norms, rotary embedding, the KV cache append, causal
 * attention over the cache, and o_proj, whose output joins the residual
 * stream (left pending for the next norm).  Head counts come from the width
 * of the local activations, not from the config, so a rank computes
 * exactly the heads its shards hold.  Backward: added here by the training
 * issue. */
#include "tp_module.h"

#include "tensorpar/kernels.h"

#include <string.h>

/* The first global head of a head-sliced activation (q, k or v). */
static int64_t first_head(const tp_model *m, const tp_module *proj, const tp_act *a, int64_t D)
{
    if (proj->tp && proj->tp->kv_rep > 1) return m->tp->rank / proj->tp->kv_rep;
    return tp_act_offset(m, a) / D;
}

/* Local query head h must read local KV head h / (nq / nkv), which is what
 * the attention kernel does; check that the plan's layout gives exactly
 * that (it does for colwise q/k/v, gathered q/k/v, and KV replication). */
static tp_status check_head_layout(const tp_model_config *c, int64_t q0, int64_t nq, int64_t k0, int64_t nkv,
                                   const char *layer)
{
    int64_t group = c->num_attention_heads / c->num_key_value_heads;
    int ok = nq > 0 && nkv > 0 && nq % nkv == 0;
    for (int64_t h = 0; ok && h < nq; h++) ok = (q0 + h) / group - k0 == h / (nq / nkv);
    if (!ok)
        return tp_fail(TP_ERR_UNSUPPORTED, "%s: this rank's query heads [%lld, %lld) do not line up with its "
                       "KV heads [%lld, %lld); shard q_proj, k_proj and v_proj alike",
                       layer, (long long)q0, (long long)(q0 + nq), (long long)k0, (long long)(k0 + nkv));
    return TP_OK;
}

typedef struct {
    tp_act q, k, v;
} qkv_acts;

static void qkv_release(tp_model *m, qkv_acts *a)
{
    tp_act_release(m, &a->q); tp_act_release(m, &a->k); tp_act_release(m, &a->v);
}

static tp_status project_qkv(tp_model *m, const tp_layer_modules *L, const float *h, int64_t T, qkv_acts *a)
{
    int64_t H = m->cfg.hidden_size;
    const tp_module *lins[3] = {&m->modules[L->q_proj], &m->modules[L->k_proj], &m->modules[L->v_proj]};
    tp_act out[3];
    tp_status s = tp_module_linear_group(m, lins, 3, h, T, H, out);
    if (s) return s;
    a->q = out[0], a->k = out[1], a->v = out[2];
    if (a->k.width != a->v.width)
        return tp_fail(TP_ERR_UNSUPPORTED, "k_proj and v_proj give %lld and %lld features on this rank; "
                       "shard them alike", (long long)a->k.width, (long long)a->v.width);
    return TP_OK;
}

/* f->sc.h holds input_layernorm(x); on return f->pending holds the
 * attention output (o_proj's), which post_attention_layernorm adds. */
static tp_status attention_forward(tp_model *m, const tp_module *mod, tp_forward_pass *f)
{
    const tp_model_config *c = &m->cfg;
    const tp_layer_modules *L = &m->layers[mod->layer];
    tp_kv_cache *cache = f->cache;
    fwd_scratch *sc = &f->sc;
    int64_t D = c->head_dim, pos0 = cache->length, T = f->T, layer = mod->layer;
    qkv_acts a = {0};
    tp_status st = project_qkv(m, L, sc->h, T, &a);
    int64_t nq = a.q.width / D, nkv = a.k.width / D;
    char where[48];
    snprintf(where, sizeof where, "layer %lld", (long long)layer);
    if (!st) st = check_head_layout(c, first_head(m, &m->modules[L->q_proj], &a.q, D), nq,
                                    first_head(m, &m->modules[L->k_proj], &a.k, D), nkv, where);
    if (!st && nkv != cache->n_kv[layer])
        st = tp_fail(TP_ERR_INVALID, "%s has %lld KV heads on this rank; the cache was made for %lld",
                     where, (long long)nkv, (long long)cache->n_kv[layer]);
    if (!st) {
        if (L->q_norm >= 0) {   /* Qwen3 normalises each head before the rotation */
            tp_par_rmsnorm(m, a.q.data, a.q.data, tp_module_weight(&m->modules[L->q_norm]), T * nq, D);
            tp_par_rmsnorm(m, a.k.data, a.k.data, tp_module_weight(&m->modules[L->k_norm]), T * nkv, D);
        }
        tp_par_rope(m, a.q.data, T, nq, D, sc->rope);
        tp_par_rope(m, a.k.data, T, nkv, D, sc->rope);
        size_t row = (size_t)(nkv * D);
        memcpy(cache->k[layer] + (size_t)pos0 * row, a.k.data, (size_t)T * row * sizeof(float));
        memcpy(cache->v[layer] + (size_t)pos0 * row, a.v.data, (size_t)T * row * sizeof(float));
        tp_attention(sc->attn, a.q.data, cache->k[layer], cache->v[layer], T, pos0, nq, nkv, D,
                     c->sliding_window, m->pool);
        st = tp_module_linear_to_stream(m, f, &m->modules[L->o_proj], mod, sc->attn, T, nq * D, &f->pending);
    }
    qkv_release(m, &a);
    return st;
}

const tp_module_ops tp_attention_ops = {"attention", attention_forward, NULL};
