/* AVX-512 matmul: y[T, n] = x[T, k] · W[n, k]ᵀ, W f32 or bf16 (the GEMM
 * also q8_0 and q4_0, dequantized while packing: gemm_q8.c's and
 * gemm_q4.c's prefill).
 *
 * GEMM (prefill), GotoBLAS style.  y is cut into tiles of MR = 12 rows (T)
 * by NR = 32 columns (n); a tile's 24 accumulators live in zmm registers.
 * The rows of y are done in passes of at most TC rows; for each:
 *   - x is packed once, by all threads together (a region of its own),
 *     into panels of MR rows laid out [k][MR] for every K block of KC, so
 *     the micro-kernel reads the MR activations of step k as 12 broadcasts;
 *   - then, K block by K block, for each NR-wide slice of W the block is
 *     packed [k][NR] (a transpose in registers), widening bf16 to f32 on the
 *     way — exact, and paid once per slice while the packed slice (32 KiB,
 *     L1) is reused by all the pass's tiles;
 *   - the micro-kernel does 24 FMAs per k: MR×NR×KC flops per call, and
 *     prefetches what comes next from memory (the next tile of y, the next
 *     slice of W) a line at a time.
 * The threads split the columns (slices of W), so W is read once overall
 * and every element of y is summed in the same order on any thread count.
 *
 * The bf16-dot variant (opt-in, bf16 weights, AVX512_BF16) packs pairs of k
 * as one 32-bit lane and uses vdpbf16ps, which does two k steps per
 * instruction; the activations are rounded to bf16 for it — not exact.  It
 * runs the same driver: x rounded and packed once per pass, shared, W packed
 * per slice by the same 16×16 register transposes (a 32-bit lane holding a
 * bf16 pair is moved as one float), the same prefetches.
 *
 * GEMV (decode, T <= 4) streams W once, in chunks of consecutive rows
 * (about 64 KiB of W, tp_gemv_chunk_rows) that the threads take
 * dynamically (tp_parallel_for: each its own share first).  For T = 1
 * (decode) a chunk is read one row after the other, so a thread's W is one
 * sequential stream, with several accumulators along the row and a
 * software prefetch GEMV_ROW_PF_BYTES ahead; for T > 1 4 rows at a time
 * side by side (the x registers are shared by the rows of a block), with a
 * prefetch GEMV_PF_BYTES ahead of every row stream.  Dot products along k
 * with horizontal sums at the end.  A group of weights on one x (q/k/v,
 * gate/up: tp_gemv_avx512_group) is one region over all their chunks.
 * bf16 rows are widened in registers: one 64-byte load is 32 weights, the
 * even ones are (lane << 16), the odd ones (lane & 0xffff0000); x is
 * permuted once per call to match (tp_permute_x_avx512). */
#include "kernels/kern_internal.h"
#include "kernels/kern_q4.h"
#include "kernels/vmath.h"

#include <immintrin.h>
#include <stdlib.h>
#include <string.h>

#define MR 12
#define NR 32
#define KC 256       /* f32: packed W slice KC×NR×4 B = 32 KiB */
#define TC (MR * 86)  /* rows per pass: the packed x of a K block (~1 MiB)
                         stays in L2, and all of it is at most 12 MiB at k = 3072 */
#define KC_DOT 512   /* bf16 pairs: (KC_DOT/2)×NR×4 B = 32 KiB */

#define T512 __attribute__((target("avx512f,avx512bw,avx512vl,fma,avx2")))
#define T512BF __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,fma,avx2")))

static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

/* ---- packing ---------------------------------------------------------- */

/* x[0:rows, 0:kc] (rows <= MR, row stride ldx) → one panel dst[kc][MR];
 * rows past `rows` are zero.  16 k at a time: the rows are transposed in
 * registers and each k's MR values stored with a mask — the scalar
 * tp_gemm_pack_a took ~2.5 cycles per float, this well under one. */
T512 static void pack_a_panel(float *dst, const float *x, int64_t rows, int64_t ldx, int64_t kc)
{
    for (int64_t k = 0; k < kc; k += 16) {
        __mmask16 m = tp_mask16(kc - k);
        __m512 r[16];
        for (int i = 0; i < 16; i++)
            r[i] = i < rows ? _mm512_maskz_loadu_ps(m, x + i * ldx + k) : _mm512_setzero_ps();
        tp_transpose16x16(r);
        int nk = kc - k < 16 ? (int)(kc - k) : 16;
        for (int j = 0; j < nk; j++) _mm512_mask_storeu_ps(dst + (k + j) * MR, (1u << MR) - 1, r[j]);
    }
}

/* As pack_a_panel, into dst[(kc+1)/2][MR] of bf16 pairs: lane (k, k+1) of
 * a row holds x[k] in its low half and x[k+1] in its high half, each rounded
 * to nearest even (vcvtne2ps2bf16); an odd tail pairs with 0.  32 k at a
 * time: each row's 16 pairs are one zmm, and the rows are transposed as
 * 32-bit lanes. */
T512BF static void pack_a_dot_panel(uint32_t *dst, const float *x, int64_t rows, int64_t ldx, int64_t kc)
{
    for (int64_t k = 0; k < kc; k += 32) {
        __mmask16 m0 = tp_mask16(kc - k), m1 = tp_mask16(kc - k - 16);
        __m512 r[16];
        for (int i = 0; i < 16; i++)
            r[i] = i < rows ? (__m512)_mm512_cvtne2ps_pbh(_mm512_maskz_loadu_ps(m1, x + i * ldx + k + 16),
                                                           _mm512_maskz_loadu_ps(m0, x + i * ldx + k))
                            : _mm512_setzero_ps();
        tp_transpose16x16(r);
        int np = kc - k < 32 ? (int)(kc - k + 1) / 2 : 16;
        for (int p = 0; p < np; p++) _mm512_mask_storeu_ps(dst + (k / 2 + p) * MR, (1u << MR) - 1, r[p]);
    }
}

