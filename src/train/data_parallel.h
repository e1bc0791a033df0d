/* Data parallelism for the training loop (private to src/train): the
 * replicas of a mesh with dimensions "dp_replicate", "dp_shard" and "tp"
 * (ParallelismConfig's ["dp_replicate", "dp_shard", "cp", "tp"] with cp 1;
 * tp-semantics.md §9.2, §9.4), each holding the TP shards of the model.
 *
 * dp_replicate copies hold whole TP-local parameters; their gradients are
 * summed over every dp rank after the step's micro-batches (Partial ->
 * Replicate; each rank's loss is already divided by the whole global
 * batch's label count, so the sum is DDP's mean of the per-rank losses
 * scaled by the dp size, as Transformers does with num_items_in_batch).
 *
 * dp_shard > 1 is ZeRO-3 / FSDP: each TP-local parameter, flattened
 * row-major, is chunked over the dp_shard group (torch.chunk's rule: rank s
 * holds elements [s·c, min((s+1)·c, n)), c = ceil(n / S)); its gradient and
 * optimizer state are chunks of the same range.  A decoder layer's
 * parameters are all-gathered (Shard(0) -> Replicate over dp_shard) by the
 * module hook before its forward and again before its backward, and freed
 * after each; after its backward its gradient is reduce-scattered
 * (Partial -> Shard(0)) and added into the chunk.  The parameters outside
 * the layers (embedding, final norm, lm_head) are gathered for the whole
 * forward and backward of a sequence (FSDP's root unit, which a tied
 * lm_head shares with the embedding).  Every move goes through
 * tp_redistribute_local on a sub-mesh.
 *
 * LoRA training (a frozen base, tensorpar/lora.h) chunks the base's
 * values alone: gathered around each unit's forward and backward like any
 * chunk, but with no gradient to reduce-scatter and no optimizer state.
 * The optimizer steps the adapters (and the base parameters that train
 * with them, modules_to_save and biases, which stay whole), copies on
 * every dp rank whose gradients are summed over dp_replicate × dp_shard,
 * as dp_replicate does. */
#ifndef TP_TRAIN_DATA_PARALLEL_H
#define TP_TRAIN_DATA_PARALLEL_H

#include "tensorpar/models.h"
#include "tensorpar/train.h"

typedef struct tp_dp tp_dp;

/* Data parallelism for m over grid (named as above, other dimensions of
 * size 1; the model was loaded on grid["tp"]).  With dp_shard > 1 the model's parameters are
 * replaced by their chunks (their local tensors keep shape, data NULL) and
 * the hooks are installed.  f32 or bf16 weights: the chunks are f32 (a
 * bf16 weight's master), gathered rounded to bf16, as the trainer's masters
 * without dp. */
tp_status tp_dp_new(tp_model *m, const tp_mesh *grid, tp_dp **out);
/* Gathers every parameter back whole into the model (owned tensors), takes
 * the hooks away and frees dp; NULL is fine.  Collective when finish != 0
 * (the trained model is then as without dp); finish == 0 after a failure
 * only frees. */
tp_status tp_dp_free(tp_dp *dp, int finish);

/* This rank's data-parallel index (dp_replicate-major) and their count. */
int tp_dp_index(const tp_dp *dp);
int tp_dp_count(const tp_dp *dp);
/* 1 when the optimizer steps chunks (dp_shard > 1, not LoRA training:
 * there the chunks are the frozen base's, and the adapters whole). */
int tp_dp_sharded(const tp_dp *dp);
/* The chunks as the optimizer's parameter list (dp_shard > 1; borrowed). */
const tp_train_param *tp_dp_params(const tp_dp *dp, int *n);

/* Around each sequence's forward and backward (dp_shard > 1): gathers the
 * root unit's parameters with zeroed gradients; row_end reduce-scatters
 * those gradients and frees them.  Collective over dp_shard. */
tp_status tp_dp_row_begin(tp_dp *dp);
tp_status tp_dp_row_end(tp_dp *dp);
/* A sequence that counts no label runs no forward here but its dp_shard
 * partners do: the same gathers and (zero) reduce-scatters, in order. */
tp_status tp_dp_row_idle(tp_dp *dp);
/* The root unit gathered (whole model forward for eval) or freed again. */
tp_status tp_dp_root_gather(tp_dp *dp);
void tp_dp_root_release(tp_dp *dp);

/* The step's loss sum and token count summed over every dp rank. */
tp_status tp_dp_reduce_loss(tp_dp *dp, double *loss_sum, int64_t *tokens);
/* The step's gradients summed over the dp ranks that hold copies: the
 * whole gradients over dp_replicate × dp_shard, or the chunks over
 * dp_replicate.  params: the optimizer's list. */
tp_status tp_dp_reduce_grads(tp_dp *dp, const tp_train_param *params, int n);
/* clip_grad_norm_ over the whole model: each element once. */
tp_status tp_dp_clip(tp_dp *dp, const tp_train_param *params, int n, const tp_mesh *tp_sub, tp_threadpool *pool,
                     double max_norm, float *norm);
/* The replica check over the dp copies (dp_replicate): every parameter's
 * value and gradient bitwise equal on every replica. */
tp_status tp_dp_check_replicas(tp_dp *dp, const tp_train_param *params, int n);

/* ---- checkpoints under dp_shard (checkpoint.c) ----------------------
 * The flat chunks cross the rows of a TP shard; tp_slice_runs maps a
 * chunk to the runs of the whole tensor it holds, so a save writes each
 * rank's chunks where they lie in the files and a resume reads its
 * chunk's runs back, with no gather over dp_shard. */

/* Optimizer parameter k: its module parameter and this rank's chunk
 * [start, start + len) of the flat TP shard. */
void tp_dp_param_at(const tp_dp *dp, int k, int *module, int *j, int64_t *start, int64_t *len);
/* Chunk (len values) of parameter k -> its whole TP shard (numel values)
 * on every dp_shard rank.  Collective over dp_shard. */
tp_status tp_dp_gather_chunk(tp_dp *dp, int k, const float *chunk, float *whole);
/* s agreed over dp_shard: an error on any rank there is one on each. */
tp_status tp_dp_agree(tp_dp *dp, tp_status s);

#endif
