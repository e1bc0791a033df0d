/* Added tokens: parsing, and cutting them out of text before the rest of
 * the pipeline sees it.
 *
 * Matching is leftmost-longest, like the Aho-Corasick automaton of
 * `tokenizers`; with a few hundred tokens, bucketing them by first byte
 * (longest first) and comparing in place is as fast and much smaller.
 * After a match: single_word rejects it when a word character touches it,
 * lstrip/rstrip swallow the whitespace around it. */
#include "tok_internal.h"

#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

static tp_status parse_entry(tp_tokenizer *t, const cJSON *e, size_t i, tok_added *a)
{
    const cJSON *id = cJSON_GetObjectItemCaseSensitive(e, "id");
    const cJSON *content = cJSON_GetObjectItemCaseSensitive(e, "content");
    if (!cJSON_IsNumber(id) || id->valuedouble < 0 || id->valuedouble > INT32_MAX - 1 ||
        id->valuedouble != (double)(int32_t)id->valuedouble)
        return tp_tok_bad(t, TP_ERR_FORMAT, "added_tokens", "entry %zu has no valid \"id\"", i);
    if (!cJSON_IsString(content) || !content->valuestring[0])
        return tp_tok_bad(t, TP_ERR_FORMAT, "added_tokens", "entry %zu has no \"content\"", i);
    size_t len = strlen(content->valuestring);
    *a = (tok_added){.id = (int32_t)id->valuedouble, .len = (uint32_t)len,
                     .special = (uint8_t)tp_tok_json_bool(e, "special", 0),
                     .single_word = (uint8_t)tp_tok_json_bool(e, "single_word", 0),
                     .lstrip = (uint8_t)tp_tok_json_bool(e, "lstrip", 0),
                     .rstrip = (uint8_t)tp_tok_json_bool(e, "rstrip", 0),
                     .normalized = (uint8_t)tp_tok_json_bool(e, "normalized", !tp_tok_json_bool(e, "special", 0))};
    tp_status st = tp_tok_arena_add(t, content->valuestring, len, &a->off);
    if (!st) st = tp_tok_strmap_put(&t->added_map, t->strings.data, a->off, a->len, a->id);
    if (!st) st = tp_tok_id_assign(t, a->id, a->off, a->len);
    if (!st) t->id_special[a->id] = a->special;
    a->match_off = a->off;
    a->match_len = a->len;
    return st;
}

tp_status tp_tok_added_parse(tp_tokenizer *t, const cJSON *arr)
{
    tp_status st = tp_tok_strmap_init(&t->added_map, 64);
    if (st || !arr || cJSON_IsNull(arr)) return st;
    if (!cJSON_IsArray(arr)) return tp_tok_bad(t, TP_ERR_FORMAT, "added_tokens", "must be an array");
    size_t n = (size_t)cJSON_GetArraySize(arr);
    t->added = calloc(n ? n : 1, sizeof *t->added);
    if (!t->added) return tp_fail(TP_ERR_NOMEM, "tokenizer: out of memory");
    const cJSON *e;
    cJSON_ArrayForEach(e, arr) {
        if ((st = parse_entry(t, e, t->n_added, &t->added[t->n_added]))) return st;
        t->n_added++;
    }
    return TP_OK;
}

/* ---- matching sets ----------------------------------------------------- */

static int by_first_byte_longest(const void *x, const void *y, void *ctx)
{
    const tp_tokenizer *t = ctx;
    const tok_added *a = &t->added[*(const uint32_t *)x], *b = &t->added[*(const uint32_t *)y];
    unsigned char fa = (unsigned char)t->strings.data[a->match_off];
    unsigned char fb = (unsigned char)t->strings.data[b->match_off];
    if (fa != fb) return fa < fb ? -1 : 1;
    if (a->match_len != b->match_len) return a->match_len > b->match_len ? -1 : 1;
    return a->id < b->id ? -1 : a->id > b->id;
}

static tp_status build_set(tp_tokenizer *t, int normalized, tok_added_set *set)
{
    set->order = malloc((t->n_added ? t->n_added : 1) * sizeof *set->order);
    if (!set->order) return tp_fail(TP_ERR_NOMEM, "tokenizer: out of memory");
    size_t n = 0;
    for (size_t i = 0; i < t->n_added; i++)
        if (t->added[i].normalized == normalized && t->added[i].match_len) set->order[n++] = (uint32_t)i;
    qsort_r(set->order, n, sizeof *set->order, by_first_byte_longest, t);
    /* start[b]..start[b+1] are the tokens beginning with byte b. */
    size_t k = 0;
    for (int b = 0; b < 256; b++) {
        set->start[b] = (uint32_t)k;
        while (k < n && (unsigned char)t->strings.data[t->added[set->order[k]].match_off] == b) k++;
    }
    set->start[256] = (uint32_t)n;
    return TP_OK;
}

