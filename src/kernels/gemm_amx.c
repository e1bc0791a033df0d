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
 * row kk = the pairs (W[c][2kk], W[c][2kk+1]) of 16 columns c: seen as
 * 32-bit pairs that is the transpose of 16 rows of W, which pack_tile
 * builds with in-register shuffles (the 32-bit gathers used before cost
 * several times more).  The split x is stored in tile order,
 * [Tp/32][kp/32][passes][32 rows][32 k] bf16, so the A tiles of one k
 * step (all passes) are one contiguous run.
 *
 * Blocking.  The limit is L2 bandwidth: per k step a block loads 6 A
 * tiles (the passes) and 2 B tiles for 12 TDPBF16PS, more than L2 feeds,
 * so the A chunk of a 32-row block (≤ 36 KiB: 6 k steps at 3 passes) is
 * reused from L1 across many 32-column slices while B streams.  Per
 * thread, a group of ≤ 512 rows and NB of its columns is finished before
 * the next: for each K block the NB columns of W are packed into a panel,
 * then each row block runs over all slices.  C lives between K blocks in
 * a per-thread accumulator in tile order (≤ 512 KiB, L2), not in y: y's
 * rows are n floats apart (4 or 8 KiB at these shapes), so 16-row tile
 * loads and stores of y fell into one L1 set and cost a third of the run
 * time.  Each finished block goes to y once, with vector stores.  When
 * all of split x fits in L2 (short prompts), there is one K block and the
 * loop runs slice by slice instead, each slice packed just before use.
 *
 * Storing and reloading f32 tiles is exact, and every element of y is
 * accumulated in the same order of k steps and passes whatever the
 * blocking, so the sums are the same bits for any thread count (and the
 * same as the unblocked loop).  Threads split the 32-column slices, so no
 * two write the same y.
 *
 * The tile unit is enabled per process by cpu.c (arch_prctl) and
 * configured per thread here (ldtilecfg at the start of every worker,
 * tilerelease at its end), so pool threads never keep AMX state alive. */
#include "kernels/kern_internal.h"
#include "kernels/vmath.h"

#include <immintrin.h>
#include <stdlib.h>
#include <string.h>

#define TAMX __attribute__((target("amx-tile,amx-bf16,avx512f,avx512bw,avx512vl,avx512bf16,fma,avx2")))

#define BT 32        /* rows of y per block: two 16-row A tiles   */
#define BN 32        /* columns of y per block: two 16-col B tiles */
#define KT 32        /* k per tile step: 32 bf16 = 64 bytes        */

/* Per-thread cache budgets in bytes that set the blocking, tuned on a
 * Sapphire Rapids class core (48 KiB L1d, 2 MiB L2). */
#define ROWS_MAX 512                /* rows of y per row group             */
#define ACHUNK_BYTES (36 << 10)     /* split x of one row block, K block   */
#define XBLOCK_BYTES (768 << 10)    /* split x of one row group, K block   */
#define XFIT_BYTES (1280 << 10)     /* all of split x: one K block         */
#define PANEL_BYTES (256 << 10)     /* packed W of one column group        */
#define ACC_BYTES (512 << 10)       /* accumulator of one row × col group  */

/* gcc's tile intrinsics are asm statements that do not declare the memory
 * they read or write, so plain C accesses to the same memory (the packed
 * W, the tile config, the accumulator) must be fenced off from them. */
#define MEMORY_BARRIER() __asm__ volatile("" ::: "memory")

static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
static int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }
static int64_t round_up(int64_t a, int64_t m) { return (a + m - 1) / m * m; }

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
    return tp_bf16x16_to_ps((__m256i)b);
}

/* Rows of x → passes bf16 parts, each rounded to nearest even from the
 * residual of the previous ones; padding rows and columns are zero.  The
 * threads take whole 32-row blocks and write each block's k steps in
 * order, so the stores run through memory sequentially. */
