/* libFuzzer harness: loading a tokenizer.json (and, after the first NUL
 * byte of the input, a tokenizer_config.json), then using what loaded:
 * encoding fixed texts, decoding the ids (whole and streamed) and every id
 * of a small vocabulary, and the id/token lookups.  The seeds are small
 * hand-written tokenizers covering each supported component. */
#include "fuzz_util.h"
#include "tensorpar/text.h"

#include <stdlib.h>
#include <string.h>

static const char *const TEXTS[] = {
    "", "Hello world", "a-b--c 123 4567", "  x\n\n\ty ", "\xc3\xa9t\xc3\xa9 e\xcc\x81 \xef\xbc\xa1",
    "<s>x</s><|im_start|>user", "don't 'll A1b2", "\xf0\x9f\x8e\x89!",
};

static void exercise(const tp_tokenizer *tok)
{
    for (size_t t = 0; t < sizeof TEXTS / sizeof TEXTS[0]; t++) {
        int32_t *ids = NULL;
        size_t n = 0;
        if (tp_tokenizer_encode(tok, TEXTS[t], strlen(TEXTS[t]), (int)(t & 1), &ids, &n) != TP_OK) continue;
        char *text = NULL;
        if (tp_tokenizer_decode(tok, ids, n, (int)(t >> 1 & 1), &text, NULL) == TP_OK) free(text);
        free(ids);
    }
    size_t vocab = tp_tokenizer_vocab_size(tok);
    tp_detok_stream *s = NULL;
    if (tp_detok_stream_create(&s, tok, 0) != TP_OK) return;
    for (int32_t id = -1; id <= (int32_t)(vocab < 300 ? vocab : 300); id++) {
        const char *piece = tp_tokenizer_id_to_token(tok, id);
        if (piece && tp_tokenizer_token_to_id(tok, piece) < 0) abort();   /* a token's text has an id */
        tp_tokenizer_is_special(tok, id);
        char *text;
        size_t len;
        if (tp_detok_stream_push(s, id, &text, &len) == TP_OK) free(text);
    }
    char *rest;
    size_t len;
    if (tp_detok_stream_finish(s, &rest, &len) == TP_OK) free(rest);
    tp_detok_stream_free(s);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const uint8_t *nul = memchr(data, 0, size);
    size_t jlen = nul ? (size_t)(nul - data) : size;
    char *config = nul ? fuzz_strndup(nul + 1, size - jlen - 1) : NULL;
    tp_tokenizer *tok = NULL;
    if (tp_tokenizer_load_json(&tok, (const char *)data, jlen, config, "fuzz.json") == TP_OK) {
        exercise(tok);
        tp_tokenizer_free(tok);
    }
    free(config);
    return 0;
}
