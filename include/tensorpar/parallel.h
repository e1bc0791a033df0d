/* tensorpar/parallel.h — tensor-parallel styles and plans (tp-semantics.md
 * §2–§4, §7, §8).
 *
 *   style       a struct of hook functions plus bound options, registered by
 *               name in the style registry (§3).  At plan time a style says
 *               which placement each parameter gets (validate_param,
 *               shard_param); at run time it says what the module's forward
 *               does around its local computation (install_forward gives a
 *               declarative tp_forward_desc; pre_forward / post_forward
 *               execute it on DTensors through dist's redistribute).
 *   plan        an ordered list of (key, style name) rules (§4): the merged
 *               built-in plan of the model type, or a user's JSON object.
 *   resolution  the plan applied to the parameter table of a model config
 *               (tp_model_params) for a TP size: every parameter's rule,
 *               style and placement, every module's forward, the head
 *               layout, and the warnings.  It reads no weights, so every plan
 *               error comes before any weight is read (§5.6).
 *
 * Nothing here communicates: ranks resolve identically from identical
 * inputs, and tp_plan_digest() lets the caller check that they did (§4.4
 * step 9).
 */
#ifndef TENSORPAR_PARALLEL_H
#define TENSORPAR_PARALLEL_H

#include "tensorpar/base.h"
#include "tensorpar/dist.h"
#include "tensorpar/io.h"
#include "tensorpar/models.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- modules and parameters as styles see them (§2.3) ------------------ */

typedef enum {
    TP_MODULE_LINEAR,      /* weight [out, in], optional bias [out]      */
    TP_MODULE_EMBEDDING,   /* weight [V, H]                               */
    TP_MODULE_EXPERTS,     /* 3-D expert tensors (not in dense models)    */
    TP_MODULE_OTHER        /* norms, containers, attention modules        */
} tp_module_kind;

const char *tp_module_kind_name(tp_module_kind k);

/* A module as hooks see it.  Plan time fills the first block; the forward
 * pass adds the mesh and, for the rowwise family, the bias to add after the
 * reduction. */
typedef struct {
    const char *name;              /* qualified: "model.layers.0.mlp.up_proj" */
    tp_module_kind kind;
    int tp_size, tp_rank;
    const tp_model_config *cfg;
    /* forward time */
    const tp_mesh *mesh;           /* the TP mesh (1-D) or NULL             */
    const tp_tensor *bias;         /* rowwise family: added once after the all-reduce */
} tp_module_ctx;

/* A direct parameter of a module. */
typedef struct {
    const char *name;              /* qualified: "...up_proj.weight"          */
    const char *short_name;        /* last component: "weight", "bias"        */
    tp_param_kind kind;
    int ndim;
    const int64_t *shape;          /* global shape                            */
} tp_param_ctx;

/* 1 when the last name component is "bias" or ends in "_bias" (§2.3). */
int tp_param_is_bias_named(const char *short_name);

/* ---- forward descriptions (§2, §3.2) ----------------------------------- */

/* What an installed forward does, declaratively.  The forward pass executes
 * it as:
 *     x  <- input 0, declared `input`              (ids when ids_input)
 *     x  <- redistribute(x: input -> compute_input) (Replicate -> Shard(-1) =
 *           keep own chunk, no communication: rowwise_split_input)
 *     y  <- the module's own local computation on local shards, WITHOUT the
 *           bias when bias_after_reduce; ids outside the rank's vocabulary
 *           rows give zero rows when mask_vocab
 *     y  <- redistribute(y: local_output -> output) (Partial -> Replicate =
 *           all-reduce, Shard(-1) -> Replicate = all-gather)
 *     y  <- y + bias when bias_after_reduce
 * pre_forward / post_forward below do the two redistribute steps. */
