/* tensorpar/lora.h — PEFT LoRA adapters on a (TP) base model
 * (tp-semantics.md §9.6).
 *
 * An adapter directory holds adapter_config.json and
 * adapter_model.safetensors as PEFT's save_pretrained writes them.  Each
 * targeted Linear gets y = base(x) + scale · B(A(x)), scale = alpha / r
 * (alpha / sqrt(r) with use_rslora), its adapter read shard-on-read with
 * the placements of §9.6: colwise base -> lora_B Shard(0) like the base's
 * rows; rowwise base -> lora_A Shard(-1) like the base's columns; a base
 * that is not split -> both whole. */
#ifndef TENSORPAR_LORA_H
#define TENSORPAR_LORA_H

#include "tensorpar/models.h"

#ifdef __cplusplus
extern "C" {
#endif

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
} tp_lora_config;

/* Reads DIR/adapter_config.json; refuses what tensorpar does not do
 * (bias other than "none", modules_to_save, rank/alpha patterns,
 * fan_in_fan_out).  Free with tp_lora_config_free. */
tp_status tp_lora_config_load(tp_lora_config *c, const char *dir);
void tp_lora_config_free(tp_lora_config *c);
/* 1 when the module named `name` is a target; -1 with tp_error() for a
 * regex that does not compile. */
int tp_lora_config_matches(const tp_lora_config *c, const char *name);
/* scale = alpha / r, or alpha / sqrt(r) with use_rslora. */
double tp_lora_config_scale(const tp_lora_config *c);

/* Attaches the adapter in dir to every targeted Linear of m (each rank
 * reads its shards).  merge != 0: folds scale · B·A into the local weight
 * shards instead (f32 weights only), so the adapter costs nothing per
 * token.  Every rank calls it alike; a refused module style is
 * `Unsupported tensor parallel plan '<name>' for LoRA state dict sharding.` */
tp_status tp_model_load_adapter(tp_model *m, const char *dir, int merge);

#ifdef __cplusplus
}
#endif
#endif
