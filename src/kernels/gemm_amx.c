/* AMX-BF16 GEMM: y[T, n] = x[T, k] · W[n, k]ᵀ for bf16 W (prefill, T > 4).
 *
 * TDPBF16PS multiplies a 16×32 bf16 tile of x by a 32×16 bf16 tile of Wᵀ
 * into a 16×16 f32 tile: 16 K flops in one instruction, many times the
 * AVX-512 FMA rate.  Both operands must be bf16, so x (f32) is split:
 *
 *   passes = 1:  x ≈ hi = bf16(x)                 products off by ≤ 2^-9
 *   passes = 2:  x ≈ hi + lo, lo = bf16(x - hi)   products off by ≤ 2^-18
 *   passes = 3:  x = hi + mid + lo                exact for normal x
 *
 * x − hi and the later residuals are exact in f32 (Sterbenz), and three
 * 8-bit bf16 significands cover f32's 24, so with three passes every
 * product w·x is formed exactly and the only rounding is the f32
 * accumulation — the same error class as the widen-and-FMA path.  Each
 * pass is one more TDPBF16PS per tile; the W tile is loaded once for all.
 *
 * Layout.  The 8 tile registers hold a 32×32 block of y: C = tmm0..3
 * (2×2 tiles of 16×16 f32), A = tmm4,5 (two 16-row slabs of x, 32 k),
 * B = tmm6,7 (two 16-column slabs of W).  B tiles are in the VNNI layout,
 * row kk = the pairs (W[c][2kk], W[c][2kk+1]) of 16 columns c, which is
 * what pack_b builds with 32-bit gathers (the same [k/2][32] layout the
 * AVX-512 bf16-dot GEMM uses).  The split x is stored in tile order,
 * [Tp/32][kp/32][passes][32 rows][32 k] bf16, so the A tiles of one k step
 * (all passes) are one contiguous run that the L2 prefetcher streams in;
 * row-major x with a stride of kp·2 bytes made every A tile 16 scattered
 * lines and cost a third of the rate.
 *
 * Blocking, GotoBLAS style: K blocks of KC; the split x of one K block
 * (Tp × KC × passes bf16, ≤ 1.5 MiB at T=512) stays in L2 while a thread
 * walks its 32-column slices of W; each packed W slice (KC × 32 bf16,
 * ≤ 48 KiB) is reused by all T/32 row blocks.  The threads split the
 * slices, so W is read once overall and no two threads write the same y.
 * After the first K block, C tiles are reloaded from y and accumulated.
 *
 * The tile unit is enabled per process by cpu.c (arch_prctl) and
 * configured per thread here (ldtilecfg at the start of every worker,
 * tilerelease at its end), so pool threads never keep AMX state alive. */
#include "kernels/kern_internal.h"

#include <immintrin.h>
#include <stdlib.h>
#include <string.h>

#define TAMX __attribute__((target("amx-tile,amx-bf16,avx512f,avx512bw,avx512vl,avx512bf16,fma,avx2")))

#define BT 32        /* rows of y per block: two 16-row A tiles   */
#define BN 32        /* columns of y per block: two 16-col B tiles */
#define KT 32        /* k per tile step: 32 bf16 = 64 bytes        */

/* gcc's tile intrinsics are asm statements that do not declare the memory
 * they read, so stores made by plain C (the packed W, the tile config)
 * must be forced out before them. */
#define MEMORY_BARRIER() __asm__ volatile("" ::: "memory")

static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
static int64_t round_up(int64_t a, int64_t m) { return (a + m - 1) / m * m; }

/* K block: the split x block of Tp rows stays within ~1.5 MiB of L2. */
static int64_t k_block(int64_t Tp, int passes)
{
    int64_t kc = ((int64_t)3 << 19) / (Tp * 2 * passes) / KT * KT;
    if (kc < 256) kc = 256;
    if (kc > 2048) kc = 2048;
    return kc;
}

/* ---- palette-1 tile configuration (64 bytes, Intel SDM vol. 1 §3.2) ---- */

typedef struct {
    uint8_t palette, start_row;
    uint8_t reserved[14];
    uint16_t colsb[16];   /* bytes per row of tmm0..15 */
    uint8_t rows[16];
} __attribute__((aligned(64))) tile_config;

static void tile_config_init(tile_config *c)
{
    memset(c, 0, sizeof *c);
    c->palette = 1;
    for (int t = 0; t < 8; t++) {   /* every tile 16 rows × 64 bytes */
        c->rows[t] = 16;
        c->colsb[t] = 64;
    }
}

/* ---- splitting x ------------------------------------------------------ */

