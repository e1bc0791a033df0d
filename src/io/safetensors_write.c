/* Writing a .safetensors file the way Hugging Face's writer lays it out:
 * compact JSON header with "__metadata__" first, padded with spaces so the
 * data area starts on an 8-byte boundary, tensors back to back.
 *
 * The file is written under a temporary name and renamed into place, so a
 * failure (bad entry, full disk) never leaves a half-written checkpoint. */
#include "tensorpar/io.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char *st_dtype_str(tp_dtype t)
{
    static const char *const names[TP_DTYPE_COUNT] = {
        [TP_F32] = "F32", [TP_BF16] = "BF16", [TP_F16] = "F16", [TP_F64] = "F64",
        [TP_I64] = "I64", [TP_I32] = "I32",   [TP_I16] = "I16", [TP_I8] = "I8",
        [TP_U8] = "U8",   [TP_BOOL] = "BOOL",
    };
    return (unsigned)t < TP_DTYPE_COUNT ? names[t] : NULL;
}

/* Byte size of one entry, or an error naming it (need_data: a non-empty
 * tensor must come with its data). */
static tp_status entry_bytes_of(const char *path, const tp_st_entry *e, int need_data, uint64_t *out)
{
    if (!e->name || !e->name[0] || !strcmp(e->name, "__metadata__"))
        return tp_fail(TP_ERR_INVALID, "%s: tensor name '%s' is not allowed", path, e->name ? e->name : "(null)");
    if (!st_dtype_str(e->dtype))
        return tp_fail(TP_ERR_INVALID, "%s: tensor '%s': unknown dtype %d", path, e->name, (int)e->dtype);
    if (e->ndim < 0 || e->ndim > TP_ST_MAX_DIMS || (e->ndim && !e->shape))
        return tp_fail(TP_ERR_INVALID, "%s: tensor '%s': bad rank %d", path, e->name, e->ndim);
    uint64_t n = tp_dtype_size(e->dtype);
    int zero = 0;
    for (int i = 0; i < e->ndim; i++) {
        if (e->shape[i] < 0)
            return tp_fail(TP_ERR_INVALID, "%s: tensor '%s': negative dimension %lld",
                           path, e->name, (long long)e->shape[i]);
        if (e->shape[i] == 0) zero = 1;
        else if (n > (UINT64_MAX >> 12) / (uint64_t)e->shape[i])   /* headroom for offsets */
            return tp_fail(TP_ERR_INVALID, "%s: tensor '%s' is too large", path, e->name);
        else n *= (uint64_t)e->shape[i];
    }
    if (zero) n = 0;
    if (n && need_data && !e->data)
        return tp_fail(TP_ERR_INVALID, "%s: tensor '%s' has no data", path, e->name);
    *out = n;
    return TP_OK;
}

static tp_status entry_bytes(const char *path, const tp_st_entry *e, uint64_t *out)
{
    return entry_bytes_of(path, e, 1, out);
}

