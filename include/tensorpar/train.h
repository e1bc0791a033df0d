/* tensorpar/train.h — training: the optimizer side (parameters, AdamW and
 * SGD, learning-rate schedules, gradient-norm clipping) and the data side.
 *
 * The optimizer works on a list of parameters as the training loop sees
 * them on one rank: each parameter's local shard and its gradient of the
 * same shape (tp-semantics.md §9.3: element-wise optimizers update each
 * local shard with state of the shard's shape, so the state is sharded
 * exactly like the parameter).  Only the gradient-norm clipping and the
 * replica check talk to other ranks, and only through tp_redistribute_local.
 */
#ifndef TENSORPAR_TRAIN_H
#define TENSORPAR_TRAIN_H

#include "tensorpar/base.h"
#include "tensorpar/text.h"
#include "tensorpar/dist.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- optimizers --------------------------------------------------------- */

/* Parameter flags. */
enum {
    /* No weight decay: biases and LayerNorm/RMSNorm weights, as HF
     * Trainer's get_decay_parameter_names excludes them. */
    TP_PARAM_NO_DECAY = 1u << 0,
    /* The same shard lives on several ranks of the mesh (a replicated
     * parameter, or a KV-replicated head): counted once in the global
     * gradient norm (§9.3) and covered by tp_check_replicated. */
    TP_PARAM_COUNTED_ONCE = 1u << 1
};

/* One parameter as the training loop holds it on this rank (all borrowed). */
typedef struct {
    const char *name;      /* Hugging Face name, for messages              */
    tp_tensor *value;      /* this rank's local shard, f32                 */
    tp_tensor *grad;       /* its gradient, f32, the same shape            */
    unsigned flags;        /* TP_PARAM_*                                   */
    /* With TP_PARAM_COUNTED_ONCE: how many consecutive ranks of the mesh
     * hold this same shard — ranks r with equal r / replicas hold one copy
     * (a KV subgroup, §8.3, has n_rep = P / K).  0 means the whole mesh.
     * Ignored without the flag (the shard is this rank's alone). */
    int replicas;
} tp_train_param;

/* Checks a parameter list: names, f32 tensors, gradient shapes equal to the
 * value shapes.  The error names the first bad parameter. */
tp_status tp_train_params_check(const tp_train_param *params, int n);
/* Sets every gradient to zero (before the first micro-batch of a step). */
void tp_train_params_zero_grad(const tp_train_param *params, int n);

typedef enum { TP_OPTIM_ADAMW = 0, TP_OPTIM_SGD } tp_optim_kind;

typedef struct {
    tp_optim_kind kind;
    /* Decoupled for AdamW (p -= lr·wd·p first), coupled for SGD (g += wd·p);
     * never applied to TP_PARAM_NO_DECAY parameters.  Default 0.0, as
     * Trainer's. */
    double weight_decay;
    double beta1, beta2, eps;      /* AdamW: 0.9, 0.999, 1e-8              */
    double momentum, dampening;    /* SGD: 0, 0                            */
    int nesterov;                  /* SGD: 0                               */
    tp_threadpool *pool;           /* element ranges split over it; NULL: one thread */
} tp_optim_options;

/* torch.optim's defaults for `kind` (SGD: momentum 0). */
void tp_optim_options_default(tp_optim_options *o, tp_optim_kind kind);
/* "adamw" / "sgd". */
const char *tp_optim_kind_name(tp_optim_kind k);
tp_status tp_optim_kind_parse(const char *s, tp_optim_kind *out);

typedef struct tp_optim tp_optim;

/* An optimizer over params[0 .. n) (the list is copied, the tensors stay
 * borrowed and must not move), its state zero-filled and shaped like each
 * local shard.  Checks the list and the options. */
tp_status tp_optim_new(const tp_optim_options *o, const tp_train_param *params, int n, tp_optim **out);
void tp_optim_free(tp_optim *opt);
/* One step at learning rate lr, with torch.optim's arithmetic in f32
 * (AdamW and SGD as in torch 1.13's single-tensor paths). */