typedef struct {
    uint16_t *xs;        /* [Tp/32][kp/32][passes][32][32] */
    const float *x;
    int64_t T, Tp, k, kp;
    int passes;
} split_job;

TAMX static __m512 widen(__m256bh b)
{
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32((__m256i)b), 16));
}

/* Rows of x → passes bf16 parts, each rounded to nearest even from the
 * residual of the previous ones; padding rows and columns are zero. */
TAMX static void split_worker(void *p, int ti, int nt)
{
    const split_job *j = p;
    int64_t r0, r1;
    tp_split_range(j->Tp, ti, nt, &r0, &r1);
    int64_t ksteps = j->kp / KT;
    for (int64_t t = r0; t < r1; t++) {
        uint16_t *row = j->xs + (t / BT) * ksteps * j->passes * (BT * KT) + (t % BT) * KT;
        for (int64_t i = 0; i < j->kp; i += 16) {
            int64_t valid = t < j->T ? j->k - i : 0;
            __mmask16 m = valid >= 16 ? 0xffff : valid <= 0 ? 0 : (__mmask16)((1u << valid) - 1);
            __m512 r = _mm512_maskz_loadu_ps(m, j->x + t * j->k + i);
            uint16_t *d = row + (i / KT) * j->passes * (BT * KT) + i % KT;
            for (int ps = 0; ps < j->passes; ps++) {
                __m256bh b = _mm512_cvtneps_pbh(r);
                _mm256_storeu_si256((__m256i *)(d + ps * (BT * KT)), (__m256i)b);
                r = _mm512_sub_ps(r, widen(b));
            }
        }
    }
}

/* ---- packing W -------------------------------------------------------- */

/* W[n0:n0+32, k0:k0+kc] → dst[kcp/2][32] of (k, k+1) bf16 pairs, kcp = kc
 * rounded up to KT; columns past n and k past kc are zero. */
TAMX static void pack_b(uint32_t *dst, const uint16_t *w, int64_t n, int64_t ldw, int64_t n0,
                        int64_t k0, int64_t kc, int64_t kcp)
{
    const __m512i idx = _mm512_mullo_epi32(
        _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15), _mm512_set1_epi32((int)ldw));
    for (int h = 0; h < 2; h++) {
        int64_t c0 = n0 + 16 * h, valid = n - c0;
        __mmask16 m = valid >= 16 ? 0xffff : valid <= 0 ? 0 : (__mmask16)((1u << valid) - 1);
        uint32_t *d = dst + 16 * h;
        const uint16_t *base = w + (m ? c0 * ldw + k0 : 0);
        int64_t k = 0;
        for (; k + 1 < kc; k += 2)
            _mm512_store_si512(d + (k / 2) * BN,
                               _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), m, idx, base + k, 2));
        if (k < kc) {   /* odd tail: a 32-bit read could pass the end of W */
            for (int j = 0; j < 16; j++) d[(k / 2) * BN + j] = (m >> j) & 1 ? base[j * ldw + k] : 0;
            k += 2;
        }
        for (; k < kcp; k += 2) _mm512_store_si512(d + (k / 2) * BN, _mm512_setzero_si512());
    }
}

/* ---- the tile loop ---------------------------------------------------- */

/* One 32×32 block of y over one K block.  a: the split x chunk of the
 * block's first k step (32×32 bf16 per pass, passes after each other);
 * b: the packed slice; c: where the block lives (ldc floats per row),
 * loaded first when accumulate.  Tile numbers must be literals, hence
 * PASS(). */
TAMX static void tile_block(const uint16_t *a, const uint32_t *b, int64_t kcp, int passes, float *c,
                            int64_t ldc, int accumulate)
{
    long sa = KT * 2, sb = BN * 4, sc = (long)(ldc * 4);
    if (accumulate) {
        _tile_loadd(0, c, sc);
        _tile_loadd(1, c + 16, sc);
        _tile_loadd(2, c + 16 * ldc, sc);
        _tile_loadd(3, c + 16 * ldc + 16, sc);
    } else {
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
    }
#define PASS(ap)                          \
    do {                                  \
        _tile_loadd(4, (ap), sa);         \
        _tile_loadd(5, (ap) + 16 * KT, sa);  \
        _tile_dpbf16ps(0, 4, 6);          \
        _tile_dpbf16ps(1, 4, 7);          \
        _tile_dpbf16ps(2, 5, 6);          \
        _tile_dpbf16ps(3, 5, 7);          \
    } while (0)
    for (int64_t k = 0; k < kcp; k += KT) {
        const uint32_t *bk = b + (k / 2) * BN;
        _tile_loadd(6, bk, sb);
        _tile_loadd(7, bk + 16, sb);
        const uint16_t *ak = a + (k / KT) * passes * (BT * KT);
        PASS(ak);
        if (passes > 1) PASS(ak + BT * KT);
        if (passes > 2) PASS(ak + 2 * BT * KT);
    }
#undef PASS
    _tile_stored(0, c, sc);
    _tile_stored(1, c + 16, sc);
    _tile_stored(2, c + 16 * ldc, sc);
    _tile_stored(3, c + 16 * ldc + 16, sc);
}

