/* safetensors: write/read roundtrips, slices, sharded checkpoints, and one
 * hand-crafted malformed file per validation rule. */
#include "tensorpar/io.h"
#include "check.h"
#include "tmpdir.h"

#include <dirent.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char tmpdir[64];

static void path_in(char *buf, size_t cap, const char *name)
{
    snprintf(buf, cap, "%s/%s", tmpdir, name);
}

/* Writes an 8-byte length (header_len, or strlen(json) when 0), the JSON and
 * `data_len` bytes 0, 1, 2, ... */
static void write_raw_n(const char *path, uint64_t header_len, const char *json, size_t data_len)
{
    FILE *f = fopen(path, "wb");
    if (!f) { perror(path); exit(2); }
    uint64_t n = header_len ? header_len : strlen(json);
    for (int i = 0; i < 8; i++) fputc((int)((n >> (8 * i)) & 0xff), f);
    fputs(json, f);
    for (size_t i = 0; i < data_len; i++) fputc((int)(i & 0xff), f);
    fclose(f);
}

static void write_raw(const char *path, const char *json, size_t data_len)
{
    write_raw_n(path, 0, json, data_len);
}

static void write_text(const char *path, const char *text)
{
    FILE *f = fopen(path, "wb");
    if (!f) { perror(path); exit(2); }
    fputs(text, f);
    fclose(f);
}

/* Opening `path` must fail with a message naming `file` and containing each
 * of the (up to two) needles. */
static void expect_open_fails(const char *path, const char *file, const char *n1, const char *n2, int line)
{
    tp_checkpoint *ck = NULL;
    tp_status s = tp_checkpoint_open(&ck, path);
    const char *m = tp_error();
    if (getenv("TP_TEST_VERBOSE")) fprintf(stderr, "  %s\n", m);   /* to eyeball the messages */
    CHECK_MSG(s != TP_OK && ck == NULL, "line %d: open of %s succeeded", line, path);
    CHECK_MSG(strstr(m, file) != NULL, "line %d: message does not name %s: %s", line, file, m);
    CHECK_MSG(!n1 || strstr(m, n1), "line %d: message lacks \"%s\": %s", line, n1, m);
    CHECK_MSG(!n2 || strstr(m, n2), "line %d: message lacks \"%s\": %s", line, n2, m);
    tp_checkpoint_close(ck);
}
#define OPEN_FAILS(path, file, n1, n2) expect_open_fails(path, file, n1, n2, __LINE__)

/* ---- roundtrip ----------------------------------------------------------- */