tp_status tp_optim_step(tp_optim *opt, double lr);
/* Steps taken so far (AdamW's t after its last step). */
int64_t tp_optim_steps(const tp_optim *opt);
/* Sets the steps taken (resuming from a checkpoint, with the state
 * tensors restored through tp_optim_state). */
void tp_optim_set_steps(tp_optim *opt, int64_t t);
/* Parameter i's state tensor "exp_avg", "exp_avg_sq" (AdamW) or
 * "momentum_buffer" (SGD with momentum), torch's names, borrowed; for
 * checkpoints and tests.  The tensor has the shape of the parameter's
 * value in the optimizer's list: under `--dp-shard` (tp_trainer_run with a
 * dp_mesh whose dp_shard > 1) that is this rank's flat chunk of the
 * TP-local shard (tp_trainer_options.dp_mesh says which elements), so a
 * full-tensor save gathers the chunks over dp_shard, then the TP shards. */
tp_status tp_optim_state(const tp_optim *opt, int i, const char *which, const tp_tensor **out);

/* ---- learning-rate schedules (HF Trainer's get_scheduler) --------------- */

typedef enum {
    TP_LR_CONSTANT = 0,          /* lr; warmup ignored, as HF's `constant`  */
    TP_LR_CONSTANT_WITH_WARMUP,  /* linear warmup from 0, then lr           */
    TP_LR_LINEAR,                /* warmup, then linear decay to 0          */
    TP_LR_COSINE                 /* warmup, then half a cosine to 0         */
} tp_lr_kind;

typedef struct {
    tp_lr_kind kind;
    double lr;                   /* the base learning rate                  */
    int64_t warmup_steps;        /* >= 0                                    */
    int64_t total_steps;         /* num_training_steps: linear and cosine   */
    double num_cycles;           /* cosine; 0 means HF's default 0.5        */
} tp_lr_schedule;

/* "constant", "constant_with_warmup", "linear", "cosine". */
const char *tp_lr_kind_name(tp_lr_kind k);
tp_status tp_lr_kind_parse(const char *s, tp_lr_kind *out);
/* Refuses a negative lr or warmup, or linear/cosine without total_steps. */
tp_status tp_lr_schedule_check(const tp_lr_schedule *s);
/* The learning rate after `step` scheduler steps (LambdaLR's last_epoch):
 * lr · lambda(step), so optimizer step k (counted from 1) runs at
 * tp_lr_at(s, k - 1).  Pure. */
double tp_lr_at(const tp_lr_schedule *s, int64_t step);

/* ---- gradient-norm clipping (torch.nn.utils.clip_grad_norm_) ------------ */

/* The global L2 norm of all gradients, as if the full parameters' gradients
 * were one vector: every rank sums the squares of its shards (in double;
 * a TP_PARAM_COUNTED_ONCE shard only on the first rank of its copy), and
 * the partial sums become one total by a Partial -> Replicate move over
 * `mesh` (1-D: pass the TP sub-mesh).  mesh NULL: this process only.  Every
 * rank gets the same bits.  pool (may be NULL) shares the work; the bits do
 * not depend on it.  Collective over mesh. */
tp_status tp_grad_norm(const tp_train_param *params, int n, const tp_mesh *mesh, tp_threadpool *pool,
                       float *norm);
/* clip_grad_norm_: the global norm into *norm (may be NULL), then every
 * gradient times min(1, max_norm / (norm + 1e-6)) when that is below 1.
 * max_norm <= 0 only measures.  Collective over mesh. */
tp_status tp_clip_grad_norm(const tp_train_param *params, int n, const tp_mesh *mesh, tp_threadpool *pool,
                            double max_norm, float *norm);