TAMX static void split_worker(void *p, int ti, int nt)
{
    const split_job *j = p;
    int64_t b0, b1, chunk = j->passes * (BT * KT);
    tp_split_range(j->Tp / BT, ti, nt, &b0, &b1);
    for (int64_t b = b0; b < b1; b++) {
        uint16_t *d = j->xs + b * (j->kp / KT) * chunk;
        for (int64_t i = 0; i < j->kp; i += KT, d += chunk)
            for (int64_t r = 0; r < BT; r++) {
                int64_t t = b * BT + r;
                if (t < j->T) {   /* 32 row streams: more than the prefetchers follow */
                    _mm_prefetch((const char *)(j->x + t * j->k + i + 4 * KT), _MM_HINT_T0);
                    _mm_prefetch((const char *)(j->x + t * j->k + i + 4 * KT + 16), _MM_HINT_T0);
                }
                for (int h = 0; h < KT; h += 16) {
                    int64_t valid = t < j->T ? j->k - i - h : 0;
                    __mmask16 m = valid >= 16 ? 0xffff : valid <= 0 ? 0 : (__mmask16)((1u << valid) - 1);
                    __m512 v = _mm512_maskz_loadu_ps(m, j->x + t * j->k + i + h);
                    for (int ps = 0; ps < j->passes; ps++) {
                        __m256bh hb = _mm512_cvtneps_pbh(v);
                        _mm256_store_si256((__m256i *)(d + ps * (BT * KT) + r * KT + h), (__m256i)hb);
                        v = _mm512_sub_ps(v, widen(hb));
                        /* An infinity's residual is inf - inf = NaN, which
                         * would make the next part's products NaN where the
                         * f32 path gives ±inf: the whole value is in the part
                         * just taken, so the rest is 0.  (A NaN x stays NaN
                         * through its first part.) */
                        v = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(v, v, _CMP_ORD_Q), v);
                    }
                }
            }
    }
}

/* ---- packing W -------------------------------------------------------- */

/* In-register transpose of 16 rows of 16 32-bit elements (vmath.h's, on
 * integer registers). */
TAMX static void transpose16(__m512i r[16])
{
    __m512 f[16];
    for (int i = 0; i < 16; i++) f[i] = _mm512_castsi512_ps(r[i]);
    tp_transpose16x16(f);
    for (int i = 0; i < 16; i++) r[i] = _mm512_castps_si512(f[i]);
}

/* One B tile: rows w[0..rows) (ldw apart) of W, k values [0, kvalid) of
 * each, → dst[16 kk][16 columns] 32-bit pairs, ldd pairs apart.  Missing
 * rows and k are zero; the masked loads never read past them. */
TAMX static void pack_tile(uint32_t *dst, int64_t ldd, const uint16_t *w, int64_t ldw, int64_t rows,
                           int64_t kvalid)
{
    __mmask32 km = kvalid >= 32 ? 0xffffffffu : (__mmask32)((1u << kvalid) - 1);
    __m512i r[16];
    for (int i = 0; i < 16; i++)
        r[i] = i < rows ? _mm512_maskz_loadu_epi16(km, w + i * ldw) : _mm512_setzero_si512();
    transpose16(r);
    for (int i = 0; i < 16; i++) _mm512_store_si512(dst + i * ldd, r[i]);
}

/* Columns [c0, c0 + nc) of y (rows of W), k [k0, k0 + kc) → panel of nc/32
 * slices, each [kcp/2][32] pairs; columns past n and k past kc are zero. */
TAMX static void pack_panel(uint32_t *dst, const uint16_t *w, int64_t n, int64_t ldw, int64_t c0, int64_t nc,
                            int64_t k0, int64_t kc, int64_t kcp)
{
    for (int64_t s = 0; s < nc; s += BN, dst += (kcp / 2) * BN)
        for (int h = 0; h < 2; h++) {
            int64_t c = c0 + s + 16 * h, rows = n - c;
            if (rows <= 0) {   /* all padding: zero the half slice */
                for (int64_t kk = 0; kk < kcp / 2; kk++)
                    _mm512_store_si512(dst + kk * BN + 16 * h, _mm512_setzero_si512());
                continue;
            }
            for (int64_t k = 0; k < kcp; k += KT)
                pack_tile(dst + (k / 2) * BN + 16 * h, BN, w + c * ldw + k0 + k, ldw, rows, kc - k);
        }
}

/* ---- the tile loop ---------------------------------------------------- */

/* Lines to fetch into L2 while the tile unit works: rows of row_bytes,
 * ld bytes apart (one row for a contiguous run), issued a few at a time. */
typedef struct {
    const char *row;     /* the current row; NULL when all are issued */
    int64_t ld, lines_per_row, rows_left, line;
} prefetch_stream;

static void stream_init(prefetch_stream *s, const void *p, int64_t ld, int64_t row_bytes, int64_t rows)
{
    s->row = rows > 0 ? p : NULL;
    s->ld = ld;
    s->lines_per_row = (row_bytes + 63) / 64 + 1;   /* + 1: rows need not start on a line */
    s->rows_left = rows;
    s->line = 0;
}

