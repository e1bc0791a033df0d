/* kernels/vmath.h — vector helpers shared by the kernel files: exp,
 * horizontal sums, lane masks, f16/bf16 widening, the 16×16 transpose.
 * Static inline with target attributes, so only functions compiled for the
 * same target (or a wider one) can call them. */
#ifndef TP_VMATH_H
#define TP_VMATH_H

#include "kernels/kern_internal.h"

/* x86-64 only (TP_KERNELS_X86): the users keep their SIMD code under the
 * same flag. */
#if TP_KERNELS_X86
#include <immintrin.h>

#define TP_T512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,fma,avx2")))
#define TP_TAVX2 __attribute__((target("avx2,fma")))
#define TP_T512F __attribute__((target("avx512f")))

/* r[i][j] -> r[j][i] for a 16×16 block of 32-bit elements: three rounds of
 * shuffles (pairs of elements, pairs of pairs, 128-bit lanes), 64 in all.
 * Plain AVX-512F, so every AVX-512 kernel (GEMM packing, AMX packing,
 * attention) inlines the one copy. */
static inline __attribute__((always_inline)) TP_T512F void tp_transpose16x16(__m512 r[16])
{
    __m512 t[16];
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);       /* per lane: a0 b0 a1 b1 */
        t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);   /*           a2 b2 a3 b3 */
    }
    /* r[4g + c] holds, in lane l, column 4l + c of rows 4g..4g+3. */
    for (int g = 0; g < 16; g += 4) {
        __m512d a = _mm512_castps_pd(t[g]), b = _mm512_castps_pd(t[g + 1]);
        __m512d c = _mm512_castps_pd(t[g + 2]), d = _mm512_castps_pd(t[g + 3]);
        r[g] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, c));
        r[g + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, c));
        r[g + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(b, d));
        r[g + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(b, d));
    }
    /* Column 4l + c gathers lane l of r[c], r[4 + c], r[8 + c], r[12 + c]. */
    for (int c = 0; c < 4; c++) {
        __m512 u0 = _mm512_shuffle_f32x4(r[c], r[4 + c], 0x44), v0 = _mm512_shuffle_f32x4(r[8 + c], r[12 + c], 0x44);
        __m512 u1 = _mm512_shuffle_f32x4(r[c], r[4 + c], 0xee), v1 = _mm512_shuffle_f32x4(r[8 + c], r[12 + c], 0xee);
        t[c] = _mm512_shuffle_f32x4(u0, v0, 0x88);
        t[4 + c] = _mm512_shuffle_f32x4(u0, v0, 0xdd);
        t[8 + c] = _mm512_shuffle_f32x4(u1, v1, 0x88);
        t[12 + c] = _mm512_shuffle_f32x4(u1, v1, 0xdd);
    }
    for (int i = 0; i < 16; i++) r[i] = t[i];
}

/* exp(x) to ~1 ulp: x = n·ln2 + r with |r| <= ln2/2, exp(r) by its Taylor
 * polynomial to degree 7 (error < 1e-8), then scalef multiplies by 2^n and
 * handles overflow (inf) and underflow (denormals, 0) itself. */
static inline TP_T512 __m512 tp_exp512(__m512 x)
{
    x = _mm512_max_ps(_mm512_min_ps(x, _mm512_set1_ps(89.0f)), _mm512_set1_ps(-104.0f));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), x);   /* ln2 high part */
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.428606765330187e-06f), r);      /* ln2 low part  */
    __m512 p = _mm512_set1_ps(1.0f / 5040);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 720));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, n);
}

/* exp(x) as tp_exp512 where that is at least exp(-87) (a normal float),
 * else exactly 0: never a denormal result.  Each vector with a result below
 * FLT_MIN costs a microcode assist of some hundred cycles in scalef on
 * Intel cores, which makes the softmax of causally masked (-inf) or
 * negligible scores several times slower than the rest.  The error is below
 * 1.7e-38 absolute. */
static inline TP_T512 __m512 tp_exp512_ftz(__m512 x)
{
    __m512 lo = _mm512_set1_ps(-87.0f);
    __mmask16 keep = _mm512_cmp_ps_mask(x, lo, _CMP_GE_OQ);
    return _mm512_maskz_mov_ps(keep, tp_exp512(_mm512_max_ps(x, lo)));
}

/* 2^x, flushed to exactly 0 below 2^-126 like tp_exp512_ftz, for a
 * softmax kept in base 2 (scores pre-multiplied by log2 e): x = n + f with
 * |f| <= 1/2, 2^f = exp(f·ln2) by its Taylor polynomial to degree 6,
 * scalef multiplies by 2^n: within 2.3e-7 relative (2 ulp) over the normal
 * range.  Cheaper than tp_exp512 by the ln2 split and a degree. */