/* The same when the shards are split further over other mesh dimensions
 * (data parallelism, data_parallel.c): the squares counted as above over
 * the 1-D tp_sub (TP_PARAM_COUNTED_ONCE replicas), then this rank's sum
 * moved from sum_pl (one placement per dimension of `grid`: Partial where
 * the ranks hold different parts, Replicate where they hold copies) to
 * Replicate over grid, so every element of the model counts once.
 * Collective over grid. */
tp_status tp_clip_grad_norm_grid(const tp_train_param *params, int n, const tp_mesh *tp_sub, const tp_mesh *grid,
                                 const tp_placement *sum_pl, tp_threadpool *pool, double max_norm, float *norm);

/* ---- replica check ------------------------------------------------------ */

/* Verifies that every TP_PARAM_COUNTED_ONCE parameter (value and gradient)
 * is bitwise identical on the ranks that hold a copy of it (§9.1): each
 * rank digests its copies, the digests are all-gathered (Shard(0) ->
 * Replicate over `mesh`, 1-D), and every rank compares them.  Fails on
 * every rank alike, naming the first parameter that differs and two ranks.
 * mesh NULL: nothing to compare.  Collective over mesh. */
tp_status tp_check_replicated(const tp_train_param *params, int n, const tp_mesh *mesh);

/* ---- data -------------------------------------------------------------
 *
 * A training file becomes a dataset of fixed-length rows: input_ids[seq_len]
 * and labels[seq_len], labels -100 where no loss is counted.  The labels are
 * aligned with the inputs (labels[t] is the id at t, or -100): the causal-LM
 * shift happens in the loss, as in Transformers.  Formats (one kind per file):
 *
 *   .jsonl {"input_ids": [...]}  each line one row: truncated to seq_len, or
 *                                padded with pad_id (labels -100 there);
 *   .jsonl {"text": "..."}       tokenized (with special tokens), each
 *                                document followed by eos_ids[0], the stream
 *                                cut into seq_len rows; the tail that does
 *                                not fill a row is dropped (run_clm's
 *                                group_texts);
 *   .jsonl {"messages": [...]}   the chat template applied; each
 *                                conversation one row like input_ids; only
 *                                the assistant's tokens are counted
 *                                (data_chat.c says how they are found);
 *   any other file (.txt)        the whole file one document, packed like
 *                                text.
 *
 * Every refusal happens at load time and names the file and line. */

typedef struct {
    int64_t seq_len;
    int64_t vocab;                      /* ids must lie in [0, vocab) */
    /* eos_ids[0] separates packed documents; every one of them ends an
     * assistant turn (a chat model's end-of-turn token belongs here). */
    int64_t eos_ids[TP_MAX_EOS];
    int n_eos;
    int64_t pad_id;                     /* -1: eos_ids[0] */
    const tp_tokenizer *tok;            /* NULL: only input_ids files */
    const tp_chat_template *chat;       /* NULL: messages files refused */
} tp_data_options;

typedef struct {
    int64_t seq_len, n_rows;
    int64_t *ids;                       /* [n_rows, seq_len] */
    int64_t *labels;                    /* [n_rows, seq_len]; -100 = not counted */
    /* [n_rows]: the row's real tokens, the rest being padding (NULL: every
     * row full, as for a dataset built by hand) */
    int64_t *lengths;
} tp_dataset;

tp_status tp_dataset_load(tp_dataset *d, const char *path, const tp_data_options *o);
void tp_dataset_release(tp_dataset *d);

/* tokenizer_config.json's eos_token and pad_token as ids (-1 when absent or
 * not in the vocabulary); `dir` is a tokenizer or model directory. */
tp_status tp_data_special_ids(const char *dir, const tp_tokenizer *tok, int64_t *eos_id, int64_t *pad_id);

/* Labels that Transformers' causal-LM loss counts in one row: positions
 * t >= 1 with labels[t] != -100 (the first label has no prediction). */
int64_t tp_data_row_label_count(const int64_t *labels, int64_t seq_len);

