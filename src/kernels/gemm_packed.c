/* The packed f32 GEMM driver: C[m, n] (+)= A[m, k] · B[k, n], BLIS-style.
 *
 * Loop nest, per thread (its own rectangle of C):
 *   jc: NC columns   — B panel [kc][nc] packed once, read from L2/L3
 *   pc: KC depth     — in order from 0: the summation order is fixed
 *   ic: MC rows      — A block [mc][kc] packed once, kept in L2
 *   jr, ir: MR × NR  — the micro-kernel, its B micro-panel [kc][NR] in L1
 * With uk->nc_l2 and few rows (a prefill: A packed whole in 1 MiB), pc
 * goes outermost instead, A is packed once per KC block and B is walked in
 * panels of nc_l2 columns that stay in L2.
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
 * B may be bf16; it is widened to f32 while packing, so products stay exact.
 * B may also be q8_0 blocks (rows of W whole blocks of 32: element e of the
 * row-major matrix is quant e % 32 of block e / 32): each element is
 * dequantized while packing to d·q, exact in f32 (an 11-bit scale times an
 * 8-bit integer), the value tp_q8_dequantize_row gives; or q4_0 blocks, the
 * same way: d·(nibble - 8), as tp_q4_dequantize_row. */
#include "kernels/kern_internal.h"
#include "kernels/kern_q4.h"

#include <string.h>
#if TP_KERNELS_X86
#include <immintrin.h>
#endif

static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
static int64_t round_up(int64_t a, int64_t b) { return (a + b - 1) / b * b; }

/* ---- packing -----------------------------------------------------------
 * Packing is a transpose for two of the layouts (A read by rows, B = Wᵀ):
 * on x86-64 those go 4×4 at a time through SSE (the baseline ISA, so no
 * target attribute), everything else and every remainder element by
 * element.  bf16 is widened by a shift: the bits are the top half of the
 * f32. */