static void test_roundtrip_all_dtypes(void)
{
    char path[256];
    path_in(path, sizeof path, "all.safetensors");
    static const int64_t shape[2] = {2, 3};
    float f32[6] = {1.5f, -2.25f, 0.0f, 3.0f, -0.5f, 1024.0f};
    double f64[6] = {1.5, -2.25, 0.0, 3.0, -0.5, 1e300};
    uint16_t bf16[6], f16[6];
    for (int i = 0; i < 6; i++) { bf16[i] = tp_bf16_from_f32(f32[i]); f16[i] = tp_f16_from_f32(f32[i]); }
    int64_t i64[6] = {1, -2, 3, INT64_MAX, INT64_MIN, 0};
    int32_t i32[6] = {1, -2, 3, 40000, -7, 0};
    int16_t i16[6] = {1, -2, 3, 4000, -7, 0};
    int8_t i8[6] = {1, -2, 3, 127, -128, 0};
    uint8_t u8[6] = {1, 2, 3, 255, 128, 0};
    uint8_t bl[6] = {1, 0, 1, 1, 0, 0};
    const tp_st_entry e[] = {
        {"t.f32", TP_F32, 2, shape, f32},   {"t.f64", TP_F64, 2, shape, f64},
        {"t.bf16", TP_BF16, 2, shape, bf16}, {"t.f16", TP_F16, 2, shape, f16},
        {"t.i64", TP_I64, 2, shape, i64},   {"t.i32", TP_I32, 2, shape, i32},
        {"t.i16", TP_I16, 2, shape, i16},   {"t.i8", TP_I8, 2, shape, i8},
        {"t.u8", TP_U8, 2, shape, u8},      {"t.bool", TP_BOOL, 2, shape, bl},
        {"scalar", TP_F32, 0, NULL, f32},   {"empty", TP_F32, 2, (const int64_t[]){0, 3}, NULL},
    };
    size_t n = sizeof e / sizeof e[0];
    const char *kv[] = {"origin", "tensorpar"};
    CHECK(tp_safetensors_write(path, e, n, kv, 1) == TP_OK);

    /* Header: length a multiple of 8, metadata first, keys in given order. */
    FILE *f = fopen(path, "rb");
    unsigned char raw[8];
    CHECK(f && fread(raw, 1, 8, f) == 8);
    uint64_t hl = 0;
    for (int i = 7; i >= 0; i--) hl = (hl << 8) | raw[i];
    CHECK(hl % 8 == 0);
    char *hdr = calloc(1, hl + 1);
    CHECK(fread(hdr, 1, hl, f) == hl);
    fclose(f);
    CHECK(!strncmp(hdr, "{\"__metadata__\":{\"format\":\"pt\",\"origin\":\"tensorpar\"}", 52));
    CHECK(strstr(hdr, "\"t.f32\"") < strstr(hdr, "\"t.f64\"") && strstr(hdr, "\"t.u8\"") < strstr(hdr, "\"t.bool\""));
    free(hdr);

    tp_checkpoint *ck = NULL;
    CHECK(tp_checkpoint_open(&ck, path) == TP_OK);
    if (!ck) { fprintf(stderr, "%s\n", tp_error()); return; }
    CHECK(tp_checkpoint_count(ck) == n);
    CHECK(!strcmp(tp_checkpoint_metadata(ck, "format"), "pt"));
    CHECK(!strcmp(tp_checkpoint_metadata(ck, "origin"), "tensorpar"));
    CHECK(tp_checkpoint_metadata(ck, "nope") == NULL);
    CHECK(!strcmp(tp_checkpoint_file_path(ck, 0), path));
    CHECK(tp_checkpoint_file_path(ck, 1) == NULL);
    for (size_t i = 0; i < n; i++) {
        const tp_st_info *t = tp_checkpoint_find(ck, e[i].name);
        CHECK_MSG(t && t->dtype == e[i].dtype && t->ndim == e[i].ndim, "%s", e[i].name);
        if (!t) continue;
        CHECK(tp_checkpoint_expect(ck, e[i].name, e[i].ndim, e[i].shape) == TP_OK);
        int64_t numel = 1;
        for (int d = 0; d < t->ndim; d++) numel *= t->shape[d];
        size_t bytes = (size_t)numel * tp_dtype_size(t->dtype);
        unsigned char out[64] = {0};
        CHECK(tp_checkpoint_read(ck, e[i].name, e[i].dtype, out) == TP_OK);
        CHECK_MSG(bytes == 0 || !memcmp(out, e[i].data, bytes), "%s roundtrip", e[i].name);
    }
    CHECK(tp_checkpoint_find(ck, "absent") == NULL);
    int seen = 0;
    for (size_t i = 0; i < n; i++) seen += tp_checkpoint_at(ck, i) != NULL;
    CHECK(seen == (int)n && tp_checkpoint_at(ck, n) == NULL);

    /* Conversions. */
    float got[6];
    CHECK(tp_checkpoint_read(ck, "t.bf16", TP_F32, got) == TP_OK);
    CHECK(!memcmp(got, f32, sizeof got));
    CHECK(tp_checkpoint_read(ck, "t.f16", TP_F32, got) == TP_OK);
    CHECK(!memcmp(got, f32, sizeof got));
    CHECK(tp_checkpoint_read(ck, "t.i32", TP_F32, got) == TP_OK);
    CHECK(got[3] == 40000.0f && got[1] == -2.0f);
    uint16_t h[6];
    CHECK(tp_checkpoint_read(ck, "t.f32", TP_BF16, h) == TP_OK);
    CHECK(!memcmp(h, bf16, sizeof h));
    CHECK(tp_checkpoint_read(ck, "t.f32", TP_F16, h) == TP_OK);
    CHECK(!memcmp(h, f16, sizeof h));
    int64_t gi[6];
    CHECK(tp_checkpoint_read(ck, "t.i8", TP_I64, gi) == TP_OK);
    CHECK(gi[3] == 127 && gi[4] == -128);
    CHECK(tp_checkpoint_read(ck, "t.bf16", TP_I32, gi) == TP_ERR_UNSUPPORTED);
    CHECK(strstr(tp_error(), path) && strstr(tp_error(), "'t.bf16'"));

    /* expect and lookups that fail. */
    int64_t wrong[2] = {3, 2};
    CHECK(tp_checkpoint_expect(ck, "t.f32", 2, wrong) != TP_OK);
    CHECK_MSG(strstr(tp_error(), path) && strstr(tp_error(), "'t.f32' has shape [2, 3] but the model expects [3, 2]"),
              "%s", tp_error());
    CHECK(tp_checkpoint_expect(ck, "t.f32", 1, wrong) != TP_OK);
    CHECK(tp_checkpoint_expect(ck, "x", 2, shape) != TP_OK);
    CHECK(strstr(tp_error(), "tensor 'x' not found in") && strstr(tp_error(), path));
    CHECK(tp_checkpoint_read(ck, "x", TP_F32, got) != TP_OK);
    CHECK(strstr(tp_error(), "'x'") && strstr(tp_error(), path));
    tp_checkpoint_close(ck);

    /* Opening the folder finds model.safetensors. */
    char mpath[256];
    path_in(mpath, sizeof mpath, "model.safetensors");
    CHECK(rename(path, mpath) == 0);
    CHECK(tp_checkpoint_open(&ck, tmpdir) == TP_OK);
    CHECK(ck && tp_checkpoint_count(ck) == n);
    tp_checkpoint_close(ck);
    unlink(mpath);
}

