/* Unit tests of the tokenizer's stages, each on a tiny hand-written
 * tokenizer.json: normalizers, Split behaviours, Digits, ByteLevel BPE and
 * merges formats, added-token options, post-processors, decoding (whole
 * and streaming), and the errors malformed files give. */
#include "check.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tensorpar/io.h"
#include "tensorpar/text.h"

/* A character-level model: no merges, each known character is a token, so
 * ids show exactly what the normalizer and pre-tokenizer produced.  With
 * ignore_merges a piece found whole in the vocabulary is one token. */
static const char CHAR_VOCAB[] =
    "\"a\":0,\"b\":1,\"c\":2,\"-\":3,\"a-\":4,\"b-\":5,\"-b\":6,\"-c\":7,\"--\":8,"
    "\"1\":9,\"2\":10,\"3\":11,\"123\":12,\" \":14,\"e\":15,\"\xc3\xa9\":16,\"\xcc\x81\":17,"
    "\"x\":18,\"A\":19,\"f\":23,\"i\":24";

static tp_tokenizer *make(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static tp_tokenizer *make(const char *fmt, ...)
{
    char json[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(json, sizeof json, fmt, ap);
    va_end(ap);
    tp_tokenizer *t = NULL;
    if (tp_tokenizer_load_json(&t, json, strlen(json), NULL, "test.json") != TP_OK)
        fprintf(stderr, "load failed: %s\n", tp_error());
    return t;
}

/* A char-level tokenizer with the given normalizer / pre-tokenizer JSON
 * and added tokens. */
static tp_tokenizer *char_tok(const char *normalizer, const char *pre, const char *added)
{
    return make("{\"normalizer\":%s,\"pre_tokenizer\":%s,\"added_tokens\":[%s],"
                "\"model\":{\"type\":\"BPE\",\"ignore_merges\":true,\"vocab\":{%s},\"merges\":[]}}",
                normalizer, pre, added, CHAR_VOCAB);
}

/* Encodes and compares with the -1-terminated expected ids. */
static int ids_are(const tp_tokenizer *t, const char *text, int special, ...)
{
    if (!t) return 0;
    int32_t *ids;
    size_t n;
    if (tp_tokenizer_encode(t, text, strlen(text), special, &ids, &n) != TP_OK) {
        fprintf(stderr, "encode failed: %s\n", tp_error());
        return 0;
    }
    va_list ap;
    va_start(ap, special);
    int ok = 1;
    size_t i = 0;
    for (int want; (want = va_arg(ap, int)) >= 0; i++)
        if (i >= n || ids[i] != want) ok = 0;
    va_end(ap);
    if (i != n) ok = 0;
    if (!ok) {
        fprintf(stderr, "  '%s' gave [", text);
        for (size_t k = 0; k < n; k++) fprintf(stderr, k ? ",%d" : "%d", ids[k]);
        fprintf(stderr, "]\n");
    }
    free(ids);
    return ok;
}

static void test_normalizers(void)
{
    tp_tokenizer *t = char_tok("{\"type\":\"NFC\"}", "null", "");
    CHECK(ids_are(t, "e\xcc\x81", 0, 16, -1));
    tp_tokenizer_free(t);
    t = char_tok("{\"type\":\"NFD\"}", "null", "");
    CHECK(ids_are(t, "\xc3\xa9", 0, 15, 17, -1));
    tp_tokenizer_free(t);
    t = char_tok("{\"type\":\"NFKC\"}", "null", "");   /* U+FB01 LATIN SMALL LIGATURE FI */
    CHECK(ids_are(t, "\xef\xac\x81", 0, 23, 24, -1));
    tp_tokenizer_free(t);
    t = char_tok("{\"type\":\"Lowercase\"}", "null", "");
    CHECK(ids_are(t, "AB\xc3\x89", 0, 0, 1, 16, -1));
    tp_tokenizer_free(t);
    t = char_tok("{\"type\":\"Replace\",\"pattern\":{\"String\":\"b\"},\"content\":\"x\"}", "null", "");
    CHECK(ids_are(t, "abb", 0, 0, 18, 18, -1));
    tp_tokenizer_free(t);
    t = char_tok("{\"type\":\"Replace\",\"pattern\":{\"Regex\":\"[ab]+\"},\"content\":\"x\"}", "null", "");
    CHECK(ids_are(t, "aab e", 0, 18, 14, 15, -1));
    tp_tokenizer_free(t);
    t = char_tok("{\"type\":\"Sequence\",\"normalizers\":[{\"type\":\"NFD\"},{\"type\":\"Lowercase\"}]}", "null", "");
    CHECK(ids_are(t, "\xc3\x89", 0, 15, 17, -1));
    tp_tokenizer_free(t);
}

static void test_split_behaviours(void)
{
    static const struct { const char *behavior; int invert; int ids[8]; } cases[] = {
        {"Removed", 0, {0, 1, 2, -1}},
        {"Isolated", 0, {0, 3, 1, 3, 3, 2, -1}},
        {"MergedWithPrevious", 0, {4, 5, 3, 2, -1}},
        {"MergedWithNext", 0, {0, 6, 3, 7, -1}},
        {"Contiguous", 0, {0, 3, 1, 8, 2, -1}},
        {"Removed", 1, {3, 3, 3, -1}},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char pre[256];
        snprintf(pre, sizeof pre, "{\"type\":\"Split\",\"pattern\":{\"String\":\"-\"},\"behavior\":\"%s\",\"invert\":%s}",
                 cases[i].behavior, cases[i].invert ? "true" : "false");
        tp_tokenizer *t = char_tok("null", pre, "");
        int32_t *ids;
        size_t n, k = 0;
        CHECK(t && tp_tokenizer_encode(t, "a-b--c", 6, 0, &ids, &n) == TP_OK);
        if (!t) continue;
        int ok = 1;
        for (; cases[i].ids[k] >= 0; k++) ok &= k < n && ids[k] == cases[i].ids[k];
        CHECK_MSG(ok && k == n, "Split %s invert=%d", cases[i].behavior, cases[i].invert);
        free(ids);
        tp_tokenizer_free(t);
    }
    /* A regex pattern, as Llama 3 writes its own. */
    tp_tokenizer *t = char_tok("null", "{\"type\":\"Split\",\"pattern\":{\"Regex\":\"\\\\p{N}{1,3}\"},"
                               "\"behavior\":\"Isolated\",\"invert\":false}", "");
    CHECK(ids_are(t, "a123", 0, 0, 12, -1));
    tp_tokenizer_free(t);
}

static void test_digits(void)
{
    tp_tokenizer *t = char_tok("null", "{\"type\":\"Digits\",\"individual_digits\":true}", "");
    CHECK(ids_are(t, "a123", 0, 0, 9, 10, 11, -1));
    tp_tokenizer_free(t);
    t = char_tok("null", "{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Digits\",\"individual_digits\":false}]}", "");
    CHECK(ids_are(t, "a123", 0, 0, 12, -1));
    tp_tokenizer_free(t);
}

static void test_added_tokens(void)
{
    static const char *fmt = "{\"id\":20,\"content\":\"<m>\",\"special\":true,\"normalized\":false,%s}";
    char added[256];
    snprintf(added, sizeof added, fmt, "\"lstrip\":false");
    tp_tokenizer *t = char_tok("null", "null", added);
    CHECK(ids_are(t, "a <m> b", 0, 0, 14, 20, 14, 1, -1));
    CHECK(ids_are(t, "a<m><m>b", 0, 0, 20, 20, 1, -1));
    tp_tokenizer_free(t);
    snprintf(added, sizeof added, fmt, "\"lstrip\":true");
    t = char_tok("null", "null", added);
    CHECK(ids_are(t, "a  <m> b", 0, 0, 20, 14, 1, -1));
    tp_tokenizer_free(t);
    snprintf(added, sizeof added, fmt, "\"rstrip\":true");
    t = char_tok("null", "null", added);
    CHECK(ids_are(t, "a <m>  b", 0, 0, 14, 20, 1, -1));
    tp_tokenizer_free(t);
    snprintf(added, sizeof added, fmt, "\"single_word\":true");
    t = char_tok("null", "null", added);
    CHECK(ids_are(t, "a <m> b", 0, 0, 14, 20, 14, 1, -1));
    CHECK(ids_are(t, "a<m> b", 0, 0, 14, 1, -1));   /* '<', 'm', '>' are unknown: dropped */
    /* Decoding: special tokens kept or skipped; no decoder joins by spaces. */
    int32_t ids[] = {0, 20, 1};
    char *text;
    CHECK(t && tp_tokenizer_decode(t, ids, 3, 0, &text, NULL) == TP_OK && !strcmp(text, "a <m> b"));
    if (t) free(text);
    CHECK(t && tp_tokenizer_decode(t, ids, 3, 1, &text, NULL) == TP_OK && !strcmp(text, "a b"));
    if (t) free(text);
    CHECK(t && tp_tokenizer_token_to_id(t, "<m>") == 20 && tp_tokenizer_token_to_id(t, "a") == 0);
    CHECK(t && tp_tokenizer_is_special(t, 20) && !tp_tokenizer_is_special(t, 0));
    tp_tokenizer_free(t);
    /* A normalized added token is matched after normalization. */
    t = char_tok("{\"type\":\"Lowercase\"}", "null",
                 "{\"id\":21,\"content\":\"<n>\",\"special\":false,\"normalized\":true}");
    CHECK(ids_are(t, "A<N>b", 0, 0, 21, 1, -1));
    tp_tokenizer_free(t);
}

/* Byte-level BPE: "Ġ" is the ByteLevel character of the space. */
static const char BL_VOCAB[] =
    "\"a\":0,\"b\":1,\"c\":2,\"\xc4\xa0\":3,\"ab\":4,\"abc\":5,\"\xc4\xa0" "a\":6,\"\xc4\xa0" "ab\":7,"
    "\"\xc3\x83\":8,\"\xc2\xa9\":9";

static tp_tokenizer *bl_tok(int ignore_merges, int pairs, const char *post)
{
    const char *merges = pairs ? "[[\"a\",\"b\"],[\"ab\",\"c\"],[\"\xc4\xa0\",\"a\"]]"
                               : "[\"a b\",\"ab c\",\"\xc4\xa0 a\"]";
    return make("{\"normalizer\":null,\"pre_tokenizer\":{\"type\":\"ByteLevel\",\"add_prefix_space\":false,"
                "\"trim_offsets\":true,\"use_regex\":true},\"post_processor\":%s,"
                "\"decoder\":{\"type\":\"ByteLevel\"},\"added_tokens\":[{\"id\":10,\"content\":\"<s>\","
                "\"special\":true,\"normalized\":false},{\"id\":11,\"content\":\"</s>\",\"special\":true,"
                "\"normalized\":false}],\"model\":{\"type\":\"BPE\",\"ignore_merges\":%s,\"vocab\":{%s},\"merges\":%s}}",
                post, ignore_merges ? "true" : "false", BL_VOCAB, merges);
}

static void test_bytelevel_bpe(void)
{
    for (int pairs = 0; pairs < 2; pairs++) {
        tp_tokenizer *t = bl_tok(0, pairs, "null");
        /* " ab": the lower-ranked a+b merges first, then (Ġ, ab) is no merge. */
        CHECK(ids_are(t, "abc ab", 0, 5, 3, 4, -1));
        CHECK(ids_are(t, "abc ab", 1, 5, 3, 4, -1));
        char *text;
        int32_t ids[] = {5, 3, 4};
        CHECK(t && tp_tokenizer_decode(t, ids, 3, 0, &text, NULL) == TP_OK && !strcmp(text, "abc ab"));
        if (t) free(text);
        CHECK(t && tp_tokenizer_vocab_size(t) == 12);
        tp_tokenizer_free(t);
    }
    tp_tokenizer *t = bl_tok(1, 0, "null");   /* ignore_merges: "Ġab" is in the vocabulary */
    CHECK(ids_are(t, "abc ab", 0, 5, 7, -1));
    tp_tokenizer_free(t);
}

static void test_post_processors(void)
{
    tp_tokenizer *t = bl_tok(0, 0,
        "{\"type\":\"Sequence\",\"processors\":[{\"type\":\"ByteLevel\"},{\"type\":\"TemplateProcessing\","
        "\"single\":[{\"SpecialToken\":{\"id\":\"<s>\",\"type_id\":0}},{\"Sequence\":{\"id\":\"A\",\"type_id\":0}},"
        "{\"SpecialToken\":{\"id\":\"</s>\",\"type_id\":0}}],\"pair\":[],\"special_tokens\":{"
        "\"<s>\":{\"id\":\"<s>\",\"ids\":[10],\"tokens\":[\"<s>\"]},\"</s>\":{\"id\":\"</s>\",\"ids\":[11],\"tokens\":[\"</s>\"]}}}]}");
    CHECK(ids_are(t, "ab", 1, 10, 4, 11, -1));
    CHECK(ids_are(t, "ab", 0, 4, -1));
    tp_tokenizer_free(t);
}

static void test_streaming_decode(void)
{
    tp_tokenizer *t = bl_tok(0, 0, "null");
    if (!t) { CHECK(0); return; }
    /* "é" is bytes C3 A9, the ByteLevel characters "Ã" (8) and "©" (9). */
    tp_detok_stream *s;
    char *piece;
    size_t len;
    CHECK(tp_detok_stream_create(&s, t, 1) == TP_OK);
    CHECK(tp_detok_stream_push(s, 0, &piece, &len) == TP_OK && !strcmp(piece, "a"));
    free(piece);
    CHECK(tp_detok_stream_push(s, 8, &piece, &len) == TP_OK && len == 0);
    free(piece);
    CHECK(tp_detok_stream_push(s, 10, &piece, &len) == TP_OK && len == 0);   /* special, skipped */
    free(piece);
    CHECK(tp_detok_stream_push(s, 9, &piece, &len) == TP_OK && !strcmp(piece, "\xc3\xa9"));
    free(piece);
    CHECK(tp_detok_stream_push(s, 8, &piece, &len) == TP_OK && len == 0);
    free(piece);
    CHECK(tp_detok_stream_finish(s, &piece, &len) == TP_OK && !strcmp(piece, "\xef\xbf\xbd"));
    free(piece);
    CHECK(tp_detok_stream_push(s, 99, &piece, &len) == TP_ERR_INVALID);
    tp_detok_stream_free(s);
    /* Whole decoding repairs broken UTF-8 the same way. */
    int32_t ids[] = {8, 0};
    char *text;
    CHECK(tp_tokenizer_decode(t, ids, 2, 0, &text, NULL) == TP_OK && !strcmp(text, "\xef\xbf\xbd" "a"));
    free(text);
    CHECK(tp_tokenizer_decode(t, (int32_t[]){12}, 1, 0, &text, NULL) == TP_ERR_INVALID);
    /* Invalid UTF-8 input is refused. */
    int32_t *out;
    size_t n;
    CHECK(tp_tokenizer_encode(t, "\xff", 1, 0, &out, &n) == TP_ERR_INVALID);
    tp_tokenizer_free(t);
}

static void expect_error(const char *json, tp_status code, const char *needle)
{
    tp_tokenizer *t = NULL;
    tp_status s = tp_tokenizer_load_json(&t, json, strlen(json), NULL, "bad.json");
    CHECK_MSG(s == code && strstr(tp_error(), needle) && strstr(tp_error(), "bad.json") && !t,
              "status %d, message '%s', wanted '%s'", s, tp_error(), needle);
    tp_tokenizer_free(t);
}

static void test_malformed(void)
{
    expect_error("{\"model\": {\"type\": \"BPE\"", TP_ERR_FORMAT, "JSON");
    expect_error("[]", TP_ERR_FORMAT, "object");
    expect_error("{\"model\":{\"type\":\"Unigram\",\"vocab\":[]}}", TP_ERR_UNSUPPORTED, "Unigram");
    expect_error("{\"model\":{\"type\":\"WordPiece\",\"vocab\":{}}}", TP_ERR_UNSUPPORTED, "model.type");
    expect_error("{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":\"x\"},\"merges\":[]}}", TP_ERR_FORMAT, "model.vocab");
    expect_error("{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[\"a b\"]}}", TP_ERR_FORMAT, "'b'");
    expect_error("{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[\"ab\"]}}", TP_ERR_FORMAT, "model.merges");
    expect_error("{\"model\":{\"type\":\"BPE\",\"vocab\":{},\"merges\":[]},\"added_tokens\":[{\"id\":1}]}",
                 TP_ERR_FORMAT, "added_tokens");
    expect_error("{\"pre_tokenizer\":{\"type\":\"Split\",\"pattern\":{\"Regex\":\"(\"},\"behavior\":\"Isolated\"},"
                 "\"model\":{\"type\":\"BPE\",\"vocab\":{},\"merges\":[]}}", TP_ERR_FORMAT, "regex");
    expect_error("{\"pre_tokenizer\":{\"type\":\"Split\",\"pattern\":{\"String\":\"x\"},\"behavior\":\"Sideways\"},"
                 "\"model\":{\"type\":\"BPE\",\"vocab\":{},\"merges\":[]}}", TP_ERR_FORMAT, "Sideways");
    expect_error("{\"normalizer\":{\"type\":\"BertNormalizer\"},\"model\":{\"type\":\"BPE\",\"vocab\":{},\"merges\":[]}}",
                 TP_ERR_UNSUPPORTED, "normalizer.type");
}

/* Inputs the fuzzer (tests/fuzz/fuzz_tokenizer_load) found mishandled. */
static void test_fuzz_regressions(void)
{
    /* One huge id made the dense id tables gigabytes big. */
    expect_error("{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1073741824},\"merges\":[]}}",
                 TP_ERR_FORMAT, "token id 1073741824 is far beyond the 2 tokens");
    expect_error("{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[]},"
                 "\"added_tokens\":[{\"id\":99999999,\"content\":\"<s>\",\"special\":true}]}",
                 TP_ERR_FORMAT, "token id 99999999");
    /* Post-processor ids: 3.5e90 was cast to int32 (undefined); ids that are
     * no token would reach the model's embedding. */
    expect_error("{\"post_processor\":{\"type\":\"BertProcessing\",\"cls\":[\"a\",0],"
                 "\"sep\":[\"a\",3555555555555555555555555555555555555555555555555555555555555555555555555555555555555555555]},"
                 "\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[]}}",
                 TP_ERR_FORMAT, "post_processor.sep");
    expect_error("{\"post_processor\":{\"type\":\"TemplateProcessing\",\"single\":[{\"SpecialToken\":{\"id\":\"<s>\"}},"
                 "{\"Sequence\":{\"id\":\"A\"}}],\"special_tokens\":{\"<s>\":{\"ids\":[7]}}},"
                 "\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[]}}",
                 TP_ERR_FORMAT, "'<s>' has an id that is not a token");
    /* Holes stay allowed: the vocabulary size is one past the largest id. */
    tp_tokenizer *t = make("{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1000},\"merges\":[]}}");
    CHECK(t && tp_tokenizer_vocab_size(t) == 1001 && !tp_tokenizer_id_to_token(t, 500));
    tp_tokenizer_free(t);
}

/* Loading from a file and from a directory with tokenizer_config.json. */
static void test_files(void)
{
    char dir[] = "/tmp/tp_tok_XXXXXX";
    if (!mkdtemp(dir)) { CHECK(0); return; }
    char path[256], cfg[256];
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    snprintf(cfg, sizeof cfg, "%s/tokenizer_config.json", dir);
    static const char json[] =
        "{\"added_tokens\":[{\"id\":3,\"content\":\"<s>\",\"special\":true,\"normalized\":false}],"
        "\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1,\"ab\":2},\"merges\":[\"a b\"]}}";
    static const char config[] = "{\"add_bos_token\": true, \"bos_token\": {\"content\": \"<s>\"}}";
    CHECK(tp_write_file_atomic(path, json, strlen(json)) == TP_OK);
    tp_tokenizer *t = NULL;
    CHECK(tp_tokenizer_load(&t, path) == TP_OK);          /* a file: no config */
    CHECK(ids_are(t, "ab", 1, 2, -1));
    tp_tokenizer_free(t);
    CHECK(tp_write_file_atomic(cfg, config, strlen(config)) == TP_OK);
    t = NULL;
    CHECK(tp_tokenizer_load(&t, dir) == TP_OK);           /* a directory: config read */
    CHECK(ids_are(t, "ab", 1, 3, 2, -1));
    CHECK(ids_are(t, "ab", 0, 2, -1));
    CHECK(t && tp_tokenizer_id_to_token(t, 2) && !strcmp(tp_tokenizer_id_to_token(t, 2), "ab"));
    CHECK(t && tp_tokenizer_id_to_token(t, 4) == NULL);
    tp_tokenizer_free(t);
    unlink(cfg);
    unlink(path);
    t = NULL;
    CHECK(tp_tokenizer_load(&t, dir) == TP_ERR_IO && strstr(tp_error(), "tokenizer.json"));
    rmdir(dir);
}

int main(void)
{
    test_normalizers();
    test_split_behaviours();
    test_digits();
    test_added_tokens();
    test_bytelevel_bpe();
    test_post_processors();
    test_streaming_decode();
    test_malformed();
    test_fuzz_regressions();
    test_files();
    return check_summary();
}
