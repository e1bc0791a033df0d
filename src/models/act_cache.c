/* Activation buffers, kept between forwards.
 *
 * A prefill allocates a handful of [T, width] activations per layer (q, k,
 * v, o, gate, up, down: 1–6 MiB each at T = 512) and frees them before the
 * next layer.  From malloc, each came back as fresh pages from the kernel
 * and every 4 KiB faulted and was zeroed on first write — about a tenth of
 * a prefill, and more of a TP rank's, whose full-width all-reduce outputs
 * do not shrink with the rank count.  Large buffers are therefore taken
 * from, and returned to, a small per-model cache (best fit); only a few are
 * alive at once, so it settles at the working set of one layer.  Small
 * ones (decode's single rows) stay with malloc, which recycles them well. */
#include "tp_module.h"

#include <stdlib.h>

#define CACHE_MIN_BYTES ((size_t)256 << 10)
#define CACHE_SLOTS 16

typedef struct {
    float *data;
    size_t bytes;
    int in_use;
} act_slot;

struct tp_act_cache {
    act_slot slot[CACHE_SLOTS];
};

static size_t act_bytes(int64_t floats)
{
    size_t bytes = (size_t)(floats > 0 ? floats : 1) * sizeof(float);
    return (bytes + 63) / 64 * 64;
}

/* 64-byte aligned: the GEMM writes its output in 64-byte vectors, and with
 * malloc's 16-byte alignment every one of them straddled two cache lines. */
static float *aligned(size_t bytes)
{
    void *p = NULL;
    return posix_memalign(&p, 64, bytes) ? NULL : p;
}

float *tp_act_alloc(tp_model *m, int64_t floats)
{
    size_t bytes = act_bytes(floats);
    if (bytes < CACHE_MIN_BYTES) return aligned(bytes);
    if (!m->acts && !(m->acts = calloc(1, sizeof *m->acts))) return aligned(bytes);
    act_slot *best = NULL, *empty = NULL;
    for (int i = 0; i < CACHE_SLOTS; i++) {
        act_slot *s = &m->acts->slot[i];
        if (!s->data) { if (!empty) empty = s; continue; }
        if (!s->in_use && s->bytes >= bytes && (!best || s->bytes < best->bytes)) best = s;
    }
    if (best) { best->in_use = 1; return best->data; }
    float *p = tp_alloc(bytes);   /* 2 MiB pages from 2 MiB on */
    if (p && empty) *empty = (act_slot){p, bytes, 1};
    return p;                     /* no slot left: freed on release */
}

void tp_act_free(tp_model *m, float *data)
{
    if (!data) return;
    for (int i = 0; m->acts && i < CACHE_SLOTS; i++)
        if (m->acts->slot[i].data == data) { m->acts->slot[i].in_use = 0; return; }
    free(data);
}

void tp_act_release(tp_model *m, tp_act *a)
{
    tp_act_free(m, a->data);
    a->data = NULL;
}

void tp_act_cache_free(tp_model *m)
{
    if (!m->acts) return;
    for (int i = 0; i < CACHE_SLOTS; i++) tp_free(m->acts->slot[i].data);
    free(m->acts);
    m->acts = NULL;
}
