/* tensorpar/io.h — Hugging Face files: safetensors checkpoints (read on mmap,
 * read any slice, write), config.json, generation_config.json, and .npy output.
 *
 * A checkpoint is a model directory's set of safetensors files: either one
 * `model.safetensors` or K shards listed by `model.safetensors.index.json`.
 * Opening it validates every header strictly (sizes, JSON, dtype x shape =
 * byte count, offsets inside the data area, no overlaps, no duplicates) but
 * touches no tensor data; reads copy just the requested bytes out of the map.
 */
#ifndef TENSORPAR_IO_H
#define TENSORPAR_IO_H

#include "tensorpar/base.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- safetensors: reading --------------------------------------------- */

#define TP_ST_MAX_DIMS 8
/* Headers larger than this are refused before anything is allocated. */
#define TP_ST_MAX_HEADER_BYTES (100u * 1024u * 1024u)

typedef struct {
    const char *name;
    tp_dtype dtype;                 /* as stored in the file                */
    int ndim;
    int64_t shape[TP_ST_MAX_DIMS];
    uint64_t data_begin, data_end;  /* byte offsets within the data area   */
    int file;                       /* index into the checkpoint's files   */
} tp_st_info;

typedef struct tp_checkpoint tp_checkpoint;

/* `path` is a model directory (model.safetensors or the sharded index
 * model.safetensors.index.json inside it), a single .safetensors file, or an
 * index file (any path ending in ".index.json").  With an index, every shard
 * it names must exist and agree with it exactly (each listed tensor in its
 * shard, no unlisted tensor, no tensor in two shards); shard names must be
 * plain file names in the index's folder.  The index's own "metadata" object
 * is ignored.  Holes between tensors in a data area are allowed.
 *
 * After open the checkpoint is read-only but for the atomic byte counter, so
 * several threads may read from one checkpoint at once. */
tp_status tp_checkpoint_open(tp_checkpoint **out, const char *path);
void tp_checkpoint_close(tp_checkpoint *ck);

size_t tp_checkpoint_count(const tp_checkpoint *ck);
/* Tensors ordered by file, then by offset (the order that streams the files
 * front to back); NULL past the end.  Infos and names live until close. */
const tp_st_info *tp_checkpoint_at(const tp_checkpoint *ck, size_t i);
/* Binary search by name; NULL if absent (no error set). */
const tp_st_info *tp_checkpoint_find(const tp_checkpoint *ck, const char *name);
const char *tp_checkpoint_file_path(const tp_checkpoint *ck, int file);
/* The __metadata__ object's value for `key`, or NULL.  With shards, the
 * first shard that has the key wins. */
const char *tp_checkpoint_metadata(const tp_checkpoint *ck, const char *key);

/* Reads the whole tensor `name`, converted to `want`, into dst (which holds
 * numel * tp_dtype_size(want) bytes, aligned for `want`).  Conversion goes
 * straight from the map into dst, with tp_convert's rules (a float tensor
 * into an integer `want` is TP_ERR_UNSUPPORTED).  Errors name the file and
 * the tensor; a missing tensor is TP_ERR_INVALID. */
tp_status tp_checkpoint_read(tp_checkpoint *ck, const char *name, tp_dtype want, void *dst);

/* Reads the sub-range [start, start+len) of dimension `dim` (all of every
 * other dimension) as a dense tensor of the stored shape with shape[dim] =
 * len, converted to `want`.  Only the bytes of that range are touched. */
tp_status tp_checkpoint_read_slice(tp_checkpoint *ck, const char *name, int dim,
                                   int64_t start, int64_t len, tp_dtype want, void *dst);

/* Reads the elements [first, first + n) of the flattened (row-major)
 * tensor, converted to `want`: one run of a shard, or of a dp_shard chunk
 * of it (tp_slice_runs says where they are).  Only those bytes are
 * touched. */
tp_status tp_checkpoint_read_range(tp_checkpoint *ck, const char *name, int64_t first, int64_t n,
                                   tp_dtype want, void *dst);

/* Checks that `name` exists with exactly this shape; the error names the file,
 * the tensor, the expected and the found shape. */
tp_status tp_checkpoint_expect(const tp_checkpoint *ck, const char *name,
                               int ndim, const int64_t *shape);

/* tp_checkpoint_expect for a weight or optimizer state: the tensor must
 * also be stored in a floating-point dtype. */
tp_status tp_checkpoint_expect_weight(const tp_checkpoint *ck, const char *name,
                                      int ndim, const int64_t *shape);

