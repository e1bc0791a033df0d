/* The KV cache: for each layer, the rotated keys and the values of every
 * position processed so far, for this rank's KV heads only. */
#include "tensorpar/models.h"
#include "tp_module.h"

#include <stdlib.h>
#include <string.h>

tp_status tp_kv_cache_init(tp_kv_cache *c, const tp_model *m, int64_t capacity)
{
    memset(c, 0, sizeof *c);
    c->capacity = capacity;
    c->n_layers = m->cfg.num_hidden_layers;
    /* MLA caches each head's key and value after kv_b_proj, padded to one
     * width (module_mla.c). */
    c->head_dim = m->cfg.mla ? tp_mla_head_dim(&m->cfg) : m->cfg.head_dim;
    c->k = calloc((size_t)c->n_layers, sizeof(float *));
    c->v = calloc((size_t)c->n_layers, sizeof(float *));
    c->n_kv = calloc((size_t)c->n_layers, sizeof(int64_t));
    c->tokens = calloc((size_t)(capacity > 0 ? capacity : 1), sizeof(int64_t));
    if (!c->k || !c->v || !c->tokens || !c->n_kv) { tp_kv_cache_release(c); return tp_fail(TP_ERR_NOMEM, "out of memory for the KV cache"); }
    for (int64_t l = 0; l < c->n_layers; l++) {
        /* The heads k_proj's output holds on this rank: its shard's heads,
         * or all of them when the plan gathers the output. */
        const tp_layer_modules *L = &m->layers[l];
        c->n_kv[l] = m->cfg.mla ? tp_module_out_width(m, &m->modules[L->kv_b_proj]) /
                                      (m->cfg.qk_nope_head_dim + m->cfg.v_head_dim)
                                : tp_module_out_width(m, &m->modules[L->k_proj]) / m->cfg.head_dim;
        size_t bytes = (size_t)(capacity * c->n_kv[l] * c->head_dim) * sizeof(float);
        c->k[l] = tp_alloc(bytes);
        c->v[l] = tp_alloc(bytes);
        if (!c->k[l] || !c->v[l]) {
            tp_kv_cache_release(c);
            return tp_fail(TP_ERR_NOMEM, "out of memory for a KV cache of %lld positions", (long long)capacity);
        }
    }
    return TP_OK;
}

void tp_kv_cache_release(tp_kv_cache *c)
{
    for (int64_t l = 0; l < c->n_layers; l++) {
        if (c->k) tp_free(c->k[l]);
        if (c->v) tp_free(c->v[l]);
    }
    free(c->k);
    free(c->v);
    free(c->tokens);
    free(c->n_kv);
    memset(c, 0, sizeof *c);
}

void tp_kv_cache_reset(tp_kv_cache *c) { c->length = 0; }

int64_t tp_kv_cache_reuse_prefix(tp_kv_cache *c, const int64_t *ids, int64_t n)
{
    int64_t keep = 0;
    while (keep < c->length && keep < n - 1 && c->tokens[keep] == ids[keep]) keep++;
    c->length = keep;
    return keep;
}
