/* The ordered reduction every backend uses.
 *
 * Each element is folded in ascending rank order, src0 op src1 op ... in the
 * accumulation type (f32 for bf16/f16), and rounded once at the end.  All
 * backends and algorithms go through this one function, so every rank gets
 * the same bits whatever the transport or message size (tp-semantics §1.4).
 *
 * Work proceeds in blocks through a small accumulator on the stack: the
 * sources are streamed once and the accumulator stays in L1. */
#include "comm_internal.h"
#include "tensorpar/kernels.h"

#include <string.h>

#define BLOCK 1024

/* Inline copies of base's bf16/f16 conversions: this is the hot loop of
 * every bf16 all-reduce, and the base versions live in another unit. */
static inline float bf16_to_f32(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Branch-free (so that it vectorizes): NaN stays a quiet NaN. */
static inline uint16_t f32_to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    uint32_t quiet = (u >> 16) | 0x0040u;
    uint32_t nan = 0u - (uint32_t)((u & 0x7fffffffu) > 0x7f800000u);
    return (uint16_t)((quiet & nan) | (rounded & ~nan));
}

/* NaN-propagating max, like torch.max. */
static inline float maxf(float a, float b) { return (b > a || b != b) ? b : a; }
static inline double maxd(double a, double b) { return (b > a || b != b) ? b : a; }

/* The hot loops get AVX-512 and AVX2 copies, and the process's kernel
 * path (TENSORPAR_ISA, else the CPU's best) picks one, so that
 * TENSORPAR_ISA=scalar runs no AVX instruction here either (a target_clones
 * resolver would ask the CPU alone).  AVX2 made bf16 2.5x faster on the
 * development machine; AVX-512 matters for small f32 all-reduces, whose
 * time is the peer's cache lines crossing between cores: one 64-byte load
 * per line instead of two keeps twice as many lines in flight (4 KiB over 2
 * ranks: 1.85 -> 1.45 us).  Every copy adds the same elements in the same
 * order, so all give the same bits. */
#if defined(__x86_64__)
#define REDUCE_COPIES 1
#define T_AVX512 __attribute__((target("avx512f")))
#define T_AVX2 __attribute__((target("avx2")))
#endif

/* Loops of constant length GROUP, which the compiler vectorizes (to 256
 * bits in the AVX2 copy) even at -O2; lanes are independent elements, so
 * the per-element order of additions is unchanged.  always_inline: a
 * separate function would not get the copies' instruction sets. */
#define GROUP 16
#define INLINE static inline __attribute__((always_inline))

/* acc[0..m) = a + s.  acc may be a or s (element i is read before it is
 * written): each group goes through a local temporary, so the compiler
 * needs no aliasing checks to vectorize. */
INLINE void sum_f32(float *acc, const float *a, const float *s, size_t m)
{
    size_t g = m / GROUP * GROUP;
    for (size_t i = 0; i < g; i += GROUP) {
        float t[GROUP];
        for (int j = 0; j < GROUP; j++) t[j] = a[i + j] + s[i + j];
        memcpy(acc + i, t, sizeof t);
    }
    for (size_t i = g; i < m; i++) acc[i] = a[i] + s[i];
}

INLINE void reduce_f32(float *dst, const void *const *srcs, int n, size_t count, tp_reduce_op op)
{
    float acc[BLOCK];
    if (n == 1) { memmove(dst, srcs[0], count * sizeof(float)); return; }
    for (size_t b = 0; b < count; b += BLOCK) {
        size_t m = count - b < BLOCK ? count - b : BLOCK;
        const float *s0 = (const float *)srcs[0] + b;
        /* Two sources (the common TP=2 case) go straight to dst. */
        float *out = n == 2 && op == TP_REDUCE_SUM ? dst + b : acc;
        for (int r = 1; r < n; r++) {
            const float *s = (const float *)srcs[r] + b;
            if (op == TP_REDUCE_SUM) {
                sum_f32(out, r == 1 ? s0 : out, s, m);
            } else {
                if (r == 1) memcpy(acc, s0, m * sizeof(float));
                for (size_t i = 0; i < m; i++) acc[i] = maxf(acc[i], s[i]);
            }
        }
        if (out == acc) memcpy(dst + b, acc, m * sizeof(float));
    }
}

/* acc[0..m) = s, or acc += s; m a multiple of GROUP. */
INLINE void bf16_sum_groups(float *acc, const uint16_t *s, size_t m, int first)
{
    if (first)
        for (size_t i = 0; i + GROUP <= m; i += GROUP)
            for (int j = 0; j < GROUP; j++) acc[i + j] = bf16_to_f32(s[i + j]);
    else
        for (size_t i = 0; i + GROUP <= m; i += GROUP)
            for (int j = 0; j < GROUP; j++) acc[i + j] += bf16_to_f32(s[i + j]);
}

INLINE void reduce_half(uint16_t *dst, const void *const *srcs, int n, size_t count,
                            tp_reduce_op op, int is_bf16)
{
    float acc[BLOCK];
    int fast = is_bf16 && op == TP_REDUCE_SUM;
    for (size_t b = 0; b < count; b += BLOCK) {
        size_t m = count - b < BLOCK ? count - b : BLOCK;
        size_t vec = fast ? m / GROUP * GROUP : 0;   /* elements done by groups */
        for (int r = 0; r < n; r++) {
            const uint16_t *s = (const uint16_t *)srcs[r] + b;
            if (fast) bf16_sum_groups(acc, s, vec, r == 0);
            for (size_t i = vec; i < m; i++) {
                float x = is_bf16 ? bf16_to_f32(s[i]) : tp_f32_from_f16(s[i]);
                acc[i] = r == 0 ? x : op == TP_REDUCE_SUM ? acc[i] + x : maxf(acc[i], x);
            }
        }
        uint16_t *d = dst + b;
        if (is_bf16) {
            for (size_t i = 0; i + GROUP <= m; i += GROUP)
                for (int j = 0; j < GROUP; j++) d[i + j] = f32_to_bf16(acc[i + j]);
            for (size_t i = m / GROUP * GROUP; i < m; i++) d[i] = f32_to_bf16(acc[i]);
        } else {
            for (size_t i = 0; i < m; i++) d[i] = tp_f16_from_f32(acc[i]);
        }
    }
}