typedef struct {
    float *y;
    const uint16_t *xs;
    const uint16_t *w;
    int64_t T, Tp, n, k, kp, kc;
    int passes;
    char *buf;           /* per thread: packed slice, then a 32×32 y block */
    size_t buf_stride;
} amx_job;

TAMX static void amx_worker(void *p, int ti, int nt)
{
    const amx_job *j = p;
    int64_t b0, b1;
    tp_split_range((j->n + BN - 1) / BN, ti, nt, &b0, &b1);
    if (b0 == b1) return;
    uint32_t *bp = (uint32_t *)(j->buf + (size_t)ti * j->buf_stride);
    float *edge = (float *)(bp + (j->kc / 2) * BN);
    int64_t ksteps = j->kp / KT;
    tile_config cfg;
    tile_config_init(&cfg);
    MEMORY_BARRIER();
    _tile_loadconfig(&cfg);
    for (int64_t k0 = 0; k0 < j->k; k0 += j->kc) {
        int64_t kc = min64(j->kc, j->k - k0), kcp = round_up(kc, KT);
        for (int64_t nb = b0; nb < b1; nb++) {
            int64_t n0 = nb * BN, nr = min64(BN, j->n - n0);
            pack_b(bp, j->w, j->n, j->k, n0, k0, kc, kcp);
            MEMORY_BARRIER();
            for (int64_t t0 = 0; t0 < j->T; t0 += BT) {
                int64_t mr = min64(BT, j->T - t0);
                const uint16_t *a = j->xs + ((t0 / BT) * ksteps + k0 / KT) * j->passes * (BT * KT);
                float *c = j->y + t0 * j->n + n0;
                if (mr == BT && nr == BN) {
                    tile_block(a, bp, kcp, j->passes, c, j->n, k0 > 0);
                    continue;
                }
                /* A partial block goes through a full 32×32 scratch. */
                if (k0 > 0)
                    for (int64_t i = 0; i < mr; i++) memcpy(edge + i * BN, c + i * j->n, (size_t)nr * sizeof(float));
                MEMORY_BARRIER();
                tile_block(a, bp, kcp, j->passes, edge, BN, k0 > 0);
                for (int64_t i = 0; i < mr; i++) memcpy(c + i * j->n, edge + i * BN, (size_t)nr * sizeof(float));
            }
        }
    }
    _tile_release();
}

tp_status tp_gemm_amx(float *y, const float *x, int64_t T, const uint16_t *W, int64_t n, int64_t k,
                      int passes, tp_threadpool *pool)
{
    if (passes < 1) passes = 1;
    if (passes > 3) passes = 3;
    int nt = tp_threadpool_size(pool);
    int64_t Tp = round_up(T, BT), kp = round_up(k, KT);
    amx_job j = {y, NULL, W, T, Tp, n, k, kp, k_block(Tp, passes), passes, NULL, 0};
    /* malloc, not tp_alloc: these buffers (up to a few MiB) come back on
     * every call of every layer, and glibc recycles freed heap memory while
     * a fresh mmap (tp_alloc's huge pages) faults in zeroed pages each
     * time — that cost as much as the split itself. */
    size_t xs_bytes = (size_t)passes * (size_t)(Tp * kp) * sizeof(uint16_t);
    uint16_t *xs = aligned_alloc(64, xs_bytes);
    j.buf_stride = (size_t)round_up((j.kc / 2) * BN * 4 + BT * BN * 4, 64);
    j.buf = aligned_alloc(64, j.buf_stride * (size_t)nt);
    if (!xs || !j.buf) {
        free(xs);
        free(j.buf);
        return tp_fail(TP_ERR_NOMEM, "tp_matmul: out of memory for the AMX GEMM");
    }
    split_job s = {xs, x, T, Tp, k, kp, passes};
    tp_parallel_run(pool, split_worker, &s);
    j.xs = xs;
    tp_parallel_run(pool, amx_worker, &j);
    free(xs);
    free(j.buf);
    return TP_OK;
}
