/* The order of rows in training (train.h, tp_data_loader): epochs, the
 * shared shuffle, micro-batches, steps, and each replica's share.
 *
 * Every rank computes the same permutation from (seed, epoch) alone, so no
 * rank sends another anything, and a replica's share is a slice of the
 * job's micro-batch: the rows a step sees do not depend on how many
 * replicas there are. */
#include "train/data_internal.h"

#include <stdlib.h>
#include <string.h>

tp_status tp_data_loader_init(tp_data_loader *l, const tp_dataset *d, int64_t batch_size, int64_t grad_accum,
                              int shuffle, uint64_t seed, int replica, int n_replicas)
{
    memset(l, 0, sizeof *l);
    if (n_replicas < 1 || replica < 0 || replica >= n_replicas)
        return tp_fail(TP_ERR_INVALID, "data replica %d of %d", replica, n_replicas);
    if (batch_size < n_replicas)
        return tp_fail(TP_ERR_INVALID, "batch size %lld is smaller than the %d data-parallel replicas "
                       "that share it", (long long)batch_size, n_replicas);
    if (grad_accum < 1) return tp_fail(TP_ERR_INVALID, "gradient accumulation %lld", (long long)grad_accum);
    if (d->n_rows < batch_size)
        return tp_fail(TP_ERR_INVALID, "the data holds %lld sequences of %lld tokens, fewer than one micro-batch "
                       "of batch size %lld", (long long)d->n_rows, (long long)d->seq_len, (long long)batch_size);
    l->perm = malloc((size_t)d->n_rows * sizeof *l->perm);
    if (!l->perm) return tp_fail(TP_ERR_NOMEM, "out of memory");
    l->data = d;
    l->batch_size = batch_size;
    l->grad_accum = grad_accum;
    l->shuffle = shuffle;
    l->seed = seed;
    l->replica = replica;
    l->n_replicas = n_replicas;
    l->micro_per_epoch = d->n_rows / batch_size;
    l->steps_per_epoch = (l->micro_per_epoch + grad_accum - 1) / grad_accum;
    l->epoch = -1;
    return TP_OK;
}

void tp_data_loader_release(tp_data_loader *l)
{
    free(l->perm);
    memset(l, 0, sizeof *l);
}

/* Epoch e's order: file order, or a Fisher-Yates shuffle whose generator is
 * seeded from the seed and the epoch (splitmix64 inside tp_rng_seed spreads
 * neighbouring seeds apart). */
static void set_epoch(tp_data_loader *l, int64_t e)
{
    if (l->epoch == e) return;
    int64_t n = l->data->n_rows;
    for (int64_t i = 0; i < n; i++) l->perm[i] = i;
    if (l->shuffle) {
        tp_rng r;
        tp_rng_seed(&r, l->seed ^ ((uint64_t)e * 0xd1b54a32d192ed03ull));
        for (int64_t i = n - 1; i > 0; i--) {
            int64_t j = (int64_t)(tp_rng_next(&r) % (uint64_t)(i + 1)), t = l->perm[i];
            l->perm[i] = l->perm[j];
            l->perm[j] = t;
        }
    }
    l->epoch = e;
}

/* The first micro-batch of step `step` within its epoch, and how many. */
static void step_range(const tp_data_loader *l, int64_t step, int64_t *first, int *n)
{
    int64_t in_epoch = step % l->steps_per_epoch;
    *first = in_epoch * l->grad_accum;
    int64_t left = l->micro_per_epoch - *first;
    *n = (int)(left < l->grad_accum ? left : l->grad_accum);
}

tp_status tp_data_loader_step(tp_data_loader *l, int64_t step, tp_data_step *out)
{
    if (step < 0) return tp_fail(TP_ERR_INVALID, "data step %lld", (long long)step);
    int64_t first;
    int n;
    set_epoch(l, step / l->steps_per_epoch);
    step_range(l, step, &first, &n);
    int64_t S = l->data->seq_len, count = 0;
    for (int64_t i = first * l->batch_size; i < (first + n) * l->batch_size; i++)
        count += tp_data_row_label_count(l->data->labels + l->perm[i] * S, S);
    out->epoch = l->epoch;
    out->n_micro = n;
    out->label_tokens = count;
    return TP_OK;
}

tp_status tp_data_loader_micro(tp_data_loader *l, int64_t step, int micro, int64_t *rows, int64_t *n_rows,
                               int64_t *ids, int64_t *labels)
{
    int64_t first;
    int n;
    if (step < 0) return tp_fail(TP_ERR_INVALID, "data step %lld", (long long)step);
    set_epoch(l, step / l->steps_per_epoch);
    step_range(l, step, &first, &n);
    if (micro < 0 || micro >= n)
        return tp_fail(TP_ERR_INVALID, "micro-batch %d of a step that has %d", micro, n);
    int64_t B = l->batch_size, R = l->n_replicas, r = l->replica, S = l->data->seq_len;
    int64_t lo = r * B / R, hi = (r + 1) * B / R, base = (first + micro) * B;
    for (int64_t i = lo; i < hi; i++) {
        int64_t row = l->perm[base + i];
        rows[i - lo] = row;
        if (ids) memcpy(ids + (i - lo) * S, l->data->ids + row * S, (size_t)S * sizeof *ids);
        if (labels) memcpy(labels + (i - lo) * S, l->data->labels + row * S, (size_t)S * sizeof *labels);
    }
    *n_rows = hi - lo;
    return TP_OK;
}
