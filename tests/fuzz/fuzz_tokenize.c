/* libFuzzer harness: encoding and decoding arbitrary bytes with the real
 * Qwen3 and Llama 3 tokenizers (tests/data/tokenizers), loaded once.
 *
 * The first input byte picks the tokenizer and the flags; the rest is text
 * to encode or, in id mode, little-endian int32 ids to decode.  Checks:
 *   - decoding ids in one call and through a detok stream give the same text;
 *   - Llama 3 (no normalizer, byte-level) gives the text back exactly. */
#include "fuzz_util.h"
#include "tensorpar/text.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static tp_tokenizer *toks[2];   /* qwen3, llama3 */

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    static const char *const dirs[2] = {"tests/data/tokenizers/qwen3", "tests/data/tokenizers/llama3"};
    for (int i = 0; i < 2; i++) {
        char *p = fuzz_source_path(dirs[i]);
        if (tp_tokenizer_load(&toks[i], p) != TP_OK) {
            fprintf(stderr, "%s: %s\n", p, tp_error());
            abort();
        }
        free(p);
    }
    return 0;
}

/* Decodes through a stream, concatenating the pieces. */
static tp_status stream_decode(const tp_tokenizer *tok, const int32_t *ids, size_t n, int skip,
                               char **out, size_t *out_len)
{
    tp_detok_stream *s;
    tp_status st = tp_detok_stream_create(&s, tok, skip);
    if (st) return st;
    size_t len = 0;
    char *acc = malloc(1);
    if (!acc) abort();
    for (size_t i = 0; i <= n && st == TP_OK; i++) {
        char *piece;
        size_t plen;
        st = i < n ? tp_detok_stream_push(s, ids[i], &piece, &plen) : tp_detok_stream_finish(s, &piece, &plen);
        if (st) break;
        acc = realloc(acc, len + plen + 1);
        if (!acc) abort();
        memcpy(acc + len, piece, plen);
        len += plen;
        free(piece);
    }
    tp_detok_stream_free(s);
    acc[len] = '\0';
    if (st) { free(acc); return st; }
    *out = acc;
    *out_len = len;
    return TP_OK;
}

static void check_decode(const tp_tokenizer *tok, const int32_t *ids, size_t n, int skip)
{
    char *whole = NULL, *streamed = NULL;
    size_t wlen = 0, slen = 0;
    tp_status a = tp_tokenizer_decode(tok, ids, n, skip, &whole, &wlen);
    tp_status b = stream_decode(tok, ids, n, skip, &streamed, &slen);
    if ((a == TP_OK) != (b == TP_OK) || (a == TP_OK && (wlen != slen || memcmp(whole, streamed, wlen)))) {
        fprintf(stderr, "decode and stream decode disagree (%d/%d, %zu/%zu bytes)\n", a, b, wlen, slen);
        abort();
    }
    free(whole);
    free(streamed);
}

static void encode_mode(const tp_tokenizer *tok, int is_llama, int special, int skip,
                        const uint8_t *text, size_t len)
{
    int32_t *ids = NULL;
    size_t n = 0;
    if (tp_tokenizer_encode(tok, (const char *)text, len, special, &ids, &n) != TP_OK) return;
    for (size_t i = 0; i < n; i++)
        if (ids[i] < 0 || (size_t)ids[i] >= tp_tokenizer_vocab_size(tok)) abort();
    check_decode(tok, ids, n, skip);
    if (is_llama && !special) {
        char *back = NULL;
        size_t blen = 0;
        if (tp_tokenizer_decode(tok, ids, n, 0, &back, &blen) != TP_OK || blen != len || memcmp(back, text, len)) {
            fprintf(stderr, "llama3: decode(encode(text)) is not the text\n");
            abort();
        }
        free(back);
    }
    free(ids);
}

static void ids_mode(const tp_tokenizer *tok, int skip, const uint8_t *data, size_t len)
{
    size_t n = len / 4;
    int32_t *ids = malloc((n ? n : 1) * sizeof *ids);
    if (!ids) abort();
    int64_t span = (int64_t)tp_tokenizer_vocab_size(tok) + 8;   /* a few ids past the end */
    for (size_t i = 0; i < n; i++) {
        uint32_t v = (uint32_t)data[4 * i] | (uint32_t)data[4 * i + 1] << 8
                   | (uint32_t)data[4 * i + 2] << 16 | (uint32_t)data[4 * i + 3] << 24;
        /* Mostly ids in range; the top bit keeps a raw value (negative or huge). */
        ids[i] = v & 0x80000000u ? (int32_t)v : (int32_t)((int64_t)v % span);
    }
    check_decode(tok, ids, n, skip);
    free(ids);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size == 0) return 0;
    uint8_t flags = data[0];
    int which = flags & 1, special = flags >> 1 & 1, skip = flags >> 2 & 1, ids = flags >> 3 & 1;
    if (ids) ids_mode(toks[which], skip, data + 1, size - 1);
    else encode_mode(toks[which], which == 1, special, skip, data + 1, size - 1);
    return 0;
}
