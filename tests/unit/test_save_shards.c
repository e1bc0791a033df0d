/* The collective writer's layout on one process (save_shards.c) and the
 * atomic directories (atomic_dir.c): huggingface_hub's split (a tensor
 * over the limit alone in a file placed before the file being filled),
 * names sorted inside a file, shards written as row-strided pieces landing
 * where the whole tensor would, dp_shard chunks of a column shard written
 * as their runs and read back by range, the index text, and a commit over an
 * existing directory, an abort, and the recovery of an aside copy. */
#include "check.h"
#include "tmpdir.h"

#include "tensorpar/io.h"
#include "tensorpar/module.h"

#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static tp_save_tensor whole(const char *name, int64_t rows, int64_t cols, const float *data)
{
    tp_save_tensor t;
    memset(&t, 0, sizeof t);
    snprintf(t.name, sizeof t.name, "%s", name);
    t.dtype = TP_F32;
    t.ndim = 2;
    t.shape[0] = rows;
    t.shape[1] = cols;
    t.local = data;
    t.local_dtype = TP_F32;
    t.slice.dim = -1;
    t.writes = 1;
    return t;
}

/* dir/name into out[4096] (empty when too long). */
static void join(char *out, const char *dir, const char *name)
{
    if (snprintf(out, 4096, "%s/%s", dir, name) >= 4096) out[0] = 0;
}

static char *slurp(const char *path)
{
    char *d = NULL;
    size_t n = 0;
    if (tp_read_file(path, &d, &n)) return NULL;
    return d;
}

/* Four tensors of 64, 400, 64, 64 bytes under a 150-byte limit: "b" over
 * the limit goes alone into file 1, before "z"+"a" (file 2) and "c"
 * (file 3); inside file 2 "a" comes before "z". */
static void test_split(const char *dir)
{
    float small[16], big[100];
    for (int i = 0; i < 16; i++) small[i] = (float)i;
    for (int i = 0; i < 100; i++) big[i] = (float)(1000 + i);
    tp_save_tensor t[4] = {whole("z", 4, 4, small), whole("b", 10, 10, big), whole("a", 4, 4, small),
                           whole("c", 4, 4, small)};
    CHECK(tp_save_tensors(NULL, 0, dir, "model", t, 4, 150) == TP_OK);
    char path[4096];
    tp_checkpoint *ck = NULL;
    join(path, dir, "model.safetensors.index.json");
    CHECK(tp_checkpoint_open(&ck, path) == TP_OK);
    if (!ck) return;
    const char *want[][2] = {{"b", "model-00001-of-00003.safetensors"}, {"z", "model-00002-of-00003.safetensors"},
                             {"a", "model-00002-of-00003.safetensors"}, {"c", "model-00003-of-00003.safetensors"}};
    for (int i = 0; i < 4; i++) {
        const tp_st_info *in = tp_checkpoint_find(ck, want[i][0]);
        CHECK(in != NULL);
        if (in) CHECK_MSG(strstr(tp_checkpoint_file_path(ck, in->file), want[i][1]) != NULL, "%s in %s", want[i][0],
                          tp_checkpoint_file_path(ck, in->file));
    }
    const tp_st_info *a = tp_checkpoint_find(ck, "a"), *z = tp_checkpoint_find(ck, "z");
    CHECK(a && z && a->data_begin == 0 && z->data_begin == 64);
    float back[100];
    CHECK(tp_checkpoint_read(ck, "b", TP_F32, back) == TP_OK);
    CHECK(back[0] == 1000.0f && back[99] == 1099.0f);
    tp_checkpoint_close(ck);
    char *idx = slurp(path);
    CHECK(idx && !strcmp(idx, "{\n  \"metadata\": {\n    \"total_parameters\": 148,\n    \"total_size\": 592\n  },\n"
                              "  \"weight_map\": {\n    \"a\": \"model-00002-of-00003.safetensors\",\n"
                              "    \"b\": \"model-00001-of-00003.safetensors\",\n"
                              "    \"c\": \"model-00003-of-00003.safetensors\",\n"
                              "    \"z\": \"model-00002-of-00003.safetensors\"\n  }\n}\n"));
    free(idx);
}

/* A [3, 5] tensor written as two column shards (Shard(1): ranges [0,2)
 * and [2,5)) by two calls that each write one shard gives the whole
 * tensor's bytes. */