/* The order in which rows are consumed, the same on every rank.
 * Each micro-batch holds batch_size rows of the whole job; replica r of R
 * takes rows [r*B/R, (r+1)*B/R) of it, so the union over replicas is the
 * single-replica micro-batch.  A step is grad_accum micro-batches (fewer at
 * the end of an epoch, as Trainer does); rows that do not fill a whole
 * micro-batch at the end of an epoch are skipped (drop_last).  With shuffle
 * each epoch e visits the rows in a permutation drawn from (seed, e). */
typedef struct {
    const tp_dataset *data;
    int64_t batch_size, grad_accum;
    int shuffle;
    uint64_t seed;
    int replica, n_replicas;
    int64_t micro_per_epoch, steps_per_epoch;
    int64_t epoch;                      /* of the cached permutation; -1 none */
    int64_t *perm;                      /* [n_rows] */
} tp_data_loader;

typedef struct {
    int64_t epoch;                      /* from 0 */
    int n_micro;                        /* micro-batches in this step */
    int64_t label_tokens;               /* counted labels of the whole step, all replicas */
} tp_data_step;

tp_status tp_data_loader_init(tp_data_loader *l, const tp_dataset *d, int64_t batch_size, int64_t grad_accum,
                              int shuffle, uint64_t seed, int replica, int n_replicas);
void tp_data_loader_release(tp_data_loader *l);
/* Step `step` (from 0; epochs follow each other). */
tp_status tp_data_loader_step(tp_data_loader *l, int64_t step, tp_data_step *out);
/* This replica's rows of micro-batch `micro` of step `step`: *n_rows rows
 * (dataset row indices written to rows[], room for batch_size), and its ids
 * and labels copied into ids/labels [n_rows, seq_len] when not NULL. */
tp_status tp_data_loader_micro(tp_data_loader *l, int64_t step, int micro, int64_t *rows, int64_t *n_rows,
                               int64_t *ids, int64_t *labels);

/* ---- loss ------------------------------------------------------------- */

/* tp_cross_entropy (kernels.h) over logits split by vocabulary: this rank
 * holds logits_local [T, V_local], columns [start, start + V_local) of the
 * full [T, V] as tp_chunk_range(V, P, rank) gives them (Shard(1) over the
 * 1-D `mesh`, the TP sub-mesh; uneven and empty shards allowed); labels [T]
 * are global ids, the same on every rank, -100 ignored.  *loss_sum (the
 * same bits on every rank) = Σ over counted rows of logsumexp − z[label];
 * dlogits_local [T, V_local] (NULL: loss only; may be logits_local) =
 * (softmax − onehot) / count on this rank's columns.  The same loss and
 * gradients as tp_cross_entropy on the gathered logits, to double rounding
 * of the sums.  No rank holds [T, V]: the row maxima are all-gathered and
 * the exp-sums and label logits all-reduced ([P, T] and [T, 2], through
 * tp_redistribute_local), the scratch is
 * tp_cross_entropy_vocab_parallel_scratch(T, P) bytes.  mesh NULL: this
 * process holds the whole vocabulary.  Fails alike on every rank (before
 * any collective) for a label outside [0, V) other than -100 or a count
 * <= 0 while some row counts.  Collective over mesh. */
tp_status tp_cross_entropy_vocab_parallel(double *loss_sum, float *dlogits_local, const float *logits_local,
                                          const int64_t *labels, int64_t T, int64_t V, double count,
                                          const tp_mesh *mesh, tp_threadpool *pool);
/* The bytes the call above allocates for T rows over P ranks: 4·T·(P + 5). */
size_t tp_cross_entropy_vocab_parallel_scratch(int64_t T, int P);