static void test_writer_rejects(void)
{
    char path[256];
    path_in(path, sizeof path, "bad_write.safetensors");
    int64_t shape[1] = {2};
    float d[2] = {1, 2};
    tp_st_entry dup[2] = {{"a", TP_F32, 1, shape, d}, {"a", TP_F32, 1, shape, d}};
    CHECK(tp_safetensors_write(path, dup, 2, NULL, 0) == TP_ERR_INVALID);
    CHECK(strstr(tp_error(), "'a'") && strstr(tp_error(), path));
    tp_st_entry bad_dtype = {"b", (tp_dtype)99, 1, shape, d};
    CHECK(tp_safetensors_write(path, &bad_dtype, 1, NULL, 0) == TP_ERR_INVALID);
    CHECK(strstr(tp_error(), "'b'"));
    CHECK(access(path, F_OK) != 0);
    DIR *dir = opendir(tmpdir);   /* nothing half-written left behind */
    struct dirent *e;
    int tmp_files = 0;
    while (dir && (e = readdir(dir))) tmp_files += strstr(e->d_name, ".tmp") != NULL;
    if (dir) closedir(dir);
    CHECK(tmp_files == 0);
    char nodir[300];
    snprintf(nodir, sizeof nodir, "%s/missing/x.safetensors", tmpdir);
    tp_st_entry ok = {"a", TP_F32, 1, shape, d};
    CHECK(tp_safetensors_write(nodir, &ok, 1, NULL, 0) == TP_ERR_IO);
}

/* ---- slices --------------------------------------------------------------- */

