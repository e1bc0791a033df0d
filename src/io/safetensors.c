/* Reading safetensors checkpoints: one file or the shards of an index.
 *
 * Every file is mapped read-only and its header validated in full at open
 * (sizes, JSON, dtype x shape = byte count, offsets inside the data area, no
 * overlaps, no duplicates), so that later reads can trust the table and never
 * touch a byte outside their tensor.  Reads convert straight out of the map
 * into the caller's buffer: no full-tensor temporary, and only the bytes of
 * the requested range are paged in. */
#include "tensorpar/io.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* JSON numbers are doubles: integers above 2^53 would not be exact. */
#define MAX_EXACT_INT 9007199254740992.0
/* Misaligned source data is converted through a bounce buffer this big. */
#define BOUNCE_BYTES 16384

typedef struct {
    char *path;
    uint8_t *map;           /* whole file, PROT_READ                        */
    size_t map_len;
    const uint8_t *data;    /* start of the data area inside the map        */
    uint64_t data_len;
} st_file;

typedef struct {
    char *key, *value;
} st_meta;

struct tp_checkpoint {
    char *origin;           /* the path given to open, for messages         */
    st_file *files;
    int nfiles;
    tp_st_info *infos;      /* ordered by file, then by data_begin           */
    size_t count, cap;
    size_t *by_name;        /* indices into infos, sorted by name            */
    st_meta *meta;
    size_t n_meta;
    _Atomic uint64_t bytes_read;
};

/* ---- small helpers ----------------------------------------------------- */

static char *dup_str(const char *s)
{
    size_t n = strlen(s) + 1;
    char *d = malloc(n);
    if (d) memcpy(d, s, n);
    return d;
}

static char *join_path(const char *dir, const char *name)
{
    size_t a = strlen(dir), b = strlen(name);
    char *p = malloc(a + b + 2);
    if (!p) return NULL;
    memcpy(p, dir, a);
    size_t at = a;
    if (a && dir[a - 1] != '/') p[at++] = '/';
    memcpy(p + at, name, b + 1);
    return p;
}

static int ends_with(const char *s, const char *suffix)
{
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && !strcmp(s + a - b, suffix);
}

static int parse_st_dtype(const char *s, tp_dtype *out)
{
    *out = TP_DTYPE_COUNT;
    static const struct { const char *name; tp_dtype t; } table[] = {
        {"F64", TP_F64}, {"F32", TP_F32}, {"F16", TP_F16}, {"BF16", TP_BF16},
        {"I64", TP_I64}, {"I32", TP_I32}, {"I16", TP_I16}, {"I8", TP_I8},
        {"U8", TP_U8},   {"BOOL", TP_BOOL},
    };
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++)
        if (!strcmp(s, table[i].name)) { *out = table[i].t; return 1; }
    return 0;
}

/* A JSON number that is a whole number in [0, 2^53]. */
static int json_uint(const cJSON *j, uint64_t *out)
{
    if (!cJSON_IsNumber(j)) return 0;
    double v = j->valuedouble;
    if (!(v >= 0 && v <= MAX_EXACT_INT) || v != (double)(uint64_t)v) return 0;
    *out = (uint64_t)v;
    return 1;
}

/* numel of a shape, or 0 with *overflow set when it does not fit in 64 bits.
 * A zero dimension wins over an overflow among the others. */
static uint64_t shape_numel(int ndim, const int64_t *shape, int *overflow)
{
    uint64_t n = 1;
    *overflow = 0;
    for (int i = 0; i < ndim; i++)
        if (shape[i] == 0) return 0;
    for (int i = 0; i < ndim; i++) {
        uint64_t d = (uint64_t)shape[i];
        if (n > UINT64_MAX / d) { *overflow = 1; return 0; }
        n *= d;
    }
    return n;
}

static int64_t prod_range(const int64_t *shape, int from, int to)
{
    int64_t n = 1;
    for (int i = from; i < to; i++) n *= shape[i];
    return n;
}

/* ---- mapping a file ---------------------------------------------------- */

