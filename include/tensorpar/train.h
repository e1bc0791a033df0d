/* tensorpar/train.h — training: data, loss, optimizer, trainer loop. */
#ifndef TENSORPAR_TRAIN_H
#define TENSORPAR_TRAIN_H

#include "tensorpar/base.h"
#include "tensorpar/text.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- data -------------------------------------------------------------
 *
 * A training file becomes a dataset of fixed-length rows: input_ids[seq_len]
 * and labels[seq_len], labels -100 where no loss is counted.  The labels are
 * aligned with the inputs (labels[t] is the id at t, or -100): the causal-LM
 * shift happens in the loss, as in Transformers.  Formats (one kind per file):
 *
 *   .jsonl {"input_ids": [...]}  each line one row: truncated to seq_len, or
 *                                padded with pad_id (labels -100 there);
 *   .jsonl {"text": "..."}       tokenized (with special tokens), each
 *                                document followed by eos_ids[0], the stream
 *                                cut into seq_len rows; the tail that does
 *                                not fill a row is dropped (run_clm's
 *                                group_texts);
 *   .jsonl {"messages": [...]}   the chat template applied; each
 *                                conversation one row like input_ids; only
 *                                the assistant's tokens are counted
 *                                (data_chat.c says how they are found);
 *   any other file (.txt)        the whole file one document, packed like
 *                                text.
 *
 * Every refusal happens at load time and names the file and line. */

typedef struct {
    int64_t seq_len;
    int64_t vocab;                      /* ids must lie in [0, vocab) */
    /* eos_ids[0] separates packed documents; every one of them ends an
     * assistant turn (a chat model's end-of-turn token belongs here). */
    int64_t eos_ids[TP_MAX_EOS];
    int n_eos;
    int64_t pad_id;                     /* -1: eos_ids[0] */
    const tp_tokenizer *tok;            /* NULL: only input_ids files */
    const tp_chat_template *chat;       /* NULL: messages files refused */
} tp_data_options;

typedef struct {
    int64_t seq_len, n_rows;
    int64_t *ids;                       /* [n_rows, seq_len] */
    int64_t *labels;                    /* [n_rows, seq_len]; -100 = not counted */
} tp_dataset;

tp_status tp_dataset_load(tp_dataset *d, const char *path, const tp_data_options *o);
void tp_dataset_release(tp_dataset *d);

/* tokenizer_config.json's eos_token and pad_token as ids (-1 when absent or
 * not in the vocabulary); `dir` is a tokenizer or model directory. */
tp_status tp_data_special_ids(const char *dir, const tp_tokenizer *tok, int64_t *eos_id, int64_t *pad_id);

/* Labels that Transformers' causal-LM loss counts in one row: positions
 * t >= 1 with labels[t] != -100 (the first label has no prediction). */
int64_t tp_data_row_label_count(const int64_t *labels, int64_t seq_len);

/* The order in which rows are consumed, the same on every rank.
 * Each micro-batch holds batch_size rows of the whole job; replica r of R
 * takes rows [r*B/R, (r+1)*B/R) of it, so the union over replicas is the
 * single-replica micro-batch.  A step is grad_accum micro-batches (fewer at
 * the end of an epoch, as Trainer does); rows that do not fill a whole
 * micro-batch at the end of an epoch are skipped (drop_last).  With shuffle
 * each epoch e visits the rows in a permutation drawn from (seed, e). */
typedef struct {
    const tp_dataset *data;
    int64_t batch_size, grad_accum;
    int shuffle;
    uint64_t seed;
    int replica, n_replicas;
    int64_t micro_per_epoch, steps_per_epoch;
    int64_t epoch;                      /* of the cached permutation; -1 none */
    int64_t *perm;                      /* [n_rows] */
} tp_data_loader;

typedef struct {
    int64_t epoch;                      /* from 0 */
    int n_micro;                        /* micro-batches in this step */
    int64_t label_tokens;               /* counted labels of the whole step, all replicas */
} tp_data_step;

tp_status tp_data_loader_init(tp_data_loader *l, const tp_dataset *d, int64_t batch_size, int64_t grad_accum,
                              int shuffle, uint64_t seed, int replica, int n_replicas);
void tp_data_loader_release(tp_data_loader *l);
/* Step `step` (from 0; epochs follow each other). */
tp_status tp_data_loader_step(tp_data_loader *l, int64_t step, tp_data_step *out);
/* This replica's rows of micro-batch `micro` of step `step`: *n_rows rows
 * (dataset row indices written to rows[], room for batch_size), and its ids
 * and labels copied into ids/labels [n_rows, seq_len] when not NULL. */
tp_status tp_data_loader_micro(tp_data_loader *l, int64_t step, int micro, int64_t *rows, int64_t *n_rows,
                               int64_t *ids, int64_t *labels);

#ifdef __cplusplus
}
#endif
#endif
