/* The BPE model: vocabulary and merges from tokenizer.json, and the
 * encoding of one pre-tokenized piece.
 *
 * Merging follows `tokenizers` (Word::merge_all): a min-heap of candidate
 * pairs ordered by (merge rank, position); a popped candidate is applied
 * only if the two symbols are still there and still form that pair.  This
 * is O(n log n) per piece, so a long run of letters cannot go quadratic. */
#include "tok_internal.h"

#include <stdlib.h>
#include <string.h>

/* ---- loading ----------------------------------------------------------- */

static tp_status parse_vocab(tp_tokenizer *t, const cJSON *vocab)
{
    if (!cJSON_IsObject(vocab)) return tp_tok_bad(t, TP_ERR_FORMAT, "model.vocab", "must be an object");
    size_t n = 0, bytes = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, vocab) { n++; bytes += strlen(e->string) + 1; }
    tp_status st = tp_tok_buf_reserve(&t->strings, bytes);
    if (!st) st = tp_tok_strmap_init(&t->vocab, n);
    /* Prefetch the slot of the entry 8 places ahead: the table is much
     * bigger than the caches. */
    const cJSON *ahead = vocab->child;
    for (int k = 0; k < 8 && ahead; k++) ahead = ahead->next;
    cJSON_ArrayForEach(e, vocab) {
        if (st) return st;
        if (ahead) {
            tp_tok_strmap_prefetch(&t->vocab, ahead->string, strlen(ahead->string));
            ahead = ahead->next;
        }
        double v = e->valuedouble;
        if (!cJSON_IsNumber(e) || v < 0 || v > INT32_MAX - 1 || v != (double)(int32_t)v)
            return tp_tok_bad(t, TP_ERR_FORMAT, "model.vocab", "'%s' has no valid id", e->string);
        uint32_t off;
        size_t len = strlen(e->string);
        st = tp_tok_arena_add(t, e->string, len, &off);
        if (!st) st = tp_tok_strmap_put(&t->vocab, t->strings.data, off, (uint32_t)len, (int32_t)v);
        if (!st) st = tp_tok_id_assign(t, (int32_t)v, off, (uint32_t)len);
    }
    return st;
}

static int32_t vocab_id(const tp_tokenizer *t, const char *s, size_t len)
{
    return tp_tok_strmap_get(&t->vocab, t->strings.data, s, len);
}

/* One merge "a b" or ["a", "b"] into (a, b) strings. */
static tp_status merge_parts(tp_tokenizer *t, const cJSON *m, size_t i, const char **a, size_t *alen,
                             const char **b, size_t *blen)
{
    if (cJSON_IsString(m)) {
        const char *s = m->valuestring, *sp = strchr(s, ' ');
        if (!sp) return tp_tok_bad(t, TP_ERR_FORMAT, "model.merges", "entry %zu '%s' is not \"a b\"", i, s);
        *a = s; *alen = (size_t)(sp - s);
        *b = sp + 1; *blen = strlen(sp + 1);
        return TP_OK;
    }
    const cJSON *x = cJSON_GetArrayItem(m, 0), *y = cJSON_GetArrayItem(m, 1);
    if (!cJSON_IsArray(m) || cJSON_GetArraySize(m) != 2 || !cJSON_IsString(x) || !cJSON_IsString(y))
        return tp_tok_bad(t, TP_ERR_FORMAT, "model.merges", "entry %zu is not \"a b\" or [\"a\", \"b\"]", i);
    *a = x->valuestring; *alen = strlen(*a);
    *b = y->valuestring; *blen = strlen(*b);
    return TP_OK;
}

/* Merges go in batches: TOK_BATCH / 3 merges make one batched lookup of
 * their left, right and merged texts (see tp_tok_strmap_get_batch). */
#define MERGE_BATCH (TOK_BATCH / 3)

