/* The packed f32 GEMM driver: C[m, n] (+)= A[m, k] · B[k, n], BLIS-style.
 *
 * Loop nest, per thread (its own rectangle of C):
 *   jc: NC columns   — B panel [kc][nc] packed once, read from L2/L3
 *   pc: KC depth     — in order from 0: the summation order is fixed
 *   ic: MC rows      — A block [mc][kc] packed once, kept in L2
 *   jr, ir: MR × NR  — the micro-kernel, its B micro-panel [kc][NR] in L1
 * The micro-kernel (gemm_avx2.c, gemm_avx512.c) sums one KC block of each
 * output element from zero in k order and then adds it to C (or stores it
 * for the first block when not accumulating).  Every element therefore gets
 * the same chain of operations whatever tile, thread or row of a tile it
 * falls in: threads split C only, so results are bitwise equal for any
 * thread count.
 *
 * The operands are strided views (element (i, j) at p[i·rs + j·cs]), which
 * covers the three products a Linear needs without copies:
 *   forward  y = x·Wᵀ :  A = x (rs k, cs 1), B = Wᵀ (rs 1, cs k)
 *   dx += dy·W        :  A = dy (rs n, cs 1), B = W (rs k, cs 1)
 *   dW += dyᵀ·x       :  A = dyᵀ (rs 1, cs n), B = x (rs k, cs 1)
 * B may be bf16; it is widened to f32 while packing, so products stay exact. */
#include "kernels/kern_internal.h"

#include <string.h>

static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
static int64_t round_up(int64_t a, int64_t b) { return (a + b - 1) / b * b; }

/* ---- packing ----------------------------------------------------------- */

/* A[i0:i0+mc, p0:p0+kc] → micro-panels [mc/mr][kc][mr], rows past mc zero. */
static void pack_a(float *dst, const tp_gemm_operand *a, int64_t i0, int64_t mc, int64_t p0, int64_t kc, int mr)
{
    const float *src = a->p;
    for (int64_t ib = 0; ib < mc; ib += mr) {
        float *d = dst + ib * kc;
        int rows = (int)min64(mr, mc - ib);
        if (a->cs == 1) {   /* rows contiguous in p: one row at a time, strided stores */
            for (int i = 0; i < mr; i++) {
                if (i < rows) {
                    const float *s = src + (i0 + ib + i) * a->rs + p0;
                    for (int64_t p = 0; p < kc; p++) d[p * mr + i] = s[p];
                } else {
                    for (int64_t p = 0; p < kc; p++) d[p * mr + i] = 0.0f;
                }
            }
        } else {   /* columns: mr elements of one p at a time */
            for (int64_t p = 0; p < kc; p++) {
                const float *s = src + (p0 + p) * a->cs + (i0 + ib) * a->rs;
                for (int i = 0; i < rows; i++) d[p * mr + i] = s[i * a->rs];
                for (int i = rows; i < mr; i++) d[p * mr + i] = 0.0f;
            }
        }
    }
}

static float load_b(const tp_gemm_operand *b, int64_t off)
{
    return b->dt == TP_F32 ? ((const float *)b->p)[off] : tp_f32_from_bf16(((const uint16_t *)b->p)[off]);
}

/* One micro-panel: B[p0:p0+kc, j0:j0+cols] → dst[kc][nr], columns past
 * cols zero. */
static void pack_b_panel(float *dst, const tp_gemm_operand *b, int64_t p0, int64_t kc, int64_t j0, int cols, int nr)
{
    if (b->cs == 1 && cols == nr) {   /* a row of nr contiguous elements per p */
        for (int64_t p = 0; p < kc; p++) {
            int64_t off = (p0 + p) * b->rs + j0;
            float *d = dst + p * nr;
            if (b->dt == TP_F32) {
                memcpy(d, (const float *)b->p + off, (size_t)nr * sizeof(float));
            } else {
                const uint16_t *s = (const uint16_t *)b->p + off;
                for (int j = 0; j < nr; j++) d[j] = tp_f32_from_bf16(s[j]);
            }
        }
        return;
    }
    if (b->rs == 1) {   /* columns contiguous in p (B = Wᵀ): one column at a time */
        for (int j = 0; j < nr; j++) {
            float *d = dst + j;
            if (j >= cols) {
                for (int64_t p = 0; p < kc; p++) d[p * nr] = 0.0f;
            } else if (b->dt == TP_F32) {
                const float *s = (const float *)b->p + (j0 + j) * b->cs + p0;
                for (int64_t p = 0; p < kc; p++) d[p * nr] = s[p];
            } else {
                const uint16_t *s = (const uint16_t *)b->p + (j0 + j) * b->cs + p0;
                for (int64_t p = 0; p < kc; p++) d[p * nr] = tp_f32_from_bf16(s[p]);
            }
        }
        return;
    }
    for (int64_t p = 0; p < kc; p++)
        for (int j = 0; j < nr; j++)
            dst[p * nr + j] = j < cols ? load_b(b, (p0 + p) * b->rs + (j0 + j) * b->cs) : 0.0f;
}

