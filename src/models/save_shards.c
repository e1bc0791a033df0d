/* The collective safetensors writer: tensors held as shards by the ranks
 * become the files Transformers' save_pretrained writes, each rank writing
 * its own bytes in place, so no rank gathers a whole tensor.
 *
 * Layout (the same on every rank, computed from names, shapes and dtypes
 * alone, so it does not depend on the TP layout):
 *   - files: huggingface_hub's split_torch_state_dict_into_shards over the
 *     tensors in the given (state-dict) order: a tensor that would take the
 *     current file past max_shard_bytes starts a new one; a tensor larger
 *     than the limit gets a file of its own, placed before the file being
 *     filled (as huggingface_hub does).  One file: PREFIX.safetensors;
 *     several: PREFIX-0000k-of-0000N.safetensors and
 *     PREFIX.safetensors.index.json (json.dumps(indent=2, sort_keys=True)
 *     plus a newline; metadata: total_parameters = the elements,
 *     total_size = the bytes, as transformers >= 4.56 writes them).
 *   - inside a file: the tensors sorted as the safetensors library stores
 *     them (dtype from widest enum value down, then name), the header JSON
 *     "__metadata__" ({"format": "pt"}) first, then the tensors in data
 *     order, compact, padded with spaces to 8 bytes.
 *
 * Writing: the writer rank creates every file at its final size
 * (fallocate, so a full disk fails here, naming the file) and writes the
 * headers; all ranks agree; each rank pwrite()s the pieces of the shards
 * it writes (a Shard(0) shard is one contiguous range; a shard along a
 * later dimension is one piece per row of the dimensions before it) and
 * fsyncs them; all ranks agree again.  A rank that holds only part of
 * its shard (a dp_shard chunk: tp_save_tensor.part) writes that part's
 * runs (tp_slice_runs), so under --dp-shard no rank gathers a shard. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "tensorpar/module.h"
#include "tensorpar/comm.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define DEFAULT_MAX_SHARD ((uint64_t)5000000000ULL)   /* transformers' "5GB" */

typedef struct {
    size_t *order;      /* tensor indices, file by file, in data order */
    size_t *file_of;    /* per tensor */
    uint64_t *offset;   /* per tensor: absolute byte offset in its file */
    size_t *first;      /* per file: start in order[]; first[n_files] = n */
    uint64_t *size;     /* per file: total bytes */
    char **header;      /* per file */
    size_t *hlen;
    int n_files;
} layout;

static uint64_t tensor_bytes(const tp_save_tensor *t)
{
    uint64_t n = tp_dtype_size(t->dtype);
    for (int i = 0; i < t->ndim; i++) n *= (uint64_t)t->shape[i];
    return n;
}

/* safetensors' Dtype enum position (its files sort by it, descending). */
static int st_rank(tp_dtype d)
{
    switch (d) {
    case TP_BOOL: return 0;
    case TP_U8: return 1;
    case TP_I8: return 2;
    case TP_I16: return 5;
    case TP_F16: return 7;
    case TP_BF16: return 8;
    case TP_I32: return 9;
    case TP_F32: return 11;
    case TP_F64: return 12;
    case TP_I64: return 13;
    default: return 14;
    }
}

static int cmp_data_order(const void *a, const void *b, void *base)
{
    const tp_save_tensor *t = base, *x = &t[*(const size_t *)a], *y = &t[*(const size_t *)b];
    int rx = st_rank(x->dtype), ry = st_rank(y->dtype);
    if (rx != ry) return ry - rx;
    return strcmp(x->name, y->name);
}

void tp_save_file_name(char *buf, size_t cap, const char *prefix, int k, int n_files)
{
    if (n_files <= 1) snprintf(buf, cap, "%s.safetensors", prefix);
    else snprintf(buf, cap, "%s-%05d-of-%05d.safetensors", prefix, k + 1, n_files);
}