typedef struct {
    const char *a[MERGE_BATCH], *b[MERGE_BATCH];
    size_t alen[MERGE_BATCH], blen[MERGE_BATCH], cat_off[MERGE_BATCH];
    size_t n, first;     /* merges in the batch; rank of the first */
    tok_buf cat;         /* the merged texts, back to back */
} merge_batch;

static tp_status flush_merges(tp_tokenizer *t, merge_batch *mb)
{
    const char *keys[TOK_BATCH];
    size_t lens[TOK_BATCH];
    int32_t ids[TOK_BATCH];
    for (size_t k = 0; k < mb->n; k++) {
        keys[3 * k] = mb->a[k];
        lens[3 * k] = mb->alen[k];
        keys[3 * k + 1] = mb->b[k];
        lens[3 * k + 1] = mb->blen[k];
        keys[3 * k + 2] = mb->cat.data + mb->cat_off[k];
        lens[3 * k + 2] = mb->alen[k] + mb->blen[k];
    }
    tp_tok_strmap_get_batch(&t->vocab, t->strings.data, keys, lens, 3 * mb->n, ids);
    for (size_t k = 0; k < mb->n; k++) {
        for (int j = 0; j < 3; j++)
            if (ids[3 * k + j] < 0)
                return tp_tok_bad(t, TP_ERR_FORMAT, "model.merges", "entry %zu: '%.*s' is not in the vocabulary",
                               mb->first + k, (int)lens[3 * k + j], keys[3 * k + j]);
        tp_tok_pairmap_prefetch(&t->merges, ids[3 * k], ids[3 * k + 1]);
    }
    tp_status st = TP_OK;
    /* A repeated pair keeps its last rank, as a Rust HashMap collect does. */
    for (size_t k = 0; k < mb->n && !st; k++)
        st = tp_tok_pairmap_put(&t->merges, ids[3 * k], ids[3 * k + 1], (int32_t)(mb->first + k), ids[3 * k + 2]);
    mb->first += mb->n;
    mb->n = 0;
    mb->cat.len = 0;
    return st;
}

static tp_status parse_merges(tp_tokenizer *t, const cJSON *merges)
{
    if (!merges || cJSON_IsNull(merges)) return TP_OK;
    if (!cJSON_IsArray(merges)) return tp_tok_bad(t, TP_ERR_FORMAT, "model.merges", "must be an array");
    tp_status st = tp_tok_pairmap_init(&t->merges, (size_t)cJSON_GetArraySize(merges));
    merge_batch mb = {0};
    const cJSON *m;
    cJSON_ArrayForEach(m, merges) {
        if (st) break;
        size_t k = mb.n;
        if ((st = merge_parts(t, m, mb.first + k, &mb.a[k], &mb.alen[k], &mb.b[k], &mb.blen[k]))) break;
        mb.cat_off[k] = mb.cat.len;
        if ((st = tp_tok_buf_append(&mb.cat, mb.a[k], mb.alen[k])) ||
            (st = tp_tok_buf_append(&mb.cat, mb.b[k], mb.blen[k])))
            break;
        if (++mb.n == MERGE_BATCH) st = flush_merges(t, &mb);
    }
    if (!st && mb.n) st = flush_merges(t, &mb);
    tp_tok_buf_free(&mb.cat);
    return st;
}

static int empty_or_null(const cJSON *j)
{
    return !j || cJSON_IsNull(j) || (cJSON_IsString(j) && !j->valuestring[0]);
}

