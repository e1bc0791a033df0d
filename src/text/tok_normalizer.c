/* Normalizers: NFC, NFD, NFKC, NFKD (utf8proc), Lowercase, Replace,
 * Prepend, Strip and Sequence of them, applied in order. */
#include "tok_internal.h"

#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

static tp_status add_step(tp_tokenizer *t, tok_norm n)
{
    if (t->n_norm >= TOK_MAX_STEPS)
        return tp_tok_bad(t, TP_ERR_UNSUPPORTED, "normalizer", "more than %d steps", TOK_MAX_STEPS);
    t->norm[t->n_norm++] = n;
    return TP_OK;
}

static tp_status parse_pattern(tp_tokenizer *t, const cJSON *j, const char *key, pcre2_code **re)
{
    const cJSON *pat = cJSON_GetObjectItemCaseSensitive(j, "pattern");
    const cJSON *str = cJSON_GetObjectItemCaseSensitive(pat, "String");
    const cJSON *rx = cJSON_GetObjectItemCaseSensitive(pat, "Regex");
    char where[256];
    snprintf(where, sizeof where, "%s: %s.pattern", t->origin, key);
    if (cJSON_IsString(str)) return tp_tok_regex_compile(re, str->valuestring, 1, where);
    if (cJSON_IsString(rx)) return tp_tok_regex_compile(re, rx->valuestring, 0, where);
    return tp_tok_bad(t, TP_ERR_FORMAT, key, "pattern must be {\"String\": ...} or {\"Regex\": ...}");
}

static tp_status parse_one(tp_tokenizer *t, const cJSON *j)
{
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(j, "type");
    if (!cJSON_IsString(type)) return tp_tok_bad(t, TP_ERR_FORMAT, "normalizer", "missing \"type\"");
    const char *ty = type->valuestring;
    static const struct { const char *name; tok_norm_kind kind; } simple[] = {
        {"NFC", TOK_NFC}, {"NFD", TOK_NFD}, {"NFKC", TOK_NFKC}, {"NFKD", TOK_NFKD},
        {"Lowercase", TOK_LOWERCASE},
    };
    for (size_t i = 0; i < sizeof simple / sizeof simple[0]; i++)
        if (!strcmp(ty, simple[i].name)) return add_step(t, (tok_norm){.kind = simple[i].kind});
    if (!strcmp(ty, "Sequence")) {
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(j, "normalizers");
        if (!cJSON_IsArray(list)) return tp_tok_bad(t, TP_ERR_FORMAT, "normalizer.normalizers", "must be an array");
        const cJSON *e;
        cJSON_ArrayForEach(e, list) {
            tp_status s = parse_one(t, e);
            if (s) return s;
        }
        return TP_OK;
    }
    tok_norm n = {0};
    if (!strcmp(ty, "Replace")) {
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(j, "content");
        if (!cJSON_IsString(content)) return tp_tok_bad(t, TP_ERR_FORMAT, "normalizer.content", "must be a string");
        n.kind = TOK_REPLACE;
        tp_status s = parse_pattern(t, j, "normalizer", &n.re);
        if (s) return s;
        n.text = strdup(content->valuestring);
    } else if (!strcmp(ty, "Prepend")) {
        const cJSON *p = cJSON_GetObjectItemCaseSensitive(j, "prepend");
        if (!cJSON_IsString(p)) return tp_tok_bad(t, TP_ERR_FORMAT, "normalizer.prepend", "must be a string");
        n.kind = TOK_PREPEND;
        n.text = strdup(p->valuestring);
    } else if (!strcmp(ty, "Strip")) {
        n.kind = TOK_STRIP;
        n.left = tp_tok_json_bool(j, "strip_left", 1);
        n.right = tp_tok_json_bool(j, "strip_right", 1);
        return add_step(t, n);
    } else {
        return tp_tok_bad(t, TP_ERR_UNSUPPORTED, "normalizer.type", "'%s' is not supported", ty);
    }
    if (!n.text) { pcre2_code_free(n.re); return tp_fail(TP_ERR_NOMEM, "tokenizer: out of memory"); }
    tp_status s = add_step(t, n);
    if (s) { pcre2_code_free(n.re); free(n.text); }
    return s;
}

tp_status tp_tok_normalizer_parse(tp_tokenizer *t, const cJSON *j)
{
    if (!j || cJSON_IsNull(j)) return TP_OK;
    return parse_one(t, j);
}

static int is_ascii(const char *s, size_t len)
{
    for (size_t i = 0; i < len; i++)
        if ((unsigned char)s[i] >= 0x80) return 0;
    return 1;
}

