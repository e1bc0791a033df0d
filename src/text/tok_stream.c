/* Incremental decoding: bytes of a character that a token leaves
 * unfinished are held back until the next token completes them, so every
 * piece handed out is valid UTF-8 and the pieces concatenate to what
 * tp_tokenizer_decode gives for the whole sequence. */
#include "tok_internal.h"

#include <stdlib.h>
#include <string.h>

struct tp_detok_stream {
    const tp_tokenizer *tok;
    int skip_special, first;
    tok_buf pending;     /* decoded bytes not yet handed out */
};

tp_status tp_detok_stream_create(tp_detok_stream **out, const tp_tokenizer *tok, int skip_special_tokens)
{
    tp_detok_stream *s = calloc(1, sizeof *s);
    if (!s) return tp_fail(TP_ERR_NOMEM, "tokenizer: out of memory");
    s->tok = tok;
    s->skip_special = skip_special_tokens;
    s->first = 1;
    *out = s;
    return TP_OK;
}

static tp_status drain(tp_detok_stream *s, int final, char **text, size_t *len)
{
    tok_buf out = {0};
    size_t used = 0;
    tp_status st = tp_tok_utf8_lossy(&out, s->pending.data ? s->pending.data : "", s->pending.len, final, &used);
    if (!st) st = tp_tok_buf_append(&out, "", 0);
    if (st) { tp_tok_buf_free(&out); return st; }
    if (used) {
        memmove(s->pending.data, s->pending.data + used, s->pending.len - used);
        s->pending.len -= used;
    }
    *text = out.data;
    if (len) *len = out.len;
    return TP_OK;
}

tp_status tp_detok_stream_push(tp_detok_stream *s, int32_t id, char **text, size_t *len)
{
    *text = NULL;
    if (!(s->skip_special && tp_tokenizer_is_special(s->tok, id))) {
        tp_status st = tp_tok_decode_token(s->tok, id, s->first, &s->pending);
        if (st) return st;
        s->first = 0;
    }
    return drain(s, 0, text, len);
}

tp_status tp_detok_stream_finish(tp_detok_stream *s, char **text, size_t *len)
{
    *text = NULL;
    return drain(s, 1, text, len);
}

void tp_detok_stream_free(tp_detok_stream *s)
{
    if (!s) return;
    tp_tok_buf_free(&s->pending);
    free(s);
}
