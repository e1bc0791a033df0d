/* Loading a training file into fixed-length rows (train.h, "data").
 *
 * The whole file is read and checked before training starts, so that a bad
 * line stops the run at once with its file and line, never mid-epoch. */
#include "train/data_internal.h"
#include "tensorpar/io.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef enum { KIND_NONE, KIND_IDS, KIND_TEXT, KIND_MESSAGES } line_kind;

static const char *const kind_key[] = { "", "input_ids", "text", "messages" };

typedef struct {
    const char *path;
    const tp_data_options *o;
    int64_t pad;
    tp_idvec ids, labels;     /* finished rows, n * seq_len */
    tp_idvec lengths;         /* real tokens per finished row */
    tp_idvec stream;          /* packed documents, before cutting into rows */
} builder;

tp_status tp_idvec_push(tp_idvec *a, const int64_t *ids, int64_t n)
{
    if (a->n + n > a->cap) {
        int64_t cap = a->cap ? a->cap : 1024;
        while (cap < a->n + n) cap *= 2;
        int64_t *v = realloc(a->v, (size_t)cap * sizeof *v);
        if (!v) return tp_fail(TP_ERR_NOMEM, "out of memory (%lld ids)", (long long)cap);
        a->v = v;
        a->cap = cap;
    }
    if (n) memcpy(a->v + a->n, ids, (size_t)n * sizeof *ids);
    a->n += n;
    return TP_OK;
}

void tp_idvec_release(tp_idvec *a)
{
    free(a->v);
    memset(a, 0, sizeof *a);
}

int64_t tp_data_row_label_count(const int64_t *labels, int64_t seq_len)
{
    int64_t c = 0;
    for (int64_t t = 1; t < seq_len; t++) c += labels[t] != TP_IGNORE_INDEX;
    return c;
}

/* One row from a sequence: cut at seq_len, or padded with labels -100. */
static tp_status add_row(builder *b, const int64_t *ids, const int64_t *labels, int64_t n)
{
    int64_t S = b->o->seq_len, keep = n < S ? n : S, ignore = TP_IGNORE_INDEX;
    tp_status s = tp_idvec_push(&b->ids, ids, keep);
    if (!s) s = tp_idvec_push(&b->labels, labels, keep);
    if (!s) s = tp_idvec_push(&b->lengths, &keep, 1);
    for (int64_t t = keep; t < S && !s; t++) {
        s = tp_idvec_push(&b->ids, &b->pad, 1);
        if (!s) s = tp_idvec_push(&b->labels, &ignore, 1);
    }
    return s;
}

static tp_status check_vocab(const builder *b, int64_t line, const int64_t *ids, int64_t n, const char *what)
{
    for (int64_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= b->o->vocab)
            return tp_fail(TP_ERR_INVALID, "%s:%lld: %s token %lld = %lld is outside the vocabulary [0, %lld)",
                           b->path, (long long)line, what, (long long)i, (long long)ids[i],
                           (long long)b->o->vocab);
    return TP_OK;
}

static tp_status need_tokenizer(const builder *b, int64_t line, const char *key)
{
    if (b->o->tok) return TP_OK;
    return tp_fail(TP_ERR_INVALID, "%s:%lld: \"%s\" needs the model's tokenizer, and none was given",
                   b->path, (long long)line, key);
}

/* A document of the packed stream: its tokens, then the separator. */
static tp_status add_document(builder *b, int64_t line, const char *text, size_t len)
{
    int32_t *tok_ids = NULL;
    size_t n = 0;
    tp_status s = tp_tokenizer_encode(b->o->tok, text, len, 1, &tok_ids, &n);
    if (s) {
        if (line > 0) return tp_fail_context(s, "%s:%lld", b->path, (long long)line);
        return tp_fail_context(s, "%s", b->path);
    }
    int64_t *ids = malloc((n + 1) * sizeof *ids);
    if (!ids) { free(tok_ids); return tp_fail(TP_ERR_NOMEM, "out of memory"); }
    for (size_t i = 0; i < n; i++) ids[i] = tok_ids[i];
    free(tok_ids);
    ids[n] = b->o->eos_ids[0];
    s = check_vocab(b, line > 0 ? line : 1, ids, (int64_t)n + 1, "tokenized");
    if (!s) s = tp_idvec_push(&b->stream, ids, (int64_t)n + 1);
    free(ids);
    return s;
}

static tp_status add_input_ids(builder *b, int64_t line, const cJSON *arr)
{
    if (!cJSON_IsArray(arr))
        return tp_fail(TP_ERR_FORMAT, "%s:%lld: input_ids is not an array", b->path, (long long)line);
    int64_t n = cJSON_GetArraySize(arr), i = 0;
    if (n == 0) return tp_fail(TP_ERR_FORMAT, "%s:%lld: input_ids is empty", b->path, (long long)line);
    int64_t *ids = malloc((size_t)n * sizeof *ids);
    if (!ids) return tp_fail(TP_ERR_NOMEM, "out of memory");
    tp_status s = TP_OK;
    const cJSON *e;
    cJSON_ArrayForEach(e, arr) {
        double v = cJSON_IsNumber(e) ? e->valuedouble : NAN;
        if (!(v == floor(v)) || fabs(v) > 9.0e15) {
            char *txt = cJSON_PrintUnformatted(e);
            s = tp_fail(TP_ERR_FORMAT, "%s:%lld: input_ids[%lld] = %s is not an integer", b->path,
                        (long long)line, (long long)i, txt ? txt : "?");
            free(txt);
            break;
        }
        ids[i++] = (int64_t)v;
    }
    if (!s) s = check_vocab(b, line, ids, n, "input_ids");
    if (!s) s = add_row(b, ids, ids, n);
    free(ids);
    return s;
}