static void test_pieces(const char *dir)
{
    float full[15], left[6], right[9];
    for (int i = 0; i < 15; i++) full[i] = (float)i;
    for (int r = 0; r < 3; r++) {
        for (int c = 0; c < 2; c++) left[r * 2 + c] = full[r * 5 + c];
        for (int c = 0; c < 3; c++) right[r * 3 + c] = full[r * 5 + 2 + c];
    }
    char a[4096], b[4096];
    join(a, dir, "whole");
    join(b, dir, "pieces");
    mkdir(a, 0777);
    mkdir(b, 0777);
    tp_save_tensor w = whole("w", 3, 5, full);
    CHECK(tp_save_tensors(NULL, 0, a, "model", &w, 1, 0) == TP_OK);
    tp_save_tensor s = whole("w", 3, 5, left);
    s.slice = (tp_param_slice){.dim = 1, .n = 1, .start = {0}, .len = {2}};
    CHECK(tp_save_tensors(NULL, 0, b, "model", &s, 1, 0) == TP_OK);
    s.local = right;
    s.slice.start[0] = 2;
    s.slice.len[0] = 3;
    char pa[4096], pb[4096];
    join(pa, a, "model.safetensors");
    join(pb, b, "model.safetensors");
    float got[15];
    /* The right shard alone into a scratch folder: the same header. */
    char c[4096], pc[4096];
    join(c, dir, "right");
    mkdir(c, 0777);
    CHECK(tp_save_tensors(NULL, 0, c, "model", &s, 1, 0) == TP_OK);
    join(pc, c, "model.safetensors");
    char *x = NULL, *y = NULL, *z = NULL;
    size_t nx = 0, ny = 0, nz = 0;
    CHECK(!tp_read_file(pa, &x, &nx) && !tp_read_file(pb, &y, &ny) && !tp_read_file(pc, &z, &nz));
    if (x && y && z && nx == ny && ny == nz) {
        /* Each file holds its shard where the whole tensor has it and zeros
         * elsewhere; the two files' bytes OR-ed are the whole file's. */
        for (size_t i = 0; i < ny; i++) y[i] = (char)(y[i] | z[i]);
        CHECK(!memcmp(x, y, nx));
        memcpy(got, y + (ny - sizeof got), sizeof got);
        CHECK(!memcmp(got, full, sizeof got));
    } else {
        CHECK_MSG(0, "sizes %zu %zu %zu", nx, ny, nz);
    }
    free(x);
    free(y);
    free(z);
}

/* A [4, 6] tensor as two TP shards along dimension 1 ([0, 3), [3, 6)),
 * each chunked over 3 dp_shard ranks (4 of its 12 elements each, so the
 * chunks cross its rows): the six parts, each written alone, OR-ed, are
 * the whole tensor's file, in f32 and rounded to bf16; and
 * tp_checkpoint_read_range reads each part's runs back from it. */
