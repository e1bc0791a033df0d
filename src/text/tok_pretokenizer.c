/* Pre-tokenizers: Split (regex or string, five behaviours, invert),
 * ByteLevel (prefix space, GPT-2 regex), Digits and Sequence.
 *
 * Each step turns a list of pieces into a finer one, as `tokenizers`'
 * PreTokenizedString::split does: the step's pattern cuts a piece into
 * matched and unmatched runs, the behaviour decides which runs stay and
 * which merge, and empty pieces are dropped. */
#include "tok_internal.h"

#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

/* GPT-2's pattern, used by ByteLevel with use_regex. */
static const char GPT2_PATTERN[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

typedef struct { size_t b, e; int match; } run;
typedef struct { run *data; size_t len, cap; } runs;

static tp_status runs_push(runs *v, size_t b, size_t e, int match)
{
    if (v->len == v->cap) {
        size_t ncap = v->cap ? v->cap * 2 : 32;
        run *p = realloc(v->data, ncap * sizeof *p);
        if (!p) return tp_fail(TP_ERR_NOMEM, "tokenizer: out of memory");
        v->data = p;
        v->cap = ncap;
    }
    v->data[v->len++] = (run){b, e, match};
    return TP_OK;
}

static tp_status add_step(tp_tokenizer *t, tok_pre p)
{
    if (t->n_pre >= TOK_MAX_STEPS) {
        pcre2_code_free(p.re);
        return tp_tok_bad(t, TP_ERR_UNSUPPORTED, "pre_tokenizer", "more than %d steps", TOK_MAX_STEPS);
    }
    t->pre[t->n_pre++] = p;
    return TP_OK;
}

static tp_status parse_behavior(tp_tokenizer *t, const cJSON *j, tok_behavior *out)
{
    static const struct { const char *name; tok_behavior b; } names[] = {
        {"Removed", TOK_REMOVED}, {"Isolated", TOK_ISOLATED}, {"MergedWithPrevious", TOK_MERGED_PREV},
        {"MergedWithNext", TOK_MERGED_NEXT}, {"Contiguous", TOK_CONTIGUOUS},
    };
    const cJSON *b = cJSON_GetObjectItemCaseSensitive(j, "behavior");
    if (!cJSON_IsString(b)) return tp_tok_bad(t, TP_ERR_FORMAT, "pre_tokenizer.behavior", "must be a string");
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (!strcmp(b->valuestring, names[i].name)) { *out = names[i].b; return TP_OK; }
    return tp_tok_bad(t, TP_ERR_FORMAT, "pre_tokenizer.behavior", "unknown behavior '%s'", b->valuestring);
}

static tp_status parse_split(tp_tokenizer *t, const cJSON *j)
{
    tok_pre p = {.kind = TOK_SPLIT, .invert = tp_tok_json_bool(j, "invert", 0)};
    tp_status s = parse_behavior(t, j, &p.behavior);
    if (s) return s;
    const cJSON *pat = cJSON_GetObjectItemCaseSensitive(j, "pattern");
    const cJSON *str = cJSON_GetObjectItemCaseSensitive(pat, "String");
    const cJSON *rx = cJSON_GetObjectItemCaseSensitive(pat, "Regex");
    char where[256];
    snprintf(where, sizeof where, "%s: pre_tokenizer.pattern", t->origin);
    if (cJSON_IsString(str)) s = tp_tok_regex_compile(&p.re, str->valuestring, 1, where);
    else if (cJSON_IsString(rx)) s = tp_tok_regex_compile(&p.re, rx->valuestring, 0, where);
    else return tp_tok_bad(t, TP_ERR_FORMAT, "pre_tokenizer.pattern", "must be {\"String\": ...} or {\"Regex\": ...}");
    return s ? s : add_step(t, p);
}

static tp_status parse_bytelevel(tp_tokenizer *t, const cJSON *j)
{
    tok_pre p = {.kind = TOK_BYTELEVEL, .behavior = TOK_ISOLATED,
                 .add_prefix_space = tp_tok_json_bool(j, "add_prefix_space", 1)};
    if (tp_tok_json_bool(j, "use_regex", 1)) {
        char where[256];
        snprintf(where, sizeof where, "%s: ByteLevel regex", t->origin);
        tp_status s = tp_tok_regex_compile(&p.re, GPT2_PATTERN, 0, where);
        if (s) return s;
    }
    t->byte_level = 1;
    return add_step(t, p);
}

static tp_status parse_one(tp_tokenizer *t, const cJSON *j)
{
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(j, "type");
    if (!cJSON_IsString(type)) return tp_tok_bad(t, TP_ERR_FORMAT, "pre_tokenizer", "missing \"type\"");
    const char *ty = type->valuestring;
    /* ByteLevel maps bytes to characters; tensorpar keeps raw bytes until
     * BPE, which is the same only when no later step looks at the text. */
    if (t->n_pre > 0 && t->pre[t->n_pre - 1].kind == TOK_BYTELEVEL)
        return tp_tok_bad(t, TP_ERR_UNSUPPORTED, "pre_tokenizer", "a step after ByteLevel is not supported");
    if (!strcmp(ty, "Split")) return parse_split(t, j);
    if (!strcmp(ty, "ByteLevel")) return parse_bytelevel(t, j);
    if (!strcmp(ty, "Digits"))
        return add_step(t, (tok_pre){.kind = TOK_DIGITS,
                                     .individual_digits = tp_tok_json_bool(j, "individual_digits", 0)});
    if (!strcmp(ty, "Sequence")) {
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(j, "pretokenizers");
        if (!cJSON_IsArray(list)) return tp_tok_bad(t, TP_ERR_FORMAT, "pre_tokenizer.pretokenizers", "must be an array");
        const cJSON *e;
        cJSON_ArrayForEach(e, list) {
            tp_status s = parse_one(t, e);
            if (s) return s;
        }
        return TP_OK;
    }
    return tp_tok_bad(t, TP_ERR_UNSUPPORTED, "pre_tokenizer.type", "'%s' is not supported", ty);
}

tp_status tp_tok_pretokenizer_parse(tp_tokenizer *t, const cJSON *j)
{
    if (!j || cJSON_IsNull(j)) return TP_OK;
    return parse_one(t, j);
}

/* ---- splitting --------------------------------------------------------- */

/* Regex matches of s as runs covering all of it (find_matches). */
static tp_status regex_runs(const pcre2_code *re, tok_matcher *m, const char *s, size_t len, runs *out)
{
    size_t prev = 0, from = 0, ms, me;
    tp_status st;
    int r;
    while ((r = tp_tok_regex_next(re, m, s, len, from, &ms, &me)) == 1) {
        if (prev != ms && (st = runs_push(out, prev, ms, 0))) return st;
        if ((st = runs_push(out, ms, me, 1))) return st;
        prev = me;
        if (me == ms) {   /* empty match: move on by one character */
            if (me >= len) break;
            int32_t cp;
            from = me + (size_t)tp_tok_utf8_decode(s + me, len - me, &cp);
        } else {
            from = me;
        }
    }
    if (r < 0) return TP_ERR_INTERNAL;
    return prev != len ? runs_push(out, prev, len, 0) : TP_OK;
}

/* Rust's char::is_numeric: general categories Nd, Nl, No. */
static int is_numeric(int32_t cp)
{
    if (cp < 0x80) return cp >= '0' && cp <= '9';
    utf8proc_category_t c = utf8proc_category(cp);
    return c == UTF8PROC_CATEGORY_ND || c == UTF8PROC_CATEGORY_NL || c == UTF8PROC_CATEGORY_NO;
}

/* Each numeric character is one match; the text between is one run. */
static tp_status digit_runs(const char *s, size_t len, runs *out)
{
    size_t prev = 0;
    tp_status st;
    for (size_t i = 0; i < len;) {
        int32_t cp;
        size_t n = (size_t)tp_tok_utf8_decode(s + i, len - i, &cp);
        if (is_numeric(cp)) {
            if (prev != i && (st = runs_push(out, prev, i, 0))) return st;
            if ((st = runs_push(out, i, i + n, 1))) return st;
            prev = i + n;
        }
        i += n;
    }
    return prev != len ? runs_push(out, prev, len, 0) : TP_OK;
}

/* Rewrites runs in place so that `match` means "remove", as
 * NormalizedString::split does for each behaviour. */
static void apply_behavior(runs *v, tok_behavior b)
{
    size_t n = 0;
    int prev_match = 0;
    switch (b) {
    case TOK_REMOVED: return;
    case TOK_ISOLATED:
        for (size_t i = 0; i < v->len; i++) v->data[i].match = 0;
        return;
    case TOK_CONTIGUOUS:
        for (size_t i = 0; i < v->len; i++) {
            run r = v->data[i];
            if (n && r.match == prev_match) v->data[n - 1].e = r.e;
            else v->data[n++] = (run){r.b, r.e, 0};
            prev_match = r.match;
        }
        break;
    case TOK_MERGED_PREV:
        for (size_t i = 0; i < v->len; i++) {
            run r = v->data[i];
            if (n && r.match && !prev_match) v->data[n - 1].e = r.e;
            else v->data[n++] = (run){r.b, r.e, 0};
            prev_match = r.match;
        }
        break;
    case TOK_MERGED_NEXT:
        /* Walk backwards, merging each match into the run after it. */
        for (size_t i = v->len; i-- > 0;) {
            run r = v->data[i];
            if (n && r.match && !prev_match) v->data[v->len - n].b = r.b;
            else v->data[v->len - ++n] = (run){r.b, r.e, 0};
            prev_match = r.match;
        }
        memmove(v->data, v->data + v->len - n, n * sizeof *v->data);
        break;
    }
    v->len = n;
}

static tp_status emit(const char *s, size_t len, tok_buf *buf, tok_spans *out)
{
    if (!len) return TP_OK;
    if (out->len == out->cap) {
        size_t ncap = out->cap ? out->cap * 2 : 64;
        tok_span *p = realloc(out->data, ncap * sizeof *p);
        if (!p) return tp_fail(TP_ERR_NOMEM, "tokenizer: out of memory");
        out->data = p;
        out->cap = ncap;
    }
    out->data[out->len++] = (tok_span){buf->len, len};
    return tp_tok_buf_append(buf, s, len);
}

static tp_status split_piece(const tok_pre *p, tok_matcher *m, const char *s, size_t len,
                             runs *rv, tok_buf *buf, tok_spans *out)
{
    rv->len = 0;
    tp_status st = p->kind == TOK_DIGITS ? digit_runs(s, len, rv) : regex_runs(p->re, m, s, len, rv);
    if (st) return st;
    if (p->invert)
        for (size_t i = 0; i < rv->len; i++) rv->data[i].match = !rv->data[i].match;
    tok_behavior b = p->kind == TOK_DIGITS ? (p->individual_digits ? TOK_ISOLATED : TOK_CONTIGUOUS)
                                           : p->behavior;
    apply_behavior(rv, b);
    for (size_t i = 0; i < rv->len && !st; i++)
        if (!rv->data[i].match) st = emit(s + rv->data[i].b, rv->data[i].e - rv->data[i].b, buf, out);
    return st;
}

static tp_status step_piece(const tok_pre *p, tok_matcher *m, const char *s, size_t len,
                            runs *rv, tok_buf *buf, tok_spans *out)
{
    if (p->kind != TOK_BYTELEVEL) return split_piece(p, m, s, len, rv, buf, out);
    /* ByteLevel: the prefix space goes on every piece that lacks one; the
     * byte-to-character mapping itself happens in BPE (tok_bpe.c). */
    tok_buf one = {0};
    tp_status st = TP_OK;
    if (p->add_prefix_space && s[0] != ' ') {
        if ((st = tp_tok_buf_append(&one, " ", 1)) || (st = tp_tok_buf_append(&one, s, len))) goto done;
        s = one.data;
        len = one.len;
    }
    st = p->re ? split_piece(p, m, s, len, rv, buf, out) : emit(s, len, buf, out);
done:
    tp_tok_buf_free(&one);
    return st;
}

tp_status tp_tok_pretokenize(const tp_tokenizer *t, tok_matcher *m, const char *s, size_t len,
                          tok_buf *buf, tok_spans *out, tok_buf *tmp, tok_spans *tmp_spans)
{
    buf->len = 0;
    out->len = 0;
    tp_status st = emit(s, len, buf, out);
    runs rv = {0};
    for (int i = 0; i < t->n_pre && !st; i++) {
        tmp->len = 0;
        tmp_spans->len = 0;
        for (size_t k = 0; k < out->len && !st; k++)
            st = step_piece(&t->pre[i], m, buf->data + out->data[k].off, out->data[k].len, &rv, tmp, tmp_spans);
        tok_buf xb = *buf; *buf = *tmp; *tmp = xb;
        tok_spans xs = *out; *out = *tmp_spans; *tmp_spans = xs;
    }
    free(rv.data);
    return st;
}