static tp_status add_messages(builder *b, int64_t line, const cJSON *arr)
{
    if (!cJSON_IsArray(arr) || cJSON_GetArraySize(arr) == 0)
        return tp_fail(TP_ERR_FORMAT, "%s:%lld: messages is not a non-empty array", b->path, (long long)line);
    tp_status s = need_tokenizer(b, line, "messages");
    if (s) return s;
    if (!b->o->chat)
        return tp_fail(TP_ERR_INVALID, "%s:%lld: \"messages\" needs the model's chat template, and none was given",
                       b->path, (long long)line);
    tp_idvec ids = {0}, labels = {0};
    s = tp_data_chat_row(b->o, arr, &ids, &labels);
    if (s) s = tp_fail_context(s, "%s:%lld", b->path, (long long)line);
    if (!s) s = check_vocab(b, line, ids.v, ids.n, "chat");
    if (!s) s = add_row(b, ids.v, labels.v, ids.n);
    tp_idvec_release(&ids);
    tp_idvec_release(&labels);
    return s;
}

/* Which of the three keys a line has (the first found, in kind order). */
static line_kind kind_of(const cJSON *obj, const cJSON **value)
{
    for (int k = KIND_IDS; k <= KIND_MESSAGES; k++) {
        *value = cJSON_GetObjectItemCaseSensitive(obj, kind_key[k]);
        if (*value) return (line_kind)k;
    }
    return KIND_NONE;
}

static tp_status add_line(builder *b, int64_t line, const char *text, size_t len, line_kind *file_kind)
{
    const char *end = NULL;
    cJSON *obj = cJSON_ParseWithLengthOpts(text, len, &end, 0);
    if (obj && end) {
        while (end < text + len && strchr(" \t\r", *end)) end++;
        if (end != text + len) { cJSON_Delete(obj); obj = NULL; }
    }
    if (!obj) return tp_fail(TP_ERR_FORMAT, "%s:%lld: not JSON", b->path, (long long)line);
    tp_status s = TP_OK;
    const cJSON *v = NULL;
    line_kind k = cJSON_IsObject(obj) ? kind_of(obj, &v) : KIND_NONE;
    if (!cJSON_IsObject(obj))
        s = tp_fail(TP_ERR_FORMAT, "%s:%lld: not a JSON object", b->path, (long long)line);
    else if (k == KIND_NONE)
        s = tp_fail(TP_ERR_FORMAT, "%s:%lld: none of the keys \"input_ids\", \"text\", \"messages\"",
                    b->path, (long long)line);
    else if (*file_kind != KIND_NONE && k != *file_kind)
        s = tp_fail(TP_ERR_FORMAT, "%s:%lld: \"%s\" in a file of \"%s\" lines (one kind per file)",
                    b->path, (long long)line, kind_key[k], kind_key[*file_kind]);
    else if (k == KIND_IDS)
        s = add_input_ids(b, line, v);
    else if (k == KIND_TEXT && !cJSON_IsString(v))
        s = tp_fail(TP_ERR_FORMAT, "%s:%lld: text is not a string", b->path, (long long)line);
    else if (k == KIND_TEXT && !(s = need_tokenizer(b, line, "text")))
        s = add_document(b, line, v->valuestring, strlen(v->valuestring));
    else if (k == KIND_MESSAGES)
        s = add_messages(b, line, v);
    if (!s) *file_kind = k;
    cJSON_Delete(obj);
    return s;
}

static int blank(const char *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!strchr(" \t\r\n", p[i])) return 0;
    return 1;
}

static tp_status load_jsonl(builder *b, const char *buf, size_t len, line_kind *kind)
{
    int64_t line = 0;
    for (size_t pos = 0; pos < len;) {
        const char *nl = memchr(buf + pos, '\n', len - pos);
        size_t n = nl ? (size_t)(nl - (buf + pos)) : len - pos;
        line++;
        if (!blank(buf + pos, n)) {
            tp_status s = add_line(b, line, buf + pos, n, kind);
            if (s) return s;
        }
        pos += n + 1;
    }
    return TP_OK;
}