typedef struct {
    int installed;                 /* 0: the module runs unchanged          */
    int ids_input;                 /* input 0 is token ids (Replicate)      */
    tp_placement input;            /* declared layout of input 0            */
    tp_placement compute_input;    /* layout the local computation consumes */
    tp_placement local_output;     /* layout of the local result            */
    tp_placement output;           /* layout handed to the next module      */
    int mask_vocab;                /* embedding_rowwise: MaskPartial lookup */
    int bias_after_reduce;         /* rowwise family                        */
    int use_local_tensors;         /* parameters seen as local shards       */
    int divide_params_by_p;        /* legacy `local`: parameters used ÷ P   */
    /* Styles that leave the layouts to the module ("input converted to
     * local", "output returned local": the legacy local styles, local_params,
     * gather's and all_reduce's input).  Plan resolution replaces their
     * layouts by the ones the model really gives the module (plan_flow.c),
     * so the executor never relabels an activation. */
    int input_from_model, output_from_model;
    /* 1 when post_forward is the default one: exactly the move local_output
     * -> output, then the bias when bias_after_reduce, nothing else.  Set by
     * tp_style_install_forward from the style (it has no
     * transform_output_post_forward of its own), so the model may carry out
     * that move in another form — the fused add+norm runs Partial ->
     * Replicate as Partial -> Shard(rows) -> Replicate — without knowing
     * the style's hooks. */
    int post_forward_moves;
    /* training-only markers (§1.6, §2.11): recorded, no forward effect */
    int allreduce_backward_input;  /* AllReduceBackward on input 0          */
    int param_grad_allreduce;      /* sum param grads over TP, exactly once */
    int inference_only;            /* legacy styles without backward        */
} tp_forward_desc;

/* ---- styles (§3) ------------------------------------------------------- */

typedef enum {
    TP_STYLE_OK = 0,               /* implemented                           */
    TP_STYLE_NOT_YET               /* registered, refused when a plan uses it (MoE, EP, MLA) */
} tp_style_support;

typedef struct {
    tp_placement input_layout, output_layout;
    int has_input_layout, has_output_layout;
    int use_local_output;
    int split_factor;              /* packed styles                         */
    int shard_dim;                 /* embedding styles                      */
    int sequence_dim;              /* sequence_parallel                     */
} tp_style_options;

typedef struct tp_style tp_style;

/* Every hook may be NULL, meaning its default (§3.2). */
struct tp_style {
    const char *name;              /* registered name (copied on register)  */
    const char *impl;              /* concept name: "ColwiseParallel"       */
    tp_style_options opt;
    tp_style_support support;
    int inference_only;            /* legacy: rejected for training (§2.19) */

    /* Reject a parameter this style cannot shard; `qualified_name` is the
     * name used in messages.  Default: accept. */
    tp_status (*validate_param)(const tp_style *st, const tp_module_ctx *mod,
                                const tp_param_ctx *p, const char *qualified_name);
    /* The parameter's placement (metadata only).  Default: Replicate. */
    tp_status (*shard_param)(const tp_style *st, const tp_module_ctx *mod,
                             const tp_param_ctx *p, tp_placement *out);
    /* Install the module's forward: fill *out.  Default: from opt, via the
     * pre / context / post hooks. */
    tp_status (*install_forward)(const tp_style *st, const tp_module_ctx *mod, tp_forward_desc *out);
    /* Bring input 0 into the layout the computation expects.  x is replaced
     * (its old buffer released) when its layout changes.  Default: execute
     * desc.input -> desc.compute_input. */
    tp_status (*transform_inputs_pre_forward)(const tp_style *st, const tp_module_ctx *mod,
                                              const tp_forward_desc *d, tp_dtensor *x);
    /* Enter / leave around the module's own forward.  Default: nothing
     * (tensorpar's kernels already run on local buffers). */
    tp_status (*context_enter)(const tp_style *st, const tp_module_ctx *mod, void **state);
    void (*context_leave)(const tp_style *st, const tp_module_ctx *mod, void *state);
    /* Reduce or redistribute the output (y arrives labelled
     * desc.local_output).  Default: execute desc.local_output -> desc.output,
     * then add mod->bias when bias_after_reduce. */
    tp_status (*transform_output_post_forward)(const tp_style *st, const tp_module_ctx *mod,
                                               const tp_forward_desc *d, tp_dtensor *y);
    /* Default: 1 for every built-in style that installs a forward. */
    int (*should_use_local_tensors)(const tp_style *st, const tp_module_ctx *mod);

