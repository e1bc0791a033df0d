/* Internals of the tokenizer, shared by the src/text/tok_*.c files only.
 *
 * Layout: every token text lives in one arena (`strings`), referred to by
 * offset, so loading 150k-entry vocabularies costs a handful of allocations
 * instead of one per entry.  Lookups go through open-addressing hash tables
 * (tok_hash.c). */
#ifndef TP_TOK_INTERNAL_H
#define TP_TOK_INTERNAL_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include <cjson/cJSON.h>
#include <pcre2.h>

#include "tensorpar/text.h"

/* ---- growable buffers (tok_buf.c) -------------------------------------- */

typedef struct { char *data; size_t len, cap; } tok_buf;
typedef struct { int32_t *data; size_t len, cap; } tok_ids;

tp_status tp_tok_buf_reserve(tok_buf *b, size_t extra);
tp_status tp_tok_buf_append(tok_buf *b, const void *p, size_t n);
void tp_tok_buf_free(tok_buf *b);
tp_status tp_tok_ids_push(tok_ids *v, int32_t id);
tp_status tp_tok_ids_append(tok_ids *v, const int32_t *p, size_t n);
void tp_tok_ids_free(tok_ids *v);

/* ---- hash tables (tok_hash.c) ------------------------------------------ */

/* String -> id, keys stored as (offset, length) into an external arena. */
typedef struct { uint32_t hash, off, len; int32_t value; } tok_str_slot;
typedef struct { tok_str_slot *slots; size_t mask, count; } tok_strmap;

tp_status tp_tok_strmap_init(tok_strmap *m, size_t expected);
void tp_tok_strmap_free(tok_strmap *m);
/* Inserts or overwrites. */
tp_status tp_tok_strmap_put(tok_strmap *m, const char *arena, uint32_t off, uint32_t len, int32_t value);
/* The value, or -1. */
int32_t tp_tok_strmap_get(const tok_strmap *m, const char *arena, const char *key, size_t len);

/* Lookups of n <= TOK_BATCH keys at once, with prefetching (for loading). */
#define TOK_BATCH 32
void tp_tok_strmap_get_batch(const tok_strmap *m, const char *arena, const char *const *keys,
                          const size_t *lens, size_t n, int32_t *out);
void tp_tok_strmap_prefetch(const tok_strmap *m, const char *key, size_t len);

/* (left id, right id) -> (rank, merged id). */
typedef struct { uint64_t key; int32_t rank, merged; } tok_pair_slot;
typedef struct { tok_pair_slot *slots; size_t mask, count; } tok_pairmap;

tp_status tp_tok_pairmap_init(tok_pairmap *m, size_t expected);
void tp_tok_pairmap_free(tok_pairmap *m);
tp_status tp_tok_pairmap_put(tok_pairmap *m, int32_t a, int32_t b, int32_t rank, int32_t merged);
void tp_tok_pairmap_prefetch(const tok_pairmap *m, int32_t a, int32_t b);
/* The slot, or NULL. */
const tok_pair_slot *tp_tok_pairmap_get(const tok_pairmap *m, int32_t a, int32_t b);

/* ---- UTF-8 helpers (tok_utf8.c) ---------------------------------------- */

/* Length of the valid UTF-8 sequence at p (1..4), or 0 when invalid or cut. */
int tp_tok_utf8_seq_len(const unsigned char *p, size_t avail);
int tp_tok_utf8_valid(const char *s, size_t len);
/* Decodes the (valid) character at s; returns its length. */
int tp_tok_utf8_decode(const char *s, size_t len, int32_t *cp);
/* Unicode White_Space, as Rust's char::is_whitespace and regex \s. */
int tp_tok_is_space(int32_t cp);
/* Appends bytes as UTF-8, invalid parts as U+FFFD (one per maximal
 * subpart, as Rust's from_utf8_lossy).  When !final, an unfinished character
 * at the end is left unconsumed; *used says how many bytes were taken. */