static tp_status map_file(st_file *f)
{
    int fd = open(f->path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return tp_fail(TP_ERR_IO, "%s: %s", f->path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return tp_fail(TP_ERR_IO, "%s: %s", f->path, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return tp_fail(TP_ERR_IO, "%s: not a regular file", f->path);
    }
    if (st.st_size < 8) {
        close(fd);
        return tp_fail(TP_ERR_FORMAT, "%s: file is %lld bytes, too short for the 8-byte header length",
                       f->path, (long long)st.st_size);
    }
    f->map_len = (size_t)st.st_size;
    void *m = mmap(NULL, f->map_len, PROT_READ, MAP_PRIVATE, fd, 0);
    int e = errno;
    close(fd);   /* the mapping keeps the file alive */
    if (m == MAP_FAILED) return tp_fail(TP_ERR_IO, "%s: mmap: %s", f->path, strerror(e));
    f->map = m;
    return TP_OK;
}

static void unmap_file(st_file *f)
{
    if (f->map) munmap(f->map, f->map_len);
    free(f->path);
    memset(f, 0, sizeof *f);
}

/* Reads the header length, checks it against the file and parses the JSON. */
static tp_status parse_header(st_file *f, cJSON **out)
{
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = (n << 8) | f->map[i];   /* little endian */
    uint64_t avail = (uint64_t)f->map_len - 8;
    if (n > TP_ST_MAX_HEADER_BYTES)
        return tp_fail(TP_ERR_FORMAT, "%s: header length %llu exceeds the limit of %u bytes",
                       f->path, (unsigned long long)n, TP_ST_MAX_HEADER_BYTES);
    if (n > avail)
        return tp_fail(TP_ERR_FORMAT, "%s: header length %llu runs past the end of the file (%llu bytes after the length)",
                       f->path, (unsigned long long)n, (unsigned long long)avail);
    const char *text = (const char *)f->map + 8;
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(text, (size_t)n, &end, 0);
    if (!root) {
        size_t at = end && end >= text ? (size_t)(end - text) : 0;
        return tp_fail(TP_ERR_FORMAT, "%s: header is not valid JSON (error near byte %zu of %llu)",
                       f->path, at, (unsigned long long)n);
    }
    /* Writers pad the header with spaces; anything else after it is junk. */
    for (const char *p = end; p < text + n; p++) {
        if (*p != ' ' && *p != '\t' && *p != '\n' && *p != '\r') {
            cJSON_Delete(root);
            return tp_fail(TP_ERR_FORMAT, "%s: header has trailing bytes after the JSON value", f->path);
        }
    }
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return tp_fail(TP_ERR_FORMAT, "%s: header JSON is not an object", f->path);
    }
    f->data = f->map + 8 + n;
    f->data_len = avail - n;
    *out = root;
    return TP_OK;
}

/* ---- the tensor table -------------------------------------------------- */

static tp_status push_info(tp_checkpoint *ck, tp_st_info **out)
{
    if (ck->count == ck->cap) {
        size_t ncap = ck->cap ? ck->cap * 2 : 256;
        tp_st_info *n = realloc(ck->infos, ncap * sizeof *n);
        if (!n) return tp_fail(TP_ERR_NOMEM, "out of memory reading a checkpoint header");
        ck->infos = n;
        ck->cap = ncap;
    }
    *out = &ck->infos[ck->count];
    memset(*out, 0, sizeof **out);
    return TP_OK;
}

static tp_status parse_shape(const st_file *f, const char *name, const cJSON *j, tp_st_info *t)
{
    if (!cJSON_IsArray(j))
        return tp_fail(TP_ERR_FORMAT, "%s: tensor '%s': \"shape\" is missing or not an array", f->path, name);
    int nd = cJSON_GetArraySize(j);
    if (nd > TP_ST_MAX_DIMS)
        return tp_fail(TP_ERR_FORMAT, "%s: tensor '%s': shape has %d dimensions, more than %d",
                       f->path, name, nd, TP_ST_MAX_DIMS);
    int i = 0;
    const cJSON *d;
    cJSON_ArrayForEach(d, j) {
        uint64_t v;
        if (!json_uint(d, &v))
            return tp_fail(TP_ERR_FORMAT, "%s: tensor '%s': shape entry %d is not a non-negative integer",
                           f->path, name, i);
        t->shape[i++] = (int64_t)v;
    }
    t->ndim = nd;
    return TP_OK;
}

static tp_status parse_offsets(const st_file *f, const char *name, const cJSON *j, tp_st_info *t)
{
    if (!cJSON_IsArray(j) || cJSON_GetArraySize(j) != 2
        || !json_uint(cJSON_GetArrayItem(j, 0), &t->data_begin)
        || !json_uint(cJSON_GetArrayItem(j, 1), &t->data_end))
        return tp_fail(TP_ERR_FORMAT, "%s: tensor '%s': \"data_offsets\" must be two non-negative integers",
                       f->path, name);
    if (t->data_begin > t->data_end)
        return tp_fail(TP_ERR_FORMAT, "%s: tensor '%s': data_offsets [%llu, %llu] begin after they end",
                       f->path, name, (unsigned long long)t->data_begin, (unsigned long long)t->data_end);
    if (t->data_end > f->data_len)
        return tp_fail(TP_ERR_FORMAT, "%s: tensor '%s': data_offsets [%llu, %llu] run past the end of the "
                       "data area (%llu bytes; file truncated?)", f->path, name,
                       (unsigned long long)t->data_begin, (unsigned long long)t->data_end,
                       (unsigned long long)f->data_len);
    return TP_OK;
}

/* dtype size x numel must be exactly the byte count of the offsets. */
static tp_status check_size(const st_file *f, const char *name, const tp_st_info *t, const char *dt)
{
    int overflow;
    uint64_t numel = shape_numel(t->ndim, t->shape, &overflow);
    uint64_t es = tp_dtype_size(t->dtype);
    uint64_t have = t->data_end - t->data_begin;
    char sb[256];
    tp_shape_str(t->ndim, t->shape, sb, sizeof sb);
    if (overflow || numel > UINT64_MAX / es)
        return tp_fail(TP_ERR_FORMAT, "%s: tensor '%s': %s %s is too large (byte count overflows)",
                       f->path, name, dt, sb);
    if (numel * es != have)
        return tp_fail(TP_ERR_FORMAT, "%s: tensor '%s': data_offsets [%llu, %llu] hold %llu bytes but %s %s needs %llu",
                       f->path, name, (unsigned long long)t->data_begin, (unsigned long long)t->data_end,
                       (unsigned long long)have, dt, sb, (unsigned long long)(numel * es));
    return TP_OK;
}

static tp_status parse_tensor(const st_file *f, const cJSON *e, tp_st_info *t)
{
    const char *name = e->string;
    if (!cJSON_IsObject(e))
        return tp_fail(TP_ERR_FORMAT, "%s: top-level field '%s' is neither \"__metadata__\" nor a tensor object",
                       f->path, name);
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(e, "dtype");
    if (!cJSON_IsString(dt))
        return tp_fail(TP_ERR_FORMAT, "%s: tensor '%s': \"dtype\" is missing or not a string", f->path, name);
    if (!parse_st_dtype(dt->valuestring, &t->dtype))
        return tp_fail(TP_ERR_FORMAT, "%s: tensor '%s': unknown dtype \"%s\"", f->path, name, dt->valuestring);
    tp_status s = parse_shape(f, name, cJSON_GetObjectItemCaseSensitive(e, "shape"), t);
    if (s == TP_OK) s = parse_offsets(f, name, cJSON_GetObjectItemCaseSensitive(e, "data_offsets"), t);
    if (s == TP_OK) s = check_size(f, name, t, dt->valuestring);
    return s;
}

static tp_status add_metadata(tp_checkpoint *ck, const st_file *f, const cJSON *m)
{
    if (!cJSON_IsObject(m))
        return tp_fail(TP_ERR_FORMAT, "%s: \"__metadata__\" is not an object", f->path);
    const cJSON *kv;
    cJSON_ArrayForEach(kv, m) {
        if (!cJSON_IsString(kv))
            return tp_fail(TP_ERR_FORMAT, "%s: __metadata__ value '%s' is not a string", f->path, kv->string);
        if (tp_checkpoint_metadata(ck, kv->string)) continue;   /* first shard wins */
        st_meta *n = realloc(ck->meta, (ck->n_meta + 1) * sizeof *n);
        if (!n) return tp_fail(TP_ERR_NOMEM, "out of memory");
        ck->meta = n;
        n[ck->n_meta].key = dup_str(kv->string);
        n[ck->n_meta].value = dup_str(kv->valuestring);
        ck->n_meta++;
        if (!n[ck->n_meta - 1].key || !n[ck->n_meta - 1].value)
            return tp_fail(TP_ERR_NOMEM, "out of memory");
    }
    return TP_OK;
}

static int cmp_begin(const void *a, const void *b)
{
    const tp_st_info *x = a, *y = b;
    return x->data_begin < y->data_begin ? -1 : x->data_begin > y->data_begin;
}

/* Tensors of one file, sorted by begin: any that starts before the previous
 * non-empty one ends overlaps it.  Empty tensors occupy no bytes. */
static tp_status check_overlaps(const st_file *f, tp_st_info *t, size_t n)
{
    qsort(t, n, sizeof *t, cmp_begin);
    const tp_st_info *prev = NULL;
    for (size_t i = 0; i < n; i++) {
        if (t[i].data_begin == t[i].data_end) continue;
        if (prev && t[i].data_begin < prev->data_end)
            return tp_fail(TP_ERR_FORMAT, "%s: tensor '%s' [%llu, %llu] overlaps tensor '%s' [%llu, %llu]",
                           f->path, t[i].name, (unsigned long long)t[i].data_begin,
                           (unsigned long long)t[i].data_end, prev->name,
                           (unsigned long long)prev->data_begin, (unsigned long long)prev->data_end);
        prev = &t[i];
    }
    return TP_OK;
}

/* Adds every tensor of file `fi` to the table. */
static tp_status load_file(tp_checkpoint *ck, int fi)
{
    st_file *f = &ck->files[fi];
    tp_status s = map_file(f);
    cJSON *root = NULL;
    if (s == TP_OK) s = parse_header(f, &root);
    if (s != TP_OK) return s;
    size_t first = ck->count;
    const cJSON *e;
    cJSON_ArrayForEach(e, root) {
        if (!strcmp(e->string, "__metadata__")) {
            s = add_metadata(ck, f, e);
        } else {
            tp_st_info *t = NULL;
            s = push_info(ck, &t);
            if (s == TP_OK) s = parse_tensor(f, e, t);
            if (s == TP_OK) {
                t->file = fi;
                t->name = dup_str(e->string);
                ck->count++;
                if (!t->name) s = tp_fail(TP_ERR_NOMEM, "out of memory");
            }
        }
        if (s != TP_OK) break;
    }
    cJSON_Delete(root);
    /* A header without tensors ("{}") leaves infos NULL: nothing to check,
     * and NULL + 0 is not a pointer C lets us form (found by fuzzing). */
    if (s == TP_OK && ck->count > first) s = check_overlaps(f, ck->infos + first, ck->count - first);
    return s;
}

/* ---- name lookup ------------------------------------------------------- */

static int cmp_name_idx(const void *a, const void *b, void *ctx)
{
    const tp_st_info *infos = ctx;
    return strcmp(infos[*(const size_t *)a].name, infos[*(const size_t *)b].name);
}

/* qsort_r is a GNU extension (we build with _GNU_SOURCE); the context keeps
 * the comparator free of global state. */
static tp_status build_name_index(tp_checkpoint *ck)
{
    ck->by_name = malloc((ck->count ? ck->count : 1) * sizeof *ck->by_name);
    if (!ck->by_name) return tp_fail(TP_ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < ck->count; i++) ck->by_name[i] = i;
    qsort_r(ck->by_name, ck->count, sizeof *ck->by_name, cmp_name_idx, ck->infos);
    for (size_t i = 1; i < ck->count; i++) {
        const tp_st_info *a = &ck->infos[ck->by_name[i - 1]], *b = &ck->infos[ck->by_name[i]];
        if (strcmp(a->name, b->name)) continue;
        if (a->file == b->file)
            return tp_fail(TP_ERR_FORMAT, "%s: tensor '%s' appears twice in the header",
                           ck->files[a->file].path, a->name);
        return tp_fail(TP_ERR_FORMAT, "%s: tensor '%s' is also in %s",
                       ck->files[b->file].path, b->name, ck->files[a->file].path);
    }
    return TP_OK;
}

const tp_st_info *tp_checkpoint_find(const tp_checkpoint *ck, const char *name)
{
    size_t lo = 0, hi = ck->count;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        const tp_st_info *t = &ck->infos[ck->by_name[mid]];
        int c = strcmp(name, t->name);
        if (c == 0) return t;
        if (c < 0) hi = mid; else lo = mid + 1;
    }
    return NULL;
}