/* 16 weights from W + off (in elements), widened to f32; lanes past m zero.
 * q8_0 (rows of whole blocks, off a multiple of 16: the 16 lie in one
 * block): d·q, exact in f32 and the value tp_q8_dequantize_row gives, so
 * the product is the f32 one of the dequantized weights.  q4_0 likewise:
 * d·(nibble - 8) (pack_b_q4 below, as the layout is its own).  A full
 * block of f32/bf16 is read without a mask: packing an MoE expert's cold
 * bf16 weights with masked loads ran the grouped prefill at ~0.7x (Zen 5,
 * bench kernels --moe), as it did expert_xw.c's decode loop. */
static inline __attribute__((always_inline)) T512 __m512 load_w16(const void *w, tp_dtype wt, int64_t off,
                                                                  __mmask16 m)
{
    if (wt == TP_F32)
        return m == 0xffff ? _mm512_loadu_ps((const float *)w + off) : _mm512_maskz_loadu_ps(m, (const float *)w + off);
    if (wt == TP_Q8_0) {
        const tp_q8_block *b = (const tp_q8_block *)w + off / TP_Q8_BLOCK;
        __m512i q = _mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(m, b->q + off % TP_Q8_BLOCK));
        return _mm512_mul_ps(_mm512_cvtepi32_ps(q), _mm512_set1_ps(tp_q8_scale(b->d)));
    }
    const uint16_t *p = (const uint16_t *)w + off;
    __m256i h = m == 0xffff ? _mm256_loadu_si256((const __m256i *)p) : _mm256_maskz_loadu_epi16(m, p);
    return tp_bf16x16_to_ps(h);
}

/* pack_b_f32 for q4_0 W (repacked, kern_q4.h): each 16 values of a row are
 * the low nibbles (elements 0..15 of a block) or the high ones (16..31) of
 * its 16 bytes, d·(nibble - 8), as tp_q4_dequantize_row.  Each group of 4
 * rows (c0 is a multiple of 4) is located once per chunk; within it a row
 * is 2 (scale) and 16 (nibbles) bytes after the one before, a block 2·g
 * and 16·g after the one before (g rows in the group). */
T512 static void pack_b_q4(float *dst, const char *w, int64_t n, int64_t ldw, int64_t n0, int64_t k0, int64_t kc)
{
    const int64_t nb = ldw / TP_Q4_BLOCK;
    for (int h = 0; h < 2; h++) {
        int64_t c0 = n0 + 16 * h, rows = n - c0 < 16 ? n - c0 : 16;
        float *dd = dst + 16 * h;
        int64_t ds[4] = {0}, qs[4] = {0}, g[4] = {0};
        for (int64_t k = 0; k < kc; k += 16) {
            __mmask16 m = tp_mask16(kc - k);
            int64_t blk = (k0 + k) / TP_Q4_BLOCK;
            int hi = (k0 + k) % TP_Q4_BLOCK != 0;
            for (int gi = 0; gi < 4 && 4 * gi < rows && !hi; gi++) {
                if (k == 0 || blk % TP_Q4_CHUNK == 0) {
                    ds[gi] = tp_q4_locate(n, nb, c0 + 4 * gi, blk, &qs[gi]);
                    g[gi] = n - (c0 + 4 * gi) < TP_Q4_ROWS ? n - (c0 + 4 * gi) : TP_Q4_ROWS;
                } else {
                    ds[gi] += 2 * g[gi];
                    qs[gi] += 16 * g[gi];
                }
            }
            __m512 r[16];
            for (int i = 0; i < 16; i++) {
                if (i >= rows) {
                    r[i] = _mm512_setzero_ps();
                    continue;
                }
                uint16_t d;
                memcpy(&d, w + ds[i / 4] + 2 * (i % 4), sizeof d);
                __m512i q = _mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(m, w + qs[i / 4] + 16 * (i % 4)));
                q = hi ? _mm512_srli_epi32(q, 4) : _mm512_and_si512(q, _mm512_set1_epi32(0x0f));
                q = _mm512_sub_epi32(q, _mm512_set1_epi32(8));
                r[i] = _mm512_mul_ps(_mm512_cvtepi32_ps(q), _mm512_set1_ps(tp_q8_scale(d)));
            }
            tp_transpose16x16(r);
            int nk = kc - k < 16 ? (int)(kc - k) : 16;
            for (int j = 0; j < nk; j++) _mm512_store_ps(dd + (k + j) * NR, r[j]);
        }
    }
}

/* W[n0:n0+32, k0:k0+kc] → dst[kc][NR] f32; columns past n are zero.  Each
 * half of 16 rows is read along its rows, 16 k at a time, and transposed in
 * registers (gathers, one k from 16 rows each, cost ~4x more). */