/* ---- driver ------------------------------------------------------------ */

typedef struct {
    const tp_gemm_ukernel *uk;
    float *c;
    int64_t ldc, m, n, k;
    int accumulate;
    const tp_gemm_operand *a, *b;
    int split_m;             /* 1: threads split rows, 0: columns */
    int64_t mc, kc, nc;      /* block sizes, clipped to the problem */
    char *buf;
    size_t stride, a_bytes;  /* per-thread buffer: A block, then B panel */
} gemm_job;

/* C[i0:i0+mc, j0:j0+nc] += the packed blocks. */
static void macro_kernel(const gemm_job *j, const float *ap, const float *bp, int64_t i0, int64_t mc, int64_t j0,
                         int64_t nc, int64_t kc, int acc)
{
    const tp_gemm_ukernel *uk = j->uk;
    for (int64_t jr = 0; jr < nc; jr += uk->nr) {
        int nr = (int)min64(uk->nr, nc - jr);
        for (int64_t ir = 0; ir < mc; ir += uk->mr)
            uk->fn(kc, ap + ir * kc, bp + jr * kc, j->c + (i0 + ir) * j->ldc + j0 + jr, j->ldc,
                   (int)min64(uk->mr, mc - ir), nr, acc);
    }
}

static void gemm_worker(void *p, int ti, int nt)
{
    const gemm_job *j = p;
    const tp_gemm_ukernel *uk = j->uk;
    int64_t m0 = 0, m1 = j->m, n0 = 0, n1 = j->n, b0, b1;
    if (j->split_m) {
        tp_split_range((j->m + uk->mr - 1) / uk->mr, ti, nt, &b0, &b1);
        m0 = b0 * uk->mr, m1 = min64(b1 * uk->mr, j->m);
    } else {
        tp_split_range((j->n + uk->nr - 1) / uk->nr, ti, nt, &b0, &b1);
        n0 = b0 * uk->nr, n1 = min64(b1 * uk->nr, j->n);
    }
    if (m0 >= m1 || n0 >= n1) return;
    float *ap = (float *)(j->buf + (size_t)ti * j->stride);
    float *bp = (float *)(j->buf + (size_t)ti * j->stride + j->a_bytes);
    for (int64_t jc = n0; jc < n1; jc += j->nc) {
        int64_t nc = min64(j->nc, n1 - jc);
        for (int64_t pc = 0; pc < j->k; pc += j->kc) {
            int64_t kc = min64(j->kc, j->k - pc);
            for (int64_t jr = 0; jr < nc; jr += uk->nr)
                pack_b_panel(bp + jr * kc, j->b, pc, kc, jc + jr, (int)min64(uk->nr, nc - jr), uk->nr);
            for (int64_t ic = m0; ic < m1; ic += j->mc) {
                int64_t mc = min64(j->mc, m1 - ic);
                pack_a(ap, j->a, ic, mc, pc, kc, uk->mr);
                macro_kernel(j, ap, bp, ic, mc, jc, nc, kc, j->accumulate || pc > 0);
            }
        }
    }
}

tp_status tp_gemm_packed(const tp_gemm_ukernel *uk, float *c, int64_t ldc, int accumulate, int64_t m, int64_t n,
                         int64_t k, const tp_gemm_operand *a, const tp_gemm_operand *b, tp_threadpool *pool)
{
    if (m <= 0 || n <= 0) return TP_OK;
    if (k <= 0) {   /* an empty sum: C stays or becomes zero */
        if (!accumulate)
            for (int64_t i = 0; i < m; i++) memset(c + i * ldc, 0, (size_t)n * sizeof(float));
        return TP_OK;
    }
    int nt = tp_threadpool_size(pool);
    gemm_job j = {uk, c, ldc, m, n, k, accumulate, a, b, 0, 0, 0, 0, NULL, 0, 0};
    /* Columns while every thread gets a few micro-panels, else rows. */
    int64_t nblk = (n + uk->nr - 1) / uk->nr, mblk = (m + uk->mr - 1) / uk->mr;
    j.split_m = nblk < 4 * nt && mblk > nblk;
    int64_t my_n = j.split_m ? n : round_up((nblk + nt - 1) / nt, 1) * uk->nr;
    int64_t my_m = j.split_m ? ((mblk + nt - 1) / nt) * uk->mr : m;
    j.kc = min64(uk->kc, k);
    j.mc = min64(uk->mc, round_up(my_m, uk->mr));
    j.nc = min64(uk->nc, round_up(my_n, uk->nr));
    j.a_bytes = (size_t)round_up(j.mc * j.kc * (int64_t)sizeof(float), 64);
    j.stride = j.a_bytes + (size_t)round_up(j.nc * j.kc * (int64_t)sizeof(float), 64);
    j.buf = tp_alloc(j.stride * (size_t)nt);
    if (!j.buf) return tp_fail(TP_ERR_NOMEM, "tp_gemm_packed: out of memory for the packing buffers");
    tp_parallel_run(pool, gemm_worker, &j);
    tp_free(j.buf);
    return TP_OK;
}