/* tp_cross_entropy, the same bits, over logits split by vocabulary:
 * logits_local [T, V_local] is this rank's Shard(1) of [T, V] over the 1-D
 * `mesh` (tp_chunk_range's columns) and becomes, in place, its shard of
 * the gradient (softmax − onehot) / count; labels [T] are global ids, the
 * same on every rank.  Whole rows move to one rank by blocks (Shard(1) ->
 * Shard(0), an all-to-all through tp_redistribute_local), which runs
 * tp_cross_entropy_rows on them and sends the gradient rows back; the row
 * losses are all-gathered and *loss_sum (the same on every rank) adds them
 * as tp_cross_entropy does.  The scratch is O(V) (64 rows of V per block),
 * never [T, V].  Fails alike on every rank, before any collective, for a
 * bad label or count (tp_cross_entropy_check_labels).  Collective over mesh. */
tp_status tp_cross_entropy_row_parallel(double *loss_sum, float *logits_local, const int64_t *labels, int64_t T,
                                        int64_t V, double count, const tp_mesh *mesh, tp_threadpool *pool);

/* ---- log --------------------------------------------------------------
 *
 * What a training run reports: one JSON line per optimizer step in
 * OUT/train_log.jsonl, written by one rank (rank 0) and flushed at every
 * step, so a run that stops keeps every step it finished:
 *   {"step": 1, "loss": 2.5, "lr": 0.0001, "grad_norm": 1.25,
 *    "tokens_per_s": 812.5, "eval_loss": 2.75}
 * (tokens_per_s: the real input tokens of the step's rows on this rank's
 * replica, padding not counted, over the step's wall time)
 * (steps from 1; eval_loss only on steps that evaluated; a number that is
 * not finite is written as null).  On a terminal, a progress line on stderr:
 * step/total, loss, lr, grad-norm, tokens/s, ETA.  At the end, the loss (and
 * eval loss) against the step as a PNG drawn by gnuplot. */

typedef struct {
    int64_t step;               /* from 1 */
    double loss;                /* the mean over the step's micro-batches */
    double lr, grad_norm, tokens_per_s;
    int has_eval;
    double eval_loss;
} tp_train_log_entry;

typedef struct tp_train_log tp_train_log;

/* A log of a run of total_steps steps (0: unknown, no ETA).  writer != 0
 * (rank 0): creates out_dir if needed and OUT/train_log.jsonl (truncated)
 * and draws the progress line when stderr is a terminal; writer == 0: every
 * call is a no-op, so all ranks can run the same code. */
tp_status tp_train_log_open(const char *out_dir, int64_t total_steps, int writer, tp_train_log **out);
/* Appends one step (steps must increase) and flushes it; remembers the
 * losses for the chart. */
tp_status tp_train_log_step(tp_train_log *l, const tp_train_log_entry *e);
/* Draws the chart of every logged step to png (NULL: OUT/loss.png), the
 * file written whole or not at all (a temporary, then a rename).  Without
 * gnuplot it warns, draws nothing and returns TP_OK with *drawn = 0 (drawn
 * may be NULL).  A writer == 0 log draws nothing. */
tp_status tp_train_log_chart(tp_train_log *l, const char *png, int *drawn);
/* A resumed run: the lines of an earlier run's log at path with steps up
 * to `upto` are copied into this log (and its chart) first.  Only a
 * writer log reads the file. */
tp_status tp_train_log_carry(tp_train_log *l, const char *path, int64_t upto);
/* Ends the progress line and closes the file; NULL is fine. */
void tp_train_log_close(tp_train_log *l);
/* The progress line of entry e out of total steps (0: unknown) with eta_s
 * seconds left (< 0: unknown), into buf: "step 3/10  loss 2.5000  lr
 * 1.00e-04  grad-norm 1.250  tok/s 812  ETA 0:01:05". */
void tp_train_progress_format(char *buf, size_t cap, const tp_train_log_entry *e, int64_t total, double eta_s);