/* Bytes of tensor data copied out of the files so far, counted in the stored
 * dtype (shard-on-read tests). */
uint64_t tp_checkpoint_bytes_read(const tp_checkpoint *ck);

/* ---- safetensors: writing --------------------------------------------- */

typedef struct {
    const char *name;
    tp_dtype dtype;        /* dtype of `data` and of the stored tensor */
    int ndim;
    const int64_t *shape;
    const void *data;
} tp_st_entry;

/* Writes one .safetensors file (tensors in the given order, 8-byte aligned
 * header, {"format": "pt"} metadata plus `metadata` pairs if given).
 * metadata_kv holds n_metadata (key, value) pairs flattened: k0, v0, k1, ...;
 * a "format" pair replaces the default.  Names must be distinct, non-empty and
 * not "__metadata__"; data may be NULL only for empty tensors.  Writes to
 * "<path>.tmp<pid>" and renames, so a failure never leaves a half file. */
tp_status tp_safetensors_write(const char *path, const tp_st_entry *entries, size_t n,
                               const char *const *metadata_kv, size_t n_metadata);
/* The first bytes of that file (the 8-byte length, the JSON header and its
 * padding) without the tensors' data (entries' data may be NULL): the data
 * area starts at *len, tensors back to back in the given order.  path only
 * names the file in errors.  Malloc'd into *out. */
tp_status tp_safetensors_header(const char *path, const tp_st_entry *entries, size_t n,
                                const char *const *metadata_kv, size_t n_metadata, char **out, size_t *len);

/* ---- Hugging Face config.json ----------------------------------------- */

typedef enum { TP_ARCH_LLAMA, TP_ARCH_MISTRAL, TP_ARCH_QWEN2, TP_ARCH_QWEN3, TP_ARCH_QWEN3_MOE, TP_ARCH_MIXTRAL,
               TP_ARCH_DEEPSEEK_V2, TP_ARCH_DEEPSEEK_V3, TP_ARCH_LLAMA4_TEXT, TP_ARCH_GPT_OSS } tp_arch;

typedef enum { TP_ROPE_DEFAULT, TP_ROPE_LLAMA3, TP_ROPE_LINEAR, TP_ROPE_YARN } tp_rope_kind;

typedef struct {
    tp_rope_kind kind;
    double factor;                          /* llama3, linear */
    double low_freq_factor, high_freq_factor;  /* llama3 */
    int64_t original_max_position_embeddings;  /* llama3, yarn */
    /* yarn (modeling_rope_utils' _compute_yarn_parameters): the ramp's
     * rotation bounds, and the attention factor that scales cos and sin —
     * attention_factor 0: derived from mscale / mscale_all_dim. */
    double beta_fast, beta_slow, mscale, mscale_all_dim, attention_factor;
    /* yarn, derived: the factor and original length the frequencies and
     * the attention factor use — max_position_embeddings over
     * original_max_position_embeddings when the config gives the latter
     * (0 there: absent), else factor and max_position_embeddings.  factor
     * itself stays the config's (V3's softmax mscale reads it). */
    double yarn_factor;
    int64_t yarn_original;
    /* yarn: find_correction_range's floor/ceil of the ramp's bounds
     * (Transformers' default true; gpt_oss's config sets it false). */
    int yarn_truncate;
} tp_rope_scaling;

#define TP_MAX_EOS 8
#define TP_MAX_MLP_ONLY 64
/* Per-layer flags (Llama 4's moe_layers and no_rope_layers) for up to this
 * many layers. */
#define TP_MAX_LAYER_FLAGS 256