    /* Backward (§3.4; src/parallel/style_backward.c).  The defaults are the
     * conjugates of the forward moves (tp_redistribute_backward), so a style
     * that states its layouts gets both directions.  Not called in the
     * forward path.
     * The output gradient arrives placed desc.output; leave it as the local
     * backward consumes it.  Default: backward of local_output -> output. */
    tp_status (*transform_grad_output_pre_backward)(const tp_style *st, const tp_module_ctx *mod,
                                                    const tp_forward_desc *d, tp_dtensor *gy);
    /* The input gradient arrives as the local backward left it
     * (tp_style_local_input_grad_layout); bring it to desc.input.
     * Default: backward of input -> compute_input. */
    tp_status (*transform_grad_input_post_backward)(const tp_style *st, const tp_module_ctx *mod,
                                                    const tp_forward_desc *d, tp_dtensor *gx);
    /* One parameter's gradient, as the local backward left it.  Default:
     * with param_grad_allreduce, a Partial sum all-reduced to Replicate;
     * otherwise nothing (it is already placed like its parameter). */
    tp_status (*reduce_param_grad_post_backward)(const tp_style *st, const tp_module_ctx *mod,
                                                 const tp_forward_desc *d, tp_dtensor *gw);

    void *user;                    /* free for custom styles               */
};

/* Calls a style's hook or its default.  These are what the model code calls. */
tp_status tp_style_validate_param(const tp_style *st, const tp_module_ctx *mod,
                                  const tp_param_ctx *p, const char *qualified_name);
tp_status tp_style_shard_param(const tp_style *st, const tp_module_ctx *mod,
                               const tp_param_ctx *p, tp_placement *out);
tp_status tp_style_install_forward(const tp_style *st, const tp_module_ctx *mod, tp_forward_desc *out);
tp_status tp_style_pre_forward(const tp_style *st, const tp_module_ctx *mod,
                               const tp_forward_desc *d, tp_dtensor *x);
tp_status tp_style_post_forward(const tp_style *st, const tp_module_ctx *mod,
                                const tp_forward_desc *d, tp_dtensor *y);
tp_status tp_style_context_enter(const tp_style *st, const tp_module_ctx *mod, void **state);
void tp_style_context_leave(const tp_style *st, const tp_module_ctx *mod, void *state);
int tp_style_use_local_tensors(const tp_style *st, const tp_module_ctx *mod);
/* The backward hooks or their defaults, in the order training calls them:
 * pre_backward on the output gradient, the module's local backward, then
 * post_backward on the input gradient and param_grad on each parameter's. */
tp_status tp_style_pre_backward(const tp_style *st, const tp_module_ctx *mod,
                                const tp_forward_desc *d, tp_dtensor *gy);
tp_status tp_style_post_backward(const tp_style *st, const tp_module_ctx *mod,
                                 const tp_forward_desc *d, tp_dtensor *gx);
tp_status tp_style_param_grad(const tp_style *st, const tp_module_ctx *mod,
                              const tp_forward_desc *d, tp_dtensor *gw);
/* The layout of the input gradient that the module's local backward
 * produces: Partial when a replicated input fed a sharded computation
 * (allreduce_backward_input), else desc.compute_input. */
tp_placement tp_style_local_input_grad_layout(const tp_forward_desc *d);

/* The built-in style templates (implementations bound to options); the
 * registry copies them.  Exposed so custom styles can start from one:
 *     tp_style s = *tp_style_lookup("colwise"); s.name = "colwise_custom"; */
const tp_style *tp_style_builtin(size_t i);   /* NULL past the end */

/* ---- the registry (§3.5) ----------------------------------------------- */

/* A registry is an ordered mapping name -> style instance.  The default
 * registry (process-wide, created once on first use from any thread) holds
 * the built-ins of §2.1 in order; tp_style_registry_new makes a registry
 * whose own mapping is layered over the default one, e.g. for one model
 * (tp_model_options.styles).  Every function taking a registry accepts NULL
 * for the default one.
 *
 * Registering copies the style (name included).  A new name is appended; an
 * existing name is replaced in place with no error, as Transformers'
 * ParallelInterface.register does (§3.5).  Registration and lookup are
 * thread-safe.  A replaced or deleted style is not freed until its registry
 * is: plans and models resolved earlier keep using the instance they
 * resolved.  A registry must therefore outlive the plans and models resolved
 * with it. */