/* ---- the training loop (trainer.c) -------------------------------------
 *
 * tensorpar train's loop as a library function: every rank of the TP mesh
 * calls it with the same options and data.  Per optimizer step: zero the
 * gradients; for each micro-batch, forward and backward of each row with
 * the loss normalised by the step's counted labels (all micro-batches, all
 * replicas: Transformers >= 4.46); clip to the global norm; one optimizer
 * step at the schedule's learning rate; one log entry. */

struct tp_model;   /* models.h */

/* Training checkpoints, as Trainer's checkpoint-<step>/ (checkpoint.c). */
typedef struct {
    const char *src_dir;           /* config and tokenizer files copied from here */
    int64_t save_every;            /* > 0: OUT/checkpoint-<step>/ every N steps */
    int64_t save_total_limit;      /* > 0: only the newest N are kept        */
    uint64_t max_shard_bytes;      /* safetensors files past this are split; 0: 5 GB */
    /* A checkpoint directory to continue from (the model was loaded from
     * it): optimizer state, masters, step and data position are read back. */
    const char *resume_dir;
} tp_train_checkpointing;

typedef struct {
    const char *out_dir;           /* train_log.jsonl and loss.png           */
    /* Rows per micro-batch of each data-parallel rank (Trainer's
     * per_device_train_batch_size): the job's micro-batch is batch_size ×
     * the dp size, dealt out in order (dp rank k takes its k-th slice), so
     * a run equals one process with batch_size × dp. */
    int64_t batch_size;
    int64_t grad_accum;            /* micro-batches per optimizer step       */
    int64_t steps;                 /* > 0: this many steps; else epochs      */
    int64_t epochs;                /* used when steps <= 0                   */
    uint64_t seed;
    int shuffle;
    tp_lr_schedule schedule;       /* total_steps filled by the loop         */
    tp_optim_options optim;
    double max_grad_norm;          /* <= 0: measured, not clipped            */
    int64_t eval_every;            /* eval data: every N steps; 0: the last  */
    int check_replicas;            /* tp_check_replicated after every step   */
    int writer;                    /* this rank writes the log (rank 0)      */
    /* Data parallelism: a mesh with dimensions "dp_replicate", "dp_shard"
     * and "tp" (tp_parallelism_config_mesh's; others of size 1) whose "tp"
     * dimension is `mesh` (data_parallel.h says what each does);
     * NULL: none.  With dp_shard > 1 the optimizer holds chunks: each
     * tp_optim_state tensor is then the flat range [s·c, min((s+1)·c, n))
     * of the TP-local shard's n elements (row-major), c = ceil(n / S), on
     * dp_shard rank s of S. */
    const tp_mesh *dp_mesh;
    tp_train_checkpointing ckpt;   /* checkpoints (checkpoint.c)             */
} tp_trainer_options;

typedef struct {
    int64_t steps;                 /* steps finished                         */
    double last_loss;
} tp_trainer_result;

/* Trains m (f32 or bf16 weights; each parameter's local shard is updated
 * in place; a bf16 shard through an f32 master copy that the optimizer
 * updates, the shard being the master rounded to bf16 after each step, and
 * that replaces the shard at the end when the run succeeds, so a saved
 * model holds the master's values) on `train` (eval: NULL or a dataset of the same
 * seq_len).  mesh: the 1-D TP mesh (NULL: one rank).  The logged loss of a
 * step is Σ over its micro-batches of (loss sum / the step's counted
 * labels) — the token-weighted mean over the step, what Trainer logs with
 * logging_steps = 1 (the mean of the micro-batch means when each counts as
 * many labels).  A loss that is not finite stops before its optimizer
 * step, with an error naming the step.  Collective over mesh. */
/* OUT's newest checkpoint-<step>/ into path (--resume latest). */
tp_status tp_train_checkpoint_latest(const char *out_dir, char *path, size_t cap);

tp_status tp_trainer_run(struct tp_model *m, const tp_mesh *mesh, const tp_dataset *train, const tp_dataset *eval,
                         const tp_trainer_options *o, tp_trainer_result *res);

#ifdef __cplusplus
}
#endif
#endif