/* huggingface_hub's split: file index per tensor, files in its order. */
static int split_files(const tp_save_tensor *t, size_t n, uint64_t max, size_t *file_of)
{
    int n_files = 0, current = -1;
    uint64_t current_size = 0;
    /* Files are numbered when closed; a big tensor's own file is closed at
     * once, before the file being filled. */
    int *ids = malloc((n + 1) * sizeof *ids), next_id = 0;
    if (!ids) return -1;
    for (size_t i = 0; i < n; i++) {
        uint64_t b = tensor_bytes(&t[i]);
        if (b > max) { file_of[i] = (size_t)(n_files++); ids[file_of[i]] = next_id++; continue; }
        if (current >= 0 && current_size + b > max) { ids[current] = next_id++; current = -1; }
        if (current < 0) { current = n_files++; current_size = 0; }
        file_of[i] = (size_t)current;
        current_size += b;
    }
    if (current >= 0) ids[current] = next_id++;
    for (size_t i = 0; i < n; i++) file_of[i] = (size_t)ids[file_of[i]];
    free(ids);
    return n_files;
}

static void layout_free(layout *l)
{
    for (int k = 0; l->header && k < l->n_files; k++) free(l->header[k]);
    free(l->order); free(l->file_of); free(l->offset); free(l->first); free(l->size); free(l->header); free(l->hlen);
    memset(l, 0, sizeof *l);
}

static tp_status file_header(const tp_save_tensor *t, layout *l, int k, const char *prefix)
{
    size_t a = l->first[k], b = l->first[k + 1];
    tp_st_entry *e = calloc(b - a + 1, sizeof *e);
    if (!e) return tp_fail(TP_ERR_NOMEM, "out of memory");
    for (size_t j = a; j < b; j++) {
        const tp_save_tensor *x = &t[l->order[j]];
        e[j - a] = (tp_st_entry){x->name, x->dtype, x->ndim, x->shape, NULL};
    }
    char name[256];
    tp_save_file_name(name, sizeof name, prefix, k, l->n_files);
    const char *meta[] = {"format", "pt"};
    tp_status s = tp_safetensors_header(name, e, b - a, meta, 1, &l->header[k], &l->hlen[k]);
    free(e);
    if (s) return s;
    uint64_t off = l->hlen[k];
    for (size_t j = a; j < b; j++) {
        l->offset[l->order[j]] = off;
        off += tensor_bytes(&t[l->order[j]]);
    }
    l->size[k] = off;
    return TP_OK;
}

static tp_status plan_layout(const tp_save_tensor *t, size_t n, uint64_t max, const char *prefix, layout *l)
{
    memset(l, 0, sizeof *l);
    l->order = malloc((n + 1) * sizeof *l->order);
    l->file_of = malloc((n + 1) * sizeof *l->file_of);
    l->offset = calloc(n + 1, sizeof *l->offset);
    if (!l->order || !l->file_of || !l->offset) return tp_fail(TP_ERR_NOMEM, "out of memory");
    l->n_files = n ? split_files(t, n, max ? max : DEFAULT_MAX_SHARD, l->file_of) : 1;
    if (l->n_files < 0) return tp_fail(TP_ERR_NOMEM, "out of memory");
    if (!n) l->n_files = 1;
    size_t nf = (size_t)l->n_files;
    l->first = calloc(nf + 1, sizeof *l->first);
    l->size = calloc(nf, sizeof *l->size);
    l->header = calloc(nf, sizeof *l->header);
    l->hlen = calloc(nf, sizeof *l->hlen);
    if (!l->first || !l->size || !l->header || !l->hlen) return tp_fail(TP_ERR_NOMEM, "out of memory");
    /* order: by file, stable, then data order inside each file */
    size_t at = 0;
    for (int k = 0; k < l->n_files; k++) {
        l->first[k] = at;
        for (size_t i = 0; i < n; i++)
            if (l->file_of[i] == (size_t)k) l->order[at++] = i;
        qsort_r(l->order + l->first[k], at - l->first[k], sizeof *l->order, cmp_data_order, (void *)t);
    }
    l->first[nf] = at;
    for (int k = 0; k < l->n_files; k++) {
        tp_status s = file_header(t, l, k, prefix);
        if (s) return s;
    }
    return TP_OK;
}