static void test_read_slice(void)
{
    char path[256];
    path_in(path, sizeof path, "slice.safetensors");
    const int64_t S[3] = {3, 4, 5};
    float v[60];
    uint16_t vb[60];
    for (int i = 0; i < 60; i++) { v[i] = (float)i; vb[i] = tp_bf16_from_f32((float)i); }
    const tp_st_entry e[2] = {{"w", TP_F32, 3, S, v}, {"wb", TP_BF16, 3, S, vb}};
    CHECK(tp_safetensors_write(path, e, 2, NULL, 0) == TP_OK);
    tp_checkpoint *ck = NULL;
    CHECK(tp_checkpoint_open(&ck, path) == TP_OK);
    if (!ck) { fprintf(stderr, "%s\n", tp_error()); return; }

    /* Every (dim, start, len), len 0 and the short tail chunk included. */
    int bad = 0, bad_bytes = 0, bad_bf16 = 0;
    for (int d = 0; d < 3; d++)
        for (int64_t start = 0; start <= S[d]; start++)
            for (int64_t len = 0; start + len <= S[d]; len++) {
                float out[60], outb[60], want[60];
                int k = 0;
                for (int64_t a = 0; a < S[0]; a++)
                    for (int64_t b = 0; b < S[1]; b++)
                        for (int64_t c = 0; c < S[2]; c++) {
                            int64_t idx[3] = {a, b, c};
                            if (idx[d] >= start && idx[d] < start + len) want[k++] = v[(a * 4 + b) * 5 + c];
                        }
                uint64_t before = tp_checkpoint_bytes_read(ck);
                if (tp_checkpoint_read_slice(ck, "w", d, start, len, TP_F32, out) != TP_OK
                    || memcmp(out, want, (size_t)k * sizeof(float)))
                    bad++;
                if (tp_checkpoint_bytes_read(ck) - before != (uint64_t)k * 4) bad_bytes++;
                before = tp_checkpoint_bytes_read(ck);
                if (tp_checkpoint_read_slice(ck, "wb", d, start, len, TP_F32, outb) != TP_OK
                    || memcmp(outb, want, (size_t)k * sizeof(float)))
                    bad_bf16++;
                if (tp_checkpoint_bytes_read(ck) - before != (uint64_t)k * 2) bad_bytes++;
            }
    CHECK(bad == 0);
    CHECK(bad_bf16 == 0);
    CHECK(bad_bytes == 0);

    uint64_t before = tp_checkpoint_bytes_read(ck);
    float all[60];
    CHECK(tp_checkpoint_read(ck, "w", TP_F32, all) == TP_OK && !memcmp(all, v, sizeof v));
    CHECK(tp_checkpoint_bytes_read(ck) - before == sizeof v);

    /* Bounds. */
    float out[60];
    before = tp_checkpoint_bytes_read(ck);
    CHECK(tp_checkpoint_read_slice(ck, "w", 3, 0, 1, TP_F32, out) == TP_ERR_INVALID);
    CHECK(strstr(tp_error(), "'w'") && strstr(tp_error(), path));
    CHECK(tp_checkpoint_read_slice(ck, "w", -1, 0, 1, TP_F32, out) == TP_ERR_INVALID);
    CHECK(tp_checkpoint_read_slice(ck, "w", 1, 3, 2, TP_F32, out) == TP_ERR_INVALID);
    CHECK(tp_checkpoint_read_slice(ck, "w", 1, -1, 1, TP_F32, out) == TP_ERR_INVALID);
    CHECK(tp_checkpoint_read_slice(ck, "w", 1, 0, -1, TP_F32, out) == TP_ERR_INVALID);
    CHECK(tp_checkpoint_read_slice(ck, "w", 2, INT64_MAX, 2, TP_F32, out) == TP_ERR_INVALID);
    CHECK(tp_checkpoint_read_slice(ck, "w", 2, 1, INT64_MAX, TP_F32, out) == TP_ERR_INVALID);
    CHECK(tp_checkpoint_read_slice(ck, "nope", 0, 0, 1, TP_F32, out) != TP_OK);
    CHECK(tp_checkpoint_bytes_read(ck) == before);
    tp_checkpoint_close(ck);
}

/* A header whose length is not a multiple of 8 leaves the data misaligned;
 * conversion must still work (and stay clean under UBSan). */
static void test_misaligned_data(void)
{
    char path[256];
    path_in(path, sizeof path, "misaligned.safetensors");
    const char *json = "{\"x\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,12]}}";
    CHECK(strlen(json) % 4 != 0);
    FILE *f = fopen(path, "wb");
    uint64_t n = strlen(json);
    for (int i = 0; i < 8; i++) fputc((int)((n >> (8 * i)) & 0xff), f);
    fputs(json, f);
    float vals[3] = {1.0f, -3.5f, 7.25f};
    fwrite(vals, sizeof vals, 1, f);
    fclose(f);
    tp_checkpoint *ck = NULL;
    CHECK(tp_checkpoint_open(&ck, path) == TP_OK);
    if (!ck) { fprintf(stderr, "%s\n", tp_error()); return; }
    double d[3];
    CHECK(tp_checkpoint_read(ck, "x", TP_F64, d) == TP_OK);
    CHECK(d[0] == 1.0 && d[1] == -3.5 && d[2] == 7.25);
    float g[3];
    CHECK(tp_checkpoint_read(ck, "x", TP_F32, g) == TP_OK && !memcmp(g, vals, sizeof g));
    tp_checkpoint_close(ck);
}