typedef struct tp_style_registry tp_style_registry;
const tp_style_registry *tp_style_registry_default(void);
/* Registers in the default registry. */
tp_status tp_style_register(const tp_style *style);
/* Default-registry lookup; NULL when not found (no error set). */
const tp_style *tp_style_lookup(const char *name);

tp_status tp_style_registry_new(tp_style_registry **out);
/* Frees the registry and every style it ever held; no-op for NULL and for
 * the default registry. */
void tp_style_registry_free(tp_style_registry *v);
/* Its own mapping first, then the default one's; NULL when not found. */
const tp_style *tp_style_registry_get(const tp_style_registry *v, const char *name);
int tp_style_registry_contains(const tp_style_registry *v, const char *name);
/* Registers in v's own mapping (the style's name is set to `name`). */
tp_status tp_style_registry_set(tp_style_registry *v, const char *name, const tp_style *style);
/* Removes from v's own mapping only; TP_ERR_INVALID when not there. */
tp_status tp_style_registry_del(tp_style_registry *v, const char *name);
/* valid_keys(): the default registry's names in order, then v's additions. */
size_t tp_style_registry_count(const tp_style_registry *v);
const char *tp_style_registry_name(const tp_style_registry *v, size_t i);
/* "['embedding_rowwise', 'embedding_colwise', ...]" (malloc'd). */
char *tp_style_registry_names_repr(const tp_style_registry *v);
/* Restores the default registry to the built-ins and frees every style it
 * held (tests; no plan or model resolved with it may be alive). */
void tp_style_registry_reset(void);

/* ---- plans (§4.1, §4.2) ------------------------------------------------ */

typedef struct {
    char *key;
    char *style;        /* NULL when the JSON value is not a string           */
    char *value_json;   /* the value as printed in messages: 'colwise' or JSON */
} tp_plan_entry;

typedef struct tp_plan {
    tp_plan_entry *v;
    size_t n;
    int is_user;        /* from a user (keys that match nothing are warned)   */
} tp_plan;

void tp_plan_free(tp_plan *p);
/* Adds key -> style, or replaces the style of an existing key in place. */
tp_status tp_plan_set(tp_plan *p, const char *key, const char *style);
int tp_plan_find(const tp_plan *p, const char *key);          /* index or -1 */
tp_status tp_plan_copy(tp_plan *dst, const tp_plan *src);

/* 1 when the model type has a non-empty built-in base plan. */
int tp_plan_supports_tp(const tp_model_config *cfg);
/* The merged built-in TP plan of §4.2 (a fresh copy). */
tp_status tp_plan_builtin(const tp_model_config *cfg, tp_plan *out);
/* The merged EP plan; the dense model types have none (A9's error). */
tp_status tp_plan_builtin_ep(const tp_model_config *cfg, tp_plan *out);
/* Parses a user plan (JSON object text); `origin` names it in errors. */
tp_status tp_plan_parse(const char *json_text, const char *origin, tp_plan *out);
/* spec NULL or "auto": the built-in plan; otherwise a JSON file path. */
tp_status tp_plan_load(const char *spec, const tp_model_config *cfg, tp_plan *out);
/* The same, with expert_parallel: "auto" is the EP plan (tp_plan_builtin_ep). */
tp_status tp_plan_load_mode(const char *spec, const tp_model_config *cfg, int expert_parallel, tp_plan *out);

/* ep_router's post-transformation of the router output (§2.18), in place:
 * the top-k ids [T, k] of a global expert count E become this EP rank's
 * local ids, and every slot of an expert held elsewhere gets score 0 and
 * the sentinel id E / ep_size, which the experts skip. */
void tp_ep_router_remap(int32_t *ids, float *scores, int64_t T, int64_t k, int64_t E, int ep_rank, int ep_size);
/* The plan as a JSON object text, keys in order (malloc'd). */
char *tp_plan_to_json(const tp_plan *p);
/* "{'k': 'v', ...}" of the entries whose flag is set (all when used == NULL). */
char *tp_plan_repr(const tp_plan *p, const unsigned char *only);

