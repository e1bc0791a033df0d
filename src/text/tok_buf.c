/* Growable byte and id buffers for the tokenizer: encoding reuses a few of
 * them per call instead of allocating per piece. */
#include "tok_internal.h"

#include <stdlib.h>
#include <string.h>

static tp_status grow(void **data, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap) return TP_OK;
    size_t ncap = *cap ? *cap : 64;
    while (ncap < need) ncap *= 2;
    void *p = realloc(*data, ncap * elem);
    if (!p) return tp_fail(TP_ERR_NOMEM, "tokenizer: out of memory");
    *data = p;
    *cap = ncap;
    return TP_OK;
}

tp_status tp_tok_buf_reserve(tok_buf *b, size_t extra)
{
    /* +1 keeps room for a terminating NUL. */
    return grow((void **)&b->data, &b->cap, b->len + extra + 1, 1);
}

tp_status tp_tok_buf_append(tok_buf *b, const void *p, size_t n)
{
    tp_status s = tp_tok_buf_reserve(b, n);
    if (s) return s;
    if (n) memcpy(b->data + b->len, p, n);
    b->len += n;
    b->data[b->len] = '\0';
    return TP_OK;
}

void tp_tok_buf_free(tok_buf *b)
{
    free(b->data);
    b->data = NULL;
    b->len = b->cap = 0;
}

tp_status tp_tok_ids_append(tok_ids *v, const int32_t *p, size_t n)
{
    tp_status s = grow((void **)&v->data, &v->cap, v->len + n, sizeof *v->data);
    if (s) return s;
    if (n) memcpy(v->data + v->len, p, n * sizeof *p);
    v->len += n;
    return TP_OK;
}

tp_status tp_tok_ids_push(tok_ids *v, int32_t id)
{
    if (v->len < v->cap) { v->data[v->len++] = id; return TP_OK; }
    return tp_tok_ids_append(v, &id, 1);
}

void tp_tok_ids_free(tok_ids *v)
{
    free(v->data);
    v->data = NULL;
    v->len = v->cap = 0;
}

void tp_tok_spans_free(tok_spans *v)
{
    free(v->data);
    v->data = NULL;
    v->len = v->cap = 0;
}
