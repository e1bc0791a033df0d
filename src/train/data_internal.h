/* Shared between the data loader's files (src/train/data*.c). */
#ifndef TP_TRAIN_DATA_INTERNAL_H
#define TP_TRAIN_DATA_INTERNAL_H

#include "tensorpar/train.h"

#include <cjson/cJSON.h>

/* A growable array of ids. */
typedef struct {
    int64_t *v;
    int64_t n, cap;
} tp_idvec;

tp_status tp_idvec_push(tp_idvec *a, const int64_t *ids, int64_t n);
void tp_idvec_release(tp_idvec *a);

/* One conversation (a JSON array of messages) through the chat template:
 * its ids and labels (same length; -100 outside the assistant's turns),
 * untruncated.  Errors say which message; the caller adds file and line. */
tp_status tp_data_chat_row(const tp_data_options *o, const cJSON *messages, tp_idvec *ids, tp_idvec *labels);

#endif
