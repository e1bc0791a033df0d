/* The inside of models/ (private): each module's style and shard, the
 * state of a forward pass, and the executor that runs a module's forward
 * through its style's hooks (tp-semantics.md §3.2): pre_forward -> local
 * computation -> post_forward.  All communication happens inside those
 * hooks, through dist's redistribute.  Each module kind has its file
 * (module_<kind>.c) with its ops table. */
#ifndef TP_MODELS_TP_MODULE_H
#define TP_MODELS_TP_MODULE_H

#include "tensorpar/dist.h"
#include "tensorpar/lora.h"
#include "tensorpar/models.h"
#include "tensorpar/module.h"
#include "tensorpar/parallel.h"

struct tp_module_tp {
    char name[96];                 /* "model.layers.0.self_attn.q_proj"  */
    tp_module_kind kind;
    const tp_module_plan *plan;    /* NULL: no module-level rule          */
    int64_t in_features, out_features;  /* global activation widths       */
    tp_param_slice weight_slice;   /* this rank's slice of the weight     */
    int kv_rep;                    /* > 1: k/v projection under KV-head replication */
    tp_placement out_pl;           /* its output's layout when it runs without hooks */
};

struct tp_model_tp {
    const tp_mesh *mesh;           /* 1-D TP mesh; NULL for validation only */
    int rank, size;
    tp_plan_resolution *res;
    /* the TP state of every Linear and Embedding (tp_module.tp points here) */
    struct tp_module_tp *modules;
    size_t n_modules;
};

/* An activation [T, width] of a feature dimension of `gwidth` columns, of
 * which this rank holds `width` under placement `pl` (Replicate or
 * Shard(1)); `data` is owned. */
typedef struct {
    float *data;
    int64_t T, width, gwidth;
    tp_placement pl;
} tp_act;

/* The forward's activation buffers, from the model's arena (act_arena.c,
 * which states who owns them and how long they live).  init sizes it at
 * load; begin reserves for a forward of T tokens whose head computes
 * head_rows rows, end rewinds it to empty; a block runs between a mark
 * and a rewind.  tp_act_free gives back only the latest buffer; the others
 * go at the next rewind. */
tp_status tp_act_arena_init(tp_model *m);
void tp_act_arena_free(tp_model *m);
tp_status tp_act_begin(tp_model *m, int64_t T, int64_t head_rows);
void tp_act_end(tp_model *m);
size_t tp_act_mark(const tp_model *m);
void tp_act_rewind(tp_model *m, size_t mark);
typedef struct {
    size_t capacity, used, peak;   /* bytes: the block, in use now, most ever */
    size_t spilled;                /* bytes taken outside the arena since load */
} tp_act_stats;
tp_act_stats tp_act_arena_stats(const tp_model *m);
float *tp_act_alloc(tp_model *m, int64_t floats);
void tp_act_free(tp_model *m, float *data);
void tp_act_release(tp_model *m, tp_act *a);
/* Global index of this rank's first column of a. */
int64_t tp_act_offset(const tp_model *m, const tp_act *a);

/* Resolves the plan (before any weight is read) and attaches each module's
 * TP state; m->cfg and the module table must exist. */
tp_status tp_model_tp_setup(tp_model *m, const tp_model_options *opt);
void tp_model_tp_free(tp_model *m);
/* This rank's slice of parameter i of the parameter table (whole when the
 * model is not split). */
tp_status tp_model_param_slice(const tp_model *m, size_t i, const tp_param_desc *p, tp_param_slice *out);

static inline const tp_tensor *tp_module_weight(const tp_module *mod) { return &mod->params[TP_MODULE_WEIGHT].local; }
/* A Linear's bias; data NULL when it has none. */
static inline const tp_tensor *tp_module_bias(const tp_module *mod) { return &mod->params[TP_MODULE_BIAS].local; }

/* The stored name of parameter `param` (Mixtral's router:
 * block_sparse_moe.gate; otherwise the name itself), moe_load.c. */
void tp_checkpoint_name_of(const tp_model_config *c, const char *param, char *out, size_t cap);
/* The stored name of projection `part` of expert e of layer `layer`
 * (model.layers.L.mlp.experts.e.gate_proj.weight, Mixtral's
 * block_sparse_moe.experts.e.w1.weight, ...). */