static float widen(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static float load_q8(const void *p, int64_t off)
{
    const tp_q8_block *blk = (const tp_q8_block *)p + off / TP_Q8_BLOCK;
    return tp_q8_scale(blk->d) * (float)blk->q[off % TP_Q8_BLOCK];
}

/* Element j of a q4_0 block is the low nibble of byte j (j < 16), else the
 * high nibble of byte j - 16; the block is found in the repacked layout
 * (kern_q4.h) of W's b->rows rows of b->cs values. */
static float load_q4(const tp_gemm_operand *b, int64_t off)
{
    int64_t r = off / b->cs, e = off % b->cs;
    tp_q4_block blk = tp_q4_get(b->p, b->rows, b->cs / TP_Q4_BLOCK, r, e / TP_Q4_BLOCK);
    int j = (int)(e % TP_Q4_BLOCK), half = TP_Q4_BLOCK / 2;
    int q = j < half ? blk.qs[j] & 0x0f : blk.qs[j - half] >> 4;
    return tp_q8_scale(blk.d) * (float)(q - 8);
}

static float load_b(const tp_gemm_operand *b, int64_t off)
{
    if (b->dt == TP_Q8_0) return load_q8(b->p, off);
    if (b->dt == TP_Q4_0) return load_q4(b, off);
    return b->dt == TP_F32 ? ((const float *)b->p)[off] : widen(((const uint16_t *)b->p)[off]);
}

#if TP_KERNELS_X86
/* 4 consecutive elements of B at off as f32. */
static __m128 load4_b(const tp_gemm_operand *b, int64_t off)
{
    if (b->dt == TP_F32) return _mm_loadu_ps((const float *)b->p + off);
    if (b->dt == TP_Q8_0 || b->dt == TP_Q4_0)
        return _mm_setr_ps(load_b(b, off), load_b(b, off + 1), load_b(b, off + 2), load_b(b, off + 3));
    __m128i h = _mm_loadl_epi64((const __m128i *)((const uint16_t *)b->p + off));
    return _mm_castsi128_ps(_mm_unpacklo_epi16(_mm_setzero_si128(), h));
}

/* dst[q·ld] = (s0[q], s1[q], s2[q], s3[q]) for q < 4: four rows of 4 become
 * four columns. */
static void transpose4(float *dst, int64_t ld, __m128 r0, __m128 r1, __m128 r2, __m128 r3)
{
    _MM_TRANSPOSE4_PS(r0, r1, r2, r3);
    _mm_storeu_ps(dst, r0);
    _mm_storeu_ps(dst + ld, r1);
    _mm_storeu_ps(dst + 2 * ld, r2);
    _mm_storeu_ps(dst + 3 * ld, r3);
}
#endif

/* A rows [r0, r0+rows) of the micro-panel at d, read along p (cs = 1):
 * d[p·mr + i] = A[i0+i, p0+p]. */
static void pack_a_rows(float *d, const tp_gemm_operand *a, int64_t i0, int rows, int64_t p0, int64_t kc, int mr)
{
    const float *src = a->p;
    int i = 0;
#if TP_KERNELS_X86
    for (; i + 4 <= rows; i += 4) {
        const float *s0 = src + (i0 + i) * a->rs + p0, *s1 = s0 + a->rs, *s2 = s1 + a->rs, *s3 = s2 + a->rs;
        int64_t p = 0;
        for (; p + 4 <= kc; p += 4)
            transpose4(d + p * mr + i, mr, _mm_loadu_ps(s0 + p), _mm_loadu_ps(s1 + p), _mm_loadu_ps(s2 + p),
                       _mm_loadu_ps(s3 + p));
        for (; p < kc; p++) {
            d[p * mr + i] = s0[p], d[p * mr + i + 1] = s1[p];
            d[p * mr + i + 2] = s2[p], d[p * mr + i + 3] = s3[p];
        }
    }
#endif
    for (; i < rows; i++) {
        const float *s = src + (i0 + i) * a->rs + p0;
        for (int64_t p = 0; p < kc; p++) d[p * mr + i] = s[p];
    }
}

/* A[i0:i0+mc, p0:p0+kc] → micro-panels [mc/mr][kc][mr], rows past mc zero.
 * Read along the contiguous direction: by rows when cs = 1, else (A = dyᵀ,
 * rs = 1) one p at a time across all the panels, so that the reads walk
 * memory in order rather than a page per p. */
static void pack_a(const tp_gemm_ukernel *uk, float *dst, const tp_gemm_operand *a, int64_t i0, int64_t mc,
                   int64_t p0, int64_t kc)
{
    const float *src = a->p;
    int mr = uk->mr;
    if (a->cs == 1) {
        for (int64_t ib = 0; ib < mc; ib += mr) {
            float *d = dst + ib * kc;
            int rows = (int)min64(mr, mc - ib);
            if (uk->pack_a && rows == mr) {
                uk->pack_a(d, a, i0 + ib, p0, kc);
                continue;
            }
            pack_a_rows(d, a, i0 + ib, rows, p0, kc, mr);
            for (int i = rows; i < mr; i++)
                for (int64_t p = 0; p < kc; p++) d[p * mr + i] = 0.0f;
        }
        return;
    }
    for (int64_t p = 0; p < kc; p++) {
        const float *s = src + (p0 + p) * a->cs + i0 * a->rs;
        for (int64_t ib = 0; ib < mc; ib += mr) {
            float *d = dst + ib * kc + p * mr;
            int rows = (int)min64(mr, mc - ib);
            for (int i = 0; i < rows; i++) d[i] = s[(ib + i) * a->rs];
            for (int i = rows; i < mr; i++) d[i] = 0.0f;
        }
    }
}

/* B columns [j, cols) of the micro-panel, read along p (rs = 1, B = Wᵀ):
 * dst[p·nr + j] = B[p0+p, j0+j]; j advances past what was packed. */
static void pack_b_cols(float *dst, const tp_gemm_operand *b, int64_t p0, int64_t kc, int64_t j0, int cols, int nr)
{
    int j = 0;
#if TP_KERNELS_X86
    for (; j + 4 <= cols; j += 4) {
        int64_t o0 = (j0 + j) * b->cs + p0, cs = b->cs, p = 0;
        for (; p + 4 <= kc; p += 4)
            transpose4(dst + p * nr + j, nr, load4_b(b, o0 + p), load4_b(b, o0 + cs + p), load4_b(b, o0 + 2 * cs + p),
                       load4_b(b, o0 + 3 * cs + p));
        for (; p < kc; p++)
            for (int q = 0; q < 4; q++) dst[p * nr + j + q] = load_b(b, o0 + q * cs + p);
    }
#endif
    for (; j < cols; j++)
        for (int64_t p = 0; p < kc; p++) dst[p * nr + j] = load_b(b, (j0 + j) * b->cs + p0 + p);
    for (j = cols; j < nr; j++)
        for (int64_t p = 0; p < kc; p++) dst[p * nr + j] = 0.0f;
}

/* B[p0:p0+kc, j0:j0+nc] → micro-panels [nc/nr][kc][nr], columns past nc
 * zero.  As for A, read along the contiguous direction: B = Wᵀ (rs = 1)
 * by columns, one panel at a time; otherwise one row p at a time across all
 * the panels. */
static void pack_b(const tp_gemm_ukernel *uk, float *dst, const tp_gemm_operand *b, int64_t p0, int64_t kc,
                   int64_t j0, int64_t nc)
{
    int nr = uk->nr;
    if (b->rs == 1 && b->cs != 1) {
        for (int64_t jr = 0; jr < nc; jr += nr) {
            int cols = (int)min64(nr, nc - jr);
            if (uk->pack_bt && cols == nr) uk->pack_bt(dst + jr * kc, b, p0, kc, j0 + jr);
            else pack_b_cols(dst + jr * kc, b, p0, kc, j0 + jr, cols, nr);
        }
        return;
    }
    for (int64_t p = 0; p < kc; p++) {
        int64_t row = (p0 + p) * b->rs + j0 * b->cs;
        for (int64_t jr = 0; jr < nc; jr += nr) {
            float *d = dst + jr * kc + p * nr;
            int cols = (int)min64(nr, nc - jr), j = 0;
#if TP_KERNELS_X86
            if (b->cs == 1)
                for (; j + 4 <= cols; j += 4) _mm_storeu_ps(d + j, load4_b(b, row + jr + j));
#endif
            for (; j < cols; j++) d[j] = load_b(b, row + (jr + j) * b->cs);
            for (; j < nr; j++) d[j] = 0.0f;
        }
    }
}

/* ---- driver ------------------------------------------------------------ */

typedef struct {
    const tp_gemm_ukernel *uk;
    float *c;
    int64_t ldc, m, n, k;
    int accumulate;
    const tp_gemm_operand *a, *b;
    int split_m;             /* 1: threads split rows, 0: columns */
    int a_whole;             /* 1: a thread's rows of A packed once per KC block */
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
    if (j->a_whole) {
        /* pc outermost: A packed once per KC block, each small B panel
         * once; every element still gets its KC blocks in order. */
        for (int64_t pc = 0; pc < j->k; pc += j->kc) {
            int64_t kc = min64(j->kc, j->k - pc);
            pack_a(uk, ap, j->a, m0, m1 - m0, pc, kc);
            for (int64_t jc = n0; jc < n1; jc += j->nc) {
                int64_t nc = min64(j->nc, n1 - jc);
                pack_b(uk, bp, j->b, pc, kc, jc, nc);
                for (int64_t ic = m0; ic < m1; ic += j->mc)
                    macro_kernel(j, ap + (ic - m0) * kc, bp, ic, min64(j->mc, m1 - ic), jc, nc, kc,
                                 j->accumulate || pc > 0);
            }
        }
        return;
    }
    for (int64_t jc = n0; jc < n1; jc += j->nc) {
        int64_t nc = min64(j->nc, n1 - jc);
        for (int64_t pc = 0; pc < j->k; pc += j->kc) {
            int64_t kc = min64(j->kc, j->k - pc);
            pack_b(uk, bp, j->b, pc, kc, jc, nc);
            for (int64_t ic = m0; ic < m1; ic += j->mc) {
                int64_t mc = min64(j->mc, m1 - ic);
                pack_a(uk, ap, j->a, ic, mc, pc, kc);
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
    gemm_job j = {uk, c, ldc, m, n, k, accumulate, a, b, 0, 0, 0, 0, 0, NULL, 0, 0};
    /* Columns while every thread gets a few micro-panels, else rows.  The
     * split and the MC / NC blocks only tile C; KC alone decides the sums. */
    int64_t nblk = (n + uk->nr - 1) / uk->nr, mblk = (m + uk->mr - 1) / uk->mr;
    j.split_m = nblk < 4 * nt && mblk > nblk;
    int64_t my_n = j.split_m ? n : (nblk + nt - 1) / nt * uk->nr;
    int64_t my_m = j.split_m ? (mblk + nt - 1) / nt * uk->mr : m;
    j.kc = min64(uk->kc, k);
    /* MC: as many blocks as uk->mc gives to the nearest, evened out — 512
     * rows in blocks of 168 left a last block of 8 that read every B
     * micro-panel again for 2 tiles. */
    int64_t mblocks = (my_m + uk->mc / 2) / uk->mc;
    if (mblocks < 1) mblocks = 1;
    j.mc = round_up((my_m + mblocks - 1) / mblocks, uk->mr);
    size_t whole = (size_t)(round_up(my_m, uk->mr) * j.kc) * sizeof(float);
    j.a_whole = uk->nc_l2 > 0 && whole <= TP_GEMM_A_WHOLE_BYTES;
    j.nc = min64(j.a_whole ? uk->nc_l2 : uk->nc, round_up(my_n, uk->nr));
    j.a_bytes = (size_t)round_up(j.a_whole ? (int64_t)whole : j.mc * j.kc * (int64_t)sizeof(float), 64);
    j.stride = j.a_bytes + (size_t)round_up(j.nc * j.kc * (int64_t)sizeof(float), 64);
    /* The pool's kept scratch: a fresh buffer per call (2 MiB and more per
     * thread) faulted its pages in again at every GEMM of a prefill. */
    char *own = NULL;
    j.buf = tp_threadpool_scratch(pool, j.stride * (size_t)nt);
    if (!j.buf) j.buf = own = tp_alloc(j.stride * (size_t)nt);
    if (!j.buf) return tp_fail(TP_ERR_NOMEM, "tp_gemm_packed: out of memory for the packing buffers");
    tp_parallel_run(pool, gemm_worker, &j);
    tp_free(own);
    return TP_OK;
}
