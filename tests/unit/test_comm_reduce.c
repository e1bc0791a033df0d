/* The ordered reduction behind every backend: rank order, accumulation in
 * f32 for bf16/f16 with one rounding, aliasing, integer wrap, NaN in max. */
#include "check.h"
#include "comm/comm_internal.h"

#include <math.h>
#include <string.h>

static void test_f32_order(void)
{
    /* 1e8 + 1 - 1e8 is 0 in f32 left to right, but 1 in another order. */
    float a[3] = {1e8f, 2.5f, 3.0f}, b[3] = {1.0f, -2.5f, 4.0f}, c[3] = {-1e8f, 0.0f, -7.0f}, out[3];
    const void *srcs[3] = {a, b, c};
    tp_comm_reduce_ordered(out, srcs, 3, 3, TP_F32, TP_REDUCE_SUM);
    CHECK(out[0] == 0.0f);
    CHECK(out[1] == 0.0f);
    CHECK(out[2] == 0.0f);
}

static void test_large_blocks_and_alias(void)
{
    enum { N = 5000 };
    static float x[4][N], want[N];
    for (int r = 0; r < 4; r++)
        for (int i = 0; i < N; i++) x[r][i] = (float)((i * 37 + r * 11) % 101) / 7.0f - 5.0f;
    for (int i = 0; i < N; i++) want[i] = ((x[0][i] + x[1][i]) + x[2][i]) + x[3][i];
    const void *srcs[4] = {x[0], x[1], x[2], x[3]};
    tp_comm_reduce_ordered(x[2], srcs, 4, N, TP_F32, TP_REDUCE_SUM);   /* dst aliases a source */
    CHECK(memcmp(x[2], want, sizeof want) == 0);
}

static void test_bf16_single_rounding(void)
{
    /* 1 + 2^-8 + 2^-8: rounding to bf16 after each add gives 1 (ties to
     * even), rounding once at the end gives 1 + 2^-7. */
    uint16_t one = tp_bf16_from_f32(1.0f), tiny = tp_bf16_from_f32(ldexpf(1.0f, -8)), out;
    const void *srcs[3] = {&one, &tiny, &tiny};
    tp_comm_reduce_ordered(&out, srcs, 3, 1, TP_BF16, TP_REDUCE_SUM);
    CHECK(tp_f32_from_bf16(out) == 1.0f + ldexpf(1.0f, -7));
    uint16_t h1 = tp_f16_from_f32(2048.0f), h2 = tp_f16_from_f32(1.0f), ho;
    const void *hs[3] = {&h1, &h2, &h2};
    tp_comm_reduce_ordered(&ho, hs, 3, 1, TP_F16, TP_REDUCE_SUM);
    CHECK(tp_f32_from_f16(ho) == 2050.0f);
}

static void test_ints_and_max(void)
{
    int32_t a = INT32_MAX, b = 1, o;
    const void *s[2] = {&a, &b};
    tp_comm_reduce_ordered(&o, s, 2, 1, TP_I32, TP_REDUCE_SUM);
    CHECK(o == INT32_MIN);
    int64_t c = -5, d = 7, e;
    const void *s2[2] = {&c, &d};
    tp_comm_reduce_ordered(&e, s2, 2, 1, TP_I64, TP_REDUCE_MAX);
    CHECK(e == 7);
    float f[2] = {1.0f, NAN}, g[2] = {NAN, 2.0f}, m[2];
    const void *s3[2] = {f, g};
    tp_comm_reduce_ordered(m, s3, 2, 2, TP_F32, TP_REDUCE_MAX);
    CHECK(isnan(m[0]) && isnan(m[1]));
    double x = 0.1, y = 0.2, z;
    const void *s4[2] = {&x, &y};
    tp_comm_reduce_ordered(&z, s4, 2, 1, TP_F64, TP_REDUCE_SUM);
    CHECK(z == 0.1 + 0.2);
    CHECK(tp_comm_reducible(TP_BF16) && !tp_comm_reducible(TP_U8) && !tp_comm_reducible(TP_BOOL));
}

int main(void)
{
    test_f32_order();
    test_large_blocks_and_alias();
    test_bf16_single_rounding();
    test_ints_and_max();
    return check_summary();
}
