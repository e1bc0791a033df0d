/* Choosing the next token from logits, with Transformers' logits processors
 * in Transformers' order: repetition penalty, then (when sampling)
 * temperature, top-k, top-p, min-p, and a draw from the softmax.
 *
 * Under tensor parallelism only TP rank 0 calls this and broadcasts the id
 * (tp-semantics.md §10.7), so a sampler's state never needs to agree across
 * ranks. */
#include "tensorpar/text.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

void tp_sampling_defaults(tp_sampling *s)
{
    memset(s, 0, sizeof *s);
    s->temperature = 1.0;
    s->top_k = 50;
    s->top_p = 1.0;
    s->repetition_penalty = 1.0;
}

tp_status tp_sampling_validate(const tp_sampling *s)
{
    if (s->temperature < 0) return tp_fail(TP_ERR_INVALID, "temperature must be >= 0, got %g", s->temperature);
    if (!(s->top_p > 0 && s->top_p <= 1)) return tp_fail(TP_ERR_INVALID, "top_p must be in (0, 1], got %g", s->top_p);
    if (s->min_p < 0 || s->min_p > 1) return tp_fail(TP_ERR_INVALID, "min_p must be in [0, 1], got %g", s->min_p);
    if (s->top_k < 0) return tp_fail(TP_ERR_INVALID, "top_k must be >= 0, got %lld", (long long)s->top_k);
    if (!(s->repetition_penalty > 0))
        return tp_fail(TP_ERR_INVALID, "repetition_penalty must be > 0, got %g", s->repetition_penalty);
    return TP_OK;
}

tp_status tp_sampler_init(tp_sampler *sp, const tp_sampling *s, int64_t vocab)
{
    tp_status st = tp_sampling_validate(s);
    if (st) return st;
    memset(sp, 0, sizeof *sp);
    sp->cfg = *s;
    sp->vocab = vocab;
    tp_rng_seed(&sp->rng, s->seed);
    sp->work = malloc((size_t)vocab * sizeof *sp->work);
    sp->seen = calloc((size_t)vocab, 1);
    if (!sp->work || !sp->seen) { tp_sampler_release(sp); return tp_fail(TP_ERR_NOMEM, "out of memory"); }
    return TP_OK;
}

void tp_sampler_release(tp_sampler *sp)
{
    free(sp->work);
    free(sp->seen);
    sp->work = NULL;
    sp->seen = NULL;
}

void tp_sampler_observe(tp_sampler *sp, const int64_t *ids, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        if (ids[i] >= 0 && ids[i] < sp->vocab) sp->seen[ids[i]] = 1;
}

/* Every id already in the sequence: positive logits divided by the penalty,
 * negative ones multiplied, as in the CTRL paper and Transformers. */
static void apply_repetition_penalty(const tp_sampler *sp, float *x)
{
    float p = (float)sp->cfg.repetition_penalty;
    if (p == 1.0f) return;
    for (int64_t i = 0; i < sp->vocab; i++)
        if (sp->seen[i]) x[i] = x[i] < 0 ? x[i] * p : x[i] / p;
}

static int64_t argmax(const float *x, int64_t n)
{
    int64_t best = 0;
    for (int64_t i = 1; i < n; i++) if (x[i] > x[best]) best = i;
    return best;
}

static int by_logit_desc(const void *a, const void *b)
{
    const tp_scored *x = a, *y = b;
    if (x->logit != y->logit) return x->logit < y->logit ? 1 : -1;
    return x->id < y->id ? -1 : x->id > y->id;
}

/* Softmax of the first n (sorted) candidates into .prob. */
static void softmax_candidates(tp_scored *c, int64_t n)
{
    double sum = 0;
    for (int64_t i = 0; i < n; i++) { c[i].prob = exp((double)c[i].logit - (double)c[0].logit); sum += c[i].prob; }
    for (int64_t i = 0; i < n; i++) c[i].prob /= sum;
}

/* Top-k keeps every candidate tied with the k-th (Transformers compares with
 * the k-th value, not the k-th index). */
static int64_t keep_top_k(const tp_scored *c, int64_t n, int64_t k)
{
    if (k <= 0 || k >= n) return n;
    int64_t keep = k;
    while (keep < n && c[keep].logit == c[k - 1].logit) keep++;
    return keep;
}

/* Top-p keeps the smallest prefix whose probability reaches p (at least 1). */
static int64_t keep_top_p(const tp_scored *c, int64_t n, double p)
{
    if (p >= 1.0) return n;
    double acc = 0;
    for (int64_t i = 0; i < n; i++) {
        acc += c[i].prob;
        if (acc >= p) return i + 1;
    }
    return n;
}

/* Min-p keeps candidates with probability >= min_p · the top probability. */
static int64_t keep_min_p(const tp_scored *c, int64_t n, double min_p)
{
    if (min_p <= 0) return n;
    double threshold = min_p * c[0].prob;
    int64_t keep = 1;
    while (keep < n && c[keep].prob >= threshold) keep++;
    return keep;
}

int64_t tp_sampler_next(tp_sampler *sp, float *logits)
{
    apply_repetition_penalty(sp, logits);
    const tp_sampling *s = &sp->cfg;
    if (!s->do_sample || s->temperature == 0) return argmax(logits, sp->vocab);
    tp_scored *c = sp->work;
    for (int64_t i = 0; i < sp->vocab; i++) c[i] = (tp_scored){i, logits[i] / (float)s->temperature, 0};
    qsort(c, (size_t)sp->vocab, sizeof *c, by_logit_desc);
    int64_t n = keep_top_k(c, sp->vocab, s->top_k);
    softmax_candidates(c, n);
    n = keep_top_p(c, n, s->top_p);
    softmax_candidates(c, n);
    n = keep_min_p(c, n, s->min_p);
    softmax_candidates(c, n);
    double u = tp_rng_uniform(&sp->rng), acc = 0;
    for (int64_t i = 0; i < n; i++) {
        acc += c[i].prob;
        if (u < acc) return c[i].id;
    }
    return c[n - 1].id;
}