T512 static void pack_b_f32(float *dst, const void *w, tp_dtype wt, int64_t n, int64_t ldw,
                            int64_t n0, int64_t k0, int64_t kc)
{
    for (int h = 0; h < 2; h++) {
        int64_t c0 = n0 + 16 * h, rows = n - c0 < 16 ? n - c0 : 16;
        float *d = dst + 16 * h;
        for (int64_t k = 0; k < kc; k += 16) {
            __mmask16 m = tp_mask16(kc - k);
            __m512 r[16];
            for (int i = 0; i < 16; i++)
                r[i] = i < rows ? load_w16(w, wt, (c0 + i) * ldw + k0 + k, m) : _mm512_setzero_ps();
            tp_transpose16x16(r);
            int nk = kc - k < 16 ? (int)(kc - k) : 16;
            for (int j = 0; j < nk; j++) _mm512_store_ps(d + (k + j) * NR, r[j]);
        }
    }
}

/* W[n0:n0+32, k0:k0+kc] bf16 → dst[(kc+1)/2][NR] of (k, k+1) pairs for
 * vdpbf16ps; columns past n and the partner of an odd tail are zero.  As
 * pack_b_f32: 16 rows read along k, 32 bf16 (16 pairs) per load, transposed
 * as 32-bit lanes (gathers of one pair from 16 rows cost several times
 * more). */
T512 static void pack_b_dot(uint32_t *dst, const uint16_t *w, int64_t n, int64_t ldw, int64_t n0, int64_t k0,
                            int64_t kc)
{
    for (int h = 0; h < 2; h++) {
        int64_t c0 = n0 + 16 * h, rows = n - c0 < 16 ? n - c0 : 16;
        uint32_t *d = dst + 16 * h;
        for (int64_t k = 0; k < kc; k += 32) {
            __mmask32 m = kc - k >= 32 ? 0xffffffffu : (__mmask32)((1u << (kc - k)) - 1);
            __m512 r[16];
            for (int i = 0; i < 16; i++)
                r[i] = i < rows ? _mm512_castsi512_ps(_mm512_maskz_loadu_epi16(m, w + (c0 + i) * ldw + k0 + k))
                                : _mm512_setzero_ps();
            tp_transpose16x16(r);
            int np = kc - k < 32 ? (int)(kc - k + 1) / 2 : 16;
            for (int p = 0; p < np; p++) _mm512_store_ps((float *)d + (k / 2 + p) * NR, r[p]);
        }
    }
}

/* ---- micro-kernels ---------------------------------------------------- */

/* Adds (or, for the first K block, stores) the tile into c, rows < mr and
 * columns < nr only. */
#define STORE_TILE(acc)                                                                  \
    do {                                                                                 \
        __mmask16 m0 = tp_mask16(nr), m1 = tp_mask16(nr - 16);                             \
        _Pragma("GCC unroll 12") for (int i = 0; i < MR && i < mr; i++) {                \
            float *ci = c + i * ldc;                                                     \
            if (accumulate) {                                                            \
                acc[i][0] = _mm512_add_ps(acc[i][0], _mm512_maskz_loadu_ps(m0, ci));     \
                acc[i][1] = _mm512_add_ps(acc[i][1], _mm512_maskz_loadu_ps(m1, ci + 16)); \
            }                                                                            \
            _mm512_mask_storeu_ps(ci, m0, acc[i][0]);                                    \
            _mm512_mask_storeu_ps(ci + 16, m1, acc[i][1]);                               \
        }                                                                                \
    } while (0)

/* One k step of a tile: two vectors of B, MR broadcasts of A, 2·MR FMAs. */
static inline __attribute__((always_inline)) T512 void kernel_step(__m512 acc[MR][2], const float *a,
                                                                   const float *b)
{
    __m512 b0 = _mm512_load_ps(b), b1 = _mm512_load_ps(b + 16);
#pragma GCC unroll 12
    for (int i = 0; i < MR; i++) {
        __m512 ai = _mm512_set1_ps(a[i]);
        acc[i][0] = _mm512_fmadd_ps(ai, b0, acc[i][0]);
        acc[i][1] = _mm512_fmadd_ps(ai, b1, acc[i][1]);
    }
}

/* The k loop of both micro-kernels: kc steps of STEP (a k, or a pair of k
 * for vdpbf16ps), each reading MR lanes of A and NR of B.  Prefetches into
 * L2, one line of each per 8 steps: pc, the pc_rows rows of the next tile's
 * c, two lines each (y is far bigger than L2, and each tile's
 * read-modify-write of c waited on 2·MR misses); pw, nw lines of W that the
 * next slice's packing reads (it stalled on memory, W being far bigger than
 * the caches).  Spread out so that they never hold many of L1's miss
 * buffers at once. */
#define KERNEL_LOOP(STEP)                                                                                   \
    do {                                                                                                    \
        int64_t k_ = 0;                                                                                     \
        for (int s = 0; k_ + 8 <= kc; k_ += 8, s++) {                                                       \
            if (s < 2 * pc_rows) _mm_prefetch((const char *)(pc + (s >> 1) * ldc + (s & 1) * 16), _MM_HINT_T1); \
            if (s < nw) _mm_prefetch(pw + 64 * s, _MM_HINT_T1);                                             \
            _Pragma("GCC unroll 8") for (int u = 0; u < 8; u++, a += MR, b += NR) STEP(acc, a, b);          \
        }                                                                                                   \
        for (; k_ < kc; k_++, a += MR, b += NR) STEP(acc, a, b);                                            \
    } while (0)

T512 static void kernel_f32(int64_t kc, const float *a, const float *b, float *c, int64_t ldc,
                            int mr, int nr, int accumulate, const float *pc, int pc_rows, const char *pw,
                            int nw)
{
    __m512 acc[MR][2];
    for (int i = 0; i < MR; i++) acc[i][0] = acc[i][1] = _mm512_setzero_ps();
    KERNEL_LOOP(kernel_step);
    STORE_TILE(acc);
}

