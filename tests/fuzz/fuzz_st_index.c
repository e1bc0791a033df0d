/* libFuzzer harness: model.safetensors.index.json.  Two small valid shards
 * are written once into the scratch folder; each input is the index that
 * lists them, opened through the folder as a sharded model is.  Whatever
 * opens must agree with its index: every tensor found by name, in a shard. */
#include "fuzz_util.h"
#include "tensorpar/io.h"

#include <stdlib.h>
#include <string.h>

static void write_shard(const char *name, const char *t0, const char *t1)
{
    const int64_t s0[2] = {2, 3}, s1[1] = {4};
    const float a[6] = {1, 2, 3, 4, 5, 6};
    const int32_t b[4] = {7, 8, 9, 10};
    const tp_st_entry e[2] = {
        {t0, TP_F32, 2, s0, a},
        {t1, TP_I32, 1, s1, b},
    };
    char *path = fuzz_write(name, (const uint8_t *)"", 0);
    if (tp_safetensors_write(path, e, 2, NULL, 0) != TP_OK) abort();
    free(path);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    write_shard("model-00001-of-00002.safetensors", "model.embed_tokens.weight", "model.layers.0.a");
    write_shard("model-00002-of-00002.safetensors", "lm_head.weight", "model.layers.1.b");
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *path = fuzz_write("model.safetensors.index.json", data, size);
    tp_checkpoint *ck = NULL;
    if (tp_checkpoint_open(&ck, fuzz_scratch_dir()) == TP_OK) {
        for (size_t i = 0; i < tp_checkpoint_count(ck); i++) {
            const tp_st_info *t = tp_checkpoint_at(ck, i);
            if (tp_checkpoint_find(ck, t->name) != t || !tp_checkpoint_file_path(ck, t->file)) abort();
            float buf[8];
            if (tp_checkpoint_read(ck, t->name, TP_F32, buf) != TP_OK) abort();   /* valid shards read */
        }
        tp_checkpoint_metadata(ck, "format");
        tp_checkpoint_close(ck);
    }
    free(path);
    return 0;
}