typedef struct {
    tp_arch arch;
    char model_type[32];
    int64_t hidden_size, intermediate_size, num_hidden_layers;
    int64_t num_attention_heads, num_key_value_heads, head_dim;
    int64_t vocab_size, max_position_embeddings;
    double rms_norm_eps, rope_theta;
    tp_rope_scaling rope_scaling;
    int tie_word_embeddings;
    int attention_bias;      /* q/k/v/o biases (llama, mistral: attention_bias) */
    int qkv_bias;            /* q/k/v biases only (qwen2 always)               */
    int qk_norm;             /* per-head RMSNorm on q and k (qwen3)             */
    int64_t sliding_window;  /* 0 = none; mistral/qwen windows (see models.h)   */
    tp_dtype dtype;          /* "torch_dtype"/"dtype": the stored weight dtype  */
    int64_t bos_token_id;    /* -1 when absent */
    int64_t eos_token_ids[TP_MAX_EOS];
    int n_eos;
    /* Mixture of experts (qwen3_moe, mixtral; deepseek_v2/v3's routed
     * experts, n_routed_experts, below); num_experts = 0: dense.
     * num_experts reads qwen3_moe's `num_experts` or mixtral's
     * `num_local_experts` (aliases, §7.1); moe_intermediate_size is each
     * expert's width (mixtral: its intermediate_size).  Mixtral always
     * renormalises the top-k weights (norm_topk_prob = 1).  A qwen3_moe
     * layer l is sparse unless listed in mlp_only_layers or (l + 1) is not
     * a multiple of decoder_sparse_step (tp_config_layer_is_sparse). */
    int64_t num_experts, num_experts_per_tok, moe_intermediate_size, decoder_sparse_step;
    int norm_topk_prob;
    /* Transformers adds router_aux_loss_coef × the load-balancing loss to a
     * training loss only when this is set; tensorpar trains without it and
     * refuses a config that sets it (models/backward.c). */
    int output_router_logits;
    int n_mlp_only;
    int64_t mlp_only_layers[TP_MAX_MLP_ONLY];
    /* Multi-head latent attention (deepseek_v2, deepseek_v3; mla = 1).
     * head_dim is qk_rope_head_dim, the rotary part shared by all heads
     * (DeepseekV2Config sets it so); a query/key head is qk_nope_head_dim +
     * qk_rope_head_dim wide, a value head v_head_dim.  q_lora_rank 0 (null
     * in config.json): q_proj instead of q_a_proj -> q_a_layernorm ->
     * q_b_proj.  rope_interleave: deepseek_v3's rotation of interleaved
     * pairs (deepseek_v2 always rotates pairs).  Layers from
     * first_k_dense_replace on have MoE blocks (not built yet: refused). */
    int mla, rope_interleave;
    int64_t q_lora_rank, kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim;
    int64_t first_k_dense_replace;
    /* DeepSeek's MoE blocks (layers from first_k_dense_replace on; their
     * routed experts in num_experts, num_experts_per_tok,
     * moe_intermediate_size): n_shared_experts dense experts of that width
     * (shared_experts, one MLP n_shared_experts times wider) added to the
     * routed output; the routing weights times routed_scaling_factor.  V2
     * routes by softmax, topk_method greedy or group_limited_greedy (the
     * best expert of each of n_group groups picks topk_group groups);
     * V3 by sigmoid, choosing with e_score_correction_bias added (group
     * score: its two best), weights renormalised when norm_topk_prob. */
    int64_t n_shared_experts, n_group, topk_group;
    double routed_scaling_factor;
    int group_limited;       /* V2's topk_method = group_limited_greedy */
    /* gpt_oss: layer_types, one flag per layer (1: sliding_attention with
     * sliding_window, 0: full_attention; n_layer_types 0: absent, Transformers'
     * default alternation sliding, full, ...); each layer's attention has a
     * learned sink logit per head; the router is a Linear with a bias whose
     * top-k logits are softmaxed; the experts carry biases and run the
     * clamped SwiGLU (up + 1)·g·σ(swiglu_alpha·g) with g ≤ swiglu_limit and
     * |up| ≤ swiglu_limit. */
    int n_layer_types;
    unsigned char layer_sliding[TP_MAX_LAYER_FLAGS];
    double swiglu_alpha, swiglu_limit;
    /* Llama 4 (llama4_text; llama4 = 1).  Its MoE layers (moe_layers, or
     * every interleave_moe_layer_step-th) have num_experts bmm-style experts
     * of moe_intermediate_size (= intermediate_size), a sigmoid top-k
     * router that scales the experts' input, and a shared expert of that
     * width; the dense layers' MLP is intermediate_size_mlp wide.  RoPE
     * layers (rope_layer[l], no_rope_layers) rotate interleaved pairs,
     * L2-normalise q and k when l2_qk_norm (use_qk_norm) and attend within
     * chunks of attention_chunk_size (0: whole); NoPE layers scale q by
     * log1p(floor((pos + 1) / floor_scale)) * attn_scale + 1 when
     * attn_temperature_tuning. */
    int llama4, l2_qk_norm, attn_temperature_tuning;
    int64_t intermediate_size_mlp, interleave_moe_layer_step, attention_chunk_size, no_rope_layer_interval;
    double floor_scale, attn_scale;
    int n_moe_layers;        /* moe_layers given: the list's length (else -1) */
    unsigned char moe_layer[TP_MAX_LAYER_FLAGS];
    int n_rope_layers;       /* no_rope_layers given: its length (else -1)   */
    unsigned char rope_layer[TP_MAX_LAYER_FLAGS];
} tp_model_config;

