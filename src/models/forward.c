/* The decoder forward pass, shared by the four model types: they differ only
 * in flags (q/k/v biases, q/k norms, sliding window) that the config sets.
 *
 * Head counts come from the local weight shapes, not from the config, so the
 * same code runs on a rank that holds a slice of the heads. */
#include "tensorpar/models.h"
#include "tensorpar/kernels.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
    float *x, *h, *q, *k, *v, *attn, *gate, *up;
} scratch;

static void scratch_free(scratch *s)
{
    free(s->x); free(s->h); free(s->q); free(s->k); free(s->v);
    free(s->attn); free(s->gate); free(s->up);
}

static tp_status scratch_alloc(scratch *s, const tp_model *m, int64_t T)
{
    const tp_layer *L = &m->layers[0];
    size_t H = (size_t)m->cfg.hidden_size, t = (size_t)T;
    size_t q = (size_t)L->q_proj.weight.shape[0], kv = (size_t)L->k_proj.weight.shape[0];
    size_t inter = (size_t)L->gate_proj.weight.shape[0];
    memset(s, 0, sizeof *s);
    s->x = malloc(t * H * sizeof(float));
    s->h = malloc(t * H * sizeof(float));
    s->q = malloc(t * q * sizeof(float));
    s->k = malloc(t * kv * sizeof(float));
    s->v = malloc(t * kv * sizeof(float));
    s->attn = malloc(t * q * sizeof(float));
    s->gate = malloc(t * inter * sizeof(float));
    s->up = malloc(t * inter * sizeof(float));
    if (!s->x || !s->h || !s->q || !s->k || !s->v || !s->attn || !s->gate || !s->up) {
        scratch_free(s);
        return tp_fail(TP_ERR_NOMEM, "out of memory for activations of %lld tokens", (long long)T);
    }
    return TP_OK;
}

static void add_into(float *x, const float *y, int64_t n)
{
    for (int64_t i = 0; i < n; i++) x[i] += y[i];
}

static tp_status attention_block(tp_model *m, const tp_layer *L, tp_kv_cache *cache, int64_t layer,
                                 scratch *s, int64_t T)
{
    const tp_model_config *c = &m->cfg;
    int64_t D = c->head_dim, H = c->hidden_size, pos0 = cache->length;
    int64_t nh = L->q_proj.weight.shape[0] / D, nkv = L->k_proj.weight.shape[0] / D;
    tp_status st;
    tp_rmsnorm(s->h, s->x, &L->input_layernorm, T, H, c->rms_norm_eps);
    if ((st = tp_matmul(s->q, s->h, T, &L->q_proj.weight, &L->q_proj.bias, m->pool)) ||
        (st = tp_matmul(s->k, s->h, T, &L->k_proj.weight, &L->k_proj.bias, m->pool)) ||
        (st = tp_matmul(s->v, s->h, T, &L->v_proj.weight, &L->v_proj.bias, m->pool)))
        return st;
    if (c->qk_norm) {   /* Qwen3 normalises each head before the rotation */
        tp_rmsnorm(s->q, s->q, &L->q_norm, T * nh, D, c->rms_norm_eps);
        tp_rmsnorm(s->k, s->k, &L->k_norm, T * nkv, D, c->rms_norm_eps);
    }
    tp_rope_apply(s->q, T, nh, D, m->inv_freq, pos0);
    tp_rope_apply(s->k, T, nkv, D, m->inv_freq, pos0);
    size_t row = (size_t)(nkv * D);
    memcpy(cache->k[layer] + (size_t)pos0 * row, s->k, (size_t)T * row * sizeof(float));
    memcpy(cache->v[layer] + (size_t)pos0 * row, s->v, (size_t)T * row * sizeof(float));
    tp_attention(s->attn, s->q, cache->k[layer], cache->v[layer], T, pos0, nh, nkv, D,
                 c->sliding_window, m->pool);
    if ((st = tp_matmul(s->h, s->attn, T, &L->o_proj.weight, &L->o_proj.bias, m->pool))) return st;
    add_into(s->x, s->h, T * H);
    return TP_OK;
}

static tp_status mlp_block(tp_model *m, const tp_layer *L, scratch *s, int64_t T)
{
    const tp_model_config *c = &m->cfg;
    int64_t H = c->hidden_size, I = L->gate_proj.weight.shape[0];
    tp_status st;
    tp_rmsnorm(s->h, s->x, &L->post_attention_layernorm, T, H, c->rms_norm_eps);
    if ((st = tp_matmul(s->gate, s->h, T, &L->gate_proj.weight, NULL, m->pool)) ||
        (st = tp_matmul(s->up, s->h, T, &L->up_proj.weight, NULL, m->pool)))
        return st;
    tp_silu_mul(s->gate, s->up, T * I);
    if ((st = tp_matmul(s->h, s->gate, T, &L->down_proj.weight, NULL, m->pool))) return st;
    add_into(s->x, s->h, T * H);
    return TP_OK;
}

static tp_status embed(const tp_model *m, const int64_t *tokens, int64_t T, float *x)
{
    int64_t V = m->embed_tokens.shape[0], H = m->cfg.hidden_size;
    for (int64_t t = 0; t < T; t++) {
        if (tokens[t] < 0 || tokens[t] >= V)
            return tp_fail(TP_ERR_INVALID, "token id %lld at position %lld is outside the vocabulary [0, %lld)",
                           (long long)tokens[t], (long long)t, (long long)V);
        tp_row_to_f32(x + t * H, &m->embed_tokens, tokens[t]);
    }
    return TP_OK;
}

tp_status tp_model_forward(tp_model *m, tp_kv_cache *cache, const int64_t *tokens, int64_t T,
                           float *logits, int all_logits)
{
    if (T <= 0) return tp_fail(TP_ERR_INVALID, "forward needs at least one token");
    if (cache->length + T > cache->capacity)
        return tp_fail(TP_ERR_INVALID, "the KV cache holds %lld positions; %lld are needed",
                       (long long)cache->capacity, (long long)(cache->length + T));
    int64_t H = m->cfg.hidden_size;
    scratch s;
    tp_status st = scratch_alloc(&s, m, T);
    if (st) return st;
    if ((st = embed(m, tokens, T, s.x))) { scratch_free(&s); return st; }
    for (int64_t l = 0; l < m->cfg.num_hidden_layers && !st; l++) {
        st = attention_block(m, &m->layers[l], cache, l, &s, T);
        if (!st) st = mlp_block(m, &m->layers[l], &s, T);
    }
    if (!st) {
        int64_t first = all_logits ? 0 : T - 1;
        tp_rmsnorm(s.h, s.x + first * H, &m->norm, T - first, H, m->cfg.rms_norm_eps);
        st = tp_matmul(logits, s.h, T - first, &m->lm_head, NULL, m->pool);
        memcpy(cache->tokens + cache->length, tokens, (size_t)T * sizeof *tokens);
        cache->length += T;
    }
    scratch_free(&s);
    return st;
}