static tp_status pwrite_all(int fd, const void *buf, size_t len, uint64_t off, const char *path)
{
    const char *p = buf;
    while (len) {
        ssize_t w = pwrite(fd, p, len, (off_t)off);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return tp_fail(TP_ERR_IO, "%s: write failed: %s", path, strerror(w < 0 ? errno : ENOSPC));
        p += w; len -= (size_t)w; off += (uint64_t)w;
    }
    return TP_OK;
}

/* The writer's part: every file at its size, with its header. */
static tp_status create_files(const char *dir, const char *prefix, const layout *l)
{
    char path[4096], name[256];
    for (int k = 0; k < l->n_files; k++) {
        tp_save_file_name(name, sizeof name, prefix, k, l->n_files);
        snprintf(path, sizeof path, "%s/%s", dir, name);
        int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
        if (fd < 0) return tp_fail(TP_ERR_IO, "%s: %s", path, strerror(errno));
        int e = l->size[k] ? posix_fallocate(fd, 0, (off_t)l->size[k]) : 0;
        if (e == EOPNOTSUPP || e == EINVAL) e = ftruncate(fd, (off_t)l->size[k]) ? errno : 0;
        tp_status s = e ? tp_fail(TP_ERR_IO, "%s: cannot allocate %llu bytes: %s", path,
                                  (unsigned long long)l->size[k], strerror(e))
                        : pwrite_all(fd, l->header[k], l->hlen[k], 0, path);
        if (!s && fsync(fd) != 0) s = tp_fail(TP_ERR_IO, "%s: fsync: %s", path, strerror(errno));
        close(fd);
        if (s) return s;
    }
    return TP_OK;
}

/* Where one run of this rank's elements goes in the file. */
typedef struct {
    int fd;
    const char *path;
    const char *src;     /* the rank's elements, from element `first` */
    int64_t first;
    uint64_t base;       /* the tensor's data in the file */
    size_t esz;
} run_target;

static tp_status write_run(void *ctx, int64_t local, int64_t global, int64_t count)
{
    const run_target *w = ctx;
    return pwrite_all(w->fd, w->src + (size_t)(local - w->first) * w->esz, (size_t)count * w->esz,
                      w->base + (uint64_t)global * w->esz, w->path);
}

/* This rank's elements of tensor t (its shard, or the part of it that it
 * holds), converted to the stored dtype, at base: one pwrite per run. */
static tp_status write_pieces(int fd, const char *path, const tp_save_tensor *t, uint64_t base)
{
    size_t esz = tp_dtype_size(t->dtype);
    const tp_param_slice *sl = &t->slice;
    int64_t numel = 1, ldim = 0;
    for (int r = 0; sl->dim >= 0 && r < sl->n; r++) ldim += sl->len[r];
    for (int i = 0; i < t->ndim; i++) numel *= i == sl->dim ? ldim : t->shape[i];
    int64_t first = t->part ? t->part_start : 0, n = t->part ? t->part_len : numel;
    const void *src = t->local;
    void *conv = NULL;
    if (t->local_dtype != t->dtype && n > 0) {
        conv = malloc((size_t)n * esz);
        if (!conv) return tp_fail(TP_ERR_NOMEM, "out of memory saving %s", t->name);
        tp_status s = tp_convert(conv, t->dtype, t->local, t->local_dtype, (size_t)n);
        if (s) { free(conv); return s; }
        src = conv;
    }
    run_target w = {fd, path, src, first, base, esz};
    tp_status s = tp_slice_runs(t->ndim, t->shape, &t->slice, first, n, write_run, &w);
    free(conv);
    return s ? tp_fail_context(s, "saving %s", t->name) : TP_OK;
}