/* ---- sharded checkpoints ---------------------------------------------------- */

static void write_shards(const char *dir)
{
    char p1[300], p2[300];
    snprintf(p1, sizeof p1, "%s/model-00001-of-00002.safetensors", dir);
    snprintf(p2, sizeof p2, "%s/model-00002-of-00002.safetensors", dir);
    int64_t s2[2] = {2, 2}, s1[1] = {3};
    float a[4] = {1, 2, 3, 4}, b[3] = {5, 6, 7}, c[4] = {8, 9, 10, 11};
    tp_st_entry e1[2] = {{"a", TP_F32, 2, s2, a}, {"b", TP_F32, 1, s1, b}};
    tp_st_entry e2[1] = {{"c", TP_F32, 2, s2, c}};
    CHECK(tp_safetensors_write(p1, e1, 2, NULL, 0) == TP_OK);
    CHECK(tp_safetensors_write(p2, e2, 1, NULL, 0) == TP_OK);
}

static const char *good_index =
    "{\"metadata\": {\"total_size\": 44}, \"weight_map\": {"
    "\"a\": \"model-00001-of-00002.safetensors\", \"b\": \"model-00001-of-00002.safetensors\","
    "\"c\": \"model-00002-of-00002.safetensors\"}}";

static void test_sharded(void)
{
    char dir[256], index[300];
    path_in(dir, sizeof dir, "sharded");
    CHECK(mkdir(dir, 0700) == 0);
    write_shards(dir);
    snprintf(index, sizeof index, "%s/model.safetensors.index.json", dir);
    write_text(index, good_index);

    tp_checkpoint *ck = NULL;
    CHECK(tp_checkpoint_open(&ck, dir) == TP_OK);
    if (!ck) { fprintf(stderr, "%s\n", tp_error()); return; }
    CHECK(tp_checkpoint_count(ck) == 3);
    const tp_st_info *a = tp_checkpoint_find(ck, "a"), *c = tp_checkpoint_find(ck, "c");
    CHECK(a && c && a->file != c->file);
    CHECK(c && strstr(tp_checkpoint_file_path(ck, c->file), "model-00002-of-00002.safetensors"));
    float out[4];
    CHECK(tp_checkpoint_read(ck, "c", TP_F32, out) == TP_OK && out[0] == 8 && out[3] == 11);
    CHECK(tp_checkpoint_read_slice(ck, "a", 1, 1, 1, TP_F32, out) == TP_OK && out[0] == 2 && out[1] == 4);
    CHECK(tp_checkpoint_read(ck, "b", TP_F32, out) == TP_OK && out[2] == 7);
    CHECK(tp_checkpoint_bytes_read(ck) == 16 + 8 + 12);
    CHECK(!strcmp(tp_checkpoint_metadata(ck, "format"), "pt"));
    tp_checkpoint_close(ck);

    /* The index file itself is accepted too. */
    CHECK(tp_checkpoint_open(&ck, index) == TP_OK);
    CHECK(ck && tp_checkpoint_count(ck) == 3);
    tp_checkpoint_close(ck);

    /* Index naming a file that does not exist. */
    write_text(index, "{\"weight_map\": {\"a\": \"model-00001-of-00002.safetensors\","
                      "\"b\": \"model-00001-of-00002.safetensors\", \"z\": \"model-00009.safetensors\"}}");
    OPEN_FAILS(dir, "model-00009.safetensors", "No such file", index);

    /* Index listing a tensor its shard does not hold. */
    write_text(index, "{\"weight_map\": {\"a\": \"model-00001-of-00002.safetensors\","
                      "\"b\": \"model-00001-of-00002.safetensors\", \"c\": \"model-00002-of-00002.safetensors\","
                      "\"ghost\": \"model-00002-of-00002.safetensors\"}}");
    OPEN_FAILS(dir, "model-00002-of-00002.safetensors", "'ghost'", index);

    /* Index placing a tensor in the wrong shard. */
    write_text(index, "{\"weight_map\": {\"a\": \"model-00002-of-00002.safetensors\","
                      "\"b\": \"model-00001-of-00002.safetensors\", \"c\": \"model-00002-of-00002.safetensors\"}}");
    OPEN_FAILS(dir, "model-00001-of-00002.safetensors", "'a'", index);

    /* A shard tensor the index does not list. */
    write_text(index, "{\"weight_map\": {\"a\": \"model-00001-of-00002.safetensors\","
                      "\"c\": \"model-00002-of-00002.safetensors\"}}");
    OPEN_FAILS(dir, "model-00001-of-00002.safetensors", "'b'", "not listed");

    /* The same tensor in two shards. */
    char p2[300];
    snprintf(p2, sizeof p2, "%s/model-00002-of-00002.safetensors", dir);
    int64_t s1[1] = {3};
    float b[3] = {0};
    tp_st_entry e2[2] = {{"c", TP_F32, 1, s1, b}, {"b", TP_F32, 1, s1, b}};
    CHECK(tp_safetensors_write(p2, e2, 2, NULL, 0) == TP_OK);
    write_text(index, good_index);
    OPEN_FAILS(dir, "model-00002-of-00002.safetensors", "'b'", "model-00001-of-00002.safetensors");

    /* Shard names must stay inside the folder. */
    write_text(index, "{\"weight_map\": {\"a\": \"../model-00001-of-00002.safetensors\"}}");
    OPEN_FAILS(dir, index, "'a'", NULL);
    write_text(index, "{\"weight_map\": [1]}");
    OPEN_FAILS(dir, index, "weight_map", NULL);

    /* Neither a model.safetensors nor an index. */
    unlink(index);
    OPEN_FAILS(dir, dir, "model.safetensors.index.json", NULL);
}

