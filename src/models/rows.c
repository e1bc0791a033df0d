/* The element-wise kernels of the forward pass over the model's pool.
 * Norms, rope and the activation are row-wise (or element-wise), so each
 * thread takes a contiguous range of rows and calls the kernel on it: the
 * result is bitwise the same for any thread count.  With one thread, or a
 * single row (decode), the kernel runs directly on the caller. */
#include "tp_module.h"

#include "tensorpar/kernels.h"

typedef enum { ROWS_RMSNORM, ROWS_ADD_RMSNORM, ROWS_ROPE, ROWS_SILU_MUL } rows_op;

typedef struct {
    rows_op op;
    float *x, *out;            /* x: rmsnorm input / residual / rope target / silu's a */
    const float *y;            /* add_rmsnorm's addend, silu_mul's b */
    const tp_tensor *w;
    const float *table;        /* rope */
    int64_t rows, n;           /* n: row length (rope: heads; silu: elements per row) */
    int64_t head_dim;
    double eps;
} rows_job;

static void rows_range(const rows_job *j, int64_t b, int64_t e)
{
    int64_t r = e - b;
    if (r <= 0) return;
    switch (j->op) {
    case ROWS_RMSNORM: tp_rmsnorm(j->out + b * j->n, j->x + b * j->n, j->w, r, j->n, j->eps); break;
    case ROWS_ADD_RMSNORM:
        tp_add_rmsnorm(j->x + b * j->n, j->y + b * j->n, j->out + b * j->n, j->w, r, j->n, j->eps);
        break;
    case ROWS_ROPE:
        tp_rope_apply_table(j->x + b * j->n * j->head_dim, r, j->n, j->head_dim, j->table + b * j->head_dim);
        break;
    case ROWS_SILU_MUL: tp_silu_mul(j->x + b * j->n, j->y + b * j->n, r * j->n); break;
    }
}

static void rows_worker(void *p, int ti, int nt)
{
    const rows_job *j = p;
    int64_t b, e;
    tp_split_range(j->rows, ti, nt, &b, &e);
    rows_range(j, b, e);
}

/* Below this many floats a parallel region costs more than it saves. */
#define MIN_PARALLEL_FLOATS 16384

static void run_rows(tp_model *m, const rows_job *j)
{
    int64_t floats = j->rows * j->n * (j->op == ROWS_ROPE ? j->head_dim : 1);
    if (j->rows < 2 || floats < MIN_PARALLEL_FLOATS || tp_threadpool_size(m->pool) == 1) rows_range(j, 0, j->rows);
    else tp_parallel_run(m->pool, rows_worker, (void *)j);
}

void tp_par_rmsnorm(tp_model *m, float *out, const float *x, const tp_tensor *w, int64_t rows, int64_t n)
{
    rows_job j = {.op = ROWS_RMSNORM, .x = (float *)x, .out = out, .w = w, .rows = rows, .n = n,
                  .eps = m->cfg.rms_norm_eps};
    run_rows(m, &j);
}

void tp_par_add_rmsnorm(tp_model *m, float *x, const float *y, float *out, const tp_tensor *w, int64_t rows,
                        int64_t n)
{
    rows_job j = {.op = ROWS_ADD_RMSNORM, .x = x, .y = y, .out = out, .w = w, .rows = rows, .n = n,
                  .eps = m->cfg.rms_norm_eps};
    run_rows(m, &j);
}

void tp_par_rope(tp_model *m, float *x, int64_t T, int64_t heads, int64_t D, const float *table)
{
    rows_job j = {.op = ROWS_ROPE, .x = x, .table = table, .rows = T, .n = heads, .head_dim = D};
    run_rows(m, &j);
}

void tp_par_silu_mul(tp_model *m, float *a, const float *b, int64_t T, int64_t width)
{
    rows_job j = {.op = ROWS_SILU_MUL, .x = a, .y = b, .rows = T, .n = width};
    run_rows(m, &j);
}

