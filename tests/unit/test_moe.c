/* Mixture of experts: the grouped expert kernel against a per-token loop,
 * x @ W for [in, out] expert weights (tp_expert_xw) and an expert's rows
 * (tp_matmul_rows) against a double loop,
 * the routers (DeepSeek V2's masked picks), the MoE config keys and
 * presets, and the module and checkpoint tables of qwen3_moe and mixtral. */
#include "check.h"
#include "kernels/kern_internal.h"
#include "models/tp_module.h"
#include "tensorpar/kernels.h"
#include "tensorpar/models.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static float frand(uint64_t *s)
{
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((*s >> 40) & 0xFFFF) / 32768.0f - 1.0f;
}

static float silu(float x) { return x / (1.0f + expf(-x)); }

/* out[t] = Σ_j w[t,j] · down_e (silu(gate_e x_t) ⊙ up_e x_t), one token at
 * a time in double, slots of ids outside [0, E) skipped. */
static void naive(double *out, const float *x, int64_t T, int64_t H, int64_t I, int64_t k, const int32_t *ids,
                  const float *w, const float *gu, const float *dn, int64_t E)
{
    double *h = malloc((size_t)I * sizeof *h);
    memset(out, 0, (size_t)(T * H) * sizeof *out);
    for (int64_t t = 0; t < T; t++)
        for (int64_t j = 0; j < k; j++) {
            int32_t e = ids[t * k + j];
            if (e < 0 || e >= E) continue;
            for (int64_t i = 0; i < I; i++) {
                double g = 0, u = 0;
                for (int64_t c = 0; c < H; c++) {
                    g += (double)gu[(e * 2 * I + i) * H + c] * x[t * H + c];
                    u += (double)gu[(e * 2 * I + I + i) * H + c] * x[t * H + c];
                }
                h[i] = silu((float)g) * u;
            }
            for (int64_t c = 0; c < H; c++) {
                double y = 0;
                for (int64_t i = 0; i < I; i++) y += (double)dn[(e * H + c) * I + i] * h[i];
                out[t * H + c] += w[t * k + j] * y;
            }
        }
    free(h);
}

/* Llama 4's form of the same experts: bmm-style tensors (the transposes
 * of gu and dn) and the weight scaling each slot's input, expert(w · x),
 * against the per-token loop run on the scaled input one slot at a time. */
static void check_bmm(const tp_grouped_experts_args *lin, const float *gu, const float *dn, int64_t E, int64_t I,
                      float *scratch, double *want)
{
    int64_t T = lin->T, H = lin->H, k = lin->k;
    tp_dtype dt = lin->gate_up->dtype;
    float *gt = malloc((size_t)(E * 2 * I * H) * sizeof *gt), *dt_ = malloc((size_t)(E * H * I) * sizeof *dt_);
    for (int64_t e = 0; e < E; e++)
        for (int64_t h = 0; h < H; h++) {
            for (int64_t i = 0; i < 2 * I; i++) gt[(e * H + h) * 2 * I + i] = gu[(e * 2 * I + i) * H + h];
            for (int64_t i = 0; i < I; i++) dt_[(e * I + i) * H + h] = dn[(e * H + h) * I + i];
        }
    tp_tensor tgu, tdn;
    tp_tensor_init(&tgu, dt, 3, (int64_t[3]){E, H, 2 * I});
    tp_tensor_init(&tdn, dt, 3, (int64_t[3]){E, I, H});
    tp_convert(tgu.data, dt, gt, TP_F32, (size_t)(E * 2 * I * H));
    tp_convert(tdn.data, dt, dt_, TP_F32, (size_t)(E * H * I));
    float *out = malloc((size_t)(T * H) * sizeof *out), *xs = malloc((size_t)H * sizeof *xs), one = 1.0f;
    double *y = malloc((size_t)H * sizeof *y);
    tp_grouped_experts_args a = *lin;
    a.out = out, a.gate_up = &tgu, a.down = &tdn, a.bmm = 1, a.scale_input = 1;
    CHECK(tp_grouped_experts(&a, scratch) == TP_OK);
    memset(want, 0, (size_t)(T * H) * sizeof *want);
    for (int64_t t = 0; t < T; t++)
        for (int64_t j = 0; j < k; j++) {
            for (int64_t c = 0; c < H; c++) xs[c] = lin->x[t * H + c] * lin->weights[t * k + j];
            naive(y, xs, 1, H, I, 1, &lin->ids[t * k + j], &one, gu, dn, E);
            for (int64_t c = 0; c < H; c++) want[t * H + c] += y[c];
        }
    double err = 0, mx = 0;
    for (int64_t i = 0; i < T * H; i++) {
        err = fmax(err, fabs(out[i] - want[i]));
        mx = fmax(mx, fabs(want[i]));
    }
    CHECK_MSG(mx > 0 && err <= 1e-5 * mx, "bmm T=%lld E=%lld k=%lld: max err %g of %g", (long long)T, (long long)E,
              (long long)k, err, mx);
    a.H = H + 1;
    CHECK(tp_grouped_experts(&a, scratch) != TP_OK);
    tp_tensor_release(&tgu);
    tp_tensor_release(&tdn);
    free(gt); free(dt_); free(out); free(xs); free(y);
}