static tp_status write_mine(const char *dir, const char *prefix, const tp_save_tensor *t, const layout *l)
{
    char path[4096], name[256];
    tp_status s = TP_OK;
    for (int k = 0; !s && k < l->n_files; k++) {
        int fd = -1;
        tp_save_file_name(name, sizeof name, prefix, k, l->n_files);
        snprintf(path, sizeof path, "%s/%s", dir, name);
        for (size_t j = l->first[k]; !s && j < l->first[k + 1]; j++) {
            const tp_save_tensor *x = &t[l->order[j]];
            if (!x->writes || !tensor_bytes(x) || (x->part && x->part_len <= 0)) continue;
            if (fd < 0 && (fd = open(path, O_WRONLY | O_CLOEXEC)) < 0) {
                s = tp_fail(TP_ERR_IO, "%s: %s", path, strerror(errno));
                break;
            }
            s = write_pieces(fd, path, x, l->offset[l->order[j]]);
        }
        if (fd >= 0) {
            if (!s && fsync(fd) != 0) s = tp_fail(TP_ERR_IO, "%s: fsync: %s", path, strerror(errno));
            close(fd);
        }
    }
    return s;
}

static void json_string(FILE *f, const char *s)
{
    fputc('"', f);
    for (; *s; s++) {
        if (*s == '"' || *s == '\\') fprintf(f, "\\%c", *s);
        else if ((unsigned char)*s < 0x20) fprintf(f, "\\u%04x", (unsigned char)*s);
        else fputc(*s, f);
    }
    fputc('"', f);
}

static int cmp_name_idx(const void *a, const void *b, void *base)
{
    const tp_save_tensor *t = base;
    return strcmp(t[*(const size_t *)a].name, t[*(const size_t *)b].name);
}

/* PREFIX.safetensors.index.json as json.dumps(indent=2, sort_keys=True). */
static tp_status write_index(const char *dir, const char *prefix, const tp_save_tensor *t, size_t n, const layout *l)
{
    char *text = NULL, path[4096], name[256];
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    size_t *idx = malloc((n + 1) * sizeof *idx);
    if (!f || !idx) { if (f) fclose(f); free(text); free(idx); return tp_fail(TP_ERR_NOMEM, "out of memory"); }
    uint64_t total = 0, params = 0;
    for (size_t i = 0; i < n; i++) {
        idx[i] = i;
        total += tensor_bytes(&t[i]);
        params += tensor_bytes(&t[i]) / tp_dtype_size(t[i].dtype);
    }
    qsort_r(idx, n, sizeof *idx, cmp_name_idx, (void *)t);
    fprintf(f, "{\n  \"metadata\": {\n    \"total_parameters\": %llu,\n    \"total_size\": %llu\n  },\n  \"weight_map\": {",
            (unsigned long long)params, (unsigned long long)total);
    for (size_t i = 0; i < n; i++) {
        tp_save_file_name(name, sizeof name, prefix, (int)l->file_of[idx[i]], l->n_files);
        fputs(i ? ",\n    " : "\n    ", f);
        json_string(f, t[idx[i]].name);
        fputs(": ", f);
        json_string(f, name);
    }
    fputs(n ? "\n  }\n}\n" : "}\n}\n", f);
    fclose(f);
    free(idx);
    snprintf(path, sizeof path, "%s/%s.safetensors.index.json", dir, prefix);
    tp_status s = text ? tp_write_file_synced(path, text, len) : tp_fail(TP_ERR_NOMEM, "out of memory");
    free(text);
    return s;
}

tp_status tp_save_tensors(tp_group *g, int writer, const char *dir, const char *prefix, const tp_save_tensor *t,
                          size_t n, uint64_t max_shard_bytes)
{
    int me = g ? tp_group_rank(g) : 0;
    layout l;
    tp_status s = plan_layout(t, n, max_shard_bytes, prefix, &l);
    if (!s && me == writer) s = create_files(dir, prefix, &l);
    if (!s && me == writer && l.n_files > 1) s = write_index(dir, prefix, t, n, &l);
    s = tp_comm_agree(g, s);   /* the files exist at their sizes */
    if (!s) s = write_mine(dir, prefix, t, &l);
    s = tp_comm_agree(g, s);   /* every piece written and synced */
    layout_free(&l);
    return s;
}
