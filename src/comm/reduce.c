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

static inline uint16_t f32_to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x0040u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* NaN-propagating max, like torch.max. */
static inline float maxf(float a, float b) { return (b > a || b != b) ? b : a; }
static inline double maxd(double a, double b) { return (b > a || b != b) ? b : a; }

static void reduce_f32(float *dst, const void *const *srcs, int n, size_t count, tp_reduce_op op)
{
    float acc[BLOCK];
    for (size_t b = 0; b < count; b += BLOCK) {
        size_t m = count - b < BLOCK ? count - b : BLOCK;
        memcpy(acc, (const float *)srcs[0] + b, m * sizeof(float));
        for (int r = 1; r < n; r++) {
            const float *s = (const float *)srcs[r] + b;
            if (op == TP_REDUCE_SUM)
                for (size_t i = 0; i < m; i++) acc[i] += s[i];
            else
                for (size_t i = 0; i < m; i++) acc[i] = maxf(acc[i], s[i]);
        }
        memcpy(dst + b, acc, m * sizeof(float));
    }
}

static void reduce_half(uint16_t *dst, const void *const *srcs, int n, size_t count,
                        tp_reduce_op op, int is_bf16)
{
    float acc[BLOCK];
    for (size_t b = 0; b < count; b += BLOCK) {
        size_t m = count - b < BLOCK ? count - b : BLOCK;
        const uint16_t *s0 = (const uint16_t *)srcs[0] + b;
        if (is_bf16) for (size_t i = 0; i < m; i++) acc[i] = bf16_to_f32(s0[i]);
        else for (size_t i = 0; i < m; i++) acc[i] = tp_f32_from_f16(s0[i]);
        for (int r = 1; r < n; r++) {
            const uint16_t *s = (const uint16_t *)srcs[r] + b;
            if (is_bf16 && op == TP_REDUCE_SUM) {
                for (size_t i = 0; i < m; i++) acc[i] += bf16_to_f32(s[i]);
                continue;
            }
            for (size_t i = 0; i < m; i++) {
                float x = is_bf16 ? bf16_to_f32(s[i]) : tp_f32_from_f16(s[i]);
                acc[i] = op == TP_REDUCE_SUM ? acc[i] + x : maxf(acc[i], x);
            }
        }
        for (size_t i = 0; i < m; i++)
            dst[b + i] = is_bf16 ? f32_to_bf16(acc[i]) : tp_f16_from_f32(acc[i]);
    }
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
    case TP_F32: reduce_f32(dst, srcs, n, count, op); break;
    case TP_BF16: reduce_half(dst, srcs, n, count, op, 1); break;
    case TP_F16: reduce_half(dst, srcs, n, count, op, 0); break;
    case TP_F64: reduce_f64(dst, srcs, n, count, op); break;
    case TP_I64: reduce_i64(dst, srcs, n, count, op); break;
    case TP_I32: reduce_i32(dst, srcs, n, count, op); break;
    default: break;   /* comm.c refuses other dtypes before we get here */
    }
}