static void check_grouped(int64_t T, int64_t E, int64_t k, tp_dtype dt)
{
    int64_t H = 24, I = 10;
    uint64_t seed = (uint64_t)(T * 131 + E);
    float *x = malloc((size_t)(T * H) * sizeof *x), *w = malloc((size_t)(T * k) * sizeof *w);
    float *gu = malloc((size_t)(E * 2 * I * H) * sizeof *gu), *dn = malloc((size_t)(E * H * I) * sizeof *dn);
    int32_t *ids = malloc((size_t)(T * k) * sizeof *ids);
    for (int64_t i = 0; i < T * H; i++) x[i] = frand(&seed);
    for (int64_t i = 0; i < E * 2 * I * H; i++) gu[i] = 0.3f * frand(&seed);
    for (int64_t i = 0; i < E * H * I; i++) dn[i] = 0.3f * frand(&seed);
    for (int64_t t = 0; t < T; t++)
        for (int64_t j = 0; j < k; j++) {
            /* distinct experts per token; every 5th slot the EP sentinel E */
            ids[t * k + j] = (t * k + j) % 5 == 4 ? (int32_t)E : (int32_t)((t * 3 + j) % E);
            w[t * k + j] = 0.5f + 0.1f * frand(&seed);
        }
    tp_tensor tgu, tdn;
    tp_tensor_init(&tgu, dt, 3, (int64_t[3]){E, 2 * I, H});
    tp_tensor_init(&tdn, dt, 3, (int64_t[3]){E, H, I});
    tp_convert(tgu.data, dt, gu, TP_F32, (size_t)(E * 2 * I * H));
    tp_convert(tdn.data, dt, dn, TP_F32, (size_t)(E * H * I));
    /* the reference sees the weights as stored (bf16 rounded) */
    tp_convert(gu, TP_F32, tgu.data, dt, (size_t)(E * 2 * I * H));
    tp_convert(dn, TP_F32, tdn.data, dt, (size_t)(E * H * I));
    float *out = malloc((size_t)(T * H) * sizeof *out);
    float *scratch = malloc((size_t)tp_grouped_experts_scratch(T, H, I, k, 3) * sizeof *scratch);
    double *want = malloc((size_t)(T * H) * sizeof *want);
    tp_threadpool *pool;
    tp_threadpool_create(&pool, 2);
    tp_matmul_opts opts;
    tp_matmul_opts_default(&opts);
    tp_grouped_experts_args a = {out, x, T, H, k, ids, w, &tgu, &tdn, pool, &opts, 0, 0};
    CHECK(tp_grouped_experts(&a, scratch) == TP_OK);
    naive(want, x, T, H, I, k, ids, w, gu, dn, E);
    double err = 0, mx = 0;
    for (int64_t i = 0; i < T * H; i++) {
        err = fmax(err, fabs(out[i] - want[i]));
        mx = fmax(mx, fabs(want[i]));
    }
    CHECK_MSG(mx > 0 && err <= 1e-5 * mx, "T=%lld E=%lld k=%lld %s: max err %g of %g", (long long)T, (long long)E,
              (long long)k, tp_dtype_name(dt), err, mx);
    /* 1 and 3 threads give the bits of 2: whole experts per thread (a
     * prompt's 2 or more per thread) or each expert split (fewer) */
    float *again = malloc((size_t)(T * H) * sizeof *again);
    for (int nt = 1; nt <= 3; nt += 2) {
        tp_threadpool *p2;
        tp_threadpool_create(&p2, nt);
        tp_grouped_experts_args b = a;
        b.out = again;
        b.pool = p2;
        CHECK(tp_grouped_experts(&b, scratch) == TP_OK);
        CHECK_MSG(memcmp(again, out, (size_t)(T * H) * sizeof *out) == 0, "T=%lld E=%lld k=%lld: %d threads differ",
                  (long long)T, (long long)E, (long long)k, nt);
        tp_threadpool_destroy(p2);
    }
    free(again);
    /* the shapes must agree */
    tp_grouped_experts_args bad = a;
    bad.H = H + 1;
    CHECK(tp_grouped_experts(&bad, scratch) != TP_OK);
    check_bmm(&a, gu, dn, E, I, scratch, want);
    tp_threadpool_destroy(pool);
    tp_tensor_release(&tgu);
    tp_tensor_release(&tdn);
    free(x); free(w); free(gu); free(dn); free(ids); free(out); free(scratch); free(want);
}

