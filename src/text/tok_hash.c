/* Open-addressing hash tables (linear probing, power-of-two size, load at
 * most 1/2) for the vocabulary and the merges.  Keys of the string table
 * live in the tokenizer's arena, so a slot is 16 bytes and a 150k-entry
 * vocabulary is one allocation. */
#include "tok_internal.h"

#include <stdlib.h>
#include <string.h>

/* FNV-1a: token texts are short, so a simple byte loop is as fast as any. */
static uint32_t hash_str(const char *s, size_t len)
{
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < len; i++) { h ^= (unsigned char)s[i]; h *= 16777619u; }
    return h;
}

/* The splitmix64 finalizer spreads the two ids over all bits. */
static uint64_t hash_pair(uint64_t k)
{
    k ^= k >> 30; k *= 0xbf58476d1ce4e5b9ull;
    k ^= k >> 27; k *= 0x94d049bb133111ebull;
    return k ^ (k >> 31);
}

static size_t table_size(size_t expected)
{
    size_t n = 16;
    while (n < expected * 2) n *= 2;
    return n;
}

tp_status tp_tok_strmap_init(tok_strmap *m, size_t expected)
{
    size_t n = table_size(expected);
    m->slots = malloc(n * sizeof *m->slots);
    if (!m->slots) return tp_fail(TP_ERR_NOMEM, "tokenizer: out of memory");
    for (size_t i = 0; i < n; i++) m->slots[i].value = -1;
    m->mask = n - 1;
    m->count = 0;
    return TP_OK;
}

void tp_tok_strmap_free(tok_strmap *m)
{
    free(m->slots);
    m->slots = NULL;
    m->mask = m->count = 0;
}

static size_t str_find(const tok_strmap *m, const char *arena, const char *key, size_t len, uint32_t h)
{
    size_t i = h & m->mask;
    for (;;) {
        const tok_str_slot *s = &m->slots[i];
        if (s->value < 0) return i;
        if (s->hash == h && s->len == len && !memcmp(arena + s->off, key, len)) return i;
        i = (i + 1) & m->mask;
    }
}

static tp_status str_rehash(tok_strmap *m)
{
    tok_strmap n;
    if (tp_tok_strmap_init(&n, (m->mask + 1)) != TP_OK) return TP_ERR_NOMEM;
    for (size_t i = 0; i <= m->mask; i++) {
        if (m->slots[i].value < 0) continue;
        size_t j = m->slots[i].hash & n.mask;
        while (n.slots[j].value >= 0) j = (j + 1) & n.mask;
        n.slots[j] = m->slots[i];
    }
    n.count = m->count;
    free(m->slots);
    *m = n;
    return TP_OK;
}

tp_status tp_tok_strmap_put(tok_strmap *m, const char *arena, uint32_t off, uint32_t len, int32_t value)
{
    if ((m->count + 1) * 2 > m->mask + 1 && str_rehash(m) != TP_OK) return TP_ERR_NOMEM;
    uint32_t h = hash_str(arena + off, len);
    size_t i = str_find(m, arena, arena + off, len, h);
    if (m->slots[i].value < 0) m->count++;
    m->slots[i] = (tok_str_slot){h, off, len, value};
    return TP_OK;
}

int32_t tp_tok_strmap_get(const tok_strmap *m, const char *arena, const char *key, size_t len)
{
    if (!m->slots) return -1;
    return m->slots[str_find(m, arena, key, len, hash_str(key, len))].value;
}

/* Loading looks up hundreds of thousands of random keys in tables far
 * bigger than the caches; doing them in batches with the slot lines (then
 * the arena texts) prefetched first overlaps the cache misses. */
void tp_tok_strmap_get_batch(const tok_strmap *m, const char *arena, const char *const *keys,
                          const size_t *lens, size_t n, int32_t *out)
{
    uint32_t h[TOK_BATCH];
    for (size_t i = 0; i < n; i++) {
        h[i] = hash_str(keys[i], lens[i]);
        __builtin_prefetch(&m->slots[h[i] & m->mask]);
    }
    for (size_t i = 0; i < n; i++) {
        const tok_str_slot *s = &m->slots[h[i] & m->mask];
        if (s->value >= 0) __builtin_prefetch(arena + s->off);
    }
    for (size_t i = 0; i < n; i++) out[i] = m->slots[str_find(m, arena, keys[i], lens[i], h[i])].value;
}

void tp_tok_strmap_prefetch(const tok_strmap *m, const char *key, size_t len)
{
    __builtin_prefetch(&m->slots[hash_str(key, len) & m->mask], 1);
}

#define PAIR_EMPTY UINT64_MAX

static uint64_t pair_key(int32_t a, int32_t b) { return ((uint64_t)(uint32_t)a << 32) | (uint32_t)b; }

tp_status tp_tok_pairmap_init(tok_pairmap *m, size_t expected)
{
    size_t n = table_size(expected);
    m->slots = malloc(n * sizeof *m->slots);
    if (!m->slots) return tp_fail(TP_ERR_NOMEM, "tokenizer: out of memory");
    for (size_t i = 0; i < n; i++) m->slots[i].key = PAIR_EMPTY;
    m->mask = n - 1;
    m->count = 0;
    return TP_OK;
}

void tp_tok_pairmap_free(tok_pairmap *m)
{
    free(m->slots);
    m->slots = NULL;
    m->mask = m->count = 0;
}

static size_t pair_find(const tok_pairmap *m, uint64_t key)
{
    size_t i = hash_pair(key) & m->mask;
    while (m->slots[i].key != PAIR_EMPTY && m->slots[i].key != key) i = (i + 1) & m->mask;
    return i;
}

static tp_status pair_rehash(tok_pairmap *m)
{
    tok_pairmap n;
    if (tp_tok_pairmap_init(&n, m->mask + 1) != TP_OK) return TP_ERR_NOMEM;
    for (size_t i = 0; i <= m->mask; i++)
        if (m->slots[i].key != PAIR_EMPTY) n.slots[pair_find(&n, m->slots[i].key)] = m->slots[i];
    n.count = m->count;
    free(m->slots);
    *m = n;
    return TP_OK;
}

tp_status tp_tok_pairmap_put(tok_pairmap *m, int32_t a, int32_t b, int32_t rank, int32_t merged)
{
    if ((m->count + 1) * 2 > m->mask + 1 && pair_rehash(m) != TP_OK) return TP_ERR_NOMEM;
    uint64_t key = pair_key(a, b);
    size_t i = pair_find(m, key);
    if (m->slots[i].key == PAIR_EMPTY) m->count++;
    m->slots[i] = (tok_pair_slot){key, rank, merged};
    return TP_OK;
}

void tp_tok_pairmap_prefetch(const tok_pairmap *m, int32_t a, int32_t b)
{
    __builtin_prefetch(&m->slots[hash_pair(pair_key(a, b)) & m->mask], 1);
}

const tok_pair_slot *tp_tok_pairmap_get(const tok_pairmap *m, int32_t a, int32_t b)
{
    if (!m->slots) return NULL;
    const tok_pair_slot *s = &m->slots[pair_find(m, pair_key(a, b))];
    return s->key == PAIR_EMPTY ? NULL : s;
}
