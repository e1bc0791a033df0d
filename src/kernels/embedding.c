/* The token embedding: a row lookup forward, a scatter-add backward.
 *
 * Both take the rows of the table that this rank holds, vocabulary ids
 * [row0, row0 + rows), so that embedding_rowwise (a vocabulary split, spec
 * §2.6) runs them on its shard: ids outside the range look up zeros (the
 * all-reduce then adds the owner's row) and send no gradient.  With row0 = 0
 * and every row, they are the plain lookup and its gradient. */
#include "kernels/kern_internal.h"

#include <string.h>

void tp_embedding_forward(float *y, const tp_tensor *W, int64_t row0, const int64_t *ids, int64_t T)
{
    int64_t rows = W->shape[0], width = W->shape[1];
    for (int64_t t = 0; t < T; t++) {
        int64_t r = ids[t] - row0;
        if (r >= 0 && r < rows) tp_row_to_f32(y + t * width, W, r);
        else memset(y + t * width, 0, (size_t)width * sizeof(float));
    }
}

/* ---- backward ---------------------------------------------------------
 * dW[id − row0] += dy[t] for every t whose id is in range.  A token that
 * occurs several times adds each occurrence, in order of t: the threads
 * split the columns, never the tokens, so every element of dW receives its
 * sums in the same order whatever the thread count (bitwise reproducible,
 * which replicated parameters on different ranks rely on). */

typedef struct {
    float *dw;
    const int64_t *ids;
    const float *dy;
    int64_t row0, rows, width, T;
} embed_job;

static void embed_backward_worker(void *p, int ti, int nt)
{
    const embed_job *j = p;
    int64_t c0, c1;
    tp_split_range(j->width, ti, nt, &c0, &c1);
    for (int64_t t = 0; t < j->T; t++) {
        int64_t r = j->ids[t] - j->row0;
        if (r < 0 || r >= j->rows) continue;
        float *dst = j->dw + r * j->width;
        const float *src = j->dy + t * j->width;
        for (int64_t c = c0; c < c1; c++) dst[c] += src[c];
    }
}

void tp_embedding_backward(float *dw, int64_t row0, int64_t rows, int64_t width, const int64_t *ids,
                           const float *dy, int64_t T, tp_threadpool *pool)
{
    embed_job j = {dw, ids, dy, row0, rows, width, T};
    tp_parallel_run(pool, embed_backward_worker, &j);
}