static void test_grouped_experts(void)
{
    check_grouped(1, 8, 2, TP_F32);      /* decode: one row per selected expert */
    check_grouped(37, 8, 2, TP_F32);     /* a prompt */
    check_grouped(37, 6, 3, TP_BF16);
    check_grouped(64, 4, 4, TP_F32);     /* every expert on every token */
}

/* y [n, out] = x [n, in] times W through `prod` against a double loop: W
 * stored [in, out] (x @ W, tp_expert_xw) or, with w_out_in, [out, in]
 * (x · Wᵀ, tp_matmul_rows); y is overwritten, not added to, and 1 and 3
 * threads give the bits of 2. */
typedef tp_status (*product_fn)(float *y, const float *x, int64_t n, const tp_tensor *w, tp_threadpool *pool,
                                const tp_matmul_opts *opts);

static void check_product(const char *name, product_fn prod, int w_out_in, int64_t n, int64_t in, int64_t out,
                          tp_dtype dt)
{
    uint64_t seed = (uint64_t)(n * 1009 + in * 31 + out + w_out_in);
    float *x = malloc((size_t)(n * in) * sizeof *x), *wf = malloc((size_t)(in * out) * sizeof *wf);
    float *y = malloc((size_t)(n * out) * sizeof *y), *again = malloc((size_t)(n * out) * sizeof *again);
    for (int64_t i = 0; i < n * in; i++) x[i] = frand(&seed);
    for (int64_t i = 0; i < in * out; i++) wf[i] = frand(&seed);
    tp_tensor w;
    CHECK(tp_tensor_init(&w, dt, 2, w_out_in ? (int64_t[2]){out, in} : (int64_t[2]){in, out}) == TP_OK);
    tp_convert(w.data, dt, wf, TP_F32, (size_t)(in * out));
    tp_convert(wf, TP_F32, w.data, dt, (size_t)(in * out));   /* the reference sees the stored values */
    tp_matmul_opts opts;
    tp_matmul_opts_default(&opts);
    tp_threadpool *pool;
    tp_threadpool_create(&pool, 2);
    for (int64_t i = 0; i < n * out; i++) y[i] = 1e30f;
    CHECK(prod(y, x, n, &w, pool, &opts) == TP_OK);
    double err = 0, mx = 0;
    for (int64_t r = 0; r < n; r++)
        for (int64_t c = 0; c < out; c++) {
            double want = 0;
            for (int64_t i = 0; i < in; i++) want += (double)x[r * in + i] * wf[w_out_in ? c * in + i : i * out + c];
            err = fmax(err, fabs(y[r * out + c] - want));
            mx = fmax(mx, fabs(want));
        }
    CHECK_MSG(mx > 0 && err <= 1e-5 * mx, "%s n=%lld in=%lld out=%lld %s: max err %g of %g", name, (long long)n,
              (long long)in, (long long)out, tp_dtype_name(dt), err, mx);
    for (int nt = 1; nt <= 3; nt += 2) {
        tp_threadpool *p2;
        tp_threadpool_create(&p2, nt);
        CHECK(prod(again, x, n, &w, p2, &opts) == TP_OK);
        CHECK_MSG(memcmp(again, y, (size_t)(n * out) * sizeof *y) == 0, "%s n=%lld in=%lld out=%lld: %d threads differ",
                  name, (long long)n, (long long)in, (long long)out, nt);
        tp_threadpool_destroy(p2);
    }
    tp_threadpool_destroy(pool);
    tp_tensor_release(&w);
    free(x); free(wf); free(y); free(again);
}