/* kernel_f32 as the packed GEMM's micro-kernel (gemm_packed.c; the
 * training backward), without the prefetches, which are this file's
 * driver's.  Blocks: the A block MC×KC×4 = 192 KiB of an L2 of 1 MiB or
 * more, the B micro-panel 32 KiB, a B panel 2 MiB. */
T512 static void ukernel_f32(int64_t kc, const float *a, const float *b, float *c, int64_t ldc, int mr, int nr,
                             int accumulate)
{
    kernel_f32(kc, a, b, c, ldc, mr, nr, accumulate, c, 0, NULL, 0);
}

const tp_gemm_ukernel tp_gemm_ukernel_avx512 = {MR, NR, 16 * MR, KC, 2048, ukernel_f32, NULL, NULL, 0};

/* One pair step of a tile: two vectors of B pairs, MR broadcasts of A
 * pairs, 2·MR vdpbf16ps. */
static inline __attribute__((always_inline)) T512BF void kernel_step_dot(__m512 acc[MR][2], const uint32_t *a,
                                                                         const uint32_t *b)
{
    __m512bh b0 = (__m512bh)_mm512_load_si512(b), b1 = (__m512bh)_mm512_load_si512(b + 16);
#pragma GCC unroll 12
    for (int i = 0; i < MR; i++) {
        __m512bh ai = (__m512bh)_mm512_set1_epi32((int)a[i]);
        acc[i][0] = _mm512_dpbf16_ps(acc[i][0], ai, b0);
        acc[i][1] = _mm512_dpbf16_ps(acc[i][1], ai, b1);
    }
}

/* kernel_f32 on bf16 pairs: kc pairs of k. */
T512BF static void kernel_dot(int64_t kc, const uint32_t *a, const uint32_t *b, float *c, int64_t ldc,
                              int mr, int nr, int accumulate, const float *pc, int pc_rows, const char *pw,
                              int nw)
{
    __m512 acc[MR][2];
    for (int i = 0; i < MR; i++) acc[i][0] = acc[i][1] = _mm512_setzero_ps();
    KERNEL_LOOP(kernel_step_dot);
    STORE_TILE(acc);
}

/* ---- GEMM driver ------------------------------------------------------ */

typedef struct {
    float *y;
    const float *x;
    const void *w;
    tp_dtype wt;
    int64_t T, n, k, tpad;
    int dot;
    int64_t kb;         /* K block: KC, or KC_DOT k (KC_DOT / 2 pairs) for dot */
    float *ap;          /* x packed once for all threads, per K block
                           tpad×KC floats (dot: tpad×KC_DOT/2 bf16 pairs) of
                           MR-row panels */
    char *buf;          /* per thread: the packed W slice */
    size_t buf_stride;
} gemm_job;

/* Lanes per k of a packed K block: 1 float, or half a bf16 pair. */
static int64_t packed_lanes(const gemm_job *j, int64_t kc) { return j->dot ? (kc + 1) / 2 : kc; }

/* x is packed up front, in a region of its own: thread ti takes a share of
 * the MR-row panels for every K block.  Before, every thread packed all of
 * x for itself (the same T×k floats nt times over). */
static void pack_a_worker(void *p, int ti, int nt)
{
    const gemm_job *j = p;
    int64_t p0, p1;
    tp_split_range(j->tpad / MR, ti, nt, &p0, &p1);
    /* A panel's rows are read along their whole length, K block after K
     * block: long sequential streams for the hardware prefetcher. */
    for (int64_t pi = p0; pi < p1; pi++)
        for (int64_t k0 = 0; k0 < j->k; k0 += j->kb) {
            int64_t kc = min64(j->kb, j->k - k0), rows = min64(MR, j->T - pi * MR);
            float *blk = j->ap + (k0 / j->kb) * j->tpad * packed_lanes(j, j->kb);
            const float *xs = j->x + pi * MR * j->k + k0;
            if (j->dot) pack_a_dot_panel((uint32_t *)blk + pi * MR * packed_lanes(j, kc), xs, rows, j->k, kc);
            else pack_a_panel(blk + pi * MR * kc, xs, rows, j->k, kc);
        }
}

/* The bytes of `elems` weights of W (for q8_0 a multiple of 32). */
static int64_t w_bytes(tp_dtype wt, int64_t elems)
{
    if (wt == TP_Q8_0) return elems / TP_Q8_BLOCK * (int64_t)sizeof(tp_q8_block);
    if (wt == TP_Q4_0) return elems / TP_Q4_BLOCK * (int64_t)sizeof(tp_q4_block);
    return elems * (wt == TP_F32 ? 4 : 2);
}

/* Where row r's stretch of W from column c begins, for the prefetch; q4_0
 * (repacked, kern_q4.h): r is a group's first row, whose stretch is the
 * group's 4 stretches together (c a multiple of KC: whole chunks). */
static int64_t w_stretch(const gemm_job *j, int64_t r, int64_t c)
{
    if (j->wt != TP_Q4_0) return w_bytes(j->wt, r * j->k + c);
    int64_t qs;
    return tp_q4_locate(j->n, j->k / TP_Q4_BLOCK, r, c / TP_Q4_BLOCK, &qs);
}

