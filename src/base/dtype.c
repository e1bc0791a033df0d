/* Dtypes and conversions between them.
 *
 * bf16 and f16 conversions round to nearest even, as PyTorch does, so that a
 * checkpoint written by tensorpar holds the same bits Transformers would. */
#include "tensorpar/base.h"

#include <math.h>
#include <string.h>

static const struct { const char *name; size_t size; int is_float; } dtype_table[TP_DTYPE_COUNT] = {
    [TP_F32] = {"f32", 4, 1},  [TP_BF16] = {"bf16", 2, 1}, [TP_F16] = {"f16", 2, 1},
    [TP_F64] = {"f64", 8, 1},  [TP_I64] = {"i64", 8, 0},   [TP_I32] = {"i32", 4, 0},
    [TP_I16] = {"i16", 2, 0},  [TP_I8] = {"i8", 1, 0},     [TP_U8] = {"u8", 1, 0},
    [TP_BOOL] = {"bool", 1, 0},  [TP_Q8_0] = {"q8_0", 0, 0},
    [TP_Q4_0] = {"q4_0", 0, 0},
};

size_t tp_dtype_size(tp_dtype t) { return (unsigned)t < TP_DTYPE_COUNT ? dtype_table[t].size : 0; }
const char *tp_dtype_name(tp_dtype t) { return (unsigned)t < TP_DTYPE_COUNT ? dtype_table[t].name : "?"; }
int tp_dtype_is_float(tp_dtype t) { return (unsigned)t < TP_DTYPE_COUNT && dtype_table[t].is_float; }

size_t tp_dtype_row_bytes(tp_dtype t, int64_t n)
{
    if (t == TP_Q8_0) return (size_t)(n / TP_Q8_BLOCK) * sizeof(tp_q8_block);
    if (t == TP_Q4_0) return (size_t)(n / TP_Q4_BLOCK) * sizeof(tp_q4_block);
    return (size_t)n * tp_dtype_size(t);
}

tp_status tp_dtype_parse(const char *s, tp_dtype *out)
{
    static const struct { const char *name; tp_dtype t; } names[] = {
        {"f32", TP_F32}, {"float32", TP_F32}, {"bf16", TP_BF16}, {"bfloat16", TP_BF16},
        {"f16", TP_F16}, {"float16", TP_F16}, {"q8_0", TP_Q8_0}, {"q4_0", TP_Q4_0},
    };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (!strcmp(s, names[i].name)) { *out = names[i].t; return TP_OK; }
    return tp_fail(TP_ERR_INVALID, "unknown dtype '%s' (expected f32, bf16, f16, q8_0 or q4_0)", s);
}

static uint32_t f32_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static float bits_f32(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

uint16_t tp_bf16_from_f32(float f)
{
    uint32_t u = f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u)          /* NaN: keep it quiet */
        return (uint16_t)((u >> 16) | 0x0040u);
    u += 0x7fffu + ((u >> 16) & 1u);               /* round to nearest even */
    return (uint16_t)(u >> 16);
}

float tp_f32_from_bf16(uint16_t h) { return bits_f32((uint32_t)h << 16); }

uint16_t tp_f16_from_f32(float f)
{
    uint32_t u = f32_bits(f);
    uint32_t sign = (u >> 16) & 0x8000u;
    uint32_t absu = u & 0x7fffffffu;
    if (absu > 0x7f800000u) return (uint16_t)(sign | 0x7e00u);       /* NaN */
    if (absu >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);      /* overflow -> inf */
    if (absu < 0x38800000u) {                                        /* subnormal or zero */
        /* Add 0.5 as magic number: the FPU rounds to nearest even for us. */
        float a = bits_f32(absu) + 0.5f;
        return (uint16_t)(sign | (f32_bits(a) - 0x3f000000u));
    }
    uint32_t mant_odd = (absu >> 13) & 1u;
    absu += 0xc8000fffu + mant_odd;   /* rebias exponent (-112 << 23) and round */
    return (uint16_t)(sign | (absu >> 13));
}