enum { TP_MOE_GATE, TP_MOE_UP, TP_MOE_DOWN };
void tp_moe_expert_name(const tp_model_config *c, int64_t layer, int64_t e, int part, char *out, size_t cap);
/* Saving (§6.4): the 3·E per-expert tensors of an experts module, in
 * checkpoint order, each described from this rank's part of the stacked
 * tensors (moe_save.c); out has room for them. */
size_t tp_moe_save_tensors(const tp_model *m, const tp_module *experts, tp_dtype dtype, tp_save_tensor *out);
/* Reads this rank's slice sl of an expert tensor p (gate_up_proj or
 * down_proj) from the per-expert tensors of the checkpoint into p->slot. */
/* 1 when the checkpoint stores an experts module as per-expert tensors
 * (qwen3_moe, mixtral, deepseek); 0 for gpt_oss and llama4_text, whose checkpoints hold
 * the 3-D tensors as the model does (loaded and saved as any parameter). */
int tp_moe_stored_per_expert(const tp_model_config *c);
tp_status tp_moe_load_experts(tp_checkpoint *ck, const tp_model_config *c, const tp_param_desc *p,
                              const tp_param_slice *sl, tp_dtype dt);

/* Builds m->modules, m->layers and the top-level indices from m->cfg
 * (params.c); the tensors are empty until loading. */
tp_status tp_model_build_modules(tp_model *m);
/* The ops table of a module type (NULL: a type not built yet). */
const tp_module_ops *tp_module_ops_of(tp_module_type type);
extern const tp_module_ops tp_container_ops, tp_decoder_layer_ops, tp_embedding_ops, tp_linear_ops,
    tp_norm_ops, tp_attention_ops, tp_mlp_ops, tp_moe_ops, tp_experts_ops, tp_mla_ops;

/* ---- mixture of experts (moe_router.c, module_moe.c, module_experts.c) -- */

/* The router's choice for each of T tokens from its logits [T, E]
 * (overwritten): softmax in f32 over all experts, the k largest
 * probabilities (ties: the lower id), divided by their sum when renorm.
 * ids, w: [T, k]. */
void tp_moe_route(float *logits, int64_t T, int64_t E, int64_t k, int renorm, int32_t *ids, float *w);
/* DeepSeek's routing of T tokens from the router logits [T, E]
 * (overwritten): V2 softmax / V3 sigmoid with e_score_correction_bias
 * (bias, [E], NULL: none) for the choice, the group limits, the routed
 * scaling factor (moe_router.c says which step is whose). */
tp_status tp_moe_route_deepseek(const tp_model_config *c, float *logits, int64_t T, const float *bias, int32_t *ids,
                                float *w);
/* Its backward: dw [T, k] the gradients of the weights (of the chosen
 * experts, ids as tp_moe_route gave them: global); dlogits [T, E]
 * (overwritten) those of the router's logits. */
void tp_moe_route_backward(const float *logits, int64_t T, int64_t E, int64_t k, int renorm, const int32_t *ids,
                           const float *dw, float *dlogits);
/* gpt_oss's routing (GptOssTopKRouter) from the logits [T, E] of the
 * router Linear (with its bias): the k largest logits, softmaxed over those
 * k; and its backward, dlogits [T, E] overwritten (k <= 256). */
void tp_moe_route_topk_softmax(float *logits, int64_t T, int64_t E, int64_t k, int32_t *ids, float *w);
void tp_moe_route_topk_softmax_backward(const float *logits, int64_t T, int64_t E, int64_t k, const int32_t *ids,
                                        const float *dw, float *dlogits);
/* DeepSeek's router backward (no gradient through the choice): logits as
 * the router gave them, ids and dw [T, k] the chosen experts (global) and
 * the gradient of their weights; writes dlogits [T, E]. */
void tp_moe_route_deepseek_backward(const tp_model_config *c, const float *logits, int64_t T, const int32_t *ids,
                                    const float *dw, float *dlogits);
/* A sparse block's routing as its experts see it: [T, k] ids (local under
 * expert parallelism, the sentinel for other ranks' experts) and weights. */
typedef struct {
    const int32_t *ids;
    const float *w;
    int64_t k;
} tp_moe_routing;
/* The experts' backward on their input x [T, H] and the block output's
 * gradient dy: the weight gradients accumulated, dx [T, H] += the input
 * gradient and dw [T, k] = the slots' weight gradients, both summed over
 * the ranks when the experts are split (module_experts.c). */