static tp_status parse_options(tp_tokenizer *t, const cJSON *model)
{
    if (!empty_or_null(cJSON_GetObjectItemCaseSensitive(model, "continuing_subword_prefix")) ||
        !empty_or_null(cJSON_GetObjectItemCaseSensitive(model, "end_of_word_suffix")))
        return tp_tok_bad(t, TP_ERR_UNSUPPORTED, "model", "continuing_subword_prefix/end_of_word_suffix are not supported");
    const cJSON *dropout = cJSON_GetObjectItemCaseSensitive(model, "dropout");
    if (cJSON_IsNumber(dropout) && dropout->valuedouble > 0)
        return tp_tok_bad(t, TP_ERR_UNSUPPORTED, "model.dropout", "BPE dropout is not supported");
    t->ignore_merges = tp_tok_json_bool(model, "ignore_merges", 0);
    t->byte_fallback = tp_tok_json_bool(model, "byte_fallback", 0);
    t->unk_id = -1;
    const cJSON *unk = cJSON_GetObjectItemCaseSensitive(model, "unk_token");
    if (cJSON_IsString(unk)) {
        t->unk_id = vocab_id(t, unk->valuestring, strlen(unk->valuestring));
        if (t->unk_id < 0)
            return tp_tok_bad(t, TP_ERR_FORMAT, "model.unk_token", "'%s' is not in the vocabulary", unk->valuestring);
    }
    return TP_OK;
}

tp_status tp_tok_bpe_parse(tp_tokenizer *t, const cJSON *model)
{
    if (!cJSON_IsObject(model)) return tp_tok_bad(t, TP_ERR_FORMAT, "model", "missing or not an object");
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(model, "type");
    const cJSON *merges = cJSON_GetObjectItemCaseSensitive(model, "merges");
    if (cJSON_IsString(type) && strcmp(type->valuestring, "BPE"))
        return tp_tok_bad(t, TP_ERR_UNSUPPORTED, "model.type", "'%s' is not supported (only BPE)", type->valuestring);
    if (!cJSON_IsString(type) && !merges)
        return tp_tok_bad(t, TP_ERR_UNSUPPORTED, "model.type", "missing, and the model has no merges (only BPE is supported)");
    tp_status st = parse_vocab(t, cJSON_GetObjectItemCaseSensitive(model, "vocab"));
    if (!st) st = parse_merges(t, merges);
    if (!st) st = parse_options(t, model);
    if (st) return st;
    for (int b = 0; b < 256; b++) t->byte_id[b] = vocab_id(t, t->byte_char[b], t->byte_char_len[b]);
    return TP_OK;
}

/* ---- encoding ---------------------------------------------------------- */

typedef struct { int32_t id, prev, next, alive; } symbol;
typedef struct { int32_t rank, pos, merged; } cand;

static int cand_less(cand a, cand b) { return a.rank != b.rank ? a.rank < b.rank : a.pos < b.pos; }

static void heap_push(cand *h, size_t *n, cand c)
{
    size_t i = (*n)++;
    while (i > 0 && cand_less(c, h[(i - 1) / 2])) { h[i] = h[(i - 1) / 2]; i = (i - 1) / 2; }
    h[i] = c;
}

static cand heap_pop(cand *h, size_t *n)
{
    cand top = h[0], last = h[--*n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && cand_less(h[c + 1], h[c])) c++;
        if (!cand_less(h[c], last)) break;
        h[i] = h[c];
        i = c;
    }
    if (*n) h[i] = last;
    return top;
}

static void try_pair(const tp_tokenizer *t, const symbol *sym, int32_t pos, cand *h, size_t *nh)
{
    int32_t next = sym[pos].next;
    if (next < 0) return;
    const tok_pair_slot *m = tp_tok_pairmap_get(&t->merges, sym[pos].id, sym[next].id);
    if (m) heap_push(h, nh, (cand){m->rank, pos, m->merged});
}

static void merge_all(const tp_tokenizer *t, symbol *sym, int32_t n, cand *h)
{
    size_t nh = 0;
    for (int32_t i = 0; i < n; i++) try_pair(t, sym, i, h, &nh);
    while (nh) {
        cand c = heap_pop(h, &nh);
        symbol *s = &sym[c.pos];
        if (!s->alive || s->next < 0) continue;
        const tok_pair_slot *m = tp_tok_pairmap_get(&t->merges, s->id, sym[s->next].id);
        if (!m || m->merged != c.merged) continue;     /* stale candidate */
        symbol *r = &sym[s->next];
        s->id = c.merged;
        s->next = r->next;
        r->alive = 0;
        if (s->next >= 0) sym[s->next].prev = c.pos;
        if (s->prev >= 0) try_pair(t, sym, s->prev, h, &nh);
        try_pair(t, sym, c.pos, h, &nh);
    }
}