static void gemm_worker(void *p, int ti, int nt)
{
    const gemm_job *j = p;
    int64_t b0, b1;
    tp_split_range((j->n + NR - 1) / NR, ti, nt, &b0, &b1);
    if (b0 == b1) return;
    void *bp = j->buf + (size_t)ti * j->buf_stride;
    for (int64_t k0 = 0; k0 < j->k; k0 += j->kb) {
        int64_t kc = min64(j->kb, j->k - k0), kl = packed_lanes(j, kc);
        const float *ap = j->ap + (k0 / j->kb) * j->tpad * packed_lanes(j, j->kb);
        for (int64_t nb = b0; nb < b1; nb++) {
            int64_t n0 = nb * NR;
            int nr = (int)min64(NR, j->n - n0);
            if (j->dot) pack_b_dot(bp, j->w, j->n, j->k, n0, k0, kc);
            else if (j->wt == TP_Q4_0) pack_b_q4(bp, j->w, j->n, j->k, n0, k0, kc);
            else pack_b_f32(bp, j->w, j->wt, j->n, j->k, n0, k0, kc);
            /* The next slice of this K block, or the first of the next:
             * tile i prefetches row i of its W block for the packing. */
            int64_t pn = nb + 1 < b1 ? n0 + NR : b0 * NR, pk = nb + 1 < b1 ? k0 : k0 + j->kb;
            /* q4_0: tile i prefetches group i (4 rows, together in memory) */
            int64_t rpt = j->wt == TP_Q4_0 ? TP_Q4_ROWS : 1;
            int64_t wlines = (w_bytes(j->wt, rpt * min64(j->kb, j->k - pk)) + 63) / 64;
            for (int64_t t0 = 0; t0 < j->T; t0 += MR) {
                int mr = (int)min64(MR, j->T - t0);
                float *c = j->y + t0 * j->n + n0;
                /* The next tile down, or the top of the next slice (none
                 * after the last). */
                int last = t0 + MR >= j->T;
                const float *pc = last ? j->y + n0 + NR : c + MR * j->n;
                int pc_rows = (int)(last ? (n0 + NR < j->n ? min64(MR, j->T) : 0) : min64(MR, j->T - t0 - MR));
                int64_t pr = pn + rpt * (t0 / MR);
                int nw = wlines > 0 && rpt * (t0 / MR) < NR && pr < j->n ? (int)wlines : 0;
                const char *pw = nw ? (const char *)j->w + w_stretch(j, pr, pk) : NULL;
                if (j->dot)
                    kernel_dot(kl, (const uint32_t *)ap + t0 * kl, bp, c, j->n, mr, nr, k0 > 0, pc, pc_rows, pw, nw);
                else
                    kernel_f32(kc, ap + t0 * kc, bp, c, j->n, mr, nr, k0 > 0, pc, pc_rows, pw, nw);
            }
        }
    }
}

/* The parts share x: each row pass packs it once, then runs every part's
 * W over the same packed panels.  A part's sums do not depend on the
 * others, so a group gives the same bits as one call per part. */
tp_status tp_gemm_avx512_group(const tp_gemm_part *parts, int count, const float *x, int64_t T, tp_dtype wt,
                               int64_t k, int bf16_dot, tp_threadpool *pool)
{
    int nt = tp_threadpool_size(pool);
    int64_t tc = T < TC ? T : TC, tpad = (tc + MR - 1) / MR * MR;
    gemm_job j = {NULL, x, NULL, wt, tc, 0, k, tpad, bf16_dot && wt == TP_BF16, 0, NULL, NULL, 0};
    j.kb = j.dot ? KC_DOT : KC;
    /* x packed once per pass, shared, all K blocks (tpad×KC floats each, or
     * tpad×KC_DOT/2 pairs); per thread one W slice, 32 KiB either way. */
    int64_t nkb = (k + j.kb - 1) / j.kb;
    j.buf_stride = (size_t)KC * NR * sizeof(float);
    size_t shared = (size_t)(nkb * tpad * packed_lanes(&j, j.kb)) * sizeof(float);
    size_t bytes = shared + j.buf_stride * (size_t)nt;
    void *own;
    char *mem = tp_kernel_scratch(pool, bytes, &own);
    if (!mem) return tp_fail(TP_ERR_NOMEM, "tp_matmul: out of memory for GEMM packing");
    j.ap = (float *)mem;
    j.buf = mem + shared;
    for (int64_t t0 = 0; t0 < T; t0 += tc) {
        j.x = x + t0 * k;
        j.T = min64(tc, T - t0);
        j.tpad = (j.T + MR - 1) / MR * MR;
        tp_parallel_run(pool, pack_a_worker, &j);
        for (int i = 0; i < count; i++) {
            j.y = parts[i].y + t0 * parts[i].n;
            j.w = parts[i].w;
            j.n = parts[i].n;
            if (j.n > 0) tp_parallel_run(pool, gemm_worker, &j);
        }
    }
    tp_free(own);
    return TP_OK;
}

tp_status tp_gemm_avx512(float *y, const float *x, int64_t T, const void *W, tp_dtype wt,
                         int64_t n, int64_t k, int bf16_dot, tp_threadpool *pool)
{
    tp_gemm_part part = {y, W, n};
    return tp_gemm_avx512_group(&part, 1, x, T, wt, k, bf16_dot, pool);
}

/* ---- GEMV ------------------------------------------------------------- */

typedef struct {
    float *y;
    const float *x;      /* f32 W: x itself; bf16: permuted, or bf16 for dot */
    const void *w;
    tp_dtype wt;
    int64_t T, n, k, kp; /* kp: row length of the prepared x */
    int dot;
} gemv_job;