/* tp_expert_xw (Llama 4's and gpt_oss's x @ W [in, out]) at widths that
 * reach the SIMD loops' bodies, prefetches and tails (out 1003: 31 steps
 * of 32 columns, then 11: none of 16 and 11 columns, one of 8 and 3; in
 * 37: a last pass of one row where two rows of W make a pass, the scalar
 * path's last pass of fewer than 4), 1-4 rows streamed and 5 through the
 * packed GEMM. */
static void check_xw(int64_t n, int64_t in, int64_t out, tp_dtype dt)
{
    check_product("xw", tp_expert_xw, 0, n, in, out, dt);
}

static void test_expert_xw(void)
{
    for (int64_t n = 1; n <= 5; n++) {   /* 3 and 4: rows of W two a pass on the SIMD paths */
        check_xw(n, 37, 1003, TP_BF16);
        check_xw(n, 37, 1003, TP_F32);
    }
    check_xw(2, 6, 40, TP_BF16);    /* in < 8: passes of 4 rows on the scalar path */
    check_xw(1, 4, 3, TP_F32);      /* fewer columns than one SIMD step */
    /* rows longer than the prefetch distance (8 KiB: 4096 bf16, 2048 f32)
     * on one thread: prefetches within the row, then into the next one */
    check_xw(1, 9, 4133, TP_BF16);
    check_xw(4, 9, 4133, TP_F32);
    /* 5 chunks of 64 rows, the last of 44 (SIMD paths): summed apart and
     * added in order, 1, 2 and 3 threads owning 5, 3 + 2, 2 + 2 + 1 */
    check_xw(1, 300, 200, TP_BF16);
    check_xw(3, 300, 200, TP_F32);
    check_xw(2, 2100, 40, TP_BF16);   /* 32 chunks of 66 rows, the last of 54 */
}

/* opts.bf16_dot is tp_matmul_ex's product (vdpbf16ps, or x rounded to
 * bf16 first where that is emulated), not the rows kernel's exact one:
 * tp_matmul_rows gives its bits, and they differ from the exact ones. */
static void check_rows_bf16_dot(void)
{
    int64_t T = 32, n = 13, k = 100;
    uint64_t seed = 77;
    float *x = malloc((size_t)(T * k) * sizeof *x), *wf = malloc((size_t)(n * k) * sizeof *wf);
    float *y = malloc((size_t)(T * n) * sizeof *y), *want = malloc((size_t)(T * n) * sizeof *want);
    float *exact = malloc((size_t)(T * n) * sizeof *exact);
    for (int64_t i = 0; i < T * k; i++) x[i] = frand(&seed) * 1.001f;   /* not bf16 values */
    for (int64_t i = 0; i < n * k; i++) wf[i] = frand(&seed);
    tp_tensor w;
    CHECK(tp_tensor_init(&w, TP_BF16, 2, (int64_t[2]){n, k}) == TP_OK);
    tp_convert(w.data, TP_BF16, wf, TP_F32, (size_t)(n * k));
    tp_matmul_opts opts;
    tp_matmul_opts_default(&opts);
    tp_threadpool *pool;
    tp_threadpool_create(&pool, 2);
    CHECK(tp_matmul_rows(exact, x, T, &w, pool, &opts) == TP_OK);
    opts.bf16_dot = 1;
    CHECK(tp_matmul_rows(y, x, T, &w, pool, &opts) == TP_OK);
    CHECK(tp_matmul_ex(want, x, T, &w, NULL, pool, &opts) == TP_OK);
    CHECK_MSG(memcmp(y, want, (size_t)(T * n) * sizeof *y) == 0, "rows bf16_dot: not tp_matmul_ex's bits");
    CHECK_MSG(memcmp(y, exact, (size_t)(T * n) * sizeof *y) != 0, "rows bf16_dot: the exact product");
    tp_threadpool_destroy(pool);
    tp_tensor_release(&w);
    free(x); free(wf); free(y); free(want); free(exact);
}

/* tp_matmul_rows (an expert's rows; on the AVX-512 path W read in place,
 * gemm_rows_avx512.c): T = 5..128 (the most it takes) reaches every row
 * tile (4 rows and the 1-3 left over), n every column edge of the
 * 5-column tiles and a split of a few tiles over 3 threads, k the 16- and
 * 32-lane tails (f32, bf16) below and above one step. */