tp_status tp_moe_experts_backward(tp_model *m, const tp_module *experts, const tp_moe_routing *r, const float *x,
                                  const float *dy, int64_t T, float *dx, float *dw);
/* 1 when the experts of this sparse block are split on the expert
 * dimension (grouped_gemm): each rank holds whole experts. */
int tp_moe_expert_parallel(const tp_model *m, const tp_module *experts);
/* The intermediate width I of this rank's expert tensors (either layout). */
int64_t tp_moe_experts_width(const tp_model *m, const tp_module *experts);
/* Llama 4's routing (Llama4Router) of T tokens from the logits [T, E]: the
 * k largest logits (ties: the lower id), each weight the sigmoid of its
 * logit (the other experts' sigmoid(-inf) = 0 leave them out). */
void tp_moe_route_llama4(const float *logits, int64_t T, int64_t E, int64_t k, int32_t *ids, float *w);
/* Floats per token a sparse block's forward takes from the arena. */
int64_t tp_moe_block_bound(const tp_model *m, const tp_module *moe);

/* ---- multi-head latent attention (module_mla.c) --------------------------- */

/* The padded head width of MLA's queries, keys and values in the cache:
 * max(qk_nope_head_dim + qk_rope_head_dim, v_head_dim). */
int64_t tp_mla_head_dim(const tp_model_config *c);
/* Floats per token an MLA block takes from the arena besides its Linears. */
int64_t tp_mla_block_bound(const tp_model_config *c);
/* YaRN's attention factor, by which Transformers multiplies cos and sin
 * (1 without YaRN): attention_factor, else from mscale / mscale_all_dim. */
float tp_rope_attention_factor(const tp_model_config *c);

/* ---- the forward pass ---------------------------------------------------- */

/* What one forward pass allocates once and every layer reuses (forward.c). */
typedef struct {
    float *h;          /* [T, H] the normed residual stream, input of the next block */
    float *attn;       /* [T, heads * head_dim] attention output (local heads) */
    float *rope;       /* [T, head_dim] cos/sin of each position */
    int fused;         /* the fused add+norm (module_norm.c) runs in this pass */
} fwd_scratch;

/* ---- training: what the forward keeps for the backward (train_acts.c) ----
 * A training forward (tp_forward_pass.save != NULL) copies into one arena,
 * reserved once for T tokens from the config's widths, what each layer's
 * backward reads: the stream after each residual add and its norm, q and k
 * before Qwen3's norms, q/k/v after norm and rope, the attention output and
 * its log-sum-exp, gate and up before SwiGLU and its product.  They live
 * until tp_train_acts_free, after the backward. */
typedef struct {
    float *x_attn, *h_attn;        /* input_layernorm: stream after the add, its norm [T, H] */
    float *x_mlp, *h_mlp;          /* post_attention_layernorm                  */
    float *q_raw, *k_raw;          /* before q_norm/k_norm (NULL without them)  */
    float *q, *k, *v;              /* after norm and rope [T, heads * D]         */
    float *attn, *lse;             /* attention output [T, nq * D], lse [T, nq]  */
    float *gate, *up, *act;        /* [T, I]: before SwiGLU, and silu(gate)·up   */
    /* MLA (module_mla.c): q, k, v above are the padded [T, nh * Dp] rows the
     * attention kernel read, attn o_proj's input [T, nh * v_head_dim] */
    float *o_pad;                  /* the kernel's output [T, nh * Dp]           */
    float *q_lat, *q_latn;         /* q_a_proj's output and its norm [T, q_lora_rank] */
    float *kv_lat, *kv_latn;       /* the latent before and after kv_a_layernorm [T, kv_lora_rank] */
    int64_t nq, nkv, inter;        /* the local widths: heads, heads, features   */
} tp_saved_layer;

typedef struct {
    tp_arena *arena;               /* the model's (tp_train_ws), rewound by init and free */
    int64_t T;
    tp_saved_layer *layers;        /* [num_hidden_layers] */
    float *x_final, *h_final;      /* model.norm's input (after the add) and output */
    float *rope;                   /* the rope table of the pass [T, D]          */
} tp_train_acts;

/* Takes `arena` (kept by the caller across steps: its pages stay
 * resident) from empty, grown to fit T tokens if it must be. */