static int64_t stream_lines(const prefetch_stream *s) { return s->row ? s->rows_left * s->lines_per_row : 0; }

static void stream_fetch(prefetch_stream *s, int64_t count)
{
    for (; count > 0 && s->row; count--) {
        _mm_prefetch(s->row + s->line * 64, _MM_HINT_T1);
        if (++s->line == s->lines_per_row) {
            s->line = 0;
            s->row = --s->rows_left > 0 ? s->row + s->ld : NULL;
        }
    }
}

/* One 32×32 block of y over one K block.  a: the split x chunk of the
 * block's first k step (32×32 bf16 per pass, passes after each other);
 * b: the packed slice; cin: the block's sums so far (32 rows of 32
 * floats), NULL for zero; cout: where the new sums go; pf: pfl lines per
 * k step to fetch for a later block.  B and C are loaded with the streaming hint (TILELOADDT1):
 * the A chunk is the operand reused from L1, and the hint keeps the
 * others from evicting it (about 10 % at T = 512).  Tile numbers must be
 * literals, hence PASS(). */
TAMX static void tile_block(const uint16_t *a, const uint32_t *b, int64_t kcp, int passes, const float *cin,
                            float *cout, prefetch_stream *pf, int64_t pfl)
{
    long sa = KT * 2, sb = BN * 4, sc = BN * 4;
    if (cin) {
        _tile_stream_loadd(0, cin, sc);
        _tile_stream_loadd(1, cin + 16, sc);
        _tile_stream_loadd(2, cin + 16 * BN, sc);
        _tile_stream_loadd(3, cin + 16 * BN + 16, sc);
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
        _tile_stream_loadd(6, bk, sb);
        _tile_stream_loadd(7, bk + 16, sb);
        const uint16_t *ak = a + (k / KT) * passes * (BT * KT);
        stream_fetch(pf, pfl);
        PASS(ak);
        if (passes > 1) PASS(ak + BT * KT);
        if (passes > 2) PASS(ak + 2 * BT * KT);
    }
#undef PASS
    _tile_stored(0, cout, sc);
    _tile_stored(1, cout + 16, sc);
    _tile_stored(2, cout + 16 * BN, sc);
    _tile_stored(3, cout + 16 * BN + 16, sc);
}

/* One finished 32×32 accumulator block → y at row t0, column c0; rows past
 * T and columns past n are dropped. */
TAMX static void store_block(float *y, int64_t T, int64_t n, const float *c, int64_t t0, int64_t c0)
{
    int64_t v = n - c0, nr = min64(BT, T - t0);
    __mmask16 m0 = v >= 16 ? 0xffff : v <= 0 ? 0 : (__mmask16)((1u << v) - 1);
    __mmask16 m1 = v >= 32 ? 0xffff : v <= 16 ? 0 : (__mmask16)((1u << (v - 16)) - 1);
    for (int64_t i = 0; i < nr; i++) {
        _mm512_mask_storeu_ps(y + (t0 + i) * n + c0, m0, _mm512_load_ps(c + i * BN));
        _mm512_mask_storeu_ps(y + (t0 + i) * n + c0 + 16, m1, _mm512_load_ps(c + i * BN + 16));
    }
}

typedef struct {
    float *y;
    const uint16_t *xs;
    const uint16_t *w;
    int64_t T, Tp, n, k, kp;
    int64_t tb, nkb, nb; /* rows per row group, K blocks, columns per column group */
    int passes;
    char *buf;           /* per thread: panel, then accumulator */
    size_t panel_bytes, buf_stride;
} amx_job;

/* K block kb: k steps [*s0, *s1) of ksteps, the blocks as even as can be. */
static void k_block(const amx_job *j, int64_t kb, int64_t *s0, int64_t *s1)
{
    *s0 = kb * (j->kp / KT) / j->nkb;
    *s1 = (kb + 1) * (j->kp / KT) / j->nkb;
}

/* The W rows [c0, c1) and k steps [s0, s1) that a panel is packed from. */
static void w_stream(prefetch_stream *s, const amx_job *j, int64_t c0, int64_t c1, int64_t s0, int64_t s1)
{
    int64_t rows = min64(c1, j->n) - c0, k0 = s0 * KT;
    stream_init(s, rows > 0 ? j->w + c0 * j->k + k0 : NULL, j->k * 2, (min64(s1 * KT, j->k) - k0) * 2, rows);
}

