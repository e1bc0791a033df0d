/* The generation loop: prefill the prompt, then one token at a time, with a
 * sampler choosing each id, text streamed as it completes, and stops at eos
 * ids, at stop strings, or after max_new_tokens. */
#include "tensorpar/text.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
    char *text;          /* generated text so far */
    size_t len, cap, emitted;
} text_buf;

static tp_status append(text_buf *b, const char *s, size_t n)
{
    if (b->len + n + 1 > b->cap) {
        size_t cap = (b->len + n + 1) * 2;
        char *t = realloc(b->text, cap);
        if (!t) return tp_fail(TP_ERR_NOMEM, "out of memory");
        b->text = t;
        b->cap = cap;
    }
    memcpy(b->text + b->len, s, n);
    b->len += n;
    b->text[b->len] = '\0';
    return TP_OK;
}

/* Where the first stop string starts in the text, or -1. */
static int64_t find_stop(const text_buf *b, const tp_generate_options *o)
{
    int64_t best = -1;
    for (int i = 0; i < o->n_stop; i++) {
        size_t sl = strlen(o->stop[i]);
        if (!sl || sl > b->len) continue;
        const char *p = memmem(b->text, b->len, o->stop[i], sl);
        if (p && (best < 0 || p - b->text < best)) best = p - b->text;
    }
    return best;
}

/* Text that might still grow into a stop string is held back. */
static size_t holdback(const text_buf *b, const tp_generate_options *o)
{
    size_t hold = 0;
    for (int i = 0; i < o->n_stop; i++) {
        size_t sl = strlen(o->stop[i]);
        for (size_t k = sl > 1 ? sl - 1 : 0; k > hold; k--)
            if (k <= b->len && !memcmp(b->text + b->len - k, o->stop[i], k)) { hold = k; break; }
    }
    return hold;
}

static void emit(text_buf *b, size_t upto, const tp_generate_options *o)
{
    if (upto > b->emitted && o->on_text) o->on_text(o->ctx, b->text + b->emitted, upto - b->emitted);
    if (upto > b->emitted) b->emitted = upto;
}

static int is_eos(const tp_generate_options *o, int64_t id)
{
    for (int i = 0; i < o->n_eos; i++) if (o->eos_ids[i] == id) return 1;
    return 0;
}

typedef struct {
    tp_model *m;
    tp_kv_cache *kv;
    const tp_generate_options *o;
    tp_sampler sampler;
    tp_detok_stream *stream;
    text_buf text;
    float *logits;
} gen_state;

/* Streams the text of `id`; returns 1 when a stop string was reached. */
static tp_status stream_token(gen_state *g, int64_t id, int *stop)
{
    *stop = 0;
    if (!g->stream) return TP_OK;
    char *piece;
    size_t n;
    tp_status s = is_eos(g->o, id) ? tp_detok_stream_finish(g->stream, &piece, &n)
                                   : tp_detok_stream_push(g->stream, (int32_t)id, &piece, &n);
    if (s) return s;
    s = append(&g->text, piece, n);
    free(piece);
    if (s) return s;
    int64_t at = find_stop(&g->text, g->o);
    if (at >= 0) {
        emit(&g->text, (size_t)at, g->o);
        *stop = 1;
    } else {
        emit(&g->text, g->text.len - holdback(&g->text, g->o), g->o);
    }
    return TP_OK;
}

static tp_status finish_stream(gen_state *g, int stopped)
{
    if (!g->stream || stopped) return TP_OK;
    char *piece;
    size_t n;
    tp_status s = tp_detok_stream_finish(g->stream, &piece, &n);
    if (!s) s = append(&g->text, piece, n);
    if (!s) free(piece);
    if (!s) emit(&g->text, g->text.len, g->o);
    return s;
}

static tp_status gen_init(gen_state *g, tp_model *m, tp_kv_cache *kv, const tp_generate_options *o)
{
    memset(g, 0, sizeof *g);
    g->m = m;
    g->kv = kv;
    g->o = o;
    tp_status s = tp_sampler_init(&g->sampler, &o->sampling, m->cfg.vocab_size);
    if (s) return s;
    g->logits = malloc((size_t)m->cfg.vocab_size * sizeof(float));
    if (!g->logits) return tp_fail(TP_ERR_NOMEM, "out of memory");
    if (o->tok) return tp_detok_stream_create(&g->stream, o->tok, 1);
    return TP_OK;
}

static void gen_release(gen_state *g)
{
    tp_sampler_release(&g->sampler);
    if (g->stream) tp_detok_stream_free(g->stream);
    free(g->text.text);
    free(g->logits);
}

static tp_status prefill(gen_state *g, const int64_t *prompt, int64_t n, tp_generate_stats *st)
{
    int64_t reused = tp_kv_cache_reuse_prefix(g->kv, prompt, n);
    /* Only the prompt must fit: decoding stops when the cache is full. */
    if (g->kv->length + (n - reused) > g->kv->capacity)
        return tp_fail(TP_ERR_INVALID, "the prompt of %lld tokens does not fit the context of %lld positions",
                       (long long)n, (long long)g->kv->capacity);
    tp_sampler_observe(&g->sampler, prompt, n);
    double t0 = tp_now();
    tp_status s = tp_model_forward(g->m, g->kv, prompt + reused, n - reused, g->logits, 0);
    st->prefill_s = tp_now() - t0;
    st->prompt_tokens = n;
    st->reused_tokens = reused;
    return s;
}

tp_status tp_generate(tp_model *m, tp_kv_cache *kv, const int64_t *prompt, int64_t n_prompt,
                      const tp_generate_options *o, int64_t *out, int64_t *n_out, tp_generate_stats *st)
{
    memset(st, 0, sizeof *st);
    *n_out = 0;
    if (n_prompt <= 0) return tp_fail(TP_ERR_INVALID, "the prompt is empty");
    gen_state g;
    tp_status s = gen_init(&g, m, kv, o);
    if (!s) s = prefill(&g, prompt, n_prompt, st);
    double t0 = tp_now();
    int stopped = 0;
    st->stop_reason = "length";
    while (!s && *n_out < o->max_new_tokens) {
        /* The next token would sit at position kv->length: past the cache,
         * the model has no position for it (max_position_embeddings). */
        if (kv->length >= kv->capacity) { st->stop_reason = "context full"; break; }
        int64_t id = tp_sampler_next(&g.sampler, g.logits);
        if (o->choose && (s = o->choose(o->choose_ctx, &id))) break;
        out[(*n_out)++] = id;
        tp_sampler_observe(&g.sampler, &id, 1);
        if ((s = stream_token(&g, id, &stopped))) break;
        if (stopped) { st->stop_reason = "stop string"; break; }
        if (is_eos(o, id)) { st->stop_reason = "eos"; stopped = 1; break; }
        if (*n_out == o->max_new_tokens) break;
        s = tp_model_forward(m, kv, &id, 1, g.logits, 0);
    }
    if (!s) s = finish_stream(&g, stopped);
    st->decode_s = tp_now() - t0;
    st->new_tokens = *n_out;
    gen_release(&g);
    return s;
}
