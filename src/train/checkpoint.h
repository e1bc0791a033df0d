/* Training checkpoints (checkpoint.c): what the loop hands over to save
 * or restore its state.  Private to src/train. */
#ifndef TP_TRAIN_CHECKPOINT_H
#define TP_TRAIN_CHECKPOINT_H

#include "tensorpar/train.h"
#include "train/data_parallel.h"

typedef struct {
    struct tp_model *m;
    const tp_mesh *mesh;
    const tp_train_param *params;  /* the optimizer's, in module order      */
    tp_tensor *masters;            /* f32 masters of bf16 shards (data NULL: none) */
    int n_params;
    tp_optim *opt;
    const tp_lr_schedule *sched;
    const tp_data_loader *loader;
    const tp_trainer_options *o;
    tp_dp *dp;                     /* under dp_shard (params are its chunks), else NULL */
    tp_group *save_group;          /* under dp_shard: dp_shard x tp, the ranks that
                                      write one replica's checkpoint (open/close) */
} tp_train_view;

/* Before the first step: under dp_shard with save_every > 0, makes
 * v->save_group (collective over the world of o->dp_mesh); else nothing.
 * close frees it. */
tp_status tp_train_checkpoint_open(tp_train_view *v);
void tp_train_checkpoint_close(tp_train_view *v);

/* After optimizer step `step` (from 1): OUT/checkpoint-<step>/ when
 * save_every divides it (as Trainer's save_steps; the final model is saved
 * by the caller), then the oldest checkpoints beyond save_total_limit
 * removed.  A step that left a non-finite weight fails instead.
 * Collective. */
tp_status tp_train_checkpoint_maybe_save(const tp_train_view *v, int64_t step);
/* Reads o->ckpt.resume_dir back into the optimizer state and masters and
 * checks it against the run's options; *step = the steps already done.
 * Collective (every rank reads its own shards). */
tp_status tp_train_checkpoint_resume(const tp_train_view *v, int64_t *step);

/* The resumed run's log starts with the checkpoint's history up to
 * `step` (its train_log.jsonl, when present). */
tp_status tp_train_checkpoint_carry_log(const tp_train_view *v, tp_train_log *log, int64_t step);

#endif