/* ---- malformed single files -------------------------------------------------- */

#define T_F32_4(begin, end) "{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[" #begin "," #end "]}"

static void test_malformed(void)
{
    char p[256];

    /* Truncated: a good file with its data cut short. */
    path_in(p, sizeof p, "truncated.safetensors");
    int64_t shape[1] = {4};
    float d[4] = {1, 2, 3, 4};
    tp_st_entry e = {"model.norm.weight", TP_F32, 1, shape, d};
    CHECK(tp_safetensors_write(p, &e, 1, NULL, 0) == TP_OK);
    FILE *f = fopen(p, "rb");
    fseek(f, 0, SEEK_END);
    long sz = ftell(f);
    fclose(f);
    CHECK(truncate(p, sz - 4) == 0);
    OPEN_FAILS(p, p, "'model.norm.weight'", "past the end");

    path_in(p, sizeof p, "short.safetensors");
    write_text(p, "\x10\0\0");
    OPEN_FAILS(p, p, "too short", NULL);

    path_in(p, sizeof p, "empty.safetensors");
    write_text(p, "");
    OPEN_FAILS(p, p, "too short", NULL);

    path_in(p, sizeof p, "huge_n.safetensors");
    write_raw_n(p, UINT64_MAX - 3, "{}", 0);
    OPEN_FAILS(p, p, "header length", NULL);

    path_in(p, sizeof p, "long_n.safetensors");
    write_raw_n(p, 4096, "{}", 0);
    OPEN_FAILS(p, p, "header length 4096", "past the end");

    /* Hand-made headers (and that many bytes of data): the file name,
     * the header, the data's size, what the message must name. */
    static const struct { const char *file, *header; size_t data; const char *needle, *needle2; } bad[] = {
        {"not_json.safetensors", "{\"a\": {\"dtype\": \"F32\", ", 0, "not valid JSON", NULL},
        {"trailing.safetensors", "{} x", 0, "trailing", NULL},
        {"array.safetensors", "[1, 2]", 0, "not an object", NULL},
        {"dtype.safetensors", "{\"w\":{\"dtype\":\"Q4\",\"shape\":[4],\"data_offsets\":[0,4]}}", 4,
         "'w'", "unknown dtype \"Q4\""},
        {"count.safetensors", "{\"model.norm.weight\":" T_F32_4(0, 12) "}", 12,
         "tensor 'model.norm.weight': data_offsets [0, 12] hold 12 bytes but F32 [4] needs 16", NULL},
        {"overflow.safetensors",
         "{\"w\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,16],\"data_offsets\":[0,0]}}", 0,
         "'w'", "overflow"},
        {"past_end.safetensors", "{\"w\":" T_F32_4(16, 32) "}", 20, "'w'", "past the end"},
        {"begin_end.safetensors", "{\"w\":" T_F32_4(16, 0) "}", 20, "'w'", "[16, 0]"},
        {"overlap.safetensors", "{\"a\":" T_F32_4(0, 16) ",\"b\":" T_F32_4(8, 24) "}", 24,
         "'b'", "overlaps tensor 'a'"},
        {"dup.safetensors", "{\"a\":" T_F32_4(0, 16) ",\"a\":" T_F32_4(16, 32) "}", 32, "'a'", "twice"},
        {"neg_shape.safetensors", "{\"w\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", 4,
         "'w'", "shape entry 0"},
        {"frac_shape.safetensors", "{\"w\":{\"dtype\":\"F32\",\"shape\":[1,1.5],\"data_offsets\":[0,4]}}", 4,
         "'w'", "shape entry 1"},
        {"str_shape.safetensors", "{\"w\":{\"dtype\":\"F32\",\"shape\":[\"1\"],\"data_offsets\":[0,4]}}", 4,
         "'w'", "shape entry 0"},
        {"rank.safetensors", "{\"w\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,4]}}", 4,
         "'w'", "dimensions"},
        {"no_shape.safetensors", "{\"w\":{\"dtype\":\"F32\",\"data_offsets\":[0,4]}}", 4, "'w'", "shape"},
        {"offsets.safetensors", "{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0]}}", 4,
         "'w'", "data_offsets"},
        {"field.safetensors", "{\"w\":" T_F32_4(0, 16) ",\"version\":3}", 16, "'version'", "nor a tensor object"},
        {"meta.safetensors", "{\"__metadata__\":{\"format\":1},\"w\":" T_F32_4(0, 16) "}", 16,
         "'format'", "not a string"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        path_in(p, sizeof p, bad[i].file);
        write_raw(p, bad[i].header, bad[i].data);
        OPEN_FAILS(p, p, bad[i].needle, bad[i].needle2);
    }

    path_in(p, sizeof p, "no_such.safetensors");
    OPEN_FAILS(p, p, "No such file", NULL);

    /* Sanity: the hand-crafting itself yields a valid file when it should,
     * and empty tensors at any offset overlap nothing. */
    path_in(p, sizeof p, "handmade_ok.safetensors");
    write_raw(p, "{\"a\":" T_F32_4(0, 16) ",\"z\":{\"dtype\":\"BF16\",\"shape\":[0,7],\"data_offsets\":[8,8]},"
                 "\"b\":" T_F32_4(16, 32) "}", 32);
    tp_checkpoint *ck = NULL;
    CHECK_MSG(tp_checkpoint_open(&ck, p) == TP_OK, "%s", tp_error());
    CHECK(ck && tp_checkpoint_count(ck) == 3);
    float out[4];
    CHECK(ck && tp_checkpoint_read_slice(ck, "z", 1, 2, 3, TP_F32, out) == TP_OK);
    tp_checkpoint_close(ck);
}

/* Inputs the fuzzer (tests/fuzz/fuzz_safetensors) found mishandled. */
static void test_fuzz_regressions(void)
{
    char p[256];
    tp_checkpoint *ck = NULL;

    /* A header with no tensor at all is a valid, empty checkpoint. */
    path_in(p, sizeof p, "no_tensors.safetensors");
    write_raw(p, "{}      ", 0);
    CHECK_MSG(tp_checkpoint_open(&ck, p) == TP_OK, "%s", tp_error());
    CHECK(ck && tp_checkpoint_count(ck) == 0 && !tp_checkpoint_find(ck, "w"));
    tp_checkpoint_close(ck);
}

int main(void)
{
    snprintf(tmpdir, sizeof tmpdir, "/tmp/tp_st_XXXXXX");
    if (!mkdtemp(tmpdir)) { perror("mkdtemp"); return 2; }
    test_roundtrip_all_dtypes();
    test_writer_rejects();
    test_read_slice();
    test_misaligned_data();
    test_sharded();
    test_malformed();
    test_fuzz_regressions();
    remove_tree(tmpdir);
    return check_summary();
}
