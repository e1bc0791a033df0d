/* Vocabulary-parallel cross-entropy: tp_cross_entropy's loss and gradients
 * when each rank holds only its vocabulary shard of the logits, [T, V_local]
 * (Shard(1) of [T, V] over a 1-D mesh, torch.chunk's split), so that no rank
 * ever holds the full [T, V] matrix (Megatron's vocab-parallel loss).
 *
 * Per row, with z the full logits row and y its label:
 *   M   = max_i z_i             each rank's maximum of its shard, the P
 *                               maxima all-gathered ([P, T] Shard(0) ->
 *                               Replicate: dist has no Partial(max)) and
 *                               the largest taken locally;
 *   S   = Σ_i exp(z_i − M)      each rank's sum over its shard, Partial;
 *   z_y                         only the rank whose shard holds y puts it
 *                               in, the others 0, Partial;
 * S and z_y travel together as one [T, 2] Partial -> Replicate move, so a
 * call is two collectives whatever T is.  Then loss_t = M + log S − z_y and
 * dz_i = (exp(z_i − lse) − [i = y]) / count on this rank's columns, with
 * tp_cross_entropy's own row pieces (tp_cross_entropy_max, _sum_exp, _grad:
 * f32 exponentials, sums in double, the label's term in double) — only the order in which S's terms are added
 * differs, so the results agree to double rounding in S.
 *
 * Memory: besides the caller's [T, V_local] logits and dlogits (which may be
 * the same buffer), one scratch block of T·P floats (the gathered maxima),
 * T floats (this rank's maxima) and 2·T doubles (S and z_y, reduced in
 * place): 4·T·(P + 5) bytes, O(T·P), never O(T·V). */
#include "tensorpar/train.h"
#include "tensorpar/kernels.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    const float *logits;        /* [T, Vl]                                  */
    float *dlogits;             /* [T, Vl] or NULL                          */
    const int64_t *labels;      /* [T], global ids                          */
    int64_t T, Vl, v0;          /* this rank's columns: [v0, v0 + Vl)       */
    int P;
    float *local_max;           /* [T]                                      */
    const float *all_max;       /* [P, T]                                   */
    double *sums;               /* [T, 2]: S, z_y                           */
    double inv_count;
} vp_job;

/* Phase 1: each row's maximum over this rank's columns (-inf when the shard
 * is empty, which every other rank's maximum then beats). */
static void vp_local_max(void *p, int ti, int nt)
{
    const vp_job *j = p;
    int64_t b, e;
    tp_split_range(j->T, ti, nt, &b, &e);
    for (int64_t t = b; t < e; t++) {
        j->local_max[t] = tp_cross_entropy_max(j->logits + t * j->Vl, j->Vl, -INFINITY);
    }
}

static float row_max(const vp_job *j, int64_t t)
{
    float mx = j->all_max[t];
    for (int r = 1; r < j->P; r++)
        if (j->all_max[(int64_t)r * j->T + t] > mx) mx = j->all_max[(int64_t)r * j->T + t];
    return mx;
}

/* Whether row t's label lies in this rank's columns (ignored rows: never). */
static int owns(const vp_job *j, int64_t t)
{
    int64_t y = j->labels[t];
    return y != TP_IGNORE_INDEX && y >= j->v0 && y < j->v0 + j->Vl;
}

/* Phase 2: this rank's part of S and of z_y. */
static void vp_partial_sums(void *p, int ti, int nt)
{
    const vp_job *j = p;
    int64_t b, e;
    tp_split_range(j->T, ti, nt, &b, &e);
    for (int64_t t = b; t < e; t++) {
        double *s = j->sums + 2 * t;
        s[0] = s[1] = 0;
        if (j->labels[t] == TP_IGNORE_INDEX) continue;
        const float *z = j->logits + t * j->Vl;
        s[0] = tp_cross_entropy_sum_exp(z, j->Vl, row_max(j, t), 0);
        if (owns(j, t)) s[1] = z[j->labels[t] - j->v0];
    }
}

static double row_lse(const vp_job *j, int64_t t)
{
    return row_max(j, t) + log(j->sums[2 * t]);
}

/* Phase 3: the gradient of this rank's columns. */
static void vp_grad(void *p, int ti, int nt)
{
    const vp_job *j = p;
    int64_t b, e;
    tp_split_range(j->T, ti, nt, &b, &e);
    for (int64_t t = b; t < e; t++) {
        const float *z = j->logits + t * j->Vl;
        float *dz = j->dlogits + t * j->Vl;
        if (j->labels[t] == TP_IGNORE_INDEX) {
            memset(dz, 0, (size_t)j->Vl * sizeof(float));
            continue;
        }
        tp_cross_entropy_grad(dz, z, j->Vl, row_lse(j, t), j->inv_count, owns(j, t) ? j->labels[t] - j->v0 : -1);
    }
}

