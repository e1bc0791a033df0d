/* The inside of LoRA (private to models/): the adapter of each module and
 * the set of them on a model (lora.c loads and runs them, lora_train.c
 * initialises and differentiates them, lora_save.c writes them). */
#ifndef TP_MODELS_LORA_INTERNAL_H
#define TP_MODELS_LORA_INTERNAL_H

#include "tensorpar/lora.h"
#include "tp_module.h"
#include "tensorpar/io.h"
#include "tensorpar/module.h"

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
    /* the base parameters trained with the adapter (lora_saved.c):
     * saved[i] bit j for parameter j of module i (NULL: none), and their
     * PEFT keys in module, parameter order */
    unsigned char *saved;
    char (*saved_keys)[200];
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

/* Reads `name` [rows, cols] (global) into dst (f32, local: its shape):
 * whole, or the ranges of sl along sl->dim (0 or 1) when split. */
tp_status tp_lora_read_into(tp_checkpoint *ck, const char *name, int64_t rows, int64_t cols, const tp_param_slice *sl,
                            int split, const int64_t local[2], float *dst);
/* The same into a new f32 tensor t. */
tp_status tp_lora_read_shard(tp_checkpoint *ck, const char *name, int64_t rows, int64_t cols,
                             const tp_param_slice *sl, int split, tp_tensor *t);

/* ---- modules_to_save (lora_saved.c) ---- */
/* Marks the modules that l->cfg saves (refusing those it cannot), and with
 * ck reads their saved weights over the base shards; *used (may be NULL)
 * gains the tensors read. */
tp_status tp_lora_saved_attach(tp_model *m, struct tp_lora *l, tp_checkpoint *ck, size_t *used);
/* Training them needs f32 weights. */
tp_status tp_lora_saved_check_training(const tp_model *m);
/* The saved parameters as trainable tensors, k in [0, count): after the
 * adapters' in tp_model_lora_tensor's order. */
size_t tp_lora_saved_count(const tp_model *m);
tp_status tp_lora_saved_tensor(tp_model *m, size_t k, const char **name, tp_tensor **value, tp_tensor **grad,
                               int *replicas);
tp_status tp_lora_saved_zero_grad(tp_model *m);
/* The k-th saved parameter for the collective writer, under `name` with
 * the values `local` (its shard's layout). */
void tp_lora_saved_describe(const tp_model *m, size_t k, const char *name, const void *local, tp_save_tensor *t);
/* Reads `name`, shaped like the k-th saved parameter, into dst (f32, its
 * shard): its optimizer state on resume. */
tp_status tp_lora_saved_read(const tp_model *m, size_t k, tp_checkpoint *ck, const char *name, float *dst);

/* The placement of §9.6 for an embedding's adapter (keys, vocabulary
 * ranges of lora_embedding_A, B whole) into e; refuses another style. */
tp_status tp_lora_embedding_placement(const tp_model *m, const tp_module *emb, lora_entry *e);
/* The local column of an embedding adapter's A that holds token id v, or
 * -1 (another rank's). */
int64_t tp_lora_vocab_column(const lora_entry *e, int64_t v);

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