float tp_f32_from_f16(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
    if (exp == 0) {                         /* zero or subnormal: exact in f32 */
        float v = ldexpf((float)mant, -24);
        return sign ? -v : v;
    }
    if (exp == 31) return bits_f32(sign | 0x7f800000u | (mant << 13));
    return bits_f32(sign | ((exp + 112u) << 23) | (mant << 13));
}

/* Loads element i of a float-typed buffer as double (exact for all of them). */
static double load_float(const void *src, tp_dtype st, size_t i)
{
    switch (st) {
    case TP_F32: return ((const float *)src)[i];
    case TP_F64: return ((const double *)src)[i];
    case TP_BF16: return tp_f32_from_bf16(((const uint16_t *)src)[i]);
    case TP_F16: return tp_f32_from_f16(((const uint16_t *)src)[i]);
    default: return 0;
    }
}

static int64_t load_int(const void *src, tp_dtype st, size_t i)
{
    switch (st) {
    case TP_I64: return ((const int64_t *)src)[i];
    case TP_I32: return ((const int32_t *)src)[i];
    case TP_I16: return ((const int16_t *)src)[i];
    case TP_I8: return ((const int8_t *)src)[i];
    case TP_U8: return ((const uint8_t *)src)[i];
    case TP_BOOL: return ((const uint8_t *)src)[i] != 0;
    default: return 0;
    }
}

static void store(void *dst, tp_dtype dt, size_t i, double v, int64_t iv, int from_float)
{
    switch (dt) {
    case TP_F32: ((float *)dst)[i] = from_float ? (float)v : (float)iv; break;
    case TP_F64: ((double *)dst)[i] = from_float ? v : (double)iv; break;
    case TP_BF16: ((uint16_t *)dst)[i] = tp_bf16_from_f32(from_float ? (float)v : (float)iv); break;
    case TP_F16: ((uint16_t *)dst)[i] = tp_f16_from_f32(from_float ? (float)v : (float)iv); break;
    case TP_I64: ((int64_t *)dst)[i] = iv; break;
    case TP_I32: ((int32_t *)dst)[i] = (int32_t)iv; break;
    case TP_I16: ((int16_t *)dst)[i] = (int16_t)iv; break;
    case TP_I8: ((int8_t *)dst)[i] = (int8_t)iv; break;
    case TP_U8: ((uint8_t *)dst)[i] = (uint8_t)iv; break;
    case TP_BOOL: ((uint8_t *)dst)[i] = iv != 0; break;
    default: break;
    }
}

tp_status tp_convert(void *dst, tp_dtype dt, const void *src, tp_dtype st, size_t n)
{
    if ((unsigned)dt >= TP_DTYPE_COUNT || (unsigned)st >= TP_DTYPE_COUNT)
        return tp_fail(TP_ERR_INVALID, "tp_convert: bad dtype");
    /* Blocks are made by tp_q8/q4_quantize_rows, which know the rows. */
    if (dt == TP_Q8_0 || st == TP_Q8_0 || dt == TP_Q4_0 || st == TP_Q4_0)
        return tp_fail(TP_ERR_UNSUPPORTED, "cannot convert %s to %s element by element", tp_dtype_name(st),
                       tp_dtype_name(dt));
    if (dt == st) { memcpy(dst, src, n * tp_dtype_size(st)); return TP_OK; }
    int sf = tp_dtype_is_float(st);
    if (sf && !tp_dtype_is_float(dt))
        return tp_fail(TP_ERR_UNSUPPORTED, "cannot convert %s to %s", tp_dtype_name(st), tp_dtype_name(dt));
    /* Fast paths for the conversions weight loading does all the time. */
    if (dt == TP_F32 && st == TP_BF16) {
        const uint16_t *s = src; float *d = dst;
        for (size_t i = 0; i < n; i++) d[i] = tp_f32_from_bf16(s[i]);
        return TP_OK;
    }
    if (dt == TP_BF16 && st == TP_F32) {
        const float *s = src; uint16_t *d = dst;
        for (size_t i = 0; i < n; i++) d[i] = tp_bf16_from_f32(s[i]);
        return TP_OK;
    }
    for (size_t i = 0; i < n; i++) {
        if (sf) store(dst, dt, i, load_float(src, st, i), 0, 1);
        else store(dst, dt, i, 0, load_int(src, st, i), 0);
    }
    return TP_OK;
}