/* ---- the sharded index ------------------------------------------------- */

static int file_index(const tp_checkpoint *ck, const char *path)
{
    for (int i = 0; i < ck->nfiles; i++)
        if (!strcmp(ck->files[i].path, path)) return i;
    return -1;
}

/* Collects the distinct shard files the weight map names, in first-seen
 * order.  Shard names must be plain file names inside the index's folder. */
static tp_status collect_shards(tp_checkpoint *ck, const char *index_path, const char *dir,
                                const cJSON *wm)
{
    int n = cJSON_GetArraySize(wm);
    ck->files = calloc(n ? (size_t)n : 1, sizeof *ck->files);
    if (!ck->files) return tp_fail(TP_ERR_NOMEM, "out of memory");
    const cJSON *e;
    cJSON_ArrayForEach(e, wm) {
        if (!cJSON_IsString(e))
            return tp_fail(TP_ERR_FORMAT, "%s: weight_map entry '%s' is not a string", index_path, e->string);
        const char *fn = e->valuestring;
        if (!fn[0] || strchr(fn, '/') || !strcmp(fn, "..") || !strcmp(fn, "."))
            return tp_fail(TP_ERR_FORMAT, "%s: tensor '%s': shard name \"%s\" is not a file name in the model folder",
                           index_path, e->string, fn);
        char *p = join_path(dir, fn);
        if (!p) return tp_fail(TP_ERR_NOMEM, "out of memory");
        if (file_index(ck, p) >= 0) { free(p); continue; }
        ck->files[ck->nfiles++].path = p;
    }
    if (ck->nfiles == 0) return tp_fail(TP_ERR_FORMAT, "%s: weight_map is empty", index_path);
    return TP_OK;
}