static int cmp_str_ptr(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Entries must be valid and their names distinct (checked on a sorted copy). */
static tp_status check_entries(const char *path, const tp_st_entry *entries, size_t n, int need_data)
{
    for (size_t i = 0; i < n; i++) {
        uint64_t b;
        tp_status s = entry_bytes_of(path, &entries[i], need_data, &b);
        if (s != TP_OK) return s;
    }
    const char **names = malloc((n ? n : 1) * sizeof *names);
    if (!names) return tp_fail(TP_ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < n; i++) names[i] = entries[i].name;
    qsort(names, n, sizeof *names, cmp_str_ptr);
    tp_status s = TP_OK;
    for (size_t i = 1; i < n && s == TP_OK; i++)
        if (!strcmp(names[i - 1], names[i]))
            s = tp_fail(TP_ERR_INVALID, "%s: tensor '%s' is given twice", path, names[i]);
    free(names);
    return s;
}

/* "__metadata__": {"format": "pt"} plus the caller's pairs (which may
 * override "format"). */
static tp_status add_metadata(cJSON *root, const char *path, const char *const *kv, size_t n)
{
    cJSON *meta = cJSON_AddObjectToObject(root, "__metadata__");
    if (!meta || !cJSON_AddStringToObject(meta, "format", "pt"))
        return tp_fail(TP_ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < n; i++) {
        const char *k = kv[2 * i], *v = kv[2 * i + 1];
        if (!k || !v) return tp_fail(TP_ERR_INVALID, "%s: metadata pair %zu has a NULL key or value", path, i);
        for (size_t j = 0; j < i; j++)
            if (!strcmp(kv[2 * j], k))
                return tp_fail(TP_ERR_INVALID, "%s: metadata key '%s' is given twice", path, k);
        cJSON *item = cJSON_CreateString(v);
        if (!item) return tp_fail(TP_ERR_NOMEM, "out of memory");
        if (cJSON_GetObjectItemCaseSensitive(meta, k))   /* only "format" */
            cJSON_ReplaceItemInObjectCaseSensitive(meta, k, item);
        else
            cJSON_AddItemToObject(meta, k, item);
    }
    return TP_OK;
}

/* Numbers go in as raw text: cJSON keeps doubles, and offsets are exact
 * 64-bit integers. */
static cJSON *tensor_json(const tp_st_entry *e, uint64_t begin, uint64_t end)
{
    char shape[TP_ST_MAX_DIMS * 24 + 4], offs[64];
    size_t at = 0;
    shape[at++] = '[';
    for (int i = 0; i < e->ndim; i++)
        at += (size_t)snprintf(shape + at, sizeof shape - at, "%s%lld", i ? "," : "", (long long)e->shape[i]);
    snprintf(shape + at, sizeof shape - at, "]");
    snprintf(offs, sizeof offs, "[%llu,%llu]", (unsigned long long)begin, (unsigned long long)end);
    cJSON *o = cJSON_CreateObject();
    if (!o) return NULL;
    if (!cJSON_AddStringToObject(o, "dtype", st_dtype_str(e->dtype))
        || !cJSON_AddRawToObject(o, "shape", shape)
        || !cJSON_AddRawToObject(o, "data_offsets", offs)) {
        cJSON_Delete(o);
        return NULL;
    }
    return o;
}

/* The header text, padded with spaces to a multiple of 8 bytes. */
static tp_status build_header(const char *path, const tp_st_entry *entries, size_t n,
                              const char *const *kv, size_t n_kv, char **out, size_t *len)
{
    cJSON *root = cJSON_CreateObject();
    if (!root) return tp_fail(TP_ERR_NOMEM, "out of memory");
    tp_status s = add_metadata(root, path, kv, n_kv);
    uint64_t off = 0;
    for (size_t i = 0; i < n && s == TP_OK; i++) {
        uint64_t b = 0;
        entry_bytes_of(path, &entries[i], 0, &b);   /* already validated */
        cJSON *t = tensor_json(&entries[i], off, off + b);
        if (!t) s = tp_fail(TP_ERR_NOMEM, "out of memory");
        else cJSON_AddItemToObject(root, entries[i].name, t);
        off += b;
    }
    char *text = s == TP_OK ? cJSON_PrintUnformatted(root) : NULL;
    cJSON_Delete(root);
    if (s != TP_OK) return s;
    if (!text) return tp_fail(TP_ERR_NOMEM, "out of memory");
    size_t tl = strlen(text), padded = (tl + 7) / 8 * 8;
    char *buf = realloc(text, padded + 1);
    if (!buf) { free(text); return tp_fail(TP_ERR_NOMEM, "out of memory"); }
    memset(buf + tl, ' ', padded - tl);
    buf[padded] = '\0';
    *out = buf;
    *len = padded;
    return TP_OK;
}

static int write_all(FILE *f, const char *header, size_t hlen, const tp_st_entry *entries, size_t n)
{
    uint8_t lenbuf[8];
    for (int i = 0; i < 8; i++) lenbuf[i] = (uint8_t)((uint64_t)hlen >> (8 * i));   /* little endian */
    int ok = fwrite(lenbuf, 1, 8, f) == 8 && fwrite(header, 1, hlen, f) == hlen;
    for (size_t i = 0; i < n && ok; i++) {
        uint64_t b = 0;
        entry_bytes("", &entries[i], &b);
        ok = b == 0 || fwrite(entries[i].data, 1, (size_t)b, f) == (size_t)b;
    }
    ok = fflush(f) == 0 && ok;
    ok = fsync(fileno(f)) == 0 && ok;   /* the rename must not outrun the data */
    return ok;
}

tp_status tp_safetensors_write(const char *path, const tp_st_entry *entries, size_t n,
                               const char *const *metadata_kv, size_t n_metadata)
{
    if (!path || (n && !entries) || (n_metadata && !metadata_kv))
        return tp_fail(TP_ERR_INVALID, "tp_safetensors_write: NULL argument");
    char *header = NULL;
    size_t hlen = 0;
    tp_status s = check_entries(path, entries, n, 1);
    if (s == TP_OK) s = build_header(path, entries, n, metadata_kv, n_metadata, &header, &hlen);
    if (s != TP_OK) return s;
    size_t plen = strlen(path) + 32;
    char *tmp = malloc(plen);
    if (!tmp) { free(header); return tp_fail(TP_ERR_NOMEM, "out of memory"); }
    snprintf(tmp, plen, "%s.tmp%ld", path, (long)getpid());
    FILE *f = fopen(tmp, "wb");
    if (!f) {
        s = tp_fail(TP_ERR_IO, "%s: %s", tmp, strerror(errno));
    } else {
        int ok = write_all(f, header, hlen, entries, n);
        int e = ok ? 0 : errno;
        if (fclose(f) != 0 && ok) { ok = 0; e = errno; }
        if (ok && rename(tmp, path) != 0) { ok = 0; e = errno; }
        if (!ok) {
            unlink(tmp);
            s = tp_fail(TP_ERR_IO, "%s: write failed: %s", path, strerror(e ? e : EIO));
        }
    }
    free(tmp);
    free(header);
    return s;
}

tp_status tp_safetensors_header(const char *path, const tp_st_entry *entries, size_t n,
                                const char *const *metadata_kv, size_t n_metadata, char **out, size_t *len)
{
    char *header = NULL;
    size_t hlen = 0;
    tp_status s = check_entries(path, entries, n, 0);
    if (s == TP_OK) s = build_header(path, entries, n, metadata_kv, n_metadata, &header, &hlen);
    if (s != TP_OK) return s;
    char *buf = malloc(hlen + 8);
    if (!buf) { free(header); return tp_fail(TP_ERR_NOMEM, "out of memory"); }
    for (int i = 0; i < 8; i++) buf[i] = (char)(uint8_t)((uint64_t)hlen >> (8 * i));   /* little endian */
    memcpy(buf + 8, header, hlen);
    free(header);
    *out = buf;
    *len = hlen + 8;
    return TP_OK;
}
