/* kernels/vmath.h — vector helpers shared by the element-wise kernels and
 * attention: exp, horizontal sums.  Static inline with target attributes,
 * so only functions compiled for the same target can call them. */
#ifndef TP_VMATH_H
#define TP_VMATH_H

#include <immintrin.h>

#define TP_T512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,fma,avx2")))
#define TP_TAVX2 __attribute__((target("avx2,fma")))

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

static inline TP_TAVX2 float tp_hsum256(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
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

#endif
