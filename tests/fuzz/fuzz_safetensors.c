/* libFuzzer harness: a whole .safetensors file (8-byte length, JSON header,
 * data area).  The input is written to a scratch file and opened as users'
 * checkpoints are; whatever opens is then read back whole and in slices
 * along every dimension, converted to a dtype chosen by the input, so the
 * table the header built is checked against the data it describes. */
#include "fuzz_util.h"
#include "tensorpar/io.h"

#include <stdlib.h>
#include <string.h>

/* Reads of more than this are skipped: the checks are the same for big
 * tensors and the fuzzer should spend its time on headers. */
#define MAX_READ_ELEMS (1u << 16)

static void read_back(tp_checkpoint *ck, const tp_st_info *t, tp_dtype want)
{
    uint64_t numel = (t->data_end - t->data_begin) / tp_dtype_size(t->dtype);
    if (numel > MAX_READ_ELEMS) return;
    void *buf = malloc((size_t)(numel ? numel : 1) * 8);
    if (!buf) abort();
    tp_checkpoint_read(ck, t->name, want, buf);
    for (int d = 0; d < t->ndim; d++) {
        int64_t size = t->shape[d];
        tp_checkpoint_read_slice(ck, t->name, d, size / 3, size - size / 3 - size / 4, want, buf);
        tp_checkpoint_read_slice(ck, t->name, d, size, 1, want, buf);   /* out of range: refused */
    }
    tp_checkpoint_read_slice(ck, t->name, t->ndim, 0, 1, want, buf);  /* no such dimension */
    tp_checkpoint_expect(ck, t->name, t->ndim, t->shape);
    free(buf);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *path = fuzz_write("model.safetensors", data, size);
    tp_checkpoint *ck = NULL;
    if (tp_checkpoint_open(&ck, path) == TP_OK) {
        tp_dtype want = (tp_dtype)(size % TP_DTYPE_COUNT);
        for (size_t i = 0; i < tp_checkpoint_count(ck); i++) {
            const tp_st_info *t = tp_checkpoint_at(ck, i);
            if (tp_checkpoint_find(ck, t->name) != t) abort();   /* the name index lost a tensor */
            read_back(ck, t, want);
        }
        tp_checkpoint_metadata(ck, "format");
        tp_checkpoint_find(ck, "missing.weight");
        tp_checkpoint_close(ck);
    }
    free(path);
    return 0;
}