/* One row group × column group of y over all K blocks (several when x is
 * too big for L2).  Order: for each K block, pack the group's panel, then
 * for each 32-row block all slices, so that the row block's A chunk (at
 * most ACHUNK_BYTES) is reused from L1 while B streams from L2.  In the
 * last K block each finished block goes through a 4 KiB scratch in L1 to
 * y at once, so that the stores drain while the tile unit works on the
 * next block.
 *
 * Prefetches into L2 run alongside: the A chunk of the next row block
 * (the chunks of a K block do not all stay in L2, and the hardware
 * prefetchers stop at every 4 KiB page) and the W of the next panel. */
TAMX static void run_group(const amx_job *j, uint32_t *panel, float *acc, int64_t t0, int64_t rows, int64_t c0,
                           int64_t nc, int64_t cend)
{
    int64_t ksteps = j->kp / KT, nblk = nc / BN, chunk = j->passes * (BT * KT);
    float out[BT * BN] __attribute__((aligned(64)));
    for (int64_t kb = 0; kb < j->nkb; kb++) {
        int64_t s0, s1, n0, n1;
        k_block(j, kb, &s0, &s1);
        int64_t steps = s1 - s0, k0 = s0 * KT, kc = min64(s1 * KT, j->k) - k0, kcp = steps * KT;
        pack_panel(panel, j->w, j->n, j->k, c0, nc, k0, kc, kcp);
        MEMORY_BARRIER();
        int last = kb + 1 == j->nkb;
        prefetch_stream wp, ap;
        k_block(j, last ? 0 : kb + 1, &n0, &n1);
        if (!last) w_stream(&wp, j, c0, c0 + nc, n0, n1);
        else w_stream(&wp, j, c0 + nc, min64(cend, c0 + nc + j->nb), n0, n1);
        int64_t wpl = (stream_lines(&wp) + rows / BT * nblk - 1) / (rows / BT * nblk);
        for (int64_t r = 0; r < rows; r += BT) {
            const uint16_t *a = j->xs + (((t0 + r) / BT) * ksteps + s0) * chunk;
            const uint16_t *next = r + BT < rows ? a + ksteps * chunk
                                   : !last ? j->xs + ((t0 / BT) * ksteps + s1) * chunk : NULL;
            stream_init(&ap, next, 0, steps * chunk * 2, next ? 1 : 0);
            int64_t apl = (stream_lines(&ap) + nblk * steps - 1) / (nblk * steps);
            for (int64_t b = 0; b < nblk; b++) {
                float *c = acc + ((r / BT) * nblk + b) * (BT * BN);
                stream_fetch(&wp, wpl);
                tile_block(a, panel + b * (kcp / 2) * BN, kcp, j->passes, kb > 0 ? c : NULL, last ? out : c, &ap,
                           apl);
                MEMORY_BARRIER();
                if (last) store_block(j->y, j->T, j->n, out, t0 + r, c0 + b * BN);
            }
        }
    }
}

/* A column group when all of x fits in L2 (short prompts), one K block:
 * slice by slice, pack it and run all row blocks with it while it is hot;
 * A comes from L2 and the W of the next slice is fetched meanwhile. */
TAMX static void run_group_small(const amx_job *j, uint32_t *panel, float *acc, int64_t c0, int64_t nc,
                                 int64_t cend)
{
    int64_t chunk = j->passes * (BT * KT), nrb = j->Tp / BT;
    for (int64_t b = 0; b < nc; b += BN) {
        pack_panel(panel, j->w, j->n, j->k, c0 + b, BN, 0, j->k, j->kp);
        MEMORY_BARRIER();
        prefetch_stream wp;
        w_stream(&wp, j, c0 + b + BN, min64(cend, c0 + b + 2 * BN), 0, j->kp / KT);
        int64_t wpl = (stream_lines(&wp) + nrb * (j->kp / KT) - 1) / (nrb * (j->kp / KT));
        for (int64_t r = 0; r < nrb; r++) {
            tile_block(j->xs + r * (j->kp / KT) * chunk, panel, j->kp, j->passes, NULL, acc, &wp, wpl);
            MEMORY_BARRIER();
            store_block(j->y, j->T, j->n, acc, r * BT, c0 + b);
        }
    }
}

