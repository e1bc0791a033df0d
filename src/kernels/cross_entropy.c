/* Cross-entropy over rows of logits, forward and backward in one pass, as
 * the causal-LM loss of Transformers needs it: labels of -100 are ignored,
 * and the loss is a sum that the caller divides by the number of counted
 * tokens — of the whole accumulated batch when it accumulates gradients
 * (Transformers >= 4.46), which is why the count is an argument.
 *
 * Per counted row with label y:
 *   loss_t = logsumexp(z) − z_y
 *   dz_i   = (softmax(z)_i − [i = y]) / count
 * logsumexp is max + log Σ exp(z − max) with the sum in double, so no
 * exponent overflows and the sum of V terms keeps its precision.  The
 * exponentials themselves are f32 (expf, ~1 ulp): with the vocabulary in
 * the hundreds of thousands they are most of the time of the loss, and a
 * double exp costs several times more for digits no f32 gradient keeps. */
#include "kernels/kern_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    float *dlogits;
    const float *logits;
    const int64_t *labels;
    int64_t T, V;
    double inv_count;
    double *row_loss;   /* [T]: summed in row order afterwards */
} ce_job;

float tp_cross_entropy_max(const float *z, int64_t n, float mx)
{
    for (int64_t i = 0; i < n; i++) if (z[i] > mx) mx = z[i];
    return mx;
}

double tp_cross_entropy_sum_exp(const float *z, int64_t n, float mx, double sum)
{
    for (int64_t i = 0; i < n; i++) sum += expf(z[i] - mx);
    return sum;
}

void tp_cross_entropy_grad(float *dz, const float *z, int64_t n, double lse, double inv_count, int64_t y)
{
    /* dz may be z: each element is read just before it is overwritten. */
    float lsef = (float)lse, inv = (float)inv_count, zy = y >= 0 ? z[y] : 0;
    for (int64_t i = 0; i < n; i++) dz[i] = expf(z[i] - lsef) * inv;
    if (y >= 0) dz[y] = (float)((exp((double)zy - lse) - 1.0) * inv_count);   /* the label's term, in double */
}

static double logsumexp(const float *z, int64_t V)
{
    float mx = tp_cross_entropy_max(z + 1, V - 1, z[0]);
    return mx + log(tp_cross_entropy_sum_exp(z, V, mx, 0));
}

static void ce_row(const ce_job *j, int64_t t)
{
    const float *z = j->logits + t * j->V;
    float *dz = j->dlogits ? j->dlogits + t * j->V : NULL;
    int64_t y = j->labels[t];
    if (y == TP_IGNORE_INDEX) {
        j->row_loss[t] = 0;
        if (dz) memset(dz, 0, (size_t)j->V * sizeof(float));
        return;
    }
    double lse = logsumexp(z, j->V);
    j->row_loss[t] = lse - z[y];
    if (dz) tp_cross_entropy_grad(dz, z, j->V, lse, j->inv_count, y);
}

static void ce_worker(void *p, int ti, int nt)
{
    const ce_job *j = p;
    int64_t b, e;
    tp_split_range(j->T, ti, nt, &b, &e);
    for (int64_t t = b; t < e; t++) ce_row(j, t);
}

tp_status tp_cross_entropy_check_labels(const int64_t *labels, int64_t T, int64_t V, double count, const char *who,
                                        int64_t *counted_out)
{
    int64_t counted = 0;
    for (int64_t t = 0; t < T; t++) {
        if (labels[t] == TP_IGNORE_INDEX) continue;
        if (labels[t] < 0 || labels[t] >= V)
            return tp_fail(TP_ERR_INVALID, "%s: label %lld of row %lld is outside [0, %lld) and not %d (ignored)",
                           who, (long long)labels[t], (long long)t, (long long)V, TP_IGNORE_INDEX);
        counted++;
    }
    if (counted > 0 && !(count > 0))
        return tp_fail(TP_ERR_INVALID, "%s: %lld counted tokens but a count of %g to divide by", who,
                       (long long)counted, count);
    if (counted_out) *counted_out = counted;
    return TP_OK;
}

tp_status tp_cross_entropy_rows(double *row_loss, float *dlogits, const float *logits, const int64_t *labels,
                                int64_t T, int64_t V, double inv_count, tp_threadpool *pool)
{
    ce_job j = {dlogits, logits, labels, T, V, inv_count, row_loss};
    tp_parallel_run(pool, ce_worker, &j);
    return TP_OK;
}

double tp_cross_entropy_sum(const double *row_loss, int64_t T)
{
    double sum = 0;
    for (int64_t t = 0; t < T; t++) sum += row_loss[t];
    return sum;
}

tp_status tp_cross_entropy(double *loss_sum, float *dlogits, const float *logits, const int64_t *labels,
                           int64_t T, int64_t V, double count, tp_threadpool *pool)
{
    int64_t counted = 0;
    tp_status st = tp_cross_entropy_check_labels(labels, T, V, count, "tp_cross_entropy", &counted);
    if (st) return st;
    double *row_loss = malloc((size_t)(T > 0 ? T : 1) * sizeof(double));
    if (!row_loss) return tp_fail(TP_ERR_NOMEM, "tp_cross_entropy: out of memory");
    tp_cross_entropy_rows(row_loss, dlogits, logits, labels, T, V, counted > 0 ? 1.0 / count : 0.0, pool);
    *loss_sum = tp_cross_entropy_sum(row_loss, T);
    free(row_loss);
    return TP_OK;
}