/* Rows per block for T > 1: 4 (4·T accumulators plus 2·T x registers fit
 * the 32 zmm). */
#define GEMV_ROWS 4
#define GEMV_MAX_ROWS 4

/* Software prefetch distance, in bytes of W still to be read.  Without it
 * one thread read W at ~0.75 of a plain sum loop over memory, with it at or
 * above the loop (bench/README.md, "Kernels"); 8–16 KiB measured alike, 4 KiB
 * less well.  Likely cause: the hardware streamers stop at every 4 KiB page
 * and need a few misses to start again. */
#define GEMV_PF_BYTES 16384

/* Prefetch for row r of a block at byte pos of the row: the line that this
 * row stream will read GEMV_PF_BYTES of W later.  The block's R rows are read
 * side by side, so that is pf_row = GEMV_PF_BYTES / R bytes further along the
 * rows, counted across blocks: pf_near when it stays in the same row, pf_far
 * when it passes the row's end into a later block (see gemv_block).  Offsets
 * are from the block's first byte and clamped to W's last byte (lim): they
 * may reach into rows after the chunk's (usually the thread's next chunk),
 * never past W. */
#define GEMV_PREFETCH(r, pos)                                                        \
    do {                                                                             \
        int64_t o_ = (r) * kb + (pos) + ((pos) + pf_rem < kb ? pf_near : pf_far);    \
        _mm_prefetch(wb + (o_ < lim ? o_ : lim), _MM_HINT_T0);                       \
    } while (0)

/* y[t, r0..r0+R) for T activations; R and T are compile-time constants in
 * every inlined call, so acc stays in registers.  lim: the byte offset of the
 * last byte of the thread's rows, from row r0. */
static inline __attribute__((always_inline)) T512BF void
gemv_block(const gemv_job *j, int64_t r0, const int R, const int T, int64_t lim)
{
    __m512 acc[GEMV_MAX_ROWS][TP_GEMV_MAX_T];
    for (int r = 0; r < R; r++)
        for (int t = 0; t < T; t++) acc[r][t] = _mm512_setzero_ps();
    const int64_t k = j->k, kb = k * (j->wt == TP_F32 ? 4 : 2);
    const char *wb = (const char *)j->w + r0 * kb;
    /* pf_row = whole rows (blocks of R·kb bytes further) + pf_rem bytes. */
    const int64_t pf_row = GEMV_PF_BYTES / R, pf_blocks = pf_row / kb, pf_rem = pf_row - pf_blocks * kb;
    const int64_t pf_near = pf_blocks * R * kb + pf_rem, pf_far = pf_near + (R - 1) * kb;
    if (j->wt == TP_F32) {
        const float *w = (const float *)j->w + r0 * k;
        for (int64_t i = 0; i < k; i += 16) {
            int full = k - i >= 16;
            __mmask16 m = full ? 0xffff : (__mmask16)((1u << (k - i)) - 1);
            __m512 xv[TP_GEMV_MAX_T];
            for (int t = 0; t < T; t++) xv[t] = _mm512_maskz_loadu_ps(m, j->x + t * k + i);
            for (int r = 0; r < R; r++) {
                if (full) GEMV_PREFETCH(r, 4 * i);
                __m512 wv = _mm512_maskz_loadu_ps(m, w + r * k + i);
                for (int t = 0; t < T; t++) acc[r][t] = _mm512_fmadd_ps(wv, xv[t], acc[r][t]);
            }
        }
    } else if (!j->dot) {
        const uint16_t *w = (const uint16_t *)j->w + r0 * k;
        const __m512i hi = _mm512_set1_epi32((int)0xffff0000u);
        for (int64_t i = 0; i < k; i += 32) {
            int full = k - i >= 32;
            __mmask32 m = full ? 0xffffffffu : (__mmask32)((1u << (k - i)) - 1);
            __m512 xe[TP_GEMV_MAX_T], xo[TP_GEMV_MAX_T];
            for (int t = 0; t < T; t++) {
                xe[t] = _mm512_load_ps(j->x + t * j->kp + i);
                xo[t] = _mm512_load_ps(j->x + t * j->kp + i + 16);
            }
            for (int r = 0; r < R; r++) {
                if (full) GEMV_PREFETCH(r, 2 * i);
                __m512i v = _mm512_maskz_loadu_epi16(m, w + r * k + i);
                __m512 we = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
                __m512 wo = _mm512_castsi512_ps(_mm512_and_si512(v, hi));
                for (int t = 0; t < T; t++) {
                    acc[r][t] = _mm512_fmadd_ps(we, xe[t], acc[r][t]);
                    acc[r][t] = _mm512_fmadd_ps(wo, xo[t], acc[r][t]);
                }
            }
        }
    } else {
        const uint16_t *w = (const uint16_t *)j->w + r0 * k;
        const uint16_t *xb = (const uint16_t *)j->x;
        for (int64_t i = 0; i < k; i += 32) {
            int full = k - i >= 32;
            __mmask32 m = full ? 0xffffffffu : (__mmask32)((1u << (k - i)) - 1);
            __m512bh xv[TP_GEMV_MAX_T];
            for (int t = 0; t < T; t++) xv[t] = (__m512bh)_mm512_load_si512(xb + t * j->kp + i);
            for (int r = 0; r < R; r++) {
                if (full) GEMV_PREFETCH(r, 2 * i);
                __m512bh wv = (__m512bh)_mm512_maskz_loadu_epi16(m, w + r * k + i);
                for (int t = 0; t < T; t++) acc[r][t] = _mm512_dpbf16_ps(acc[r][t], xv[t], wv);
            }
        }
    }
    for (int r = 0; r < R; r++)
        for (int t = 0; t < T; t++) j->y[t * j->n + r0 + r] = _mm512_reduce_add_ps(acc[r][t]);
}

