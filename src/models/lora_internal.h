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
    /* Dropout (training only): on for one sequence's forward and backward,
     * its masks keyed by drop_key (lora_dropout.c). */
    int drop_on;
    uint64_t drop_key;
};

/* A new, empty set for m with cfg's scale (cfg is moved into it). */
tp_status tp_lora_new(tp_model *m, tp_lora_config *cfg, struct tp_lora **out);
/* The placements of §9.6 for lin's adapter: which of A (dim 1) and B
 * (dim 0) is split like the base's weight; refuses another style. */
tp_status tp_lora_placement(const tp_model *m, const tp_module *lin, int *a_split, int *b_split);

/* Adapter tensor k (A then B of each adapted module, in module order):
 * its entry, module index and whether it is A; NULL past the last. */
lora_entry *tp_lora_entry_at(const struct tp_lora *l, size_t k, size_t *module, int *is_a);
/* The whole (unsplit) shape of e's A (is_a) or B. */
void tp_lora_global_shape(const tp_model *m, size_t module, const lora_entry *e, int is_a, int64_t shape[2]);

/* 1 when lin's adapter input is dropped out now (training, p > 0). */
int tp_lora_dropping(const tp_model *m);
/* out [T, in_local] = x with lin's dropout mask: x / (1 - p) where kept,
 * 0 where dropped (x == out is fine).  Each element's mask comes from
 * drop_key, the module's index and the element's global index
 * t · in + j (j in the base's whole input dimension), so every TP layout
 * draws the same mask for it, and a recomputation draws it again. */
tp_status tp_lora_dropout(const tp_model *m, const tp_module *lin, const lora_entry *e, const float *x, int64_t T,
                          float *out);

#endif