tp_status tp_train_acts_init(tp_train_acts *s, const tp_model *m, int64_t T, tp_arena *arena);
void tp_train_acts_free(tp_train_acts *s);
/* Frees m->train_ws (tp_model_free). */
void tp_model_train_ws_free(tp_model *m);
/* A copy of n floats of src in the arena (NULL: out of memory, reported). */
float *tp_train_save(tp_train_acts *s, const float *src, int64_t n);
/* The saved stream and norm slots of a stream norm module. */
void tp_train_norm_slots(const tp_model *m, const tp_module *norm, tp_train_acts *s, float ***x, float ***h);

/* The state the modules' forward ops share.  The stream: the embedding
 * writes x; a norm adds the pending block output (if any) to x and writes
 * sc.h = norm(x); attention and MLP read sc.h and leave their output
 * pending.  A lone Linear (lm_head) reads in [rows, in_width] into out. */
struct tp_forward_pass {
    tp_kv_cache *cache;
    const int64_t *tokens;
    int64_t T;
    tp_act x;                      /* the residual stream [T, H], replicated */
    tp_act pending;                /* a block's output not yet added (data NULL: none) */
    size_t block_mark;             /* the arena's mark after the stream: blocks rewind to it */
    fwd_scratch sc;
    const float *in;
    int64_t rows, in_width;
    tp_act out;
    tp_train_acts *save;           /* training forward: keep activations; NULL: inference */
    /* A sparse block's routing, for its experts (module_moe.c): [T, moe_k]
     * expert ids (local ones under expert parallelism) and weights. */
    const int32_t *moe_ids;
    const float *moe_w;
    int64_t moe_k;
};

/* The state the modules' backward ops share (backward.c runs them in
 * reverse table order).  dx is the gradient of the residual stream: a
 * stream norm adds its input gradient into it, and since the residual add
 * passes a gradient unchanged to both addends, a block (attention, MLP)
 * reads dx as the gradient of its output.  A block writes dh, the
 * gradient of the norm output it read, which that norm then consumes.  A
 * lone Linear (lm_head) reads dy [rows, out] and its saved input `in` and
 * writes dh. */
struct tp_backward_pass {
    const tp_train_acts *saved;
    /* Under m->gradient_checkpointing: the same activations, which a
     * decoder layer's backward refills by recomputing its forward (on the
     * pass's cache and tokens) and empties again. */
    tp_train_acts *acts;
    tp_kv_cache *cache;
    const int64_t *tokens;
    int64_t T;
    float *dx, *dh;                /* [T, H] */
    const float *dy, *in;
    int64_t rows;
};

/* The forward of tp_model_forward with every row's logits, keeping what
 * the backward needs in *save (reserved for T tokens).  logits NULL: no
 * lm_head (the vocabulary-parallel loss runs it on save->h_final);
 * head_local: lm_head's column shard [T, local columns] before its gather
 * (tp_module_linear_local; the row-parallel loss). */
tp_status tp_model_forward_train(tp_model *m, tp_kv_cache *cache, const int64_t *tokens, int64_t T, float *logits,
                                 int head_local, tp_train_acts *save);
/* Gradient checkpointing: decoder layer `layer`'s forward again from its
 * saved input (x_attn, h_attn), from self_attn on, keeping its
 * activations in *save as the training forward did (bitwise the same). */
tp_status tp_layer_recompute(tp_model *m, const tp_module *layer, tp_kv_cache *cache, const int64_t *tokens,
                             int64_t T, tp_train_acts *save);
/* lm_head's forward, the causal-LM loss and lm_head's backward in
 * vocabulary blocks (head_blocks.c), for a head weight kept in row blocks
 * (tp_module_rows_block > 0): h [T, H] the saved final norm output, labels
 * shifted, *loss_sum as tp_cross_entropy's, dh += the input gradient, the
 * weight's gradient through rows_grad; z scratch [T, block rows]. */
tp_status tp_head_blocks(tp_model *m, const float *h, const int64_t *labels, int64_t T, double count,
                         double *loss_sum, float *dh, float *z);
/* Runs the children of a container backward, last first. */
tp_status tp_module_run_children_backward(tp_model *m, const tp_module *mod, tp_backward_pass *b);
/* The gradient buffer of parameter j of mod (a tied one: its owner's),
 * f32 shaped like the local tensor; fails when tp_model_zero_grad has not
 * allocated it.  *g = NULL (TP_OK) while the base is frozen (LoRA training):
 * callers then skip the parameter's gradient. */
