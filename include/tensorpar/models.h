/* tensorpar/models.h — decoder-only transformer models in Hugging Face's
 * layout: Llama (GQA, RoPE with llama3/linear scaling), Mistral (sliding
 * window), Qwen2 (q/k/v biases), Qwen3 (per-head q/k RMSNorm), and the
 * mixture-of-experts Qwen3-MoE and Mixtral (a router and stacked experts in
 * place of the MLP), DeepSeek-V2/V3 (latent attention) and Llama 4's text
 * model (chunked attention, NoPE layers, sigmoid-routed bmm-style experts).
 *
 * A model is loaded from a model directory (config.json + safetensors).  The
 * forward pass takes token ids and a KV cache and returns f32 logits;
 * weights stay in f32 or bf16, activations are f32. */
#ifndef TENSORPAR_MODELS_H
#define TENSORPAR_MODELS_H

#include "tensorpar/base.h"
#include "tensorpar/io.h"
#include "tensorpar/kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

struct tp_mesh;          /* dist.h */
struct tp_style_registry; /* parallel.h */
struct tp_plan;          /* parallel.h */
struct tp_module_tp;     /* a module's tensor-parallel state (models/tp_module.h) */
struct tp_model_tp;      /* the model's plan resolution and mesh */

typedef struct tp_module tp_module;              /* module.h */
typedef struct tp_layer_modules tp_layer_modules; /* module.h */

typedef struct tp_model {
    tp_model_config cfg;
    tp_dtype weight_dtype;         /* f32, bf16, q8_0 or q4_0 (the Linear weights; the
                                      embedding then stays as stored) */
    /* The model as a table of modules (module.h), in pre-order; lm_head
     * borrows embed_tokens' weight when tied. */
    tp_module *modules;
    size_t n_modules;
    tp_layer_modules *layers;      /* per layer: the indices of its modules */
    int embed_tokens, norm, lm_head;   /* indices into modules */
    struct tp_model_tp *tp;        /* NULL on a single rank without a plan */
    uint64_t bytes_read;           /* checkpoint bytes this rank read */
    double *inv_freq;              /* [head_dim / 2] */
    tp_threadpool *pool;
    /* Seconds this rank spent inside the TP styles' pre_forward and
     * post_forward hooks (the collectives, and waiting there for slower
     * ranks), summed over every forward since load; benchmarks read and
     * reset it. */
    double comm_seconds;
    struct tp_act_arena *acts;     /* the forward's activations (models/act_arena.c) */
    /* Under TP, prompts of 64 tokens or more do the residual add and norm
     * after o_proj and down_proj inside the all-reduce, each rank on its own
     * rows (forward.c); the logits are bitwise the same.  From
     * tp_model_options.fuse_norm (on by default). */
    int fuse_norm;
    tp_matmul_opts matmul;         /* every Linear's GEMM: tp_model_options.kernels */
    /* tp_model_forward_backward's loss: 0 = Hugging Face's, bit for bit
     * (under TP with a gathered colwise lm_head, row-parallel: no rank
     * gathers [T, V]); 1 = vocabulary-parallel (lm_head's output stays split on the
     * vocabulary, tp_cross_entropy_vocab_parallel).  Set it after loading. */
    int vocab_parallel_loss;
    /* tp_model_forward_backward keeps only each decoder layer's input (the
     * stream after its first residual add and that norm's output) and
     * recomputes the layer's forward inside its backward (Transformers'
     * gradient_checkpointing): losses and gradients bitwise the same, the
     * saved activations about a tenth.  Set it after loading. */
    int gradient_checkpointing;
    /* Called around every module's forward and backward inside the module
     * tree (module.h, tp_module_hooks), NULL: none.  Data parallelism's
     * ZeRO-3 (train/data_parallel.c) gathers a decoder layer's parameters
     * there and frees them after.  Set it after loading. */
    const struct tp_module_hooks *hooks;
    /* Called last by tp_model_free with on_free_ctx: what a loader above
     * models/ attached to the model (tp_model_from_pretrained's mesh and
     * world group, api.h).  NULL: nothing. */
    void (*on_free)(void *ctx);
    void *on_free_ctx;
    /* LoRA adapters on its Linear modules (tensorpar/lora.h); NULL: none. */
    struct tp_lora *lora;
    /* What tp_model_forward_backward keeps between steps (the saved
     * activations' arena, the KV cache, the logits), so that every step
     * after the first reuses resident pages (models/backward.c); NULL
     * until the first call. */
    struct tp_train_ws *train_ws;
} tp_model;