TAMX static void amx_worker(void *p, int ti, int nt)
{
    const amx_job *j = p;
    int64_t s0, s1;
    tp_split_range((j->n + BN - 1) / BN, ti, nt, &s0, &s1);
    if (s0 == s1) return;
    char *buf = j->buf + (size_t)ti * j->buf_stride;
    uint32_t *panel = (uint32_t *)buf;
    float *acc = (float *)(buf + j->panel_bytes);
    tile_config cfg;
    tile_config_init(&cfg);
    MEMORY_BARRIER();
    _tile_loadconfig(&cfg);
    for (int64_t t0 = 0; t0 < j->Tp; t0 += j->tb)
        for (int64_t c0 = s0 * BN; c0 < s1 * BN; c0 += j->nb) {
            int64_t nc = min64(j->nb, s1 * BN - c0);
            if (j->tb == j->Tp && j->nkb == 1) run_group_small(j, panel, acc, c0, nc, s1 * BN);
            else run_group(j, panel, acc, t0, min64(j->tb, j->Tp - t0), c0, nc, s1 * BN);
        }
    _tile_release();
}

/* Row group, K blocks and column group from the cache budgets; returns
 * the largest K block in k steps. */
static int64_t blocking(amx_job *j)
{
    int64_t ksteps = j->kp / KT, chunk_bytes = (int64_t)j->passes * BT * KT * 2;
    j->tb = min64(j->Tp, ROWS_MAX);
    int64_t steps = max64(1, min64(ACHUNK_BYTES / chunk_bytes, XBLOCK_BYTES / (j->tb / BT * chunk_bytes)));
    if (j->Tp / BT * ksteps * chunk_bytes <= XFIT_BYTES) steps = ksteps;   /* all of x fits in L2 */
    j->nkb = (ksteps + steps - 1) / steps;
    steps = (ksteps + j->nkb - 1) / j->nkb;
    int64_t nb = min64(PANEL_BYTES / (steps * KT * 2), ACC_BYTES / (j->tb * 4));
    j->nb = min64(round_up(j->n, BN), max64(BN, nb / BN * BN));
    return steps;
}

/* The parts share x, so it is split once for all of them; each part then
 * runs with its own blocking (which depends on n).  The split x's layout
 * depends only on T, k and passes. */
tp_status tp_gemm_amx_group(const tp_gemm_part *parts, int count, const float *x, int64_t T, int64_t k,
                            int passes, tp_threadpool *pool)
{
    if (passes < 1) passes = 1;
    if (passes > 3) passes = 3;
    int nt = tp_threadpool_size(pool);
    amx_job j = {NULL, NULL, NULL, T, round_up(T, BT), 0, k, round_up(k, KT), 0, 0, 0, passes, NULL, 0, 0};
    /* The split x and the per-thread panels live in the pool's scratch,
     * which is faulted in once and reused by every GEMM of every layer: a
     * fresh buffer per call (malloc hands large ones back to the kernel)
     * paid a page fault per 4 KiB each time, as much as the split itself. */
    size_t xs_bytes = ((size_t)passes * (size_t)(j.Tp * j.kp) * sizeof(uint16_t) + 63) / 64 * 64, stride = 0;
    for (int i = 0; i < count; i++) {
        j.n = parts[i].n;
        int64_t steps = blocking(&j);
        size_t need = (size_t)(j.nb * steps * KT * 2) + (size_t)(j.tb * j.nb * 4);
        if (need > stride) stride = need;
    }
    size_t bytes = xs_bytes + stride * (size_t)nt;
    void *own;
    char *mem = tp_kernel_scratch(pool, bytes, &own);
    if (!mem) return tp_fail(TP_ERR_NOMEM, "tp_matmul: out of memory for the AMX GEMM");
    uint16_t *xs = (uint16_t *)mem;
    split_job s = {xs, x, T, j.Tp, k, j.kp, passes};
    tp_parallel_run(pool, split_worker, &s);
    j.xs = xs;
    j.buf = mem + xs_bytes;
    j.buf_stride = stride;
    for (int i = 0; i < count; i++) {
        j.y = parts[i].y;
        j.w = parts[i].w;
        j.n = parts[i].n;
        if (j.n == 0) continue;
        int64_t steps = blocking(&j);
        j.panel_bytes = (size_t)(j.nb * steps * KT * 2);
        tp_parallel_run(pool, amx_worker, &j);
    }
    tp_free(own);
    return TP_OK;
}

tp_status tp_gemm_amx(float *y, const float *x, int64_t T, const uint16_t *W, int64_t n, int64_t k,
                      int passes, tp_threadpool *pool)
{
    tp_gemm_part part = {y, W, n};
    return tp_gemm_amx_group(&part, 1, x, T, k, passes, pool);
}
