/* tensorpar/module.h — a model as a table of modules.
 *
 * Every module of the model (the embedding, each decoder layer and the
 * attention, MLP, Linear and norm modules in it, the final norm, lm_head)
 * is one entry of m->modules, in Hugging Face's pre-order (a parent before
 * its children, children in checkpoint order).  An entry carries its
 * Hugging Face name, its type, its place in the tree, its parameters as
 * DTensor-like records (global shape of any rank up to TP_MAX_DIMS, this
 * rank's local tensor and slice), an ops table and its TP style binding.
 * The parameter table (tp_model_params), and so loading, make-model and the
 * plan, are derived from it: a name is spelled in one place (params.c).
 *
 * A new kind of module (experts, a LoRA adapter) is a new ops table and a
 * new tp_module_type, not a new field in every layer. */
#ifndef TENSORPAR_MODULE_H
#define TENSORPAR_MODULE_H

#include "tensorpar/models.h"
#include "tensorpar/parallel.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    TP_MT_CONTAINER,       /* holds modules, no computation of its own ("model") */
    TP_MT_DECODER_LAYER,   /* model.layers.N: runs its children in order   */
    TP_MT_EMBEDDING,       /* weight [vocab, hidden]                       */
    TP_MT_LINEAR,          /* weight [out, in], optional bias [out]        */
    TP_MT_NORM,            /* RMSNorm, weight [width]                      */
    TP_MT_ATTENTION,       /* self_attn: q/k/v/o projections, q/k norms    */
    TP_MT_MLP,             /* gate/up/down projections                     */
    TP_MT_EXPERTS,         /* mlp.experts: gate_up_proj [E, 2I, H], down_proj [E, H, I] */
    TP_MT_ADAPTER,         /* declared for LoRA adapters; not built yet    */
    TP_MT_MOE,             /* a sparse MoE block (mlp): router `gate` and `experts` */
    TP_MT_COUNT
} tp_module_type;

const char *tp_module_type_name(tp_module_type t);

#define TP_MODULE_MAX_PARAMS 4
/* Where a Linear/Embedding/norm keeps its tensors in params[]: the weight
 * first; a Linear's bias second, its local tensor empty (data NULL) when the
 * module has none. */
enum { TP_MODULE_WEIGHT = 0, TP_MODULE_BIAS = 1 };

/* One parameter as a DTensor: global shape, this rank's local tensor and
 * which global indices it holds. */
typedef struct {
    char suffix[24];               /* last name component: "weight", "bias" */
    tp_param_kind kind;
    int ndim;                      /* 1..TP_MAX_DIMS                         */
    int64_t shape[TP_MAX_DIMS];    /* global shape                           */
    tp_tensor local;               /* this rank's shard (or the whole tensor) */
    tp_param_slice slice;          /* its ranges; dim = -1: whole            */
    tp_placement placement;        /* on the 1-D TP mesh; Replicate when whole */
    int tied_to;                   /* index of the module whose weight this one borrows, or -1 */
    /* Its gradient, f32, shaped like `local` (training only): empty until
     * tp_model_zero_grad allocates it.  A tied parameter has none: its
     * gradient is added into the owner's. */
    tp_tensor grad;
} tp_module_param;

/* The state of one forward pass (private to the library: models/tp_module.h). */
typedef struct tp_forward_pass tp_forward_pass;
typedef struct tp_backward_pass tp_backward_pass;

typedef struct {
    const char *name;              /* "linear", "attention", ...             */
    /* Runs the module on the pass's state (each kind reads and writes the
     * fields its file documents). */
    tp_status (*forward)(tp_model *m, const tp_module *mod, tp_forward_pass *f);
    /* The gradient of forward (training): reads the activations the
     * training forward saved and the pass's output gradient, adds into the
     * parameters' gradients and writes the input gradient (each kind's file
     * says which fields).  Runs on one rank (TP = 1) today. */
    tp_status (*backward)(tp_model *m, const tp_module *mod, tp_backward_pass *b);
} tp_module_ops;

struct tp_module {
    char name[96];                 /* "model.layers.3.self_attn.q_proj"      */
    tp_module_type type;
    int64_t layer;                 /* its decoder layer, or -1 outside the layers */
    int parent, first_child, next_sibling;   /* indices into the table, -1: none */
    int n_params;                  /* entries of params[] in use (a Linear without bias: 1) */
    tp_module_param params[TP_MODULE_MAX_PARAMS];
    const tp_module_ops *ops;      /* NULL: a type not built yet             */
    /* Style binding.  Linear/Embedding: the style and shard of the module
     * (NULL: a plain local module).  Attention/MLP/norm: the plan's rule on
     * this module whose hooks run on its output (blocks) or input
     * (sequence_parallel norms), or NULL. */
    struct tp_module_tp *tp;
    const tp_module_plan *plan;
};

