/* Decoders: ByteLevel maps each character of a token back to its byte; a
 * token holding a character outside the map (an added token such as
 * "<think>" is fine, it is printable ASCII) is taken as its raw UTF-8, as
 * `tokenizers` does.  Without a decoder, tokens are joined by spaces. */
#include "tok_internal.h"

#include <string.h>

static tp_status parse_one(tp_tokenizer *t, const cJSON *j)
{
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(j, "type");
    if (!cJSON_IsString(type)) return tp_tok_bad(t, TP_ERR_FORMAT, "decoder", "missing \"type\"");
    if (!strcmp(type->valuestring, "ByteLevel")) { t->decoder_byte_level = 1; return TP_OK; }
    if (!strcmp(type->valuestring, "Sequence")) {
        const cJSON *e;
        cJSON_ArrayForEach(e, cJSON_GetObjectItemCaseSensitive(j, "decoders")) {
            tp_status st = parse_one(t, e);
            if (st) return st;
        }
        return TP_OK;
    }
    return tp_tok_bad(t, TP_ERR_UNSUPPORTED, "decoder.type", "'%s' is not supported", type->valuestring);
}

tp_status tp_tok_decoder_parse(tp_tokenizer *t, const cJSON *j)
{
    if (!j || cJSON_IsNull(j)) return TP_OK;
    return parse_one(t, j);
}

/* Maps a ByteLevel token to bytes; 0 if some character is not in the map. */
static int bytelevel_bytes(const tp_tokenizer *t, const char *s, size_t len, tok_buf *out)
{
    size_t mark = out->len;
    for (size_t i = 0; i < len;) {
        int32_t cp;
        i += (size_t)tp_tok_utf8_decode(s + i, len - i, &cp);
        if (cp >= 512 || t->char_byte[cp] < 0) { out->len = mark; return 0; }
        out->data[out->len++] = (char)t->char_byte[cp];
    }
    return 1;
}

tp_status tp_tok_decode_token(const tp_tokenizer *t, int32_t id, int first, tok_buf *out)
{
    const char *s = tp_tokenizer_id_to_token(t, id);
    if (!s)
        return tp_fail(TP_ERR_INVALID, "token id %ld is not in the vocabulary (size %zu)", (long)id, t->n_ids);
    size_t len = t->id_len[id];
    tp_status st = tp_tok_buf_reserve(out, len + 1);
    if (st) return st;
    if (t->decoder_byte_level) {
        if (bytelevel_bytes(t, s, len, out)) return TP_OK;
        return tp_tok_buf_append(out, s, len);
    }
    if (!first && (st = tp_tok_buf_append(out, " ", 1))) return st;
    return tp_tok_buf_append(out, s, len);
}
