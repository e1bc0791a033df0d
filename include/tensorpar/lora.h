/* tensorpar/lora.h — PEFT LoRA adapters on a (TP) base model
 * (tp-semantics.md §9.6).
 *
 * An adapter directory holds adapter_config.json and
 * adapter_model.safetensors as PEFT's save_pretrained writes them.  Each
 * targeted Linear gets y = base(x) + scale · B(A(x)), scale = alpha / r
 * (alpha / sqrt(r) with use_rslora), its adapter read shard-on-read with
 * the placements of §9.6: colwise (and lm_head's colwise_gather_output)
 * base -> lora_B Shard(0) like the base's rows; rowwise base -> lora_A
 * Shard(-1) like the base's columns; embedding_rowwise ->
 * lora_embedding_A Shard(1) on the vocabulary; a base that is not split ->
 * both whole. */
#ifndef TENSORPAR_LORA_H
#define TENSORPAR_LORA_H

#include "tensorpar/models.h"
#include "tensorpar/module.h"

#ifdef __cplusplus
extern "C" {
#endif

/* adapter_config.json's `bias`: which base biases train with the adapter. */
typedef enum { TP_LORA_BIAS_NONE, TP_LORA_BIAS_ALL, TP_LORA_BIAS_LORA_ONLY } tp_lora_bias;

/* What adapter_config.json says (the fields tensorpar uses). */
typedef struct {
    int64_t r;
    double alpha, dropout;
    int use_rslora;
    /* target_modules: a list of names (a module matches when its name is
     * one of them or ends with "." + one of them), or a regex matched
     * against the whole module name (target_regex non-empty). */
    char **targets;
    int n_targets;
    char target_regex[512];
    /* modules_to_save: modules trained in full and saved whole with the
     * adapter (names matched as target_modules' list). */
    char **save;
    int n_save;
    tp_lora_bias bias;    /* "none" | "all" (every bias) | "lora_only" (the adapted modules') */
} tp_lora_config;

/* Reads DIR/adapter_config.json; refuses what tensorpar does not do
 * (rank/alpha patterns, fan_in_fan_out, DoRA).
 * Free with tp_lora_config_free. */
tp_status tp_lora_config_load(tp_lora_config *c, const char *dir);
void tp_lora_config_free(tp_lora_config *c);
/* A config from training options: rank r, alpha, dropout and a
 * comma-separated list of target names ("q_proj,v_proj"). */
tp_status tp_lora_config_make(tp_lora_config *c, int64_t r, double alpha, double dropout, const char *targets);
/* Sets `bias` from its name: "none", "all" or "lora_only". */
tp_status tp_lora_config_set_bias(tp_lora_config *c, const char *bias, const char *where);
/* Sets modules_to_save from a comma-separated list ("lm_head,score"). */
tp_status tp_lora_config_set_saved(tp_lora_config *c, const char *names);
/* 1 when the module named `name` is one of modules_to_save. */
int tp_lora_config_saves(const tp_lora_config *c, const char *name);
/* 1 when the module named `name` is a target; -1 with tp_error() for a
 * regex that does not compile. */
int tp_lora_config_matches(const tp_lora_config *c, const char *name);
/* TP_OK when a checkpoint's adapter config `saved` is what this run's
 * options made (`run`): r, alpha, dropout, targets, bias, modules_to_save;
 * else an error naming the first difference, prefixed by `where`. */
tp_status tp_lora_config_same(const tp_lora_config *run, const tp_lora_config *saved, const char *where);
/* scale = alpha / r, or alpha / sqrt(r) with use_rslora. */
double tp_lora_config_scale(const tp_lora_config *c);

/* Attaches the adapter in dir to every targeted Linear of m (each rank
 * reads its shards).  merge != 0: folds scale · B·A into the local weight
 * shards instead (f32 weights only), so the adapter costs nothing per
 * token.  Every rank calls it alike; a refused module style is
 * `Unsupported tensor parallel plan '<name>' for LoRA state dict sharding.` */
tp_status tp_model_load_adapter(tp_model *m, const char *dir, int merge);

/* ---- training (lora_train.c) ------------------------------------------ */

/* Attaches fresh adapters to every Linear and Embedding that cfg targets,
 * initialised as PEFT's init_lora_weights=True does: Linear A
 * Kaiming-uniform (a = sqrt(5): U(±1/sqrt(in))), B zeros; Embedding
 * lora_embedding_A zeros, lora_embedding_B N(0, 1).  Each random tensor is
 * drawn whole from `seed` and the module's index, so every rank and every
 * TP size holds the same values (§9.3) and keeps its shard.  cfg is moved
 * into the model. */
tp_status tp_model_lora_init(tp_model *m, tp_lora_config *cfg, uint64_t seed);
/* Freezes the base for training: from now on tp_model_zero_grad gives only
 * the adapters gradients, and the base's weights get none.  Fails without
 * adapters. */
tp_status tp_model_lora_train(tp_model *m);
/* 1 when the base is frozen (LoRA training). */
int tp_model_base_frozen(const tp_model *m);
/* 1 when parameter j of mod is frozen: the base is, and it is not one that
 * trains with the adapter (modules_to_save, a trained bias). */
int tp_model_param_frozen(const tp_model *m, const tp_module *mod, int j);
/* The adapters' tensors as trainable parameters, 2 per adapted module
 * (A then B), in module order: k in [0, count).  *replicas: 0 when every
 * rank holds it whole, 1 when split, kv_rep when split like a KV head that
 * kv_rep consecutive ranks hold (tp_train_param.replicas). */
size_t tp_model_lora_count(const tp_model *m);
tp_status tp_model_lora_tensor(tp_model *m, size_t k, const char **name, tp_tensor **value, tp_tensor **grad,
                               int *replicas);

/* Dropout on the adapters' input (PEFT's lora_dropout, §9.3): on (and
 * only when training with p > 0) for the forward and backward of the
 * sequence that follows, with masks keyed by (seed, step, row): seed
 * shared by all ranks, step the optimizer step (from 0), row the
 * sequence's index in the dataset, so every TP and data-parallel layout
 * draws the same masks, and a resumed run the ones of an unbroken one.
 * on == 0: no dropout (evaluation, inference).  lora_dropout.c. */
void tp_model_lora_dropout_key(tp_model *m, int on, uint64_t seed, int64_t step, int64_t row);

/* ---- saving (lora_save.c) ---------------------------------------------- */

/* Writes the adapters into out_dir as PEFT's save_pretrained does:
 * adapter_model.safetensors (F32, PEFT's keys, the whole tensors: equal to
 * the TP = 1 save) and adapter_config.json.  Collective over the model's
 * TP group; rank 0 creates the files; atomic (save_dir.c). */
tp_status tp_model_save_adapter(tp_model *m, const char *out_dir);
/* The same two files written into the existing directory dir (a training
 * checkpoint's, which its caller commits).  Collective; rank 0 writes. */
tp_status tp_model_save_adapter_files(tp_model *m, const char *dir);

/* ---- checkpoints: state shaped like the adapter tensors ----------------- */

/* A tensor laid out as adapter tensor k's local shard (`local`, f32),
 * named `name`, described for the collective writer (whole shape, the
 * shard's slice, one writer per copy), as its value is saved. */
tp_status tp_model_lora_save_tensor(const tp_model *m, size_t k, const char *name, const float *local,
                                    tp_save_tensor *out);
/* Tensor `name` of ck, shaped like adapter tensor k, read shard-on-read
 * into dst (this rank's shard of it, f32). */
tp_status tp_model_lora_read_tensor(const tp_model *m, size_t k, tp_checkpoint *ck, const char *name, float *dst);

#ifdef __cplusplus
}
#endif
#endif