/* Indices into m->modules of one decoder layer's modules (-1: absent, e.g.
 * q_norm outside Qwen3), so the forward pass needs no name lookups. */
struct tp_layer_modules {
    int layer, input_layernorm, self_attn, q_proj, k_proj, v_proj, o_proj, q_norm, k_norm;
    int post_attention_layernorm, mlp, gate_proj, up_proj, down_proj;
    int router, experts;           /* a sparse layer's mlp.gate and mlp.experts */
    /* Multi-head latent attention (k_proj, v_proj absent; q_proj absent
     * when q_lora_rank is set). */
    int q_a_proj, q_a_layernorm, q_b_proj, kv_a_proj, kv_a_layernorm, kv_b_proj;
    /* DeepSeek's MoE block: mlp.shared_experts and its projections (-1: none). */
    int shared_experts, shared_gate, shared_up, shared_down;
};

/* Hooks around each module that a container runs (tp_model.hooks): before
 * and after its forward, before and after its backward, with the module's
 * index in m->modules.  They may replace the data of the module's
 * parameters' local tensors and gradients (same shapes), e.g. gather a
 * sharded parameter just before use and free it after (FSDP's unshard and
 * reshard).  A failure stops the pass with its status.  Any hook may be
 * NULL. */
typedef tp_status (*tp_module_hook_fn)(void *ctx, tp_model *m, int module);

/* Row blocks (the optional tail of tp_module_hooks): a 2-D parameter too
 * large to gather whole — ZeRO-3's embedding and lm_head, [vocab, hidden]
 * — is left without data (local.data and grad.data NULL) and reached a
 * block of rows at a time.  `module`, `j` name the parameter as its user
 * sees it (a tied lm_head's weight: the hooks resolve the owner).
 *   rows_block: rows per block, 0 when the parameter is not kept so;
 *   rows_fetch: rows [row0, row0 + n) of the value into out (its dtype);
 *   rows_grad:  dw [n, width] (f32), this sequence's gradient of those
 *               rows, added into the parameter's gradient (dw may be
 *               overwritten);
 *   rows_lookup: y[t] = row ids[t] (f32), an embedding's forward;
 *   rows_scatter: the lookup's gradient, row ids[t] += dy[t] in order of
 *               t — after the rows_grad of a tied lm_head, whose rows it
 *               adds to as the whole gradient would have.
 * All but rows_block are collective over the ranks that share the
 * parameter: every one makes the same calls, an idle one too
 * (tp_model_head_blocks_idle, T = 0 lookups and scatters). */
typedef struct tp_module_row_hooks {
    int64_t (*rows_block)(void *ctx, const tp_model *m, int module, int j);
    tp_status (*rows_fetch)(void *ctx, tp_model *m, int module, int j, int64_t row0, int64_t n, void *out);
    tp_status (*rows_grad)(void *ctx, tp_model *m, int module, int j, int64_t row0, int64_t n, float *dw);
    tp_status (*rows_lookup)(void *ctx, tp_model *m, int module, int j, const int64_t *ids, int64_t T, float *y);
    tp_status (*rows_scatter)(void *ctx, tp_model *m, int module, int j, const int64_t *ids, int64_t T,
                              const float *dy);
} tp_module_row_hooks;

typedef struct tp_module_hooks {
    tp_module_hook_fn pre_forward, post_forward, pre_backward, post_backward;
    void *ctx;
    tp_module_row_hooks rows;   /* all NULL: no parameter is kept in blocks */
} tp_module_hooks;

/* Rows per block of parameter j of module (tp_module_row_hooks), 0 when
 * it is held whole or gathered. */
int64_t tp_module_rows_block(const tp_model *m, int module, int j);
/* lm_head's blocked loss (tp_module_rows_block of its weight > 0) on a
 * rank with no row of its own: the same fetches and (zero) gradients, so
 * that its partners' collectives complete. */
tp_status tp_model_head_blocks_idle(tp_model *m);

/* The module table of the model described by cfg, without tensors (local
 * tensors empty, slices whole).  Free it with tp_module_table_free. */
tp_status tp_module_table_build(const tp_model_config *cfg, tp_module **out, size_t *n);
/* Releases the local tensors (not borrowed ones) and the table. */
void tp_module_table_free(tp_module *mods, size_t n);
/* Adds a parameter record to mod: global shape of ndim dimensions, whole
 * (Replicate) until a plan slices it. */
tp_status tp_module_add_param(tp_module *mod, const char *suffix, tp_param_kind kind, int ndim,
                              const int64_t *shape);

/* The whole gradient of parameter j of mod (its global shape, f32) into
 * out, on every rank: the shards of all ranks put together (a collective:
 * every rank calls it for the same parameters in the same order). */