tp_status tp_tok_utf8_lossy(tok_buf *out, const char *s, size_t len, int final, size_t *used);

/* ---- regex helper (tok_regex.c) ----------------------------------------- */

/* Compiles a pattern (Oniguruma syntax as tokenizer.json writes it, which
 * PCRE2 accepts for every pattern these files use) or a literal string. */
tp_status tp_tok_regex_compile(pcre2_code **out, const char *pattern, int literal, const char *where);
/* Per-call matching state: a match block, and a JIT stack made on demand
 * for long runs of whitespace. */
typedef struct { pcre2_match_data *md; pcre2_match_context *mc; pcre2_jit_stack *js; } tok_matcher;
tp_status tp_tok_matcher_init(tok_matcher *m);
void tp_tok_matcher_free(tok_matcher *m);
/* Finds the next non-empty-or-empty match in s[from..len).  Returns 1 with
 * [*ms, *me), 0 when none, -1 on a matching error (message set). */
int tp_tok_regex_next(const pcre2_code *re, tok_matcher *m, const char *s, size_t len,
                   size_t from, size_t *ms, size_t *me);

/* ---- normalizers (tok_normalizer.c) ------------------------------------ */

typedef enum { TOK_NFC, TOK_NFD, TOK_NFKC, TOK_NFKD, TOK_LOWERCASE, TOK_REPLACE,
               TOK_PREPEND, TOK_STRIP } tok_norm_kind;
typedef struct {
    tok_norm_kind kind;
    pcre2_code *re;          /* Replace */
    char *text;              /* Replace: content; Prepend: prepend */
    int left, right;         /* Strip */
} tok_norm;

tp_status tp_tok_normalizer_parse(tp_tokenizer *t, const cJSON *j);
/* Normalizes s into out (cleared first). */
tp_status tp_tok_normalize(const tp_tokenizer *t, tok_matcher *m, const char *s, size_t len, tok_buf *out);

/* ---- pre-tokenizers (tok_pretokenizer.c) ------------------------------- */

typedef enum { TOK_SPLIT, TOK_BYTELEVEL, TOK_DIGITS } tok_pre_kind;
typedef enum { TOK_REMOVED, TOK_ISOLATED, TOK_MERGED_PREV, TOK_MERGED_NEXT,
               TOK_CONTIGUOUS } tok_behavior;
typedef struct {
    tok_pre_kind kind;
    pcre2_code *re;          /* Split; ByteLevel with use_regex */
    tok_behavior behavior;
    int invert;
    int add_prefix_space;    /* ByteLevel */
    int individual_digits;   /* Digits */
} tok_pre;

/* A piece of pre-tokenized text: [off, off + len) of a buffer. */
typedef struct { size_t off, len; } tok_span;
typedef struct { tok_span *data; size_t len, cap; } tok_spans;

tp_status tp_tok_pretokenizer_parse(tp_tokenizer *t, const cJSON *j);
/* Splits s into pieces, written to `buf` (cleared) and `out` (cleared). */
tp_status tp_tok_pretokenize(const tp_tokenizer *t, tok_matcher *m, const char *s, size_t len,
                          tok_buf *buf, tok_spans *out, tok_buf *tmp, tok_spans *tmp_spans);
void tp_tok_spans_free(tok_spans *v);

/* ---- BPE model (tok_bpe.c) --------------------------------------------- */

tp_status tp_tok_bpe_parse(tp_tokenizer *t, const cJSON *model);
/* Appends the ids of one pre-tokenized piece (raw bytes). */
tp_status tp_tok_bpe_encode(const tp_tokenizer *t, const char *s, size_t len, tok_ids *out, tok_buf *tmp);

/* ---- added tokens (tok_added.c) ---------------------------------------- */

typedef struct {
    int32_t id;
    uint32_t off, len;       /* content in the arena */
    uint32_t match_off, match_len;  /* normalized content for normalized ones */
    uint8_t special, single_word, lstrip, rstrip, normalized;
} tok_added;