/* Initial symbols of a piece not in byte-level form: its characters, with
 * byte fallback ("<0xAB>") or the unknown token for unseen ones. */
static tp_status char_symbols(const tp_tokenizer *t, const char *s, size_t len, tok_ids *ids)
{
    tp_status st = TP_OK;
    for (size_t i = 0; i < len && !st;) {
        int32_t cp;
        size_t n = (size_t)tp_tok_utf8_decode(s + i, len - i, &cp);
        int32_t id = vocab_id(t, s + i, n);
        if (id >= 0) {
            st = tp_tok_ids_push(ids, id);
        } else if (t->byte_fallback) {
            for (size_t k = 0; k < n && !st; k++) {
                char name[8];
                snprintf(name, sizeof name, "<0x%02X>", (unsigned char)s[i + k]);
                int32_t b = vocab_id(t, name, 6);
                st = b >= 0 ? tp_tok_ids_push(ids, b) : t->unk_id >= 0 ? tp_tok_ids_push(ids, t->unk_id) : TP_OK;
            }
        } else if (t->unk_id >= 0) {
            st = tp_tok_ids_push(ids, t->unk_id);
        }
        i += n;
    }
    return st;
}

tp_status tp_tok_bpe_encode(const tp_tokenizer *t, const char *s, size_t len, tok_ids *out, tok_buf *tmp)
{
    tp_status st;
    if (t->ignore_merges) {
        /* A piece that is itself a token is emitted whole. */
        const char *key = s;
        size_t klen = len;
        if (t->byte_level) {
            tmp->len = 0;
            if ((st = tp_tok_buf_reserve(tmp, 2 * len))) return st;
            for (size_t i = 0; i < len; i++) {
                unsigned char b = (unsigned char)s[i];
                memcpy(tmp->data + tmp->len, t->byte_char[b], t->byte_char_len[b]);
                tmp->len += t->byte_char_len[b];
            }
            key = tmp->data;
            klen = tmp->len;
        }
        int32_t id = vocab_id(t, key, klen);
        if (id >= 0) return tp_tok_ids_push(out, id);
    }
    size_t base = out->len;
    if (t->byte_level) {
        for (size_t i = 0; i < len; i++) {
            int32_t id = t->byte_id[(unsigned char)s[i]];
            if (id < 0) id = t->unk_id;
            if (id >= 0 && (st = tp_tok_ids_push(out, id))) return st;
        }
    } else if ((st = char_symbols(t, s, len, out))) {
        return st;
    }
    int32_t n = (int32_t)(out->len - base);
    if (n < 2) return TP_OK;
    /* Small pieces (nearly all of them) merge on the stack. */
    symbol sbuf[64];
    cand hbuf[128];
    symbol *sym = n <= 64 ? sbuf : malloc((size_t)n * sizeof *sym);
    cand *h = n <= 64 ? hbuf : malloc((size_t)n * 2 * sizeof *h);
    if (!sym || !h) {
        if (sym != sbuf) free(sym);
        if (h != hbuf) free(h);
        return tp_fail(TP_ERR_NOMEM, "tokenizer: out of memory");
    }
    for (int32_t i = 0; i < n; i++) sym[i] = (symbol){out->data[base + (size_t)i], i - 1, i + 1 < n ? i + 1 : -1, 1};
    merge_all(t, sym, n, h);
    out->len = base;
    for (int32_t i = 0; i >= 0; i = sym[i].next) out->data[out->len++] = sym[i].id;
    if (sym != sbuf) free(sym);
    if (h != hbuf) free(h);
    return TP_OK;
}