tp_status tp_model_grad_full(tp_model *m, const tp_module *mod, int j, float *out);

/* The same for the parameter's value (its local shard must be f32; a tied
 * parameter gives its owner's): what a trained model saves. */
tp_status tp_model_param_full(tp_model *m, const tp_module *mod, int j, float *out);
/* How many consecutive ranks of the TP mesh hold the same copy of
 * parameter j's local shard: 1 when it is this rank's alone (or there is
 * one rank), 0 when every rank holds it whole (replicated), n_rep for a
 * k/v head replicated over a KV subgroup — tp_train_param.replicas. */
int tp_model_param_replicas(const tp_model *m, const tp_module *mod, int j);

/* The TP process group of m (NULL: one process) and this rank in it. */
tp_group *tp_model_group(const tp_model *m);

/* ---- the collective safetensors writer (save_shards.c) ---------------- */

/* One tensor to save: its global name, stored dtype and shape, and this
 * rank's shard (local, of local_dtype, laid out as slice says). */
typedef struct {
    char name[160];
    tp_dtype dtype;                /* as stored in the file                 */
    int ndim;
    int64_t shape[TP_MAX_DIMS];    /* global                                */
    const void *local;
    tp_dtype local_dtype;
    tp_param_slice slice;          /* dim = -1: the whole tensor            */
    int writes;                    /* this rank writes these bytes (one rank per copy) */
    /* part != 0: local holds only the elements [part_start, part_start +
     * part_len) of the flat, row-major shard (a dp_shard chunk), and this
     * rank writes those (tp_slice_runs places them). */
    int part;
    int64_t part_start, part_len;
} tp_save_tensor;

/* Writes the tensors t[0..n) (the same list on every rank but for the
 * local fields) into dir as PREFIX.safetensors, or PREFIX-0000k-of-0000N
 * files and PREFIX.safetensors.index.json past max_shard_bytes (0: 5 GB),
 * laid out as huggingface_hub and safetensors lay them out (save_shards.c
 * says how).  Group rank `writer` creates the files; each rank writes the
 * shards it `writes`.  Collective over g (NULL: one process); fails alike
 * on every rank. */
tp_status tp_save_tensors(tp_group *g, int writer, const char *dir, const char *prefix, const tp_save_tensor *t,
                          size_t n, uint64_t max_shard_bytes);
/* File k of n_files of PREFIX, as tp_save_tensors names it. */
void tp_save_file_name(char *buf, size_t cap, const char *prefix, int k, int n_files);
/* A parameter of m as a tp_save_tensor stored in `dtype` under `name`,
 * its local data `local` (of local_dtype, shaped like the parameter's
 * shard: the value, or optimizer state beside it). */
void tp_model_save_tensor(const tp_model *m, const tp_module *mod, int j, const char *name, tp_dtype dtype,
                          const void *local, tp_dtype local_dtype, tp_save_tensor *out);

/* The dtype the model's file stores: cfg.dtype when bf16 or f16, else f32. */
tp_dtype tp_model_save_dtype(const tp_model *m);
/* tp_model_save_files with the caller's tensors (state-dict order, as
 * tp_model_save_tensor makes them) over the caller's group g, whose rank 0
 * creates the files and copies src_dir's config and tokenizer files: the
 * training checkpoint under dp_shard, where each rank holds chunks of its
 * TP shards and g spans dp_shard x tp. */
tp_status tp_model_save_list(tp_group *g, const tp_save_tensor *t, size_t n, const char *src_dir, const char *dir,
                             uint64_t max_shard_bytes);

/* *active = 1 when some rank of g has writer != 0: the one group (of
 * several data-parallel copies of the model) that saves.  Collective over
 * g (NULL: *active = writer != 0). */
tp_status tp_save_group_active(tp_group *g, int writer, int *active);

/* ---- collective atomic directories (save_dir.c) ----------------------- */

/* Rank `writer` of g creates the temporary directory of target (see
 * tp_atomic_dir_begin) and every rank gets its path in tmp.  Collective. */
tp_status tp_save_dir_begin(tp_group *g, int writer, const char *target, char *tmp, size_t cap);
/* Ends a save begun above with every rank's status s: all succeeded, the
 * writer commits (rename over target, or, into_existing, moves the
 * files into target); else the writer removes tmp.  Collective; the same
 * verdict on every rank. */
tp_status tp_save_dir_end(tp_group *g, int writer, const char *tmp, const char *target, int into_existing,
                          tp_status s);

size_t tp_model_module_count(const tp_model *m);
const tp_module *tp_model_module_at(const tp_model *m, size_t i);
/* Index of the module named `name`, or -1. */
int tp_model_module_find(const tp_model *m, const char *name);

#ifdef __cplusplus
}
#endif
#endif