/* T = 1: row r alone, 4 cache lines of W per step into independent
 * accumulators (bf16: 8, its even and odd halves apart), the remainder of a
 * row that is not a multiple of 4 lines masked into the first ones.  On Zen 5
 * (bench/README.md, "Decode on AVX-512") reading the rows one after another
 * streams W at 0.9–1.0 of the read probe per CPU-second where 8 rows read
 * side by side (8 streams 1 row apart, the old T = 1 block) reached 0.5–0.6,
 * and even 2 side by side lost as much: the core's prefetchers follow one
 * stream, not several.  The sum's order is fixed per row (the same on any
 * thread count), but not the T > 1 blocks' order.  lim: the byte offset of
 * W's last byte from row r's first byte; prefetches stop there. */
#define GEMV_ROW_PF_BYTES 4096
#define GEMV_ROW_PF(off)                                                                    \
    do {                                                                                    \
        int64_t o_ = (off) + GEMV_ROW_PF_BYTES;                                             \
        _mm_prefetch(wb + (o_ < lim ? o_ : lim), _MM_HINT_T0);                              \
    } while (0)

static inline __attribute__((always_inline)) T512BF void gemv_row(const gemv_job *j, int64_t r, int64_t lim)
{
    const int64_t k = j->k;
    __m512 a[4], b[4];
    for (int u = 0; u < 4; u++) a[u] = b[u] = _mm512_setzero_ps();
    int64_t i = 0;
    if (j->wt == TP_F32) {
        const float *w = (const float *)j->w + r * k;
        const char *wb = (const char *)w;
        for (; i + 64 <= k; i += 64)
#pragma GCC unroll 4
            for (int u = 0; u < 4; u++) {
                GEMV_ROW_PF(4 * (i + 16 * u));
                a[u] = _mm512_fmadd_ps(_mm512_loadu_ps(w + i + 16 * u), _mm512_loadu_ps(j->x + i + 16 * u), a[u]);
            }
        for (; i < k; i += 16) {
            __mmask16 m = tp_mask16(k - i);
            a[0] = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, w + i), _mm512_maskz_loadu_ps(m, j->x + i), a[0]);
        }
    } else if (!j->dot) {
        const uint16_t *w = (const uint16_t *)j->w + r * k;
        const char *wb = (const char *)w;
        const __m512i hi = _mm512_set1_epi32((int)0xffff0000u);
        for (; i + 128 <= k; i += 128)
#pragma GCC unroll 4
            for (int u = 0; u < 4; u++) {
                int64_t c = i + 32 * u;
                GEMV_ROW_PF(2 * c);
                __m512i v = _mm512_loadu_si512(w + c);
                a[u] = _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_slli_epi32(v, 16)), _mm512_load_ps(j->x + c), a[u]);
                b[u] = _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_and_si512(v, hi)), _mm512_load_ps(j->x + c + 16),
                                       b[u]);
            }
        for (; i < k; i += 32) {
            __mmask32 m = k - i >= 32 ? 0xffffffffu : (__mmask32)((1u << (k - i)) - 1);
            __m512i v = _mm512_maskz_loadu_epi16(m, w + i);
            a[0] = _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_slli_epi32(v, 16)), _mm512_load_ps(j->x + i), a[0]);
            b[0] = _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_and_si512(v, hi)), _mm512_load_ps(j->x + i + 16), b[0]);
        }
    } else {
        const uint16_t *w = (const uint16_t *)j->w + r * k;
        const char *wb = (const char *)w;
        const uint16_t *xb = (const uint16_t *)j->x;
        for (; i + 128 <= k; i += 128)
#pragma GCC unroll 4
            for (int u = 0; u < 4; u++) {
                int64_t c = i + 32 * u;
                GEMV_ROW_PF(2 * c);
                a[u] = _mm512_dpbf16_ps(a[u], (__m512bh)_mm512_load_si512(xb + c),
                                        (__m512bh)_mm512_loadu_si512(w + c));
            }
        for (; i < k; i += 32) {
            __mmask32 m = k - i >= 32 ? 0xffffffffu : (__mmask32)((1u << (k - i)) - 1);
            a[0] = _mm512_dpbf16_ps(a[0], (__m512bh)_mm512_load_si512(xb + i),
                                    (__m512bh)_mm512_maskz_loadu_epi16(m, w + i));
        }
    }
    for (int u = 0; u < 4; u++) a[u] = _mm512_add_ps(a[u], b[u]);
    j->y[r] = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a[0], a[1]), _mm512_add_ps(a[2], a[3])));
}

/* All blocks of R rows in [r0, r1), then single rows. */
#define GEMV_RUN(R, T)                                                                    \
    do {                                                                                  \
        for (; r0 + (R) <= r1; r0 += (R)) gemv_block(j, r0, (R), (T), last - r0 * row_bytes); \
        for (; r0 < r1; r0++) gemv_block(j, r0, 1, (T), last - r0 * row_bytes);           \
    } while (0)

/* Rows [r0, r1) of one weight.  Prefetches may run past the rows into the
 * rest of the weight (usually the same thread's next chunk), never past
 * its last byte. */