/* ---- matching (§4.3) --------------------------------------------------- */

/* Replaces every all-digit path component by "*". */
void tp_plan_normalize(const char *name, char *out, size_t cap);
/* Index of the rule for parameter N = M.p (exact N, normalised N, exact M,
 * normalised M), or -1; *via_module says which level matched. */
int tp_plan_match_param(const tp_plan *p, const char *param_name, int *via_module);
/* Index of the rule for module M (exact, normalised), or -1. */
int tp_plan_match_module(const tp_plan *p, const char *module_name);

/* ---- resolution (§4.4, §4.5, §8) --------------------------------------- */

#define TP_PLAN_MAX_RANGES 8

/* One rank's slice of one parameter in global index space (§1.2, §6.2):
 * along `dim` the local tensor is the concatenation of the ranges
 * [start[i], start[i] + len[i]) in order; every other dimension is whole.
 * dim = -1: the whole tensor (Replicate). */
typedef struct {
    int dim;
    int n;
    int64_t start[TP_PLAN_MAX_RANGES], len[TP_PLAN_MAX_RANGES];
    int ndim;
    int64_t local_shape[TP_MAX_DIMS];
} tp_param_slice;

typedef struct {
    char name[96];
    tp_param_kind kind;
    int ndim;
    int64_t shape[TP_MAX_DIMS];
    int rule;                   /* plan entry index, -1 = none             */
    int via_module;             /* matched through its module's key        */
    const tp_style *style;      /* NULL = none                             */
    tp_placement placement;     /* normalised (non-negative dim)           */
    /* KV-head replication (§8.3): > 1 when this k/v projection tensor is
     * cut per KV head and each head is held by kv_rep consecutive ranks. */
    int kv_rep;
    int64_t head_dim;
    int tied_to;                /* index of the parameter it shares storage with, or -1 */
} tp_param_plan;

typedef struct {
    char name[96];              /* indexed module name                     */
    tp_module_kind kind;
    int rule;
    const tp_style *style;
    tp_forward_desc fwd;
    int64_t out_features;       /* width of the module's output (activation elements per token) */
} tp_module_plan;

typedef struct {
    int tp_size;
    int applied;                /* 0 when tp_size == 1 (validated, not applied) */
    tp_model_config cfg;
    tp_plan plan;               /* the active plan (a copy)                */
    tp_param_plan *params;      /* 1:1 with tp_model_params(cfg), same order */
    size_t n_params;
    /* With tied embeddings, lm_head.weight is not in the parameter table
     * but the lm_head module still runs on the shared tensor: its record is
     * here, tied_to = the embedding's index. */
    int has_tied_head;
    tp_param_plan tied_head;
    tp_module_plan *modules;    /* modules with a module-level rule, pre-order */
    size_t n_modules;
    /* heads (§8): per rank counts; kv_rep > 1 under KV replication */
    int64_t q_heads_per_rank, kv_heads_per_rank;
    int kv_rep;
    int heads_sharded;
    unsigned char *entry_used;  /* per plan entry: selected for something  */
    /* warnings, in the order of §4.4 / §4.6; NULL when none */
    char **pattern_warnings;    /* "Layer pattern '...' does not match ..." */
    size_t n_pattern_warnings;
    char *not_applied_warning;  /* "The following TP rules were not applied ..." */
    char *not_sharded_warning;  /* "The following layers were not sharded: ..." */
} tp_plan_resolution;

/* Resolves and validates `plan` for a model config and TP size, in §4.4's
 * order: style names (one error listing all), keys that match nothing
 * (warnings, user plans), validate_param of each matched parameter, styles
 * not supported for dense models, heads and KV heads, tied placements.
 * styles may be NULL (the default registry).  Prints nothing: see tp_plan_log_*. */
tp_status tp_plan_resolve(const tp_model_config *cfg, const tp_plan *plan, int tp_size,
                          const tp_style_registry *styles, tp_plan_resolution **out);