/* The added tokens matched against one kind of text (raw or normalized):
 * indices into t->added, bucketed by first byte, longest first. */
typedef struct { uint32_t *order; uint32_t start[257]; } tok_added_set;

tp_status tp_tok_added_parse(tp_tokenizer *t, const cJSON *arr);
/* After the normalizer is known: builds both matching sets. */
tp_status tp_tok_added_build(tp_tokenizer *t, tok_matcher *m);
/* Segments of s: added-token matches (id >= 0) and plain text (id -1). */
typedef struct { size_t off, len; int32_t id; } tok_segment;
typedef struct { tok_segment *data; size_t len, cap; } tok_segments;
tp_status tp_tok_added_split(const tp_tokenizer *t, int normalized, const char *s, size_t len,
                          tok_segments *out);

/* ---- post-processor and config (tok_postprocessor.c) ------------------- */

tp_status tp_tok_postprocessor_parse(tp_tokenizer *t, const cJSON *j);
tp_status tp_tok_config_apply(tp_tokenizer *t, const char *config_json);

/* ---- decoder (tok_decoder.c) ------------------------------------------- */

tp_status tp_tok_decoder_parse(tp_tokenizer *t, const cJSON *j);
/* Appends the decoded bytes of one token (before UTF-8 repair); `first`
 * says whether it is the first token emitted (no-decoder joins by " "). */
tp_status tp_tok_decode_token(const tp_tokenizer *t, int32_t id, int first, tok_buf *out);

/* ---- the tokenizer ----------------------------------------------------- */

#define TOK_MAX_STEPS 16

struct tp_tokenizer {
    char *origin;                /* file name for messages */
    tok_buf strings;             /* arena of all token texts, NUL separated */
    tok_strmap vocab;            /* model vocabulary */
    tok_strmap added_map;        /* added token content -> id */
    size_t n_ids;                /* one more than the largest id */
    size_t id_limit;             /* ids must stay below this (see parse_all) */
    uint32_t *id_off;            /* per id: text offset, UINT32_MAX if unused */
    uint32_t *id_len;
    uint8_t *id_special;

    /* BPE */
    tok_pairmap merges;
    int ignore_merges, byte_fallback;
    int32_t unk_id;              /* -1: none */
    int byte_level;              /* pieces are raw bytes mapped by ByteLevel */
    int32_t byte_id[256];        /* vocab id of each byte's ByteLevel char */
    char byte_char[256][3];      /* ByteLevel char of each byte, UTF-8 */
    uint8_t byte_char_len[256];
    int16_t char_byte[512];      /* inverse: code point -> byte, -1 */

    tok_norm norm[TOK_MAX_STEPS];
    int n_norm;
    tok_pre pre[TOK_MAX_STEPS];
    int n_pre;

    tok_added *added;
    size_t n_added;
    tok_added_set raw_set, norm_set;

    /* post-processing with add_special_tokens: prefix + ids + suffix */
    int has_template;            /* the post-processor decided */
    tok_ids prefix, suffix;

    int decoder_byte_level;      /* else: tokens joined by spaces */
};

/* Records the text of an id (growing the id tables as needed). */
tp_status tp_tok_id_assign(tp_tokenizer *t, int32_t id, uint32_t off, uint32_t len);
/* Stores a token text in the arena; *off receives its offset. */
tp_status tp_tok_arena_add(tp_tokenizer *t, const char *s, size_t len, uint32_t *off);
/* Fills the ByteLevel tables (the GPT-2 bytes-to-unicode map). */
void tp_tok_bytelevel_tables(tp_tokenizer *t);
/* "origin: key: message" helpers keep error messages uniform. */
tp_status tp_tok_bad(const tp_tokenizer *t, tp_status code, const char *key, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* A JSON boolean (or absent -> dflt). */
int tp_tok_json_bool(const cJSON *obj, const char *key, int dflt);

#endif