/* Every tensor the index lists is in the shard it names, and every tensor of
 * the shards is listed (a checkpoint that disagrees with its index is broken). */
static tp_status check_index(tp_checkpoint *ck, const char *index_path, const char *dir,
                             const cJSON *wm)
{
    size_t listed = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, wm) {
        listed++;
        const tp_st_info *t = tp_checkpoint_find(ck, e->string);
        char *p = join_path(dir, e->valuestring);
        if (!p) return tp_fail(TP_ERR_NOMEM, "out of memory");
        int fi = file_index(ck, p);
        tp_status s = TP_OK;
        if (!t)
            s = tp_fail(TP_ERR_FORMAT, "%s: tensor '%s' is listed for %s but that file does not hold it",
                        index_path, e->string, p);
        else if (t->file != fi)
            s = tp_fail(TP_ERR_FORMAT, "%s: tensor '%s' is listed for %s but is in %s",
                        index_path, e->string, p, ck->files[t->file].path);
        free(p);
        if (s != TP_OK) return s;
    }
    /* Linear lookups: quadratic, but ~1000 tensors cost about a millisecond. */
    for (size_t i = 0; i < ck->count; i++)
        if (!cJSON_GetObjectItemCaseSensitive(wm, ck->infos[i].name))
            return tp_fail(TP_ERR_FORMAT, "%s: tensor '%s' is not listed in %s",
                           ck->files[ck->infos[i].file].path, ck->infos[i].name, index_path);
    /* Now the listed names are exactly the table's: more entries than tensors
     * means a name is listed twice. */
    if (listed != ck->count)
        return tp_fail(TP_ERR_FORMAT, "%s: weight_map lists a tensor more than once", index_path);
    return TP_OK;
}