static inline __attribute__((always_inline)) T512BF void gemv_rows(const gemv_job *j, int64_t r0, int64_t r1)
{
    int64_t row_bytes = j->k * (j->wt == TP_F32 ? 4 : 2);
    int64_t last = j->n * row_bytes - 1;
    switch (j->T) {
    case 1:
        for (; r0 < r1; r0++) gemv_row(j, r0, last - r0 * row_bytes);
        break;
    case 2: GEMV_RUN(GEMV_ROWS, 2); break;
    case 3: GEMV_RUN(GEMV_ROWS, 3); break;
    default: GEMV_RUN(GEMV_ROWS, 4); break;
    }
}

/* The weights of one call (a group shares x) cut into chunks of `rows`
 * rows, numbered across the weights: weight i's chunks start at first[i]. */
typedef struct {
    gemv_job part[TP_GEMM_GROUP_MAX];
    int64_t first[TP_GEMM_GROUP_MAX + 1];
    int64_t rows;
    int count;
} gemv_group;

/* Chunks [c0, c1) (tp_parallel_for).  Each row's sum is the same whoever
 * computes it and whatever rows share its chunk, so the dynamic split
 * keeps the bits of any thread count. */
T512BF static void gemv_chunks(void *p, int64_t c0, int64_t c1, int ti)
{
    (void)ti;
    const gemv_group *g = p;
    for (int64_t c = c0; c < c1; c++) {
        int i = 0;
        while (c >= g->first[i + 1]) i++;
        const gemv_job *j = &g->part[i];
        int64_t r0 = (c - g->first[i]) * g->rows, r1 = r0 + g->rows < j->n ? r0 + g->rows : j->n;
        gemv_rows(j, r0, r1);
    }
}

/* x rounded to bf16 (nearest even), rows zero-padded to kp. */
T512BF static void x_to_bf16(uint16_t *dst, const float *x, int64_t T, int64_t k, int64_t kp)
{
    for (int64_t t = 0; t < T; t++)
        for (int64_t i = 0; i < kp; i += 16) {
            __mmask16 m = k - i >= 16 ? 0xffff : k - i <= 0 ? 0 : (__mmask16)((1u << (k - i)) - 1);
            __m256bh b = _mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(m, x + t * k + i));
            _mm256_storeu_si256((__m256i *)(dst + t * kp + i), (__m256i)b);
        }
}

/* Two vpermt2ps per block of 32 (kern_internal.h): a generic loop divided
 * per element and cost ~4 µs per call at k = 1024, serial before the
 * threads start. */
T512 void tp_permute_x_avx512(float *dst, const float *x, int64_t T, int64_t k, int64_t kp)
{
    const __m512i ev = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i od = _mm512_add_epi32(ev, _mm512_set1_epi32(1));
    for (int64_t t = 0; t < T; t++)
        for (int64_t i = 0; i < kp; i += 32) {
            __mmask16 m0 = tp_mask16(k - i), m1 = tp_mask16(k - i - 16);
            __m512 a = _mm512_maskz_loadu_ps(m0, x + t * k + i);
            __m512 b = _mm512_maskz_loadu_ps(m1, x + t * k + i + 16);
            _mm512_store_ps(dst + t * kp + i, _mm512_permutex2var_ps(a, ev, b));
            _mm512_store_ps(dst + t * kp + i + 16, _mm512_permutex2var_ps(a, od, b));
        }
}

tp_status tp_gemv_avx512_group(const tp_gemm_part *parts, int count, const float *x, int64_t T, tp_dtype wt,
                               int64_t k, int bf16_dot, tp_threadpool *pool)
{
    if (count < 1 || count > TP_GEMM_GROUP_MAX)
        return tp_fail(TP_ERR_INTERNAL, "tp_gemv_avx512_group: %d weights (1..%d)", count, TP_GEMM_GROUP_MAX);
    gemv_job j = {NULL, x, NULL, wt, T, 0, k, k, bf16_dot && wt == TP_BF16};
    void *tmp = NULL;
    if (wt == TP_BF16) {
        j.kp = (k + 31) / 32 * 32;
        tmp = tp_alloc((size_t)(T * j.kp) * sizeof(float));
        if (!tmp) return tp_fail(TP_ERR_NOMEM, "tp_matmul: out of memory for GEMV");
        if (j.dot) x_to_bf16(tmp, x, T, k, j.kp);
        else tp_permute_x_avx512(tmp, x, T, k, j.kp);
        j.x = tmp;
    }
    gemv_group g = {.count = count, .rows = tp_gemv_chunk_rows(k * (wt == TP_F32 ? 4 : 2), T == 1 ? 1 : GEMV_ROWS)};
    g.first[0] = 0;
    for (int i = 0; i < count; i++) {
        g.part[i] = j;
        g.part[i].y = parts[i].y;
        g.part[i].w = parts[i].w;
        g.part[i].n = parts[i].n;
        g.first[i + 1] = g.first[i] + (parts[i].n + g.rows - 1) / g.rows;
    }
    tp_parallel_for(pool, g.first[count], 1, gemv_chunks, &g);
    tp_free(tmp);
    return TP_OK;
}

tp_status tp_gemv_avx512(float *y, const float *x, int64_t T, const void *W, tp_dtype wt,
                         int64_t n, int64_t k, int bf16_dot, tp_threadpool *pool)
{
    tp_gemm_part part = {y, W, n};
    return tp_gemv_avx512_group(&part, 1, x, T, wt, k, bf16_dot, pool);
}
