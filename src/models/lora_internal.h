/* The inside of LoRA (private to models/): the adapter of each module and
 * the set of them on a model (lora.c loads and runs them, lora_train.c
 * initialises and differentiates them, lora_save.c writes them). */
#ifndef TP_MODELS_LORA_INTERNAL_H
#define TP_MODELS_LORA_INTERNAL_H

#include "tensorpar/lora.h"
#include "tp_module.h"

typedef struct {
    /* f32 local shards.  Linear: A [r, in_local], B [out_local, r].
     * Embedding: A = lora_embedding_A [r, V_local], B = lora_embedding_B [H, r]. */
    tp_tensor A, B;
    tp_tensor gA, gB;              /* training: their gradients (f32, same shapes) */
    int embedding;
    tp_param_slice vocab;          /* embedding: the vocabulary ranges A holds (dim -1: all) */
    tp_param_slice a_slice, b_slice;  /* the ranges of A and B this rank holds (dim -1: whole) */
    char a_name[160], b_name[160]; /* PEFT's keys */
} lora_entry;

struct tp_lora {
    size_t n;                      /* m->n_modules */
    lora_entry **by_module;        /* NULL: no adapter on that module */
    float scale;
    int64_t r;
    int training;                  /* the base is frozen: only adapters get gradients */
    tp_lora_config cfg;            /* what adapter_config.json says (saved back) */
};

/* A new, empty set for m with cfg's scale (cfg is moved into it). */
tp_status tp_lora_new(tp_model *m, tp_lora_config *cfg, struct tp_lora **out);
/* The placements of §9.6 for lin's adapter: which of A (dim 1) and B
 * (dim 0) is split like the base's weight; refuses another style. */
tp_status tp_lora_placement(const tp_model *m, const tp_module *lin, int *a_split, int *b_split);

/* The placement of §9.6 for an embedding's adapter (keys, vocabulary
 * ranges of lora_embedding_A, B whole) into e; refuses another style. */
tp_status tp_lora_embedding_placement(const tp_model *m, const tp_module *emb, lora_entry *e);
/* The local column of an embedding adapter's A that holds token id v, or
 * -1 (another rank's). */
int64_t tp_lora_vocab_column(const lora_entry *e, int64_t v);

#endif