static tp_status open_index(tp_checkpoint *ck, const char *index_path)
{
    char *text = NULL;
    size_t len = 0;
    tp_status s = tp_read_file(index_path, &text, &len);
    if (s != TP_OK) return s;
    cJSON *root = cJSON_ParseWithLength(text, len);
    free(text);
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return tp_fail(TP_ERR_FORMAT, "%s: not a JSON object", index_path);
    }
    const cJSON *wm = cJSON_GetObjectItemCaseSensitive(root, "weight_map");
    char *dir = dup_str(index_path);
    if (!dir) { cJSON_Delete(root); return tp_fail(TP_ERR_NOMEM, "out of memory"); }
    char *slash = strrchr(dir, '/');
    if (slash) slash[1] = '\0'; else strcpy(dir, "./");
    if (!cJSON_IsObject(wm))
        s = tp_fail(TP_ERR_FORMAT, "%s: \"weight_map\" is missing or not an object", index_path);
    else
        s = collect_shards(ck, index_path, dir, wm);
    for (int i = 0; s == TP_OK && i < ck->nfiles; i++) {
        s = load_file(ck, i);
        if (s != TP_OK) tp_fail_context(s, "%s", index_path);
    }
    if (s == TP_OK) s = build_name_index(ck);
    if (s == TP_OK) s = check_index(ck, index_path, dir, wm);
    free(dir);
    cJSON_Delete(root);
    return s;
}

