/* The inside of tp_dp (data_parallel.h), shared by data_parallel.c and
 * dp_row_blocks.c; private to src/train. */
#ifndef TP_TRAIN_DP_INTERNAL_H
#define TP_TRAIN_DP_INTERNAL_H

#include "train/data_parallel.h"
#include "tensorpar/module.h"

/* One owned parameter of the model under dp_shard. */
typedef struct {
    int module, j;                 /* m->modules[module].params[j] */
    int unit;                      /* its decoder layer's module index, or -1: the root unit */
    int64_t numel, start, len;     /* flat TP-local size; this rank's chunk */
    tp_tensor value, grad;         /* the chunk [len] and its gradient (f32: a bf16 weight's master) */
    tp_dtype dtype;                /* the model's weights: f32, or bf16 rounded from the masters */
    void *full;                    /* the gathered whole (of dtype), or NULL */
    int64_t block;                 /* > 0: kept in row blocks of this many rows (dp_row_blocks.c) */
} dp_param;

/* The rows of an embedding kept in blocks that this sequence's lookups
 * touch on any rank of dp_shard, and their gradient, held until the
 * lookup's backward (rows_scatter) has added to it: a tied lm_head's rows
 * come first (rows_grad), as they do in the whole gradient. */
typedef struct {
    int k;                         /* the parameter, -1: none */
    int64_t *rows, n;              /* sorted, distinct */
    float *grad;                   /* [n, width] */
} dp_kept;

struct tp_dp {
    tp_model *m;
    const tp_mesh *grid, *rep, *shard;
    int R, S, index;
    /* dp_shard > 1 chunks the parameters (chunked).  Under LoRA training
     * (frozen) the chunks are the frozen base's, gathered for compute but
     * with no gradient and no optimizer state; the optimizer steps the
     * small adapters, copies on every dp rank whose gradients are summed
     * over the whole dp group.  opt_chunks: the optimizer steps chunks. */
    int chunked, frozen, opt_chunks;
    tp_module_hooks hooks;
    dp_param *ps;
    int n;
    tp_train_param *train;         /* the chunks, for the optimizer */
    dp_kept kept;
};

/* ---- row blocks (dp_row_blocks.c) -------------------------------------
 * Under dp_shard, the embedding and lm_head weights ([vocab, hidden]) are
 * never gathered whole for training: the model reaches them a block of
 * rows at a time through tp_module_row_hooks, each block all-gathered from
 * the chunks that cover it and its gradient reduce-scattered back into
 * them.  (Eval gathers them whole, as the rest of the root unit.) */

/* Rows per block for parameter j of module i under dp, 0 when
 * it is gathered whole as before: only a TP = 1 embedding or lm_head
 * weight, without LoRA or a bias on lm_head. */
int64_t tp_dp_block_rows(const tp_dp *dp, int i, int j);
/* dp->hooks.rows. */
void tp_dp_row_hooks(tp_dp *dp);
/* The idle row's part (tp_dp_row_idle): the lookup before the layers,
 * lm_head's blocks and the lookup's gradient after them. */
tp_status tp_dp_rows_idle_lookup(tp_dp *dp);
tp_status tp_dp_rows_idle_head(tp_dp *dp);
tp_status tp_dp_rows_idle_scatter(tp_dp *dp);
/* The kept rows freed (after a failure). */
void tp_dp_kept_free(tp_dp *dp);

#endif