static inline TP_T512 __m512 tp_exp2_512_ftz(__m512 x)
{
    __m512 lo = _mm512_set1_ps(-126.0f);
    __mmask16 keep = _mm512_cmp_ps_mask(x, lo, _CMP_GE_OQ);
    x = _mm512_min_ps(_mm512_max_ps(x, lo), _mm512_set1_ps(128.0f));
    __m512 n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 f = _mm512_sub_ps(x, n);
    __m512 p = _mm512_set1_ps(1.5403530393381606e-4f);                 /* ln2^6 / 720 */
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.3333558146428443e-3f)); /* ln2^5 / 120 */
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.6181291076284772e-3f)); /* ln2^4 / 24  */
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.5504108664821580e-2f)); /* ln2^3 / 6   */
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.4022650695910071e-1f)); /* ln2^2 / 2   */
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.9314718055994531e-1f)); /* ln2         */
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
    return _mm512_maskz_mov_ps(keep, _mm512_scalef_ps(p, n));
}

/* The AVX2 exp: as above, but 2^n is built in the exponent bits, so x is
 * clamped to [-87, 88] (n within the normal range); below -87 the result is
 * exp(-87) ≈ 1.6e-38 instead of a denormal, which is harmless here. */
static inline TP_TAVX2 __m256 tp_exp256(__m256 x)
{
    x = _mm256_max_ps(_mm256_min_ps(x, _mm256_set1_ps(88.0f)), _mm256_set1_ps(-87.0f));
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693145751953125f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(1.428606765330187e-06f), r);
    __m256 p = _mm256_set1_ps(1.0f / 5040);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 720));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

/* 2^x as tp_exp2_512_ftz: 0 below 2^-126, 2^n built in the exponent bits
 * (so x is clamped to 127: at most 2^127.5, never inf). */
static inline TP_TAVX2 __m256 tp_exp2_256_ftz(__m256 x)
{
    __m256 lo = _mm256_set1_ps(-126.0f);
    __m256 keep = _mm256_cmp_ps(x, lo, _CMP_GE_OQ);
    x = _mm256_min_ps(_mm256_max_ps(x, lo), _mm256_set1_ps(127.0f));
    __m256 n = _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 f = _mm256_sub_ps(x, n);
    __m256 p = _mm256_set1_ps(1.5403530393381606e-4f);
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.3333558146428443e-3f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(9.6181291076284772e-3f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(5.5504108664821580e-2f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(2.4022650695910071e-1f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(6.9314718055994531e-1f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0f));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_and_ps(keep, _mm256_mul_ps(p, _mm256_castsi256_ps(e)));
}

static inline TP_TAVX2 float tp_hsum256(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* Eight f16 bit patterns (the low 16 bits of each lane) to f32, exactly:
 * the sign moved up, the rest shifted into f32's fields and rescaled by
 * 2^112 (subnormals included; the quantized blocks' scales are finite). */
static inline TP_TAVX2 __m256 tp_f16x8_to_ps(__m256i h)
{
    __m256i sign = _mm256_slli_epi32(_mm256_and_si256(h, _mm256_set1_epi32(0x8000)), 16);
    __m256i mag = _mm256_slli_epi32(_mm256_and_si256(h, _mm256_set1_epi32(0x7fff)), 13);
    return _mm256_mul_ps(_mm256_castsi256_ps(_mm256_or_si256(sign, mag)), _mm256_set1_ps(0x1p112f));
}

/* bf16 bit patterns to f32, exactly: a bf16 is the top half of its f32. */
static inline __attribute__((always_inline)) TP_TAVX2 __m256 tp_bf16x8_to_ps(__m128i h)
{
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

static inline __attribute__((always_inline)) TP_T512F __m512 tp_bf16x16_to_ps(__m256i h)
{
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

static inline TP_TAVX2 double tp_hsum256d(__m256d v)
{
    __m128d s = _mm_add_pd(_mm256_castpd256_pd128(v), _mm256_extractf128_pd(v, 1));
    return _mm_cvtsd_f64(_mm_add_sd(s, _mm_unpackhi_pd(s, s)));
}

static inline TP_TAVX2 float tp_hmax256(__m256 v)
{
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* Lanes < valid set (valid may be <= 0 or >= 8). */
static inline TP_TAVX2 __m256i tp_mask256(int64_t valid)
{
    int v = valid < 0 ? 0 : valid > 8 ? 8 : (int)valid;
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(v), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

static inline __mmask16 tp_mask16(int64_t valid)
{
    return valid >= 16 ? (__mmask16)0xffff : valid <= 0 ? (__mmask16)0 : (__mmask16)((1u << valid) - 1);
}

#endif /* TP_KERNELS_X86 */

#endif