/* The packed stream cut into whole rows; the tail is dropped. */
static tp_status cut_stream(builder *b)
{
    int64_t S = b->o->seq_len;
    if (b->stream.n < S)
        return tp_fail(TP_ERR_INVALID, "%s: %lld tokens after tokenization (eos separators included), "
                       "fewer than one sequence of seq_len = %lld", b->path, (long long)b->stream.n, (long long)S);
    int64_t rows = b->stream.n / S;
    tp_status s = tp_idvec_push(&b->ids, b->stream.v, rows * S);
    if (!s) s = tp_idvec_push(&b->labels, b->stream.v, rows * S);
    for (int64_t r = 0; r < rows && !s; r++) s = tp_idvec_push(&b->lengths, &S, 1);
    return s;
}

static tp_status check_options(const char *path, const tp_data_options *o)
{
    if (o->seq_len < 2)
        return tp_fail(TP_ERR_INVALID, "%s: seq_len = %lld: a sequence needs at least 2 tokens", path,
                       (long long)o->seq_len);
    if (o->vocab < 1) return tp_fail(TP_ERR_INVALID, "%s: vocabulary size %lld", path, (long long)o->vocab);
    if (o->n_eos < 1 || o->n_eos > TP_MAX_EOS)
        return tp_fail(TP_ERR_INVALID, "%s: no eos token id given (packing and chat turns need one)", path);
    if (o->eos_ids[0] < 0 || o->eos_ids[0] >= o->vocab)
        return tp_fail(TP_ERR_INVALID, "%s: eos id %lld outside the vocabulary [0, %lld)", path,
                       (long long)o->eos_ids[0], (long long)o->vocab);
    if (o->pad_id >= o->vocab)
        return tp_fail(TP_ERR_INVALID, "%s: pad id %lld outside the vocabulary [0, %lld)", path,
                       (long long)o->pad_id, (long long)o->vocab);
    return TP_OK;
}

static int ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && !strcmp(s + n - m, suffix);
}

static tp_status load_into(builder *b, const char *buf, size_t len)
{
    const char *path = b->path;
    if (blank(buf, len)) return tp_fail(TP_ERR_FORMAT, "%s: empty file", path);
    if (ends_with(path, ".txt")) {
        tp_status s = need_tokenizer(b, 1, "a .txt file");
        if (!s) s = add_document(b, 0, buf, len);
        return s ? s : cut_stream(b);
    }
    if (!ends_with(path, ".jsonl"))
        return tp_fail(TP_ERR_UNSUPPORTED, "%s: unknown data format (expected a .jsonl or .txt file)", path);
    line_kind kind = KIND_NONE;
    tp_status s = load_jsonl(b, buf, len, &kind);
    if (!s && kind == KIND_TEXT) s = cut_stream(b);
    return s;
}

tp_status tp_dataset_load(tp_dataset *d, const char *path, const tp_data_options *o)
{
    memset(d, 0, sizeof *d);
    tp_status s = check_options(path, o);
    if (s) return s;
    char *buf = NULL;
    size_t len = 0;
    s = tp_read_file(path, &buf, &len);
    if (s) return s;
    builder b = { .path = path, .o = o, .pad = o->pad_id >= 0 ? o->pad_id : o->eos_ids[0] };
    s = load_into(&b, buf, len);
    free(buf);
    tp_idvec_release(&b.stream);
    if (s) {
        tp_idvec_release(&b.ids);
        tp_idvec_release(&b.labels);
        tp_idvec_release(&b.lengths);
        return s;
    }
    d->seq_len = o->seq_len;
    d->n_rows = b.ids.n / o->seq_len;
    d->ids = b.ids.v;
    d->labels = b.labels.v;
    d->lengths = b.lengths.v;
    return TP_OK;
}

void tp_dataset_release(tp_dataset *d)
{
    free(d->ids);
    free(d->labels);
    free(d->lengths);
    memset(d, 0, sizeof *d);
}

/* bos/eos/pad in tokenizer_config.json are strings or {"content": ...}. */
static int64_t config_token(const cJSON *cfg, const char *key, const tp_tokenizer *tok)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(cfg, key);
    if (cJSON_IsObject(v)) v = cJSON_GetObjectItemCaseSensitive(v, "content");
    return cJSON_IsString(v) ? tp_tokenizer_token_to_id(tok, v->valuestring) : -1;
}

tp_status tp_data_special_ids(const char *dir, const tp_tokenizer *tok, int64_t *eos_id, int64_t *pad_id)
{
    *eos_id = *pad_id = -1;
    size_t n = strlen(dir);
    char *path = malloc(n + 32);
    if (!path) return tp_fail(TP_ERR_NOMEM, "out of memory");
    snprintf(path, n + 32, "%s/tokenizer_config.json", dir);
    char *buf = NULL;
    FILE *f = fopen(path, "rb");
    tp_status s = TP_OK;
    if (f) {
        fclose(f);
        s = tp_read_file(path, &buf, NULL);
    }
    if (!s && buf) {
        cJSON *cfg = cJSON_Parse(buf);
        if (!cfg) s = tp_fail(TP_ERR_FORMAT, "%s: not JSON", path);
        else {
            *eos_id = config_token(cfg, "eos_token", tok);
            *pad_id = config_token(cfg, "pad_token", tok);
            cJSON_Delete(cfg);
        }
    }
    free(buf);
    free(path);
    return s;
}
