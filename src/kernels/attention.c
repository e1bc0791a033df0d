/* Causal scaled-dot-product attention over the KV cache, one (query, head)
 * row at a time: only one row of scores exists at once, so long prompts
 * never materialise a T×T matrix. */
#include "tensorpar/kernels.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    float *out;
    const float *q, *k, *v;
    int64_t T, pos0, n_heads, n_kv, d, window;
} attn_job;

static void attend_row(const attn_job *j, int64_t t, int64_t h, float *scores)
{
    int64_t pos = j->pos0 + t;
    int64_t first = j->window > 0 && pos - j->window + 1 > 0 ? pos - j->window + 1 : 0;
    int64_t kvh = h / (j->n_heads / j->n_kv), kv_stride = j->n_kv * j->d;
    const float *q = j->q + (t * j->n_heads + h) * j->d;
    float scale = 1.0f / sqrtf((float)j->d);
    for (int64_t p = first; p <= pos; p++) {
        const float *k = j->k + p * kv_stride + kvh * j->d;
        float dot = 0;
        for (int64_t i = 0; i < j->d; i++) dot += q[i] * k[i];
        scores[p - first] = dot * scale;
    }
    tp_softmax(scores, pos - first + 1);
    float *o = j->out + (t * j->n_heads + h) * j->d;
    memset(o, 0, (size_t)j->d * sizeof(float));
    for (int64_t p = first; p <= pos; p++) {
        const float *v = j->v + p * kv_stride + kvh * j->d;
        float w = scores[p - first];
        for (int64_t i = 0; i < j->d; i++) o[i] += w * v[i];
    }
}

static void attention_worker(void *p, int ti, int nt)
{
    const attn_job *j = p;
    int64_t b, e;
    tp_split_range(j->T * j->n_heads, ti, nt, &b, &e);
    float *scores = malloc((size_t)(j->pos0 + j->T) * sizeof(float));
    if (!scores) return;
    for (int64_t r = b; r < e; r++) attend_row(j, r / j->n_heads, r % j->n_heads, scores);
    free(scores);
}

void tp_attention(float *out, const float *q, const float *k, const float *v,
                  int64_t T, int64_t pos0, int64_t n_heads, int64_t n_kv, int64_t d,
                  int64_t window, tp_threadpool *pool)
{
    attn_job j = {out, q, k, v, T, pos0, n_heads, n_kv, d, window};
    tp_parallel_run(pool, attention_worker, &j);
}