static tp_status open_single(tp_checkpoint *ck, const char *path)
{
    ck->files = calloc(1, sizeof *ck->files);
    if (!ck->files || !(ck->files[0].path = dup_str(path)))
        return tp_fail(TP_ERR_NOMEM, "out of memory");
    ck->nfiles = 1;
    tp_status s = load_file(ck, 0);
    if (s == TP_OK) s = build_name_index(ck);
    return s;
}

/* ---- open / close ------------------------------------------------------ */

static int is_file(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

/* Picks the single file or the index a path stands for. */
static tp_status open_path(tp_checkpoint *ck, const char *path)
{
    struct stat st;
    if (stat(path, &st) != 0) return tp_fail(TP_ERR_IO, "%s: %s", path, strerror(errno));
    if (!S_ISDIR(st.st_mode))
        return ends_with(path, ".index.json") ? open_index(ck, path) : open_single(ck, path);
    char *single = join_path(path, "model.safetensors");
    char *index = join_path(path, "model.safetensors.index.json");
    tp_status s;
    if (!single || !index) s = tp_fail(TP_ERR_NOMEM, "out of memory");
    else if (is_file(single)) s = open_single(ck, single);
    else if (is_file(index)) s = open_index(ck, index);
    else s = tp_fail(TP_ERR_IO, "%s: no model.safetensors or model.safetensors.index.json in this folder", path);
    free(single);
    free(index);
    return s;
}

tp_status tp_checkpoint_open(tp_checkpoint **out, const char *path)
{
    *out = NULL;
    tp_checkpoint *ck = calloc(1, sizeof *ck);
    if (!ck || !(ck->origin = dup_str(path))) {
        free(ck);
        return tp_fail(TP_ERR_NOMEM, "out of memory");
    }
    atomic_init(&ck->bytes_read, 0);
    tp_status s = open_path(ck, path);
    if (s != TP_OK) { tp_checkpoint_close(ck); return s; }
    *out = ck;
    return TP_OK;
}

void tp_checkpoint_close(tp_checkpoint *ck)
{
    if (!ck) return;
    for (int i = 0; i < ck->nfiles; i++) unmap_file(&ck->files[i]);
    free(ck->files);
    for (size_t i = 0; i < ck->count; i++) free((char *)ck->infos[i].name);
    free(ck->infos);
    free(ck->by_name);
    for (size_t i = 0; i < ck->n_meta; i++) { free(ck->meta[i].key); free(ck->meta[i].value); }
    free(ck->meta);
    free(ck->origin);
    free(ck);
}

/* ---- accessors --------------------------------------------------------- */

size_t tp_checkpoint_count(const tp_checkpoint *ck) { return ck->count; }

const tp_st_info *tp_checkpoint_at(const tp_checkpoint *ck, size_t i)
{
    return i < ck->count ? &ck->infos[i] : NULL;
}

const char *tp_checkpoint_file_path(const tp_checkpoint *ck, int file)
{
    return file >= 0 && file < ck->nfiles ? ck->files[file].path : NULL;
}

const char *tp_checkpoint_metadata(const tp_checkpoint *ck, const char *key)
{
    for (size_t i = 0; i < ck->n_meta; i++)
        if (ck->meta[i].key && !strcmp(ck->meta[i].key, key)) return ck->meta[i].value;
    return NULL;
}

uint64_t tp_checkpoint_bytes_read(const tp_checkpoint *ck)
{
    return atomic_load_explicit((_Atomic uint64_t *)&ck->bytes_read, memory_order_relaxed);
}

static tp_status find_or_fail(const tp_checkpoint *ck, const char *name, const tp_st_info **out)
{
    *out = tp_checkpoint_find(ck, name);
    if (!*out) return tp_fail(TP_ERR_INVALID, "tensor '%s' not found in %s", name, ck->origin);
    return TP_OK;
}

tp_status tp_checkpoint_expect(const tp_checkpoint *ck, const char *name, int ndim, const int64_t *shape)
{
    const tp_st_info *t;
    tp_status s = find_or_fail(ck, name, &t);
    if (s != TP_OK) return s;
    int same = t->ndim == ndim;
    for (int i = 0; same && i < ndim; i++) same = t->shape[i] == shape[i];
    if (same) return TP_OK;
    char found[256], want[256];
    tp_shape_str(t->ndim, t->shape, found, sizeof found);
    tp_shape_str(ndim, shape, want, sizeof want);
    return tp_fail(TP_ERR_FORMAT, "%s: tensor '%s' has shape %s but the model expects %s",
                   ck->files[t->file].path, name, found, want);
}

tp_status tp_checkpoint_expect_weight(const tp_checkpoint *ck, const char *name, int ndim, const int64_t *shape)
{
    tp_status s = tp_checkpoint_expect(ck, name, ndim, shape);
    if (s != TP_OK) return s;
    /* An integer tensor where a weight belongs is a damaged or foreign file:
     * converting its bit patterns to floats would load nonsense silently. */
    const tp_st_info *t = tp_checkpoint_find(ck, name);
    if (tp_dtype_is_float(t->dtype)) return TP_OK;
    return tp_fail(TP_ERR_FORMAT, "%s: tensor '%s' has dtype %s but the model expects a floating-point tensor",
                   ck->files[t->file].path, name, tp_dtype_name(t->dtype));
}

/* ---- reading ----------------------------------------------------------- */

/* Converts n elements at src (which may sit at any address in the map) into
 * dst.  tp_convert reads typed pointers, so misaligned sources go through an
 * aligned bounce buffer a chunk at a time. */
static tp_status convert_run(void *dst, tp_dtype want, const uint8_t *src, tp_dtype have, size_t n)
{
    size_t es = tp_dtype_size(have), ws = tp_dtype_size(want);
    if (want == have || (uintptr_t)src % es == 0) return tp_convert(dst, want, src, have, n);
    _Alignas(16) uint8_t bounce[BOUNCE_BYTES];
    size_t chunk = BOUNCE_BYTES / es;
    for (size_t done = 0; done < n; done += chunk) {
        size_t k = n - done < chunk ? n - done : chunk;
        memcpy(bounce, src + done * es, k * es);
        tp_status s = tp_convert((uint8_t *)dst + done * ws, want, bounce, have, k);
        if (s != TP_OK) return s;
    }
    return TP_OK;
}

/* Drops the map's pages of a span that has been copied out: the data now
 * lives in the model's own buffers, and keeping the file pages mapped too
 * would count every weight twice in the process's resident memory (and a
 * rank's column slices would keep its neighbours' bytes resident).  The
 * mapping is private and never written, so this only unmaps; the page
 * cache keeps the file. */
static void release_pages(const uint8_t *p, size_t len)
{
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t b = (uintptr_t)p / page * page, e = ((uintptr_t)p + len + page - 1) / page * page;
    madvise((void *)b, e - b, MADV_DONTNEED);
}

/* Copies `runs` runs of `run` elements, `stride` elements apart, starting
 * `first` elements into the tensor, densely into dst. */
static tp_status read_runs(tp_checkpoint *ck, const tp_st_info *t, tp_dtype want, void *dst,
                           size_t runs, size_t run, size_t stride, size_t first)
{
    const st_file *f = &ck->files[t->file];
    size_t es = tp_dtype_size(t->dtype), ws = tp_dtype_size(want);
    if (runs == 0 || run == 0) return TP_OK;
    if (tp_dtype_is_float(t->dtype) && !tp_dtype_is_float(want))
        return tp_fail(TP_ERR_UNSUPPORTED, "%s: tensor '%s': cannot convert stored %s to %s",
                       f->path, t->name, tp_dtype_name(t->dtype), tp_dtype_name(want));
    const uint8_t *base = f->data + t->data_begin + first * es;
    for (size_t r = 0; r < runs; r++) {
        tp_status s = convert_run((uint8_t *)dst + r * run * ws, want, base + r * stride * es, t->dtype, run);
        if (s != TP_OK) return tp_fail_context(s, "%s: tensor '%s'", f->path, t->name);
    }
    atomic_fetch_add_explicit(&ck->bytes_read, (uint64_t)(runs * run * es), memory_order_relaxed);
    release_pages(base, ((runs - 1) * stride + run) * es);
    return TP_OK;
}

static tp_status check_want(const tp_checkpoint *ck, const tp_st_info *t, tp_dtype want)
{
    if ((unsigned)want >= TP_DTYPE_COUNT)
        return tp_fail(TP_ERR_INVALID, "%s: tensor '%s': bad target dtype %d",
                       ck->files[t->file].path, t->name, (int)want);
    /* q8_0 blocks are made from a read row by tp_q8_quantize_rows (the
     * model's load), never element by element here. */
    if (want == TP_Q8_0 || want == TP_Q4_0)
        return tp_fail(TP_ERR_UNSUPPORTED, "%s: tensor '%s': read as f32 or bf16 and quantize to %s",
                       ck->files[t->file].path, t->name, tp_dtype_name(want));
    return TP_OK;
}

tp_status tp_checkpoint_read(tp_checkpoint *ck, const char *name, tp_dtype want, void *dst)
{
    const tp_st_info *t;
    tp_status s = find_or_fail(ck, name, &t);
    if (s == TP_OK) s = check_want(ck, t, want);
    if (s != TP_OK) return s;
    /* Validation at open guarantees numel * size fits the file, hence size_t. */
    size_t numel = (size_t)((t->data_end - t->data_begin) / tp_dtype_size(t->dtype));
    return read_runs(ck, t, want, dst, 1, numel, 0, 0);
}

tp_status tp_checkpoint_read_slice(tp_checkpoint *ck, const char *name, int dim,
                                   int64_t start, int64_t len, tp_dtype want, void *dst)
{
    const tp_st_info *t;
    tp_status s = find_or_fail(ck, name, &t);
    if (s == TP_OK) s = check_want(ck, t, want);
    if (s != TP_OK) return s;
    const char *path = ck->files[t->file].path;
    if (dim < 0 || dim >= t->ndim)
        return tp_fail(TP_ERR_INVALID, "%s: tensor '%s': cannot slice dimension %d of a %d-dimensional tensor",
                       path, name, dim, t->ndim);
    int64_t size = t->shape[dim];
    if (start < 0 || len < 0 || start > size || len > size - start)
        return tp_fail(TP_ERR_INVALID, "%s: tensor '%s': slice [%lld, %lld + %lld) is outside dimension %d of size %lld",
                       path, name, (long long)start, (long long)start, (long long)len, dim, (long long)size);
    if (t->data_begin == t->data_end) return TP_OK;   /* an empty tensor */
    /* Non-empty, so every partial product is at most numel: no overflow. */
    size_t outer = (size_t)prod_range(t->shape, 0, dim);
    size_t inner = (size_t)prod_range(t->shape, dim + 1, t->ndim);
    size_t run = (size_t)len * inner, stride = (size_t)size * inner;
    if (len == size)   /* the whole dimension: the runs touch, read them as one */
        return read_runs(ck, t, want, dst, 1, outer * run, 0, 0);
    return read_runs(ck, t, want, dst, outer, run, stride, (size_t)start * inner);
}

tp_status tp_checkpoint_read_range(tp_checkpoint *ck, const char *name, int64_t first, int64_t n,
                                   tp_dtype want, void *dst)
{
    const tp_st_info *t;
    tp_status s = find_or_fail(ck, name, &t);
    if (s == TP_OK) s = check_want(ck, t, want);
    if (s != TP_OK) return s;
    int64_t numel = (int64_t)((t->data_end - t->data_begin) / tp_dtype_size(t->dtype));
    if (first < 0 || n < 0 || first > numel || n > numel - first)
        return tp_fail(TP_ERR_INVALID, "%s: tensor '%s': elements [%lld, %lld + %lld) are outside its %lld",
                       ck->files[t->file].path, name, (long long)first, (long long)first, (long long)n,
                       (long long)numel);
    return read_runs(ck, t, want, dst, 1, (size_t)n, 0, (size_t)first);
}