/* Refuses a config tensorpar cannot train as Transformers would: an MoE
 * model with output_router_logits (its loss adds the router's auxiliary
 * load-balancing loss, which tensorpar does not compute). */
tp_status tp_config_check_training(const tp_model_config *c);

/* 1 when decoder layer l of cfg has a sparse MoE block instead of an MLP. */
int tp_config_layer_is_sparse(const tp_model_config *cfg, int64_t l);
/* 1 when decoder layer l rotates q and k (all but Llama 4's NoPE layers). */
int tp_config_layer_uses_rope(const tp_model_config *cfg, int64_t l);
/* The attention window of layer l as tp_attention takes it: the
 * sliding window (> 0; gpt_oss: on its sliding_attention layers only),
 * Llama 4's chunk on RoPE layers (as -chunk), or 0. */
int64_t tp_config_layer_window(const tp_model_config *cfg, int64_t l);

tp_status tp_arch_parse(const char *s, tp_arch *out);
const char *tp_arch_name(tp_arch a);
/* "LlamaForCausalLM", ... (architectures[0] of the model type). */
const char *tp_arch_class_name(tp_arch a);

/* Reads and validates DIR/config.json. Errors name the file and the key. */
tp_status tp_config_load(tp_model_config *cfg, const char *model_dir);
/* Fills derived fields (head_dim) and checks consistency. */
tp_status tp_config_validate(tp_model_config *cfg, const char *origin);
/* Applies "key=value" pairs (value is JSON; a bare word is a string) as if
 * the keys stood in config.json, then checks the resulting config once (so
 * the order of the pairs does not matter).  A key that config.json parsing
 * does not read is refused, with the list of those it does. */
tp_status tp_config_set_all(tp_model_config *cfg, const char *const *assignments, int n);
/* tp_config_set_all with one pair. */
tp_status tp_config_set(tp_model_config *cfg, const char *assignment);
/* Writes config.json in the layout Transformers writes. */
tp_status tp_config_save(const tp_model_config *cfg, const char *model_dir);

typedef struct {
    int64_t bos_token_id;
    int64_t eos_token_ids[TP_MAX_EOS];
    int n_eos;
    int do_sample;
    double temperature, top_p, min_p, repetition_penalty;
    int64_t top_k, max_new_tokens;
} tp_generation_config;

/* Defaults (greedy) overridden by DIR/generation_config.json if present. */
tp_status tp_generation_config_load(tp_generation_config *g, const char *model_dir,
                                    const tp_model_config *cfg);
tp_status tp_generation_config_save(const tp_generation_config *g, const char *model_dir);

/* ---- helpers ---------------------------------------------------------- */

/* Reads a whole file into a NUL-terminated malloc'd buffer. */
tp_status tp_read_file(const char *path, char **out, size_t *len);
/* Writes a whole file atomically (temp file + rename). */
tp_status tp_write_file_atomic(const char *path, const void *data, size_t len);

/* ---- directories written atomically (atomic_dir.c) --------------------
 *
 * A checkpoint directory DIR is written into ".DIR.tmp-<pid>" beside it
 * (tp_atomic_dir_begin creates it, after recovering from an earlier crash),
 * then tp_atomic_dir_commit fsyncs it and makes it DIR in one rename
 * (renameat2 RENAME_EXCHANGE over an existing DIR), so DIR is at every
 * moment either the previous complete directory or the new one.
 * tp_atomic_dir_abort removes the temporary directory. */
tp_status tp_atomic_dir_begin(const char *target, char *tmp, size_t cap);
tp_status tp_atomic_dir_commit(const char *tmp, const char *target);
void tp_atomic_dir_abort(const char *tmp);
/* Puts back a DIR left aside by a commit that crashed between its two
 * renames (filesystems without RENAME_EXCHANGE) and removes stale
 * temporary directories of DIR. */
tp_status tp_atomic_dir_recover(const char *target);
/* The same for every directory of parent (OUT before --resume latest). */
tp_status tp_atomic_dir_recover_all(const char *parent);
/* Writes a file (created or truncated) and fsyncs it. */
tp_status tp_write_file_synced(const char *path, const void *data, size_t len);
/* fsync of a file or directory by path. */
tp_status tp_fsync_path(const char *path);
/* Removes a file or a directory tree (best effort). */
void tp_remove_tree(const char *path);

/* Writes a float32 .npy (version 1.0, C order) atomically. */
tp_status tp_npy_write_f32(const char *path, const float *data, int ndim, const int64_t *shape);

#ifdef __cplusplus
}
#endif
#endif