static void test_parts(const char *dir)
{
    float full[24];
    for (int i = 0; i < 24; i++) full[i] = 1.0f + (float)i / 7.0f;
    const tp_dtype stored[2] = {TP_F32, TP_BF16};
    for (int d = 0; d < 2; d++) {
        char a[4096], pa[4096], sub[64];
        snprintf(sub, sizeof sub, "whole-%d", d);
        join(a, dir, sub);
        mkdir(a, 0777);
        tp_save_tensor w = whole("w", 4, 6, full);
        w.dtype = stored[d];
        CHECK(tp_save_tensors(NULL, 0, a, "model", &w, 1, 0) == TP_OK);
        join(pa, a, "model.safetensors");
        char *x = NULL, *acc = NULL;
        size_t nx = 0, nacc = 0;
        CHECK(!tp_read_file(pa, &x, &nx));
        for (int t = 0; t < 2; t++) {
            float shard[12];
            for (int r = 0; r < 4; r++)
                for (int c = 0; c < 3; c++) shard[r * 3 + c] = full[r * 6 + 3 * t + c];
            for (int k = 0; k < 3; k++) {
                char b[4096], pb[4096];
                snprintf(sub, sizeof sub, "part-%d-%d-%d", d, t, k);
                join(b, dir, sub);
                mkdir(b, 0777);
                tp_save_tensor p = whole("w", 4, 6, shard + 4 * k);
                p.dtype = stored[d];
                p.slice = (tp_param_slice){.dim = 1, .n = 1, .start = {3 * t}, .len = {3}};
                p.part = 1, p.part_start = 4 * k, p.part_len = 4;
                CHECK(tp_save_tensors(NULL, 0, b, "model", &p, 1, 0) == TP_OK);
                join(pb, b, "model.safetensors");
                char *y = NULL;
                size_t ny = 0;
                CHECK(!tp_read_file(pb, &y, &ny));
                if (!acc && y) { acc = y, nacc = ny; continue; }
                CHECK(y && ny == nacc);
                for (size_t i = 0; y && i < ny && i < nacc; i++) acc[i] = (char)(acc[i] | y[i]);
                free(y);
            }
        }
        CHECK_MSG(x && acc && nx == nacc && !memcmp(x, acc, nx), "dtype %s: the parts are not the whole",
                  tp_dtype_name(stored[d]));
        free(x);
        free(acc);
    }
    /* Reading back: chunk 1 of shard 1 is elements [4, 8) of it, i.e.
     * row 1 columns 4, 5 and row 2 columns 3, 4 of the tensor. */
    char pa[4096], a[4096];
    join(a, dir, "whole-0");
    join(pa, a, "model.safetensors");
    tp_checkpoint *ck = NULL;
    CHECK(tp_checkpoint_open(&ck, pa) == TP_OK);
    if (!ck) return;
    float got[3] = {0};
    CHECK(tp_checkpoint_read_range(ck, "w", 10, 2, TP_F32, got) == TP_OK && got[0] == full[10] && got[1] == full[11]);
    CHECK(tp_checkpoint_read_range(ck, "w", 15, 2, TP_F32, got) == TP_OK && got[0] == full[15] && got[1] == full[16]);
    uint64_t before = tp_checkpoint_bytes_read(ck);
    CHECK(tp_checkpoint_read_range(ck, "w", 23, 1, TP_F32, got) == TP_OK && got[0] == full[23]);
    CHECK(tp_checkpoint_bytes_read(ck) - before == sizeof(float));
    CHECK(tp_checkpoint_read_range(ck, "w", 23, 2, TP_F32, got) == TP_ERR_INVALID);
    CHECK(tp_checkpoint_read_range(ck, "w", -1, 1, TP_F32, got) == TP_ERR_INVALID);
    CHECK(tp_checkpoint_read_range(ck, "x", 0, 1, TP_F32, got) == TP_ERR_INVALID);
    tp_checkpoint_close(ck);
}

static int is_dir(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

static void test_atomic(const char *dir)
{
    char target[4096], tmp[4096], file[4096], aside[4096];
    join(target, dir, "ck/checkpoint-1");
    /* First save: creates the parent and the directory. */
    CHECK(tp_atomic_dir_begin(target, tmp, sizeof tmp) == TP_OK);
    CHECK(strstr(tmp, "/.checkpoint-1.tmp-") != NULL && is_dir(tmp));
    join(file, tmp, "f");
    CHECK(tp_write_file_synced(file, "old", 3) == TP_OK);
    CHECK(tp_atomic_dir_commit(tmp, target) == TP_OK);
    CHECK(!is_dir(tmp) && is_dir(target));
    /* A failed save leaves the target as it was. */
    CHECK(tp_atomic_dir_begin(target, tmp, sizeof tmp) == TP_OK);
    tp_atomic_dir_abort(tmp);
    CHECK(!is_dir(tmp));
    /* Replacing: exchanged, the old copy removed. */
    CHECK(tp_atomic_dir_begin(target, tmp, sizeof tmp) == TP_OK);
    join(file, tmp, "f");
    CHECK(tp_write_file_synced(file, "new", 3) == TP_OK);
    CHECK(tp_atomic_dir_commit(tmp, target) == TP_OK);
    join(file, target, "f");
    char *d = slurp(file);
    CHECK(d && !memcmp(d, "new", 3));
    free(d);
    CHECK(!is_dir(tmp));
    /* A crash between the two renames of the fallback: the target is
     * missing and its aside copy comes back; a stale temporary goes. */
    join(aside, dir, "ck/.checkpoint-1.old-123");
    CHECK(rename(target, aside) == 0);
    join(tmp, dir, "ck/.checkpoint-1.tmp-456");
    CHECK(mkdir(tmp, 0777) == 0);
    char parent[4096];
    join(parent, dir, "ck");
    CHECK(tp_atomic_dir_recover_all(parent) == TP_OK);
    CHECK(is_dir(target) && !is_dir(aside) && !is_dir(tmp));
}

int main(void)
{
    char dir[] = "/tmp/tp_save_shards_XXXXXX";
    if (!mkdtemp(dir)) return 1;
    char a[4096], b[4096];
    join(a, dir, "split");
    join(b, dir, "pieces");
    mkdir(a, 0777);
    mkdir(b, 0777);
    test_split(a);
    test_pieces(b);
    join(a, dir, "parts");
    mkdir(a, 0777);
    test_parts(a);
    test_atomic(dir);
    remove_tree(dir);
    return check_summary();
}