#ifdef REDUCE_COPIES
T_AVX512 static void reduce_f32_avx512(float *dst, const void *const *srcs, int n, size_t count, tp_reduce_op op)
{
    reduce_f32(dst, srcs, n, count, op);
}
T_AVX2 static void reduce_f32_avx2(float *dst, const void *const *srcs, int n, size_t count, tp_reduce_op op)
{
    reduce_f32(dst, srcs, n, count, op);
}
T_AVX512 static void reduce_half_avx512(uint16_t *dst, const void *const *srcs, int n, size_t count,
                                        tp_reduce_op op, int is_bf16)
{
    reduce_half(dst, srcs, n, count, op, is_bf16);
}
T_AVX2 static void reduce_half_avx2(uint16_t *dst, const void *const *srcs, int n, size_t count, tp_reduce_op op,
                                    int is_bf16)
{
    reduce_half(dst, srcs, n, count, op, is_bf16);
}
#endif

static void reduce_f32_any(float *dst, const void *const *srcs, int n, size_t count, tp_reduce_op op)
{
#ifdef REDUCE_COPIES
    tp_kernel_path p = tp_kernel_path_default();
    if (p == TP_KERNEL_AVX512) { reduce_f32_avx512(dst, srcs, n, count, op); return; }
    if (p == TP_KERNEL_AVX2) { reduce_f32_avx2(dst, srcs, n, count, op); return; }
#endif
    reduce_f32(dst, srcs, n, count, op);
}

static void reduce_half_any(uint16_t *dst, const void *const *srcs, int n, size_t count, tp_reduce_op op,
                            int is_bf16)
{
#ifdef REDUCE_COPIES
    tp_kernel_path p = tp_kernel_path_default();
    if (p == TP_KERNEL_AVX512) { reduce_half_avx512(dst, srcs, n, count, op, is_bf16); return; }
    if (p == TP_KERNEL_AVX2) { reduce_half_avx2(dst, srcs, n, count, op, is_bf16); return; }
#endif
    reduce_half(dst, srcs, n, count, op, is_bf16);
}

static void reduce_f64(double *dst, const void *const *srcs, int n, size_t count, tp_reduce_op op)
{
    double acc[BLOCK / 2];
    for (size_t b = 0; b < count; b += BLOCK / 2) {
        size_t m = count - b < BLOCK / 2 ? count - b : BLOCK / 2;
        memcpy(acc, (const double *)srcs[0] + b, m * sizeof(double));
        for (int r = 1; r < n; r++) {
            const double *s = (const double *)srcs[r] + b;
            for (size_t i = 0; i < m; i++)
                acc[i] = op == TP_REDUCE_SUM ? acc[i] + s[i] : maxd(acc[i], s[i]);
        }
        memcpy(dst + b, acc, m * sizeof(double));
    }
}

/* Integers wrap on overflow (summed as unsigned), as torch does, without UB. */
static void reduce_i64(int64_t *dst, const void *const *srcs, int n, size_t count, tp_reduce_op op)
{
    for (size_t i = 0; i < count; i++) {
        int64_t a = ((const int64_t *)srcs[0])[i];
        for (int r = 1; r < n; r++) {
            int64_t x = ((const int64_t *)srcs[r])[i];
            a = op == TP_REDUCE_SUM ? (int64_t)((uint64_t)a + (uint64_t)x) : (x > a ? x : a);
        }
        dst[i] = a;
    }
}

static void reduce_i32(int32_t *dst, const void *const *srcs, int n, size_t count, tp_reduce_op op)
{
    for (size_t i = 0; i < count; i++) {
        int32_t a = ((const int32_t *)srcs[0])[i];
        for (int r = 1; r < n; r++) {
            int32_t x = ((const int32_t *)srcs[r])[i];
            a = op == TP_REDUCE_SUM ? (int32_t)((uint32_t)a + (uint32_t)x) : (x > a ? x : a);
        }
        dst[i] = a;
    }
}

int tp_comm_reducible(tp_dtype dt)
{
    return dt == TP_F32 || dt == TP_BF16 || dt == TP_F16 || dt == TP_F64 ||
           dt == TP_I64 || dt == TP_I32;
}

void tp_comm_reduce_ordered(void *dst, const void *const *srcs, int n, size_t count,
                            tp_dtype dt, tp_reduce_op op)
{
    switch (dt) {
    case TP_F32: reduce_f32_any(dst, srcs, n, count, op); break;
    case TP_BF16: reduce_half_any(dst, srcs, n, count, op, 1); break;
    case TP_F16: reduce_half_any(dst, srcs, n, count, op, 0); break;
    case TP_F64: reduce_f64(dst, srcs, n, count, op); break;
    case TP_I64: reduce_i64(dst, srcs, n, count, op); break;
    case TP_I32: reduce_i32(dst, srcs, n, count, op); break;
    default: break;   /* comm.c refuses other dtypes before we get here */
    }
}
