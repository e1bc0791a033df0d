/* tensorpar tokenize / detokenize: text <-> token ids with a Hugging Face
 * tokenizer.json.  Both take one input on the command line or a JSONL file
 * of many (one object per line), which is how tests batch their vectors. */
#include "cli.h"

#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

#include "tensorpar/io.h"
#include "tensorpar/text.h"

static void print_ids(FILE *f, const int32_t *ids, size_t n)
{
    fputc('[', f);
    for (size_t i = 0; i < n; i++) fprintf(f, i ? ",%ld" : "%ld", (long)ids[i]);
    fputc(']', f);
}

/* A JSON string with every byte kept (cJSON strings stop at NUL). */
static void print_json_string(FILE *f, const char *s, size_t len)
{
    fputc('"', f);
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\') { fputc('\\', f); fputc(c, f); }
        else if (c == '\n') fputs("\\n", f);
        else if (c < 0x20 || c == 0x7F) fprintf(f, "\\u%04x", c);
        else fputc(c, f);
    }
    fputc('"', f);
}

/* Calls fn on each non-blank line of a JSONL file, parsed. */
static int each_jsonl(const char *path, const char *cmd, int (*fn)(const cJSON *, void *), void *ctx)
{
    char *data;
    size_t len;
    if (tp_read_file(path, &data, &len)) return cli_report(cmd);
    int rc = 0, lineno = 0;
    for (char *p = data; !rc && p < data + len;) {
        char *nl = memchr(p, '\n', (size_t)(data + len - p));
        char *end = nl ? nl : data + len;
        lineno++;
        size_t n = (size_t)(end - p);
        if (n && strspn(p, " \t\r") < n) {
            cJSON *j = cJSON_ParseWithLength(p, n);
            if (!cJSON_IsObject(j)) {
                tp_fail(TP_ERR_FORMAT, "%s:%d: not a valid JSON object", path, lineno);
                rc = cli_report(cmd);
            } else if (fn(j, ctx)) {
                tp_fail_context(TP_ERR_FORMAT, "%s:%d", path, lineno);
                rc = cli_report(cmd);
            }
            cJSON_Delete(j);
        }
        p = end + 1;
    }
    free(data);
    return rc;
}

typedef struct { const tp_tokenizer *tok; int special; } encode_ctx;

static int encode_line(const cJSON *j, void *vctx)
{
    encode_ctx *c = vctx;
    const cJSON *text = cJSON_GetObjectItemCaseSensitive(j, "text");
    const cJSON *sp = cJSON_GetObjectItemCaseSensitive(j, "add_special_tokens");
    if (!cJSON_IsString(text)) { tp_fail(TP_ERR_FORMAT, "\"text\" must be a string"); return -1; }
    int special = cJSON_IsBool(sp) ? cJSON_IsTrue(sp) : c->special;
    int32_t *ids;
    size_t n;
    if (tp_tokenizer_encode(c->tok, text->valuestring, strlen(text->valuestring), special, &ids, &n)) return -1;
    fputs("{\"ids\":", stdout);
    print_ids(stdout, ids, n);
    fputs("}\n", stdout);
    free(ids);
    return 0;
}

int cmd_tokenize(int argc, char **argv)
{
    cli_option opts[] = {
        {"--tokenizer", "FILE|DIR", "tokenizer.json, or a directory holding it", 0, {0}},
        {"--text", "TEXT", "the text to encode", 0, {0}},
        {"--input-jsonl", "FILE", "lines {\"text\": ..., \"add_special_tokens\": bool}; prints {\"ids\": [...]} each", 0, {0}},
        {"--special", NULL, "add special tokens (bos, ...) as the post-processor says", 0, {0}},
    };
    int nopts = sizeof opts / sizeof opts[0];
    int r = cli_parse(argc, argv, opts, nopts, "tensorpar tokenize --tokenizer FILE|DIR (--text TEXT | --input-jsonl FILE) [--special]",
                      "Encodes text into token ids, printed as a JSON array.", NULL, NULL);
    if (r) return r == 1 ? 0 : 2;
    const char *path = cli_value(opts, nopts, "--tokenizer");
    const char *text = cli_value(opts, nopts, "--text"), *jsonl = cli_value(opts, nopts, "--input-jsonl");
    if (!path || !text == !jsonl) {
        fprintf(stderr, "tensorpar tokenize: error: need --tokenizer and one of --text or --input-jsonl\n");
        return 2;
    }
    tp_tokenizer *tok;
    if (tp_tokenizer_load(&tok, path)) return cli_report("tokenize");
    encode_ctx c = {tok, cli_flag(opts, nopts, "--special")};
    int rc = 0;
    if (jsonl) {
        rc = each_jsonl(jsonl, "tokenize", encode_line, &c);
    } else {
        int32_t *ids;
        size_t n;
        if (tp_tokenizer_encode(tok, text, strlen(text), c.special, &ids, &n)) {
            rc = cli_report("tokenize");
        } else {
            print_ids(stdout, ids, n);
            fputc('\n', stdout);
            free(ids);
        }
    }
    tp_tokenizer_free(tok);
    return rc;
}