tp_status tp_tok_added_build(tp_tokenizer *t, tok_matcher *m)
{
    /* Normalized tokens are matched in their normalized form. */
    tok_buf nb = {0};
    tp_status st = TP_OK;
    for (size_t i = 0; i < t->n_added && !st; i++) {
        tok_added *a = &t->added[i];
        if (!a->normalized || !t->n_norm) continue;
        if ((st = tp_tok_normalize(t, m, t->strings.data + a->off, a->len, &nb))) break;
        st = tp_tok_arena_add(t, nb.data ? nb.data : "", nb.len, &a->match_off);
        a->match_len = (uint32_t)nb.len;
    }
    tp_tok_buf_free(&nb);
    if (!st) st = build_set(t, 0, &t->raw_set);
    if (!st) st = build_set(t, 1, &t->norm_set);
    return st;
}

/* ---- splitting --------------------------------------------------------- */

/* Rust regex \w: alphabetic, marks, decimal digits, connector punctuation,
 * and the two joiners. */
static int is_word(int32_t cp)
{
    if (cp < 0x80) return (cp >= '0' && cp <= '9') || (cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z') || cp == '_';
    if (cp == 0x200C || cp == 0x200D) return 1;
    utf8proc_category_t c = utf8proc_category(cp);
    return (c >= UTF8PROC_CATEGORY_LU && c <= UTF8PROC_CATEGORY_ME) || c == UTF8PROC_CATEGORY_ND ||
           c == UTF8PROC_CATEGORY_NL || c == UTF8PROC_CATEGORY_PC;
}

static size_t char_start_before(const char *s, size_t pos)
{
    size_t k = pos - 1;
    while (k > 0 && ((unsigned char)s[k] & 0xC0) == 0x80) k--;
    return k;
}

static int word_before(const char *s, size_t pos)
{
    if (!pos) return 0;
    size_t k = char_start_before(s, pos);
    int32_t cp;
    tp_tok_utf8_decode(s + k, pos - k, &cp);
    return is_word(cp);
}

static int word_after(const char *s, size_t len, size_t pos)
{
    if (pos >= len) return 0;
    int32_t cp;
    tp_tok_utf8_decode(s + pos, len - pos, &cp);
    return is_word(cp);
}

static size_t strip_left(const char *s, size_t pos, size_t floor)
{
    while (pos > floor) {
        size_t k = char_start_before(s, pos);
        int32_t cp;
        tp_tok_utf8_decode(s + k, pos - k, &cp);
        if (!tp_tok_is_space(cp)) break;
        pos = k;
    }
    return pos;
}

static size_t strip_right(const char *s, size_t len, size_t pos)
{
    while (pos < len) {
        int32_t cp;
        int n = tp_tok_utf8_decode(s + pos, len - pos, &cp);
        if (!tp_tok_is_space(cp)) break;
        pos += (size_t)n;
    }
    return pos;
}

static tp_status push_seg(tok_segments *v, size_t off, size_t len, int32_t id)
{
    if (v->len == v->cap) {
        size_t ncap = v->cap ? v->cap * 2 : 16;
        tok_segment *p = realloc(v->data, ncap * sizeof *p);
        if (!p) return tp_fail(TP_ERR_NOMEM, "tokenizer: out of memory");
        v->data = p;
        v->cap = ncap;
    }
    v->data[v->len++] = (tok_segment){off, len, id};
    return TP_OK;
}

/* The longest added token of the set starting at s[i], or NULL. */
static const tok_added *match_at(const tp_tokenizer *t, const tok_added_set *set, const char *s, size_t len, size_t i)
{
    unsigned char b = (unsigned char)s[i];
    for (uint32_t k = set->start[b]; k < set->start[b + 1]; k++) {
        const tok_added *a = &t->added[set->order[k]];
        if (a->match_len <= len - i && !memcmp(s + i, t->strings.data + a->match_off, a->match_len)) return a;
    }
    return NULL;
}

tp_status tp_tok_added_split(const tp_tokenizer *t, int normalized, const char *s, size_t len, tok_segments *out)
{
    const tok_added_set *set = normalized ? &t->norm_set : &t->raw_set;
    out->len = 0;
    size_t done = 0;   /* text before `done` is already in a segment */
    tp_status st = TP_OK;
    if (set->start[256] > 0) {
        for (size_t i = 0; i < len && !st;) {
            if (set->start[(unsigned char)s[i]] == set->start[(unsigned char)s[i] + 1]) { i++; continue; }
            const tok_added *a = match_at(t, set, s, len, i);
            if (!a) { i++; continue; }
            size_t start = i, stop = i + a->match_len;
            i = stop;
            if (a->single_word && (word_before(s, start) || word_after(s, len, stop))) continue;
            if (a->lstrip) start = strip_left(s, start, done);
            if (a->rstrip) stop = strip_right(s, len, stop);
            if (done < start) st = push_seg(out, done, start - done, -1);
            if (!st) st = push_seg(out, start, stop - start, a->id);
            done = i = stop;
        }
    }
    if (!st && done < len) st = push_seg(out, done, len - done, -1);
    return st;
}