static void test_matmul_rows(void)
{
    check_rows_bf16_dot();
    static const int64_t Ts[] = {5, 6, 7, 32, 45, 128}, ns[] = {1, 5, 13, 101}, ks[] = {7, 32, 45, 100, 300};
    for (size_t a = 0; a < sizeof Ts / sizeof *Ts; a++)
        for (size_t b = 0; b < sizeof ns / sizeof *ns; b++)
            for (size_t c = 0; c < sizeof ks / sizeof *ks; c++) {
                check_product("rows", tp_matmul_rows, 1, Ts[a], ks[c], ns[b], TP_BF16);
                check_product("rows", tp_matmul_rows, 1, Ts[a], ks[c], ns[b], TP_F32);
            }
}

static void test_router(void)
{
    /* token 0: a clear order; token 1: a tie between experts 1 and 3 */
    float logits[2][4] = {{0.1f, 2.0f, -1.0f, 1.0f}, {0.0f, 1.5f, -3.0f, 1.5f}};
    int32_t ids[4];
    float w[4];
    tp_moe_route(&logits[0][0], 2, 4, 2, 0, ids, w);
    double z = exp(0.1) + exp(2.0) + exp(-1.0) + exp(1.0);
    CHECK(ids[0] == 1 && ids[1] == 3 && fabs(w[0] - exp(2.0) / z) < 1e-6 && fabs(w[1] - exp(1.0) / z) < 1e-6);
    CHECK(ids[2] == 1 && ids[3] == 3 && w[2] == w[3]);   /* the lower id first on a tie */
    float again[4] = {0.1f, 2.0f, -1.0f, 1.0f};
    tp_moe_route(again, 1, 4, 2, 1, ids, w);              /* renormalised over the chosen two */
    CHECK(fabs(w[0] - exp(2.0) / (exp(2.0) + exp(1.0))) < 1e-6 && fabs(w[0] + w[1] - 1.0) < 1e-6);
}

/* DeepseekV2Moe's group_limited_greedy where the kept groups have fewer
 * probabilities above 0 than top_k (they underflow in f32 ~104 below the
 * best logit): torch.topk(tmp_scores) then also picks experts masked to 0,
 * and returns their weight from tmp_scores: 0.  Groups of 2, topk_group 2,
 * k 4; expert 0 (group 0, masked) has a probability well above 0, and the
 * lowest id among the zeros.  Transformers' output is Σ over the two live
 * picks; a weight of expert 0's probability would add its expert. */
static void test_deepseek_v2_masked_picks(void)
{
    tp_model_config c;
    memset(&c, 0, sizeof c);
    c.arch = TP_ARCH_DEEPSEEK_V2, c.num_experts = 8, c.num_experts_per_tok = 4, c.n_group = 4, c.topk_group = 2;
    c.group_limited = 1, c.routed_scaling_factor = 1.5;
    float logits[8] = {-3.0f, -500.0f, 0.0f, -500.0f, -1.0f, -500.0f, -500.0f, -500.0f};
    int32_t ids[4];
    float w[4];
    CHECK(tp_moe_route_deepseek(&c, logits, 1, NULL, ids, w) == TP_OK);
    double z = 1.0 + exp(-1.0) + exp(-3.0), live = 0, dead = 0;
    int seen2 = 0, seen4 = 0;
    for (int j = 0; j < 4; j++) {
        seen2 += ids[j] == 2, seen4 += ids[j] == 4;
        if (ids[j] == 2 || ids[j] == 4) live += w[j];
        else dead += fabs(w[j]);
    }
    CHECK_MSG(seen2 == 1 && seen4 == 1, "the two live experts are picked");
    CHECK_MSG(fabs(live - 1.5 * (1.0 + exp(-1.0)) / z) < 1e-6, "live weights %g", live);
    CHECK_MSG(dead == 0.0, "picks of masked or underflowed experts weigh 0, got %g", dead);
}