typedef struct {
    /* TP_F32, TP_BF16, TP_Q8_0 or TP_Q4_0 (inference only: the Linear weights
     * quantized at load, each rank its own shard), or TP_DTYPE_COUNT for
     * "as stored" (f16 becomes f32). */
    tp_dtype weight_dtype;
    int threads;                   /* 0 = 1 */
    /* pin_threads != 0: thread i of the pool runs on the (first_cpu + i)-th
     * allowed CPU, modulo their count (tp_threadpool_pin); 0: unpinned. */
    int pin_threads, first_cpu;
    int show_progress;             /* progress bar on stderr (terminal only) */
    /* Tensor parallelism: the 1-D TP mesh (NULL: one rank) and the plan:
     * `plan`, a plan object (tp_plan_parse, tp_plan_load, tp_plan_builtin,
     * or built with tp_plan_set; the model copies what it needs, so it may
     * be freed after loading), or else `tp_plan` ("auto" or NULL: the model
     * type's built-in plan; otherwise a JSON file).  Not both. */
    const struct tp_mesh *mesh;
    const struct tp_plan *plan;
    const char *tp_plan;
    /* Where the plan's style names are looked up: NULL for the default
     * registry.  It must outlive the model (the model keeps its styles). */
    const struct tp_style_registry *styles;
    /* Expert parallelism (§2.17, §2.18): the experts split over the TP
     * mesh's ranks, E/P whole experts each; "auto" (or no plan) is then the
     * model type's EP plan (tp_plan_builtin_ep). */
    int expert_parallel;
    /* Settings (tp_model_options_from_env fills them from TENSORPAR_*;
     * zero is each one's default). */
    tp_switch fuse_norm;           /* the fused add+norm above; default on  */
    tp_kernel_options kernels;     /* bf16_dot, blas; default both off     */
} tp_model_options;

/* Fills the settings of *o from the settings table — fuse_norm
 * (TENSORPAR_FUSE_NORM), kernels (TENSORPAR_BF16_DOT, TENSORPAR_BLAS) and
 * pin_threads (TENSORPAR_PIN, default on) — and leaves the other fields as
 * they are.  An unset variable gives its default.  A bad value is
 * TP_ERR_INVALID naming the variable, the value and what is allowed. */
tp_status tp_model_options_from_env(tp_model_options *o);

/* ---- parameters ------------------------------------------------------ */

/* OTHER: a bare parameter its module's own code uses (gpt_oss's attention
 * sinks): kept in f32, weight-decayed as Transformers' Trainer does for a
 * name without "bias" or "norm". */
typedef enum { TP_PARAM_WEIGHT, TP_PARAM_BIAS, TP_PARAM_NORM, TP_PARAM_EMBEDDING, TP_PARAM_OTHER } tp_param_kind;

typedef struct {
    char name[96];           /* Hugging Face name: model.layers.3.mlp.up_proj.weight */
    tp_param_kind kind;
    int ndim;
    int64_t shape[TP_MAX_DIMS];  /* global shape */
    tp_tensor *slot;         /* where the model keeps it (NULL without a model) */
    tp_module *module;       /* the module it belongs to (NULL without a model) */
    int module_index;        /* its index in the module table */
    int param_index;         /* its index in that module's params[] */
} tp_param_desc;

