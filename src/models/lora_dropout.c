/* Dropout on the LoRA adapters' input (PEFT's lora_dropout: y = base(x) +
 * scale · B(A(dropout(x))), tp-semantics.md §9.3 and §9.6).
 *
 * A mask is not drawn from a stream but computed: element (t, j) of the
 * input of module i keeps its value when (hash(key_i, t · in + j) >> 11)
 * / 2^53 >= p, with key_i = hash(drop_key, FNV-1a of the module's name)
 * (a name, not an index into the module table, so that a reference
 * written elsewhere computes the same masks), drop_key = hash(hash(hash(seed,
 * stream), step), row) and j the element's index in the base's whole input
 * dimension.  So a rowwise base's ranks (each holding some columns of x)
 * draw TP = 1's mask for their columns, a colwise base's ranks (x whole)
 * the same mask each, and the backward and a gradient-checkpointing
 * recomputation draw it again without storing it.  tests/reference/
 * peft_reference.py computes the same masks in Python. */
#include "lora_internal.h"

#include <stdlib.h>

/* Keeps the dropout masks apart from any other use of the seed. */
#define DROPOUT_STREAM 0x6c6f72615f64726full   /* "lora_dro" */

void tp_model_lora_dropout_key(tp_model *m, int on, uint64_t seed, int64_t step, int64_t row)
{
    if (!m->lora) return;
    m->lora->drop_on = on && m->lora->training && m->lora->cfg.dropout > 0;
    m->lora->drop_key = tp_rng_hash(tp_rng_hash(tp_rng_hash(seed, DROPOUT_STREAM), (uint64_t)step), (uint64_t)row);
}

/* FNV-1a, 64 bits. */
static uint64_t name_key(const char *name)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (const unsigned char *c = (const unsigned char *)name; *c; c++) h = (h ^ *c) * 0x100000001b3ull;
    return h;
}

int tp_lora_dropping(const tp_model *m)
{
    return m->lora && m->lora->drop_on;
}

/* The global input column of each of x's local columns. */
static tp_status global_columns(const lora_entry *e, int64_t in_local, int64_t **out)
{
    int64_t *col = malloc((size_t)(in_local ? in_local : 1) * sizeof *col);
    if (!col) return tp_fail(TP_ERR_NOMEM, "out of memory");
    const tp_param_slice *sl = &e->a_slice;
    int64_t at = 0;
    if (sl->dim < 0) {
        for (int64_t j = 0; j < in_local; j++) col[j] = j;
    } else {
        for (int i = 0; i < sl->n; i++)
            for (int64_t j = 0; j < sl->len[i] && at < in_local; j++) col[at++] = sl->start[i] + j;
        if (at != in_local) {
            free(col);
            return tp_fail(TP_ERR_INTERNAL, "the adapter's input slice holds %lld columns, its input %lld",
                           (long long)at, (long long)in_local);
        }
    }
    *out = col;
    return TP_OK;
}

typedef struct {
    const float *x;
    float *out;
    const int64_t *col;
    int64_t T, in_local, in;
    uint64_t key;
    double p;
    float keep;
} drop_job;

/* Thread ti's token rows: each element's draw depends on its index only. */
static void drop_rows(void *ctx, int ti, int nt)
{
    const drop_job *d = ctx;
    int64_t t0, t1;
    tp_split_range(d->T, ti, nt, &t0, &t1);
    for (int64_t t = t0; t < t1; t++)
        for (int64_t j = 0; j < d->in_local; j++) {
            uint64_t h = tp_rng_hash(d->key, (uint64_t)(t * d->in + d->col[j]));
            int dropped = (double)(h >> 11) * 0x1.0p-53 < d->p;
            d->out[t * d->in_local + j] = dropped ? 0.0f : d->x[t * d->in_local + j] * d->keep;
        }
}

tp_status tp_lora_dropout(const tp_model *m, const tp_module *lin, const lora_entry *e, const float *x, int64_t T,
                          float *out)
{
    const struct tp_lora *l = m->lora;
    int64_t in_local = e->A.shape[1];
    int64_t *col = NULL;
    tp_status s = global_columns(e, in_local, &col);
    if (s) return s;
    drop_job d = {x, out, col, T, in_local, lin->params[TP_MODULE_WEIGHT].shape[1],
                  tp_rng_hash(l->drop_key, name_key(lin->name)), l->cfg.dropout,
                  (float)(1.0 / (1.0 - l->cfg.dropout))};
    tp_parallel_run(m->pool, drop_rows, &d);
    free(col);
    return TP_OK;
}
