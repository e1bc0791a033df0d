/* The tokenizer: loading tokenizer.json, the encode pipeline, decoding and
 * the vocabulary queries.  Each stage lives in its own tok_*.c file; this
 * one wires them together (see tensorpar/text.h for the order). */
#include "tok_internal.h"

#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tensorpar/io.h"

/* ---- small helpers shared by the tok_*.c files ------------------------- */

tp_status tp_tok_bad(const tp_tokenizer *t, tp_status code, const char *key, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return tp_fail(code, "%s: %s: %s", t->origin, key, msg);
}

int tp_tok_json_bool(const cJSON *obj, const char *key, int dflt)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    return cJSON_IsBool(v) ? cJSON_IsTrue(v) : dflt;
}

tp_status tp_tok_arena_add(tp_tokenizer *t, const char *s, size_t len, uint32_t *off)
{
    if (t->strings.len + len + 1 > UINT32_MAX) return tp_fail(TP_ERR_UNSUPPORTED, "%s: vocabulary too large", t->origin);
    *off = (uint32_t)t->strings.len;
    tp_status st = tp_tok_buf_append(&t->strings, s, len);
    if (!st) st = tp_tok_buf_append(&t->strings, "", 1);   /* keep texts NUL-terminated */
    return st;
}

/* The id tables are dense arrays, so one token with id 2^30 would cost
 * gigabytes (found by fuzzing).  Real vocabularies are dense, with at most
 * a few holes; ids up to twice the number of tokens plus this slack are
 * accepted, which keeps memory linear in the file's size. */
#define ID_SLACK 1024

static tp_status grow_ids(tp_tokenizer *t, size_t need)
{
    size_t ncap = t->n_ids ? t->n_ids : 1024;
    while (ncap < need) ncap *= 2;
    uint32_t *off = realloc(t->id_off, ncap * sizeof *off);
    if (off) t->id_off = off;
    uint32_t *len = realloc(t->id_len, ncap * sizeof *len);
    if (len) t->id_len = len;
    uint8_t *sp = realloc(t->id_special, ncap);
    if (sp) t->id_special = sp;
    if (!off || !len || !sp) return tp_fail(TP_ERR_NOMEM, "tokenizer: out of memory");
    for (size_t i = t->n_ids; i < ncap; i++) { off[i] = UINT32_MAX; len[i] = 0; sp[i] = 0; }
    t->n_ids = ncap;   /* trimmed to the real size at the end of loading */
    return TP_OK;
}

tp_status tp_tok_id_assign(tp_tokenizer *t, int32_t id, uint32_t off, uint32_t len)
{
    if ((size_t)id >= t->id_limit)
        return tp_fail(TP_ERR_FORMAT, "%s: token id %d is far beyond the %zu tokens the file defines "
                       "(ids must be nearly dense)", t->origin, id, (t->id_limit - ID_SLACK) / 2);
    if ((size_t)id >= t->n_ids) {
        tp_status st = grow_ids(t, (size_t)id + 1);
        if (st) return st;
    }
    t->id_off[id] = off;
    t->id_len[id] = len;
    return TP_OK;
}

/* ---- loading ----------------------------------------------------------- */

static tp_status parse_all(tp_tokenizer *t, const cJSON *root, const char *config_json)
{
    if (!cJSON_IsObject(root)) return tp_fail(TP_ERR_FORMAT, "%s: not a JSON object", t->origin);
    tp_tok_bytelevel_tables(t);
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    size_t defined = (size_t)cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(model, "vocab"))
                   + (size_t)cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(root, "added_tokens"));
    t->id_limit = 2 * defined + ID_SLACK;
    /* The normalizer and pre-tokenizer come first: BPE needs to know whether
     * pieces are byte-level, added tokens need the normalizer. */
    tp_status st = tp_tok_normalizer_parse(t, cJSON_GetObjectItemCaseSensitive(root, "normalizer"));
    if (!st) st = tp_tok_pretokenizer_parse(t, cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer"));
    if (!st) st = tp_tok_bpe_parse(t, cJSON_GetObjectItemCaseSensitive(root, "model"));
    if (!st) st = tp_tok_added_parse(t, cJSON_GetObjectItemCaseSensitive(root, "added_tokens"));
    if (!st) st = tp_tok_postprocessor_parse(t, cJSON_GetObjectItemCaseSensitive(root, "post_processor"));
    if (!st) st = tp_tok_decoder_parse(t, cJSON_GetObjectItemCaseSensitive(root, "decoder"));
    if (st) return st;
    tok_matcher m;
    if ((st = tp_tok_matcher_init(&m))) return st;
    st = tp_tok_added_build(t, &m);
    tp_tok_matcher_free(&m);
    if (!st) st = tp_tok_config_apply(t, config_json);
    /* The real vocabulary size: one past the largest id in use. */
    while (t->n_ids && t->id_off[t->n_ids - 1] == UINT32_MAX) t->n_ids--;
    return st;
}