/* Every parameter of the model described by cfg, in checkpoint order: the
 * parameters of the module table (module.h) in its order.  With m != NULL
 * (its module table built) each entry points at its tensor slot.
 * lm_head.weight is absent when embeddings are tied.  Free *out with free(). */
tp_status tp_model_params(const tp_model_config *cfg, tp_model *m, tp_param_desc **out, size_t *n);
/* The tensors a Hugging Face checkpoint of cfg stores, names and shapes as
 * stored (slot and module NULL): tp_model_params for dense models; for
 * qwen3_moe, mixtral and deepseek one tensor per expert and projection instead of
 * the stacked expert tensors (and Mixtral's block_sparse_moe names), as
 * published checkpoints hold them (§6.1).  Free *out with free(). */
tp_status tp_model_checkpoint_params(const tp_model_config *cfg, tp_param_desc **out, size_t *n);

/* Loads a model.  Under TP the plan is resolved and validated before any
 * weight is read, then each rank reads only its own slices (shard-on-read). */
tp_status tp_model_load(tp_model **out, const char *model_dir, const tp_model_options *opt);
/* Writes m as the directory Transformers' save_pretrained writes, out_dir:
 * every parameter in the checkpoint's dtype (cfg.dtype: bf16, f16 or else
 * f32) under its HF name, as model.safetensors or, past max_shard_bytes,
 * model-0000k-of-0000N.safetensors and model.safetensors.index.json, the
 * bytes equal to the TP = 1 save of the same weights whatever the layout;
 * src_dir's config.json, generation_config.json and tokenizer files copied
 * unchanged.  Collective over the model's TP mesh: each rank writes its own
 * shards' bytes (save_shards.c), rank 0 creates the files.  Atomic: written
 * into ".OUT.tmp-<pid>" beside out_dir, fsynced, and renamed over it
 * (save_dir.c); a failure removes the temporary directory, leaves out_dir
 * as it was and fails on every rank with the failing rank's message. */
typedef struct {
    uint64_t max_shard_bytes;      /* 0: 5 GB, transformers' default        */
    /* out_dir holds other files (a training run's log and checkpoints): the
     * model's files are moved into it one by one, the previous model's files
     * removed first, instead of the whole directory being replaced. */
    int into_existing;
} tp_save_options;
tp_status tp_model_save_ex(tp_model *m, const char *src_dir, const char *out_dir, const tp_save_options *o);
/* tp_model_save_ex with into_existing set and the default shard size, by
 * the TP group that holds the job's writer rank (writer != 0 on exactly
 * one rank of the job, e.g. global rank 0): with data parallelism the
 * other replicas' TP groups hold the same model and return at once.  The
 * group's rank 0 creates the files. */
tp_status tp_model_save(tp_model *m, const char *src_dir, const char *out_dir, int writer);
/* The model's files only, into dir (existing, every rank sees it): the
 * collective part of tp_model_save_ex, for checkpoints that add files. */
tp_status tp_model_save_files(tp_model *m, const char *src_dir, const char *dir, uint64_t max_shard_bytes);
/* Bytes of tensor data this rank read from the checkpoint while loading. */
uint64_t tp_model_bytes_read(const tp_model *m);
void tp_model_free(tp_model *m);

/* One layer's keys and values for every position so far, f32. */
typedef struct {
    int64_t capacity, length;
    int64_t n_layers, head_dim;
    int64_t *n_kv;                 /* per layer: KV heads on this rank */
    float **k, **v;                /* per layer: [capacity, n_kv, head_dim] */
    int64_t *tokens;               /* [capacity] the ids behind each position */
} tp_kv_cache;

tp_status tp_kv_cache_init(tp_kv_cache *c, const tp_model *m, int64_t capacity);
void tp_kv_cache_release(tp_kv_cache *c);
void tp_kv_cache_reset(tp_kv_cache *c);
/* Keeps the longest cached prefix shared with `ids` (at most n - 1
 * positions, so that a forward pass still has a token to run) and returns
 * its length: a chat turn re-runs only what is new. */