tp_status tp_module_grad(const tp_model *m, const tp_module *mod, int j, float **g);
/* A Linear's backward on input x [T, in] and output gradient dy [T, out]:
 * dW (and db) += …, dx += dy · W (dx NULL: not needed). */
tp_status tp_module_linear_backward(tp_model *m, const tp_module *lin, const float *dy, const float *x, int64_t T,
                                    float *dx);

/* Runs the children of a container in order. */
tp_status tp_module_run_children(tp_model *m, const tp_module *mod, tp_forward_pass *f);

/* ---- row-wise kernels over the pool (rows.c) -----------------------------
 * Each thread takes a contiguous range of rows: bitwise the same result for
 * any thread count. */
void tp_par_rmsnorm(tp_model *m, float *out, const float *x, const tp_tensor *w, int64_t rows, int64_t n);
void tp_par_add_rmsnorm(tp_model *m, float *x, const float *y, float *out, const tp_tensor *w, int64_t rows,
                        int64_t n);
void tp_par_rope(tp_model *m, float *x, int64_t T, int64_t heads, int64_t D, const float *table);
void tp_par_silu_mul(tp_model *m, float *a, const float *b, int64_t T, int64_t width);

/* ---- Linear modules (module_linear.c) ------------------------------------ */

/* The context a style's hooks see for module mt. */
tp_module_ctx tp_module_ctx_of(const tp_model *m, const struct tp_module_tp *mt, const tp_tensor *bias);
/* Takes the local buffer of a DTensor as an owned activation (no copy when
 * it is *mine). */
tp_status tp_act_take_local(tp_model *m, tp_dtensor *d, int64_t gwidth, float **mine, tp_act *y);

/* A Linear module on input x [T, x_width]. */
tp_status tp_module_linear(tp_model *m, const tp_module *lin, const float *x, int64_t T, int64_t x_width,
                           tp_act *y);
/* Modules reading the same input x (q, k, v; gate, up), run as one: each
 * through its own hooks, the local GEMMs of those whose pre_forward leaves
 * x in place in one call that packs x once.  ys[i] is lins[i]'s output;
 * the results are those of tp_module_linear on each.  At most 4. */
tp_status tp_module_linear_group(tp_model *m, const tp_module *const *lins, int count, const float *x, int64_t T,
                                 int64_t x_width, tp_act *ys);
/* 1 if the module's output is Partial made Replicate by a plain sum over
 * the (1-D) TP group: the default post_forward, no bias after the
 * reduction, the whole output width on every rank (rowwise o_proj and
 * down_proj).  The caller may then form that sum itself, by any collective
 * that adds the same terms in rank order. */
int tp_module_output_summed(const tp_model *m, const tp_module *lin);
/* Such a module without its post_forward: y is the rank's partial sum. */
tp_status tp_module_linear_partial(tp_model *m, const tp_module *lin, const float *x, int64_t T, int64_t x_width,
                                   tp_act *y);
/* 1 when lin's style computes a column shard of its output (local_output
 * Shard(1), the weight's rows as tp_chunk_range splits them) and its
 * default post_forward only all-gathers it to Replicate
 * (colwise_gather_output): the caller may then take the local shard
 * (tp_module_linear_local) and hand the local output gradient back
 * (tp_module_linear_backward_local), doing the move itself. */
int tp_module_output_gathers_columns(const tp_model *m, const tp_module *lin);
/* lin's forward without post_forward: its local_output shard written to
 * y [T, the weight shard's rows] (the caller's buffer, not the arena). */
tp_status tp_module_linear_local(tp_model *m, const tp_module *lin, const float *x, int64_t T, int64_t x_width,
                                 float *y);
/* tp_module_linear_backward with dy_local [T, local columns], the gradient
 * of what tp_module_linear_local gave (no pre_backward). */
tp_status tp_module_linear_backward_local(tp_model *m, const tp_module *lin, const float *dy_local, const float *x,
                                          int64_t T, float *dx);
/* The rule on a block (self_attn, mlp) whose hooks run on its output, or
 * NULL. */
const tp_module_plan *tp_module_block(const tp_model *m, const tp_module *block);
/* A block's output (o_proj's or down_proj's) through the block's own
 * post_forward: e.g. `gather` all-reduces what local styles left partial. */