void tp_plan_resolution_free(tp_plan_resolution *r);
/* Whether the resolved plan can run on tensorpar's dense decoder (§1.3),
 * checked before any weight is read: every module's declared input is what
 * it receives, its local computation fits its shards, and the residual
 * stream, the attention heads and the logits come out as the model needs
 * them.  Fills in the layouts of the styles that leave them to the module
 * (the legacy local styles, local_params, gather's input).  Refusals name
 * the module, its style and why.  tp_plan_resolve checks a plan's rules;
 * this checks that they fit together (loading and `tensorpar plan` call
 * both). */
tp_status tp_plan_check_flow(tp_plan_resolution *r);

/* Rank r's slice of parameter i (i == n_params: the tied lm_head record). */
tp_status tp_plan_param_slice(const tp_plan_resolution *r, size_t i, int rank, tp_param_slice *out);

/* The elements [first, first + n) of the row-major local shard that sl
 * describes (of a tensor of global shape[ndim]) as runs contiguous in the
 * shard and in the global tensor: fn(ctx, local, global, count) per run,
 * element indices, in shard order, touching runs merged (slice_runs.c).
 * What a rank writes of a saved tensor, or reads back, when it holds a
 * range of its shard (a dp_shard chunk).  Stops at fn's first error. */
typedef tp_status (*tp_slice_run_fn)(void *ctx, int64_t local, int64_t global, int64_t count);
tp_status tp_slice_runs(int ndim, const int64_t *shape, const tp_param_slice *sl, int64_t first, int64_t n,
                        tp_slice_run_fn fn, void *ctx);
tp_status tp_plan_slice_of(const tp_plan_resolution *r, const tp_param_plan *p, int rank,
                           tp_param_slice *out);
/* The resolution entry of a parameter by name (the tied head included), or NULL. */
const tp_param_plan *tp_plan_find_param(const tp_plan_resolution *r, const char *name);
const tp_module_plan *tp_plan_find_module(const tp_plan_resolution *r, const char *name);
/* KV heads held by `rank`: global heads [*first, *first + *count). */
void tp_plan_kv_heads(const tp_plan_resolution *r, int rank, int64_t *first, int64_t *count);
/* Query heads held by `rank`. */
void tp_plan_q_heads(const tp_plan_resolution *r, int rank, int64_t *first, int64_t *count);
/* Vocabulary rows [*start, *start + *count) of rank r (chunk rule, §2.6). */
void tp_plan_vocab_range(const tp_plan_resolution *r, int rank, int64_t *start, int64_t *count);

/* A 64-bit digest of (parameter -> placement, module -> style): ranks
 * compare it to detect different plans (§4.4 step 9). */
uint64_t tp_plan_digest(const tp_plan_resolution *r);
/* The §4.7 message for disagreeing ranks a and b. */
tp_status tp_plan_fail_disagree(int rank_a, int rank_b);
/* §4.4 step 10: no inference-only legacy style may be active in training. */
tp_status tp_plan_check_training(const tp_plan_resolution *r);

/* Warnings via tp_log, printed only when global_rank == 0. */
void tp_plan_log_pattern_warnings(const tp_plan_resolution *r, int global_rank);
void tp_plan_log_coverage(const tp_plan_resolution *r, int global_rank);

/* ---- reports (tensorpar plan) ------------------------------------------ */

/* Bytes of parameters rank r holds with `dtype_size`-byte elements. */
uint64_t tp_plan_rank_bytes(const tp_plan_resolution *r, int rank, size_t dtype_size);

typedef struct {
    const char *module;         /* module name (from the resolution)       */
    tp_collective coll;         /* TP_COLL_ALL_REDUCE / ALL_GATHER / ...  */
    int64_t elements;           /* per token, f32                          */
} tp_plan_comm;

/* The forward collectives of one token, in module order (malloc'd). */
tp_status tp_plan_comms(const tp_plan_resolution *r, tp_plan_comm **out, size_t *n);

/* The human report of `tensorpar plan` (rank 0's view, noting where ranks
 * differ) and the same facts as one JSON document (malloc'd). */
tp_status tp_plan_report_text(const tp_plan_resolution *r, FILE *f);
char *tp_plan_report_json(const tp_plan_resolution *r);
/* Placement text: "Replicate()", "Shard(0)", "StridedShard(0, 2)". */
const char *tp_plan_placement_str(tp_placement p, char *buf, size_t cap);

#ifdef __cplusplus
}
#endif
#endif