static tp_status unicode_form(tok_norm_kind k, const char *s, size_t len, tok_buf *out)
{
    /* ASCII is left alone by every normalization form: skip utf8proc. */
    if (is_ascii(s, len)) return tp_tok_buf_append(out, s, len);
    int opts = UTF8PROC_STABLE;
    if (k == TOK_NFC) opts |= UTF8PROC_COMPOSE;
    if (k == TOK_NFD) opts |= UTF8PROC_DECOMPOSE;
    if (k == TOK_NFKC) opts |= UTF8PROC_COMPOSE | UTF8PROC_COMPAT;
    if (k == TOK_NFKD) opts |= UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT;
    utf8proc_uint8_t *res = NULL;
    utf8proc_ssize_t n = utf8proc_map((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)len, &res,
                                      (utf8proc_option_t)opts);
    if (n < 0) return tp_fail(TP_ERR_INVALID, "tokenizer: normalization failed: %s", utf8proc_errmsg(n));
    tp_status st = tp_tok_buf_append(out, res, (size_t)n);
    free(res);
    return st;
}

static tp_status lowercase(const char *s, size_t len, tok_buf *out)
{
    tp_status st;
    for (size_t i = 0; i < len;) {
        int32_t cp;
        int n = tp_tok_utf8_decode(s + i, len - i, &cp);
        i += (size_t)n;
        if (cp < 0x80) {
            char c = (char)(cp >= 'A' && cp <= 'Z' ? cp + 32 : cp);
            if ((st = tp_tok_buf_append(out, &c, 1))) return st;
            continue;
        }
        /* Rust's char::to_lowercase maps U+0130 to "i\u0307", the one
         * unconditional multi-character lowercase mapping; utf8proc gives
         * plain 'i'. */
        if (cp == 0x130) {
            if ((st = tp_tok_buf_append(out, "i\xCC\x87", 3))) return st;
            continue;
        }
        utf8proc_uint8_t enc[4];
        utf8proc_ssize_t m = utf8proc_encode_char(utf8proc_tolower(cp), enc);
        if ((st = tp_tok_buf_append(out, enc, (size_t)m))) return st;
    }
    return TP_OK;
}

static tp_status replace(const tok_norm *n, tok_matcher *m, const char *s, size_t len, tok_buf *out)
{
    size_t pos = 0, from = 0, ms, me;
    size_t clen = strlen(n->text);
    tp_status st;
    int r;
    while ((r = tp_tok_regex_next(n->re, m, s, len, from, &ms, &me)) == 1) {
        if ((st = tp_tok_buf_append(out, s + pos, ms - pos))) return st;
        if ((st = tp_tok_buf_append(out, n->text, clen))) return st;
        pos = me;
        if (me == ms) {          /* empty match: step over one character */
            if (me >= len) break;
            int32_t cp;
            from = me + (size_t)tp_tok_utf8_decode(s + me, len - me, &cp);
            if ((st = tp_tok_buf_append(out, s + me, from - me))) return st;
            pos = from;
        } else {
            from = me;
        }
    }
    if (r < 0) return TP_ERR_INTERNAL;
    return tp_tok_buf_append(out, s + pos, len - pos);
}

static tp_status strip(const tok_norm *n, const char *s, size_t len, tok_buf *out)
{
    size_t b = 0, e = len;
    int32_t cp;
    while (n->left && b < e) {
        int k = tp_tok_utf8_decode(s + b, e - b, &cp);
        if (!tp_tok_is_space(cp)) break;
        b += (size_t)k;
    }
    while (n->right && e > b) {
        size_t k = e - 1;
        while (k > b && ((unsigned char)s[k] & 0xC0) == 0x80) k--;
        tp_tok_utf8_decode(s + k, e - k, &cp);
        if (!tp_tok_is_space(cp)) break;
        e = k;
    }
    return tp_tok_buf_append(out, s + b, e - b);
}

static tp_status apply(const tok_norm *n, tok_matcher *m, const char *s, size_t len, tok_buf *out)
{
    switch (n->kind) {
    case TOK_NFC: case TOK_NFD: case TOK_NFKC: case TOK_NFKD: return unicode_form(n->kind, s, len, out);
    case TOK_LOWERCASE: return lowercase(s, len, out);
    case TOK_REPLACE: return replace(n, m, s, len, out);
    case TOK_STRIP: return strip(n, s, len, out);
    case TOK_PREPEND: {
        /* As `tokenizers`: only a non-empty string gets the prefix. */
        tp_status st = len ? tp_tok_buf_append(out, n->text, strlen(n->text)) : TP_OK;
        return st ? st : tp_tok_buf_append(out, s, len);
    }
    }
    return tp_fail(TP_ERR_INTERNAL, "tokenizer: bad normalizer kind");
}

tp_status tp_tok_normalize(const tp_tokenizer *t, tok_matcher *m, const char *s, size_t len, tok_buf *out)
{
    out->len = 0;
    tp_status st = tp_tok_buf_append(out, s, len);
    tok_buf tmp = {0};
    for (int i = 0; i < t->n_norm && !st; i++) {
        tmp.len = 0;
        st = apply(&t->norm[i], m, out->data, out->len, &tmp);
        if (!st) { tok_buf x = *out; *out = tmp; tmp = x; }
    }
    tp_tok_buf_free(&tmp);
    return st;
}