static void test_config(void)
{
    tp_model_config c;
    CHECK(tp_preset_config(&c, TP_ARCH_QWEN3_MOE, "qwen3-30b-a3b") == TP_OK);
    CHECK(c.hidden_size == 2048 && c.num_hidden_layers == 48 && c.num_attention_heads == 32 &&
          c.num_key_value_heads == 4 && c.head_dim == 128 && c.num_experts == 128 && c.num_experts_per_tok == 8 &&
          c.moe_intermediate_size == 768 && c.norm_topk_prob && c.vocab_size == 151936 && c.qk_norm);
    CHECK(tp_preset_config(&c, TP_ARCH_MIXTRAL, "mixtral-8x7b") == TP_OK);
    CHECK(c.hidden_size == 4096 && c.num_experts == 8 && c.num_experts_per_tok == 2 &&
          c.moe_intermediate_size == 14336 && c.intermediate_size == 14336 && c.vocab_size == 32000 &&
          c.rope_theta == 1e6 && !c.qk_norm);
    /* dense layers: decoder_sparse_step and mlp_only_layers (Qwen3MoeDecoderLayer's rule) */
    CHECK(tp_preset_config(&c, TP_ARCH_QWEN3_MOE, "tiny") == TP_OK);
    const char *sets[] = {"num_hidden_layers=6", "decoder_sparse_step=2", "mlp_only_layers=[3]"};
    CHECK(tp_config_set_all(&c, sets, 3) == TP_OK);
    int sparse[6];
    for (int l = 0; l < 6; l++) sparse[l] = tp_config_layer_is_sparse(&c, l);
    CHECK(!sparse[0] && sparse[1] && !sparse[2] && !sparse[3] && !sparse[4] && sparse[5]);
    const char *bad = "num_experts_per_tok=9";
    CHECK(tp_config_set(&c, bad) != TP_OK && strstr(tp_error(), "num_experts_per_tok") != NULL);
    /* the expert count under either name (§7.1) */
    CHECK(tp_preset_config(&c, TP_ARCH_MIXTRAL, "tiny") == TP_OK);
    CHECK(tp_config_set(&c, "num_local_experts=4") == TP_OK && c.num_experts == 4 && c.norm_topk_prob);
    CHECK(tp_preset_config(&c, TP_ARCH_LLAMA, "tiny") == TP_OK && !tp_config_layer_is_sparse(&c, 0));
}

static int has(const tp_param_desc *d, size_t n, const char *name, int ndim, const int64_t *shape)
{
    for (size_t i = 0; i < n; i++)
        if (!strcmp(d[i].name, name)) return d[i].ndim == ndim && !memcmp(d[i].shape, shape, (size_t)ndim * 8);
    return 0;
}

static void test_tables(void)
{
    tp_model_config c;
    tp_param_desc *d;
    size_t n;
    CHECK(tp_preset_config(&c, TP_ARCH_QWEN3_MOE, "tiny") == TP_OK);    /* E 8, I 40, H 64 */
    CHECK(tp_config_set(&c, "mlp_only_layers=[1]") == TP_OK);
    CHECK(tp_model_params(&c, NULL, &d, &n) == TP_OK);
    CHECK(has(d, n, "model.layers.0.mlp.gate.weight", 2, (int64_t[]){8, 64}));
    CHECK(has(d, n, "model.layers.0.mlp.experts.gate_up_proj", 3, (int64_t[]){8, 80, 64}));
    CHECK(has(d, n, "model.layers.0.mlp.experts.down_proj", 3, (int64_t[]){8, 64, 40}));
    CHECK(has(d, n, "model.layers.1.mlp.gate_proj.weight", 2, (int64_t[]){160, 64}));
    free(d);
    CHECK(tp_model_checkpoint_params(&c, &d, &n) == TP_OK);
    CHECK(has(d, n, "model.layers.0.mlp.experts.7.up_proj.weight", 2, (int64_t[]){40, 64}));
    CHECK(has(d, n, "model.layers.0.mlp.experts.0.down_proj.weight", 2, (int64_t[]){64, 40}));
    CHECK(!has(d, n, "model.layers.0.mlp.experts.gate_up_proj", 3, (int64_t[]){8, 80, 64}));
    free(d);
    CHECK(tp_preset_config(&c, TP_ARCH_MIXTRAL, "tiny") == TP_OK);
    CHECK(tp_model_checkpoint_params(&c, &d, &n) == TP_OK);
    CHECK(has(d, n, "model.layers.1.block_sparse_moe.gate.weight", 2, (int64_t[]){8, 64}));
    CHECK(has(d, n, "model.layers.1.block_sparse_moe.experts.3.w3.weight", 2, (int64_t[]){40, 64}));
    CHECK(has(d, n, "model.layers.1.block_sparse_moe.experts.3.w2.weight", 2, (int64_t[]){64, 40}));
    free(d);
}

int main(void)
{
    test_grouped_experts();
    test_expert_xw();
    test_matmul_rows();
    test_router();
    test_deepseek_v2_masked_picks();
    test_config();
    test_tables();
    return check_summary();
}