tp_status tp_module_block_output(tp_model *m, const tp_module_plan *block, tp_act *y);
/* Its backward: dy [T, width], the gradient of the block's output (placed
 * as the rule's output), through the rule's pre_backward hook (the
 * conjugate of its post_forward: `all_reduce` / `gather`'s Partial ->
 * Replicate gives the same gradient to every rank's partial sum) to the
 * gradient of what the block's last projection produced.  *have: *gy holds
 * it (read gy->local.data; tp_dtensor_release after); 0: no rule, dy as is. */
tp_status tp_module_block_output_backward(tp_model *m, const tp_module_plan *block, const float *dy, int64_t T,
                                          int64_t width, tp_dtensor *gy, int *have);
/* A module whose output joins the residual stream (o_proj, down_proj) of
 * block `block`: replicated, or under the fused norm the rank's partial
 * sum. */
tp_status tp_module_linear_to_stream(tp_model *m, const tp_forward_pass *f, const tp_module *lin,
                                     const tp_module *block, const float *in, int64_t T, int64_t width, tp_act *y);

/* ---- norms (module_norm.c) ------------------------------------------------ */

/* The sequence_parallel rule on a norm of the residual stream, or NULL. */
const tp_module_plan *tp_module_norm_rule(const tp_model *m, const tp_module *norm);
/* h = norm(x) [T, width] under a sequence_parallel rule (§2.10): x, whole
 * on every rank, is redistributed to this rank's tokens (Shard along the
 * sequence, no communication), the norm runs on those rows only, and the
 * result is redistributed to Replicate for the consumers (an all-gather). */
tp_status tp_module_norm_sp(tp_model *m, const tp_module_plan *rule, const float *x, const tp_tensor *w,
                            int64_t T, int64_t width, float *h);
/* g, a norm's local weight gradient computed alone, through its rule's
 * param_grad hook if it has one (replicated_with_grad_allreduce sums it
 * over the ranks), added into the weight's gradient. */
tp_status tp_norm_add_weight_grad(tp_model *m, const tp_module *norm, float *g);
/* The width of the module's output on this rank, before running it. */
int64_t tp_module_out_width(const tp_model *m, const tp_module *lin);
/* The embedding lookup of T token ids (ids outside [0, vocab) are an error). */
tp_status tp_module_embedding(tp_model *m, const tp_module *emb, const int64_t *ids, int64_t T, tp_act *y);

/* ---- LoRA (lora.c) ---------------------------------------------------------- */

/* y [T, out_local] += scale · B(A(x)) when lin has an adapter: x is what
 * the module's local GEMM read (after pre_forward). */
tp_status tp_lora_apply(tp_model *m, const tp_module *lin, const float *x, int64_t T, float *y);
/* The same for an embedding's lookup y [T, width] of ids, before its post_forward. */
tp_status tp_lora_apply_embedding(tp_model *m, const tp_module *emb, const int64_t *ids, int64_t T, float *y);
void tp_lora_free(struct tp_lora *l);
/* Training: the adapter's gradients from the Linear's local operands (x
 * after pre_forward, dy after pre_backward), its input gradient added into
 * dx (NULL: not needed) before the base's post_backward (lora_train.c). */
tp_status tp_lora_backward(tp_model *m, const tp_module *lin, const float *x, const float *dy, int64_t T, float *dx);
/* 1 when parameter j of mod trains with the adapter (a modules_to_save
 * weight, a bias under `bias`) while the rest of the base is frozen
 * (lora_saved.c). */
int tp_lora_param_trained(const tp_model *m, const tp_module *mod, int j);
/* Allocates or zeroes the adapters' gradients. */
tp_status tp_lora_zero_grad(tp_model *m);
/* The embedding adapter's backward: dy [T, H] is the lookup's whole output
 * gradient (lora_train.c). */
tp_status tp_lora_backward_embedding(tp_model *m, const tp_module *emb, const int64_t *ids, const float *dy,
                                     int64_t T);
/* Partial -> Replicate in place: buf, this rank's addend of an f32 tensor
 * of shape, becomes the sum over m's mesh on every rank (module_linear.c). */
tp_status tp_sum_partial(tp_model *m, int ndim, const int64_t *shape, float *buf);
/* Under KV-head replication: g, this rank's rows sl (one range, dim 0) of a
 * [shape[0], shape[1]] gradient, becomes the sum of the same rows over the
 * ranks that hold them — the ranks of a KV subgroup (module_linear.c). */
tp_status tp_sum_kv_rows(tp_model *m, const tp_param_slice *sl, int ndim, const int64_t *shape, float *g,
                         const char *what);

#endif
