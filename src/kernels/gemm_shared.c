/* What the AVX2 and AVX-512 GEMM/GEMV files share: plain C with no target
 * attributes (the kernels' working space, the activation panel packing,
 * the static row split of the quantized kernels, the dynamic GEMVs' chunk
 * size). */
#include "kern_internal.h"

void *tp_kernel_scratch(tp_threadpool *pool, size_t bytes, void **own)
{
    void *p = tp_threadpool_scratch(pool, bytes);
    *own = NULL;
    if (!p) p = *own = tp_alloc(bytes);
    return p;
}

void tp_gemm_pack_a(float *dst, const float *x, int64_t T, int64_t ldx, int64_t k0, int64_t kc, int mr)
{
    for (int64_t p = 0; p < T; p += mr) {
        for (int i = 0; i < mr; i++) {
            float *d = dst + p * kc + i;
            if (p + i < T) {
                const float *s = x + (p + i) * ldx + k0;
                for (int64_t k = 0; k < kc; k++) d[k * mr] = s[k];
            } else {
                for (int64_t k = 0; k < kc; k++) d[k * mr] = 0.0f;
            }
        }
    }
}

/* Rows per unit of the static thread split: whole blocks of R rows, and
 * whole 4 KiB pages where that still shares the rows evenly (each thread's
 * prefetch stream then starts on a page of its own). */
static int64_t gemv_split_unit(int64_t n, int64_t row_bytes, int R, int nt)
{
    int64_t g = 4096;
    while ((R * row_bytes) % g) g /= 2;
    int64_t u = R * (4096 / g);
    return u * nt * 16 <= n ? u : R;   /* keeps the threads' shares within 1/16 */
}

void tp_gemv_thread_rows(int64_t n, int64_t row_bytes, int R, int ti, int nt, int64_t *r0, int64_t *r1)
{
    int64_t u = gemv_split_unit(n, row_bytes, R, nt), g0, g1;
    tp_split_range((n + u - 1) / u, ti, nt, &g0, &g1);
    *r0 = g0 * u;
    *r1 = g1 * u < n ? g1 * u : n;
}

/* 64 KiB: a chunk's claim (one atomic add on the thread's own cache line)
 * and the prefetch stream's restart after a stolen chunk are lost in ~3 µs
 * of reading, and a thread that the OS or the host stops for a while
 * leaves all but one chunk of its share to the others. */
#define TP_GEMV_CHUNK_BYTES 65536

int64_t tp_gemv_chunk_rows(int64_t row_bytes, int R)
{
    int64_t rows = row_bytes > 0 ? TP_GEMV_CHUNK_BYTES / row_bytes : 1;
    rows = (rows + R - 1) / R * R;
    return rows > R ? rows : R;
}