int64_t tp_kv_cache_reuse_prefix(tp_kv_cache *c, const int64_t *ids, int64_t n);

/* Runs the T tokens at positions cache->length ... and appends their keys
 * and values.  Writes logits for every new position ([T, vocab]) when
 * all_logits is set, else only for the last ([vocab]).  Token ids outside
 * [0, vocab) are an error. */
tp_status tp_model_forward(tp_model *m, tp_kv_cache *cache, const int64_t *tokens, int64_t T,
                           float *logits, int all_logits);

/* ---- training: loss and gradients -------------------------------------- */

/* Allocates (first call) and zeroes every parameter's gradient
 * (tp_module_param.grad, f32, shaped like the local shard). */
tp_status tp_model_zero_grad(tp_model *m);

/* One forward and backward of Hugging Face's causal-LM loss on one
 * sequence of T tokens: labels (NULL: the tokens themselves) are shifted
 * inside, so logit t predicts labels[t + 1]; labels of -100 are ignored.
 * The loss is Σ over counted positions of -log p(label), divided by
 * `count` (<= 0: this sequence's counted positions), so that several
 * sequences accumulated with the same count give the mean over all of
 * them.  Under TP, when lm_head's plan splits it by columns and gathers
 * its output (colwise_gather_output), the default loss never gathers the
 * logits: tp_cross_entropy_row_parallel gives TP = 1's loss kernel whole
 * rows and the logits' gradient comes back to lm_head's column shard.
 * With m->vocab_parallel_loss no rank holds [T, V] logits either: each
 * computes its vocabulary shard's (lm_head's local GEMM, no gather), the
 * loss and those logits' gradient come from tp_cross_entropy_vocab_parallel
 * and lm_head's input gradient, a partial sum, is all-reduced (a Partial ->
 * Replicate move); refused when lm_head's weight is not split as
 * tp_chunk_range splits the vocabulary (or whole) or its input is not
 * replicated.  The gradients are ADDED to the parameters' (tp_model_zero_grad
 * first).  *loss_sum (the sum, not divided) and *counted may be NULL.
 * Under TP every rank calls it alike (the styles' backward hooks communicate). */
tp_status tp_model_forward_backward(tp_model *m, const int64_t *tokens, const int64_t *labels, int64_t T,
                                    double count, double *loss_sum, int64_t *counted);

/* ---- making models --------------------------------------------------- */

/* A config for `arch` from a preset name: tiny, small, qwen3-0.6b,
 * llama-3.2-1b, llama-3-8b (the last three copy the real models' configs). */
tp_status tp_preset_config(tp_model_config *cfg, tp_arch arch, const char *preset);

typedef struct {
    tp_dtype dtype;          /* stored weight dtype: f32 or bf16 */
    uint64_t seed;
    double std;              /* weights ~ N(0, std); default 0.02 */
    double qk_std;           /* q_proj/k_proj weights ~ N(0, qk_std) */
    double router_std;       /* MoE routers (mlp.gate) ~ N(0, router_std); <= 0: std */
    int shards;              /* 1 = model.safetensors; K > 1 = K shards + index */
    const char *tokenizer;   /* tokenizer.json or a folder with tokenizer files; may be NULL */
    int vocab_size_given;    /* cfg's vocab_size was chosen (--set vocab_size=N): keep it
                                exactly; it must cover the tokenizer.  Otherwise a
                                tokenizer larger than the preset's vocabulary raises it
                                to the tokenizer's size rounded up to a multiple of
                                TP_VOCAB_PAD, as published configs pad theirs. */
} tp_make_options;

/* Published configs pad the vocabulary (Llama 3: 128256, Qwen3: 151936)
 * to a multiple of 128. */
#define TP_VOCAB_PAD 128

/* Writes a random-weight model directory in Transformers' layout. */
tp_status tp_make_model(const tp_model_config *cfg, const tp_make_options *opt, const char *out_dir);

#ifdef __cplusplus
}
#endif
#endif