typedef struct { const tp_tokenizer *tok; int skip; } decode_ctx;

static int decode_print(const tp_tokenizer *tok, const int32_t *ids, size_t n, int skip, int json)
{
    char *text;
    size_t len;
    if (tp_tokenizer_decode(tok, ids, n, skip, &text, &len)) return -1;
    if (json) {
        fputs("{\"text\":", stdout);
        print_json_string(stdout, text, len);
        fputs("}\n", stdout);
    } else {
        fwrite(text, 1, len, stdout);
        fputc('\n', stdout);
    }
    free(text);
    return 0;
}

static int decode_line(const cJSON *j, void *vctx)
{
    decode_ctx *c = vctx;
    const cJSON *arr = cJSON_GetObjectItemCaseSensitive(j, "ids");
    const cJSON *sk = cJSON_GetObjectItemCaseSensitive(j, "skip_special_tokens");
    if (!cJSON_IsArray(arr)) { tp_fail(TP_ERR_FORMAT, "\"ids\" must be an array"); return -1; }
    size_t n = (size_t)cJSON_GetArraySize(arr), k = 0;
    int32_t *ids = malloc((n ? n : 1) * sizeof *ids);
    if (!ids) { tp_fail(TP_ERR_NOMEM, "out of memory"); return -1; }
    const cJSON *e;
    cJSON_ArrayForEach(e, arr) {
        if (!cJSON_IsNumber(e) || e->valuedouble < 0 || e->valuedouble > INT32_MAX) {
            free(ids);
            tp_fail(TP_ERR_INVALID, "\"ids\" must hold non-negative integers");
            return -1;
        }
        ids[k++] = (int32_t)e->valuedouble;
    }
    int rc = decode_print(c->tok, ids, n, cJSON_IsBool(sk) ? cJSON_IsTrue(sk) : c->skip, 1);
    free(ids);
    return rc;
}

int cmd_detokenize(int argc, char **argv)
{
    cli_option opts[] = {
        {"--tokenizer", "FILE|DIR", "tokenizer.json, or a directory holding it", 0, {0}},
        {"--ids", "1,2,3", "the token ids to decode", 0, {0}},
        {"--input-jsonl", "FILE", "lines {\"ids\": [...], \"skip_special_tokens\": bool}; prints {\"text\": ...} each", 0, {0}},
        {"--skip-special", NULL, "leave special tokens out of the text", 0, {0}},
    };
    int nopts = sizeof opts / sizeof opts[0];
    int r = cli_parse(argc, argv, opts, nopts, "tensorpar detokenize --tokenizer FILE|DIR (--ids 1,2,3 | --input-jsonl FILE) [--skip-special]",
                      "Decodes token ids into text.", NULL, NULL);
    if (r) return r == 1 ? 0 : 2;
    const char *path = cli_value(opts, nopts, "--tokenizer");
    const char *idstr = cli_value(opts, nopts, "--ids"), *jsonl = cli_value(opts, nopts, "--input-jsonl");
    if (!path || !idstr == !jsonl) {
        fprintf(stderr, "tensorpar detokenize: error: need --tokenizer and one of --ids or --input-jsonl\n");
        return 2;
    }
    tp_tokenizer *tok;
    if (tp_tokenizer_load(&tok, path)) return cli_report("detokenize");
    decode_ctx c = {tok, cli_flag(opts, nopts, "--skip-special")};
    int rc = 0;
    if (jsonl) {
        rc = each_jsonl(jsonl, "detokenize", decode_line, &c);
    } else {
        int64_t *ids64;
        int n;
        int32_t *ids = NULL;
        if (cli_parse_ids(idstr, &ids64, &n)) {
            rc = cli_report("detokenize");
        } else {
            ids = malloc((size_t)n * sizeof *ids);
            for (int i = 0; ids && i < n; i++) {
                if (ids64[i] < 0 || ids64[i] > INT32_MAX) {
                    tp_fail(TP_ERR_INVALID, "token id %lld is out of range (vocabulary size %zu)",
                            (long long)ids64[i], tp_tokenizer_vocab_size(tok));
                    rc = cli_report("detokenize");
                    break;
                }
                ids[i] = (int32_t)ids64[i];
            }
            if (!ids) { tp_fail(TP_ERR_NOMEM, "out of memory"); rc = cli_report("detokenize"); }
            if (!rc && decode_print(tok, ids, (size_t)n, c.skip, 0)) rc = cli_report("detokenize");
            free(ids64);
            free(ids);
        }
    }
    tp_tokenizer_free(tok);
    return rc;
}