tp_status tp_tokenizer_load_json(tp_tokenizer **out, const char *json, size_t len,
                                 const char *config_json, const char *origin)
{
    *out = NULL;
    tp_tokenizer *t = calloc(1, sizeof *t);
    if (!t) return tp_fail(TP_ERR_NOMEM, "tokenizer: out of memory");
    t->origin = strdup(origin ? origin : "tokenizer.json");
    if (!t->origin) { free(t); return tp_fail(TP_ERR_NOMEM, "tokenizer: out of memory"); }
    tp_status st;
    cJSON *root = cJSON_ParseWithLength(json, len);
    if (!root) {
        const char *where = cJSON_GetErrorPtr();
        st = tp_fail(TP_ERR_FORMAT, "%s: not valid JSON (near byte %zu)", t->origin,
                     where && where >= json && where <= json + len ? (size_t)(where - json) : (size_t)0);
    } else {
        st = parse_all(t, root, config_json);
        cJSON_Delete(root);
    }
    if (st) { tp_tokenizer_free(t); return st; }
    *out = t;
    return TP_OK;
}

static int is_dir(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISDIR(sb.st_mode);
}

tp_status tp_tokenizer_load(tp_tokenizer **out, const char *path)
{
    *out = NULL;
    size_t plen = strlen(path);
    char *file = malloc(plen + 32), *cfg_path = malloc(plen + 32);
    char *json = NULL, *cfg = NULL;
    size_t len = 0;
    tp_status st = TP_OK;
    if (!file || !cfg_path) { st = tp_fail(TP_ERR_NOMEM, "tokenizer: out of memory"); goto done; }
    if (is_dir(path)) {
        snprintf(file, plen + 32, "%s/tokenizer.json", path);
        snprintf(cfg_path, plen + 32, "%s/tokenizer_config.json", path);
    } else {
        snprintf(file, plen + 32, "%s", path);
        cfg_path[0] = '\0';
    }
    if ((st = tp_read_file(file, &json, &len))) goto done;
    if (cfg_path[0] && access(cfg_path, F_OK) == 0 && (st = tp_read_file(cfg_path, &cfg, NULL))) goto done;
    st = tp_tokenizer_load_json(out, json, len, cfg, file);
done:
    free(file);
    free(cfg_path);
    free(json);
    free(cfg);
    return st;
}

void tp_tokenizer_free(tp_tokenizer *t)
{
    if (!t) return;
    for (int i = 0; i < t->n_norm; i++) { pcre2_code_free(t->norm[i].re); free(t->norm[i].text); }
    for (int i = 0; i < t->n_pre; i++) pcre2_code_free(t->pre[i].re);
    tp_tok_buf_free(&t->strings);
    tp_tok_strmap_free(&t->vocab);
    tp_tok_strmap_free(&t->added_map);
    tp_tok_pairmap_free(&t->merges);
    free(t->id_off);
    free(t->id_len);
    free(t->id_special);
    free(t->added);
    free(t->raw_set.order);
    free(t->norm_set.order);
    tp_tok_ids_free(&t->prefix);
    tp_tok_ids_free(&t->suffix);
    free(t->origin);
    free(t);
}

/* ---- encoding ---------------------------------------------------------- */

/* Buffers reused across the pieces of one encode call. */
typedef struct {
    tok_matcher m;
    tok_segments raw_segs, norm_segs;
    tok_buf norm, pre_buf, pre_tmp, bpe_tmp;
    tok_spans pieces, pieces_tmp;
    tok_ids ids;
} encoder;

static void encoder_free(encoder *e)
{
    tp_tok_matcher_free(&e->m);
    free(e->raw_segs.data);
    free(e->norm_segs.data);
    tp_tok_buf_free(&e->norm);
    tp_tok_buf_free(&e->pre_buf);
    tp_tok_buf_free(&e->pre_tmp);
    tp_tok_buf_free(&e->bpe_tmp);
    tp_tok_spans_free(&e->pieces);
    tp_tok_spans_free(&e->pieces_tmp);
    tp_tok_ids_free(&e->ids);
}

