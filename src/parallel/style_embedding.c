/* EmbeddingParallel (§2.6, §2.7).  shard_dim 0: vocabulary-parallel, a
 * masked lookup whose partial rows are all-reduced.  shard_dim 1: hidden-
 * parallel, a local lookup all-gathered along the last dim (§10.4) with
 * per-rank counts, so neither V nor H needs to divide by P (§10.10). */
#include "parallel_internal.h"

static tp_status embedding_shard(const tp_style *st, const tp_module_ctx *mod, const tp_param_ctx *p,
                                 tp_placement *out)
{
    (void)mod;
    int d = st->opt.shard_dim < p->ndim ? st->opt.shard_dim : p->ndim - 1;
    *out = tp_shard(d);
    return TP_OK;
}

static tp_status embedding_forward(const tp_style *st, const tp_module_ctx *mod, tp_forward_desc *d)
{
    (void)mod;
    *d = tp_par_desc_passthrough();
    d->ids_input = 1;
    if (st->opt.shard_dim == 0) {
        d->mask_vocab = 1;               /* out-of-range ids: zero rows (MaskPartial) */
        d->local_output = tp_partial();
    } else {
        d->local_output = tp_shard(-1);
    }
    d->output = tp_replicate();
    return TP_OK;
}

const tp_style tp_par_embedding_rowwise = {
    .name = "embedding_rowwise", .impl = "EmbeddingParallel",
    .opt = {.shard_dim = 0, .use_local_output = 1},
    .shard_param = embedding_shard, .install_forward = embedding_forward};

const tp_style tp_par_embedding_colwise = {
    .name = "embedding_colwise", .impl = "EmbeddingParallel",
    .opt = {.shard_dim = 1, .use_local_output = 1},
    .shard_param = embedding_shard, .install_forward = embedding_forward};