/* The checks every rank makes alike (labels and count are the same on every
 * rank), so all fail before any collective or none does. */
static tp_status vp_check(const int64_t *labels, int64_t T, int64_t V, double count, const tp_mesh *mesh)
{
    if (mesh && tp_mesh_ndim(mesh) != 1)
        return tp_fail(TP_ERR_INVALID, "vocab-parallel cross-entropy: takes a 1-D mesh (the TP sub-mesh), "
                       "not %d-D", tp_mesh_ndim(mesh));
    if (T < 0 || V < 1)
        return tp_fail(TP_ERR_INVALID, "vocab-parallel cross-entropy: %lld rows of a vocabulary of %lld",
                       (long long)T, (long long)V);
    return tp_cross_entropy_check_labels(labels, T, V, count, "vocab-parallel cross-entropy", NULL);
}

/* The two moves: the maxima all-gathered, then S and z_y summed. */
static tp_status vp_gather_max(const tp_mesh *mesh, vp_job *j, float *all_max)
{
    if (!mesh) {
        memcpy(all_max, j->local_max, (size_t)j->T * sizeof(float));
        return TP_OK;
    }
    int64_t shape[2] = {j->P, j->T};
    tp_placement sh = tp_shard(0), rep = tp_replicate();
    return tp_redistribute_local(mesh, TP_F32, 2, shape, &sh, j->local_max, &rep, all_max);
}

static tp_status vp_reduce_sums(const tp_mesh *mesh, vp_job *j)
{
    if (!mesh) return TP_OK;
    int64_t shape[2] = {j->T, 2};
    tp_placement part = tp_partial(), rep = tp_replicate();
    return tp_redistribute_local(mesh, TP_F64, 2, shape, &part, j->sums, &rep, j->sums);
}

size_t tp_cross_entropy_vocab_parallel_scratch(int64_t T, int P)
{
    return (size_t)T * ((size_t)P + 1) * sizeof(float) + (size_t)T * 2 * sizeof(double);
}

tp_status tp_cross_entropy_vocab_parallel(double *loss_sum, float *dlogits_local, const float *logits_local,
                                          const int64_t *labels, int64_t T, int64_t V, double count,
                                          const tp_mesh *mesh, tp_threadpool *pool)
{
    tp_status st = vp_check(labels, T, V, count, mesh);
    if (st) return st;
    if (T == 0) {   /* every rank alike: nothing to move */
        *loss_sum = 0;
        return TP_OK;
    }
    int P = mesh ? tp_mesh_size(mesh, 0) : 1, r = mesh ? tp_mesh_coord(mesh, 0) : 0;
    vp_job j = {logits_local, dlogits_local, labels, T, 0, 0, P, NULL, NULL, NULL, 0};
    tp_chunk_range(V, P, r, &j.v0, &j.Vl);
    /* One block: the sums first (8-byte aligned), then the maxima. */
    double *block = malloc(tp_cross_entropy_vocab_parallel_scratch(T, P));
    if (!block) return tp_fail(TP_ERR_NOMEM, "vocab-parallel cross-entropy: out of memory");
    j.sums = block;
    j.local_max = (float *)(block + 2 * T);
    float *all_max = j.local_max + T;
    j.all_max = all_max;
    tp_parallel_run(pool, vp_local_max, &j);
    st = vp_gather_max(mesh, &j, all_max);
    if (!st) {
        tp_parallel_run(pool, vp_partial_sums, &j);
        st = vp_reduce_sums(mesh, &j);
    }
    if (!st) {
        /* The same rows are counted on every rank, so every rank sums the
         * same doubles in the same order: the loss is replicated bitwise. */
        double sum = 0;
        int64_t counted = 0;
        for (int64_t t = 0; t < T; t++) {
            if (labels[t] == TP_IGNORE_INDEX) continue;
            sum += row_lse(&j, t) - j.sums[2 * t + 1];
            counted++;
        }
        j.inv_count = counted > 0 ? 1.0 / count : 0.0;
        if (dlogits_local) tp_parallel_run(pool, vp_grad, &j);
        *loss_sum = sum;
    }
    free(block);
    return st ? tp_fail_context(st, "vocab-parallel cross-entropy") : TP_OK;
}