/* Pre-tokenizes and BPE-encodes text that holds no added token. */
static tp_status encode_plain(const tp_tokenizer *t, encoder *e, const char *s, size_t len)
{
    tp_status st = tp_tok_pretokenize(t, &e->m, s, len, &e->pre_buf, &e->pieces, &e->pre_tmp, &e->pieces_tmp);
    for (size_t i = 0; i < e->pieces.len && !st; i++)
        st = tp_tok_bpe_encode(t, e->pre_buf.data + e->pieces.data[i].off, e->pieces.data[i].len, &e->ids, &e->bpe_tmp);
    return st;
}

/* A segment between non-normalized added tokens: normalize, then cut out
 * the normalized added tokens, then encode the rest. */
static tp_status encode_segment(const tp_tokenizer *t, encoder *e, const char *s, size_t len)
{
    tp_status st;
    if (t->n_norm) {
        if ((st = tp_tok_normalize(t, &e->m, s, len, &e->norm))) return st;
        s = e->norm.data ? e->norm.data : "";
        len = e->norm.len;
    }
    if (!t->norm_set.start[256]) return encode_plain(t, e, s, len);
    if ((st = tp_tok_added_split(t, 1, s, len, &e->norm_segs))) return st;
    for (size_t i = 0; i < e->norm_segs.len && !st; i++) {
        tok_segment g = e->norm_segs.data[i];
        st = g.id >= 0 ? tp_tok_ids_push(&e->ids, g.id) : encode_plain(t, e, s + g.off, g.len);
    }
    return st;
}

tp_status tp_tokenizer_encode(const tp_tokenizer *t, const char *text, size_t len,
                              int add_special_tokens, int32_t **ids, size_t *n)
{
    *ids = NULL;
    *n = 0;
    if (!text && len) return tp_fail(TP_ERR_INVALID, "tokenizer: NULL text");
    if (!tp_tok_utf8_valid(text, len)) return tp_fail(TP_ERR_INVALID, "tokenizer: text is not valid UTF-8");
    encoder e = {0};
    tp_status st = tp_tok_matcher_init(&e.m);
    if (!st && add_special_tokens) st = tp_tok_ids_append(&e.ids, t->prefix.data, t->prefix.len);
    if (!st) st = tp_tok_added_split(t, 0, text, len, &e.raw_segs);
    for (size_t i = 0; !st && i < e.raw_segs.len; i++) {
        tok_segment g = e.raw_segs.data[i];
        st = g.id >= 0 ? tp_tok_ids_push(&e.ids, g.id) : encode_segment(t, &e, text + g.off, g.len);
    }
    if (!st && add_special_tokens) st = tp_tok_ids_append(&e.ids, t->suffix.data, t->suffix.len);
    if (!st) {
        *ids = e.ids.data;
        *n = e.ids.len;
        e.ids.data = NULL;
    }
    encoder_free(&e);
    return st;
}

/* ---- decoding and queries ---------------------------------------------- */

tp_status tp_tokenizer_decode(const tp_tokenizer *t, const int32_t *ids, size_t n,
                              int skip_special_tokens, char **text, size_t *len)
{
    *text = NULL;
    tok_buf raw = {0}, out = {0};
    tp_status st = TP_OK;
    int first = 1;
    for (size_t i = 0; i < n && !st; i++) {
        if (ids[i] >= 0 && (size_t)ids[i] < t->n_ids && skip_special_tokens && t->id_special[ids[i]]) continue;
        st = tp_tok_decode_token(t, ids[i], first, &raw);
        first = 0;
    }
    if (!st) st = tp_tok_utf8_lossy(&out, raw.data ? raw.data : "", raw.len, 1, NULL);
    if (!st) st = tp_tok_buf_append(&out, "", 0);   /* ensure an allocated "" */
    tp_tok_buf_free(&raw);
    if (st) { tp_tok_buf_free(&out); return st; }
    *text = out.data;
    if (len) *len = out.len;
    return TP_OK;
}

size_t tp_tokenizer_vocab_size(const tp_tokenizer *t) { return t->n_ids; }

int32_t tp_tokenizer_token_to_id(const tp_tokenizer *t, const char *token)
{
    size_t len = strlen(token);
    int32_t id = tp_tok_strmap_get(&t->added_map, t->strings.data, token, len);
    return id >= 0 ? id : tp_tok_strmap_get(&t->vocab, t->strings.data, token, len);
}

const char *tp_tokenizer_id_to_token(const tp_tokenizer *t, int32_t id)
{
    if (id < 0 || (size_t)id >= t->n_ids || t->id_off[id] == UINT32_MAX) return NULL;
    return t->strings.data + t->id_off[id];
}

int tp_tokenizer_is_special(const tp_tokenizer *t, int32_t id)
{
    return id >= 0 && (size_t)id < t->n_ids && t->id_special[id];
}
