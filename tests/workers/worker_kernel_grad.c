/* worker_kernel_grad: the C side of tests/e2e/test_kernel_grad_torch.py.
 *
 * One process, no ranks: runs each backward kernel on random inputs and
 * writes inputs, upstream gradients and the kernel's results as .npy files
 * into --out-dir DIR (CASE_NAME.npy), for the test to compare with
 * PyTorch's autograd.  The shapes and constants a case needs besides its
 * arrays go into CASE_meta.npy (int64). */
#include "worker_args.h"
#include "tensorpar/kernels.h"

#include <stdlib.h>
#include <string.h>

static tp_rng rng;
static const char *dir;
static int failed;

/* .npy version 1.0: magic, header length, a dict padded with spaces to a
 * multiple of 64 bytes, then the raw little-endian data. */
static void save(const char *name, const char *descr, size_t elem, const void *data, int ndim, const int64_t *shape)
{
    char path[1024], dims[128] = "", hdr[256];
    size_t n = 1;
    for (int i = 0; i < ndim; i++) {
        size_t used = strlen(dims);
        snprintf(dims + used, sizeof dims - used, "%lld,%s", (long long)shape[i], i + 1 < ndim ? " " : "");
        n *= (size_t)shape[i];
    }
    int len = snprintf(hdr, sizeof hdr, "{'descr': '%s', 'fortran_order': False, 'shape': (%s), }", descr, dims);
    int total = (10 + len + 1 + 63) / 64 * 64;
    memset(hdr + len, ' ', (size_t)(total - 10 - len - 1));
    hdr[total - 10 - 1] = '\n';
    snprintf(path, sizeof path, "%s/%s.npy", dir, name);
    FILE *f = fopen(path, "wb");
    unsigned char pre[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, (unsigned char)((total - 10) & 0xff),
                             (unsigned char)((total - 10) >> 8)};
    if (!f || fwrite(pre, 1, 10, f) != 10 || fwrite(hdr, 1, (size_t)(total - 10), f) != (size_t)(total - 10) ||
        fwrite(data, elem, n, f) != n) {
        fprintf(stderr, "worker_kernel_grad: cannot write %s\n", path);
        failed = 1;
    }
    if (f) fclose(f);
}

static void save_f32(const char *name, const float *x, int ndim, const int64_t *shape)
{
    save(name, "<f4", sizeof(float), x, ndim, shape);
}

static void save_i64(const char *name, const int64_t *x, int ndim, const int64_t *shape)
{
    save(name, "<i8", sizeof(int64_t), x, ndim, shape);
}

static float *rnd(int64_t n, double scale)
{
    float *x = calloc((size_t)n, sizeof(float));
    if (!x) { fprintf(stderr, "worker_kernel_grad: out of memory\n"); exit(1); }
    for (int64_t i = 0; i < n; i++) x[i] = (float)(scale * tp_rng_normal(&rng));
    return x;
}

static float *zeros(int64_t n) { return rnd(n, 0.0); }

static void ok(tp_status st, const char *what)
{
    if (st) { fprintf(stderr, "worker_kernel_grad: %s: %s\n", what, tp_error()); failed = 1; }
}

static void case_rmsnorm(void)
{
    int64_t rows = 6, n = 16, s2[2] = {rows, n}, s1[1] = {n};
    float *x = rnd(rows * n, 1.0), *w = rnd(n, 0.5), *dy = rnd(rows * n, 1.0);
    float *dx = zeros(rows * n), *dw = zeros(n);
    for (int64_t i = 0; i < n; i++) w[i] += 1.0f;
    tp_tensor W = {TP_F32, 1, {n}, w, 0};
    ok(tp_rmsnorm_backward(dx, dw, dy, x, &W, rows, n, 1e-6), "rmsnorm");
    save_f32("rms_x", x, 2, s2), save_f32("rms_w", w, 1, s1), save_f32("rms_dy", dy, 2, s2);
    save_f32("rms_dx", dx, 2, s2), save_f32("rms_dw", dw, 1, s1);
    free(x), free(w), free(dy), free(dx), free(dw);
}

/* kind 0 default, 1 llama3, 2 linear; theta 100 and original_max_pos 64
 * put llama3's three bands among head_dim 16's eight frequencies. */
static void case_rope(int kind, const char *pre)
{
    int64_t T = 5, H = 3, hd = 16, pos0 = 7, s3[3] = {T, H, hd}, meta[2] = {kind, pos0}, ms[1] = {2};
    double inv_freq[8];
    float table[5 * 16], *x = rnd(T * H * hd, 1.0), *g = rnd(T * H * hd, 1.0);
    char name[64];
    tp_rope_inv_freq(inv_freq, hd, 100.0, kind, 4.0, 1.0, 4.0, 64);
    tp_rope_table(table, T, hd, inv_freq, pos0);
    snprintf(name, sizeof name, "%s_x", pre), save_f32(name, x, 3, s3);
    snprintf(name, sizeof name, "%s_dy", pre), save_f32(name, g, 3, s3);
    snprintf(name, sizeof name, "%s_meta", pre), save_i64(name, meta, 1, ms);
    tp_rope_apply_table(x, T, H, hd, table);
    tp_rope_backward(g, T, H, hd, table);
    snprintf(name, sizeof name, "%s_y", pre), save_f32(name, x, 3, s3);
    snprintf(name, sizeof name, "%s_dx", pre), save_f32(name, g, 3, s3);
    free(x), free(g);
}

static void case_silu(void)
{
    int64_t n = 64, s1[1] = {n};
    float *a = rnd(n, 3.0), *b = rnd(n, 1.0), *dy = rnd(n, 1.0), *da = zeros(n), *db = zeros(n);
    tp_silu_mul_backward(da, db, dy, a, b, n);
    save_f32("silu_a", a, 1, s1), save_f32("silu_b", b, 1, s1), save_f32("silu_dy", dy, 1, s1);
    save_f32("silu_da", da, 1, s1), save_f32("silu_db", db, 1, s1);
    free(a), free(b), free(dy), free(da), free(db);
}

/* bf16 != 0: the weight goes to the kernel as bf16 and to the file as the
 * f32 values of those bf16 numbers. */
static void case_linear(int64_t T, int64_t out, int64_t in, int bf16, const char *pre)
{
    int64_t sx[2] = {T, in}, sw[2] = {out, in}, sy[2] = {T, out}, sb[1] = {out};
    float *x = rnd(T * in, 1.0), *w = rnd(out * in, 0.5), *b = rnd(out, 1.0), *dy = rnd(T * out, 1.0);
    float *dx = zeros(T * in), *dw = zeros(out * in), *db = zeros(out);
    uint16_t *wh = calloc((size_t)(out * in), sizeof(uint16_t));
    if (!wh) exit(1);
    for (int64_t i = 0; i < out * in && bf16; i++) wh[i] = tp_bf16_from_f32(w[i]), w[i] = tp_f32_from_bf16(wh[i]);
    tp_tensor W = {bf16 ? TP_BF16 : TP_F32, 2, {out, in}, bf16 ? (void *)wh : (void *)w, 0};
    ok(tp_matmul_backward(dx, dw, db, dy, x, T, &W, NULL), "linear");
    char name[64];
    snprintf(name, sizeof name, "%s_x", pre), save_f32(name, x, 2, sx);
    snprintf(name, sizeof name, "%s_w", pre), save_f32(name, w, 2, sw);
    snprintf(name, sizeof name, "%s_b", pre), save_f32(name, b, 1, sb);
    snprintf(name, sizeof name, "%s_dy", pre), save_f32(name, dy, 2, sy);
    snprintf(name, sizeof name, "%s_dx", pre), save_f32(name, dx, 2, sx);
    snprintf(name, sizeof name, "%s_dw", pre), save_f32(name, dw, 2, sw);
    snprintf(name, sizeof name, "%s_db", pre), save_f32(name, db, 1, sb);
    free(x), free(w), free(b), free(dy), free(dx), free(dw), free(db), free(wh);
}

/* The rows [3, 8) of a vocabulary of 13, as one rank of embedding_rowwise. */
static void case_embedding(void)
{
    int64_t ids[9] = {4, 0, 6, 4, 9, 3, 7, 12, 6}, T = 9, rows = 5, width = 6, row0 = 3;
    int64_t si[1] = {T}, sw[2] = {rows, width}, sy[2] = {T, width}, meta[1] = {row0}, ms[1] = {1};
    float *dy = rnd(T * width, 1.0), *dw = zeros(rows * width);
    tp_embedding_backward(dw, row0, rows, width, ids, dy, T, NULL);
    save_i64("emb_ids", ids, 1, si), save_i64("emb_meta", meta, 1, ms);
    save_f32("emb_dy", dy, 2, sy), save_f32("emb_dw", dw, 2, sw);
    free(dy), free(dw);
}

/* Two of the seven rows ignored; the count 9 as if 4 more tokens were
 * counted in other micro-batches of the same step. */
static void case_cross_entropy(void)
{
    int64_t T = 7, V = 11, labels[7] = {3, -100, 0, 10, -100, 5, 3}, s2[2] = {T, V}, sl[1] = {T};
    int64_t meta[1] = {9}, ms[1] = {1}, s0[1] = {1};
    float *z = rnd(T * V, 2.0), *dz = zeros(T * V), lossf;
    double loss = 0;
    ok(tp_cross_entropy(&loss, dz, z, labels, T, V, 9.0, NULL), "cross_entropy");
    lossf = (float)loss;
    save_f32("ce_logits", z, 2, s2), save_i64("ce_labels", labels, 1, sl), save_i64("ce_meta", meta, 1, ms);
    save_f32("ce_dlogits", dz, 2, s2), save_f32("ce_loss_sum", &lossf, 1, s0);
    free(z), free(dz);
}

static void case_attention(int64_t T, int64_t pos0, int64_t H, int64_t KV, int64_t d, int64_t window,
                           const char *pre)
{
    int64_t L = pos0 + T, sq[3] = {T, H, d}, sk[3] = {L, KV, d}, sl[2] = {T, H};
    int64_t meta[6] = {T, pos0, H, KV, d, window}, ms[1] = {6};
    float *q = rnd(T * H * d, 1.5), *k = rnd(L * KV * d, 1.0), *v = rnd(L * KV * d, 1.0), *dy = rnd(T * H * d, 1.0);
    float *out = zeros(T * H * d), *lse = zeros(T * H), *dq = zeros(T * H * d), *dk = zeros(L * KV * d);
    float *dv = zeros(L * KV * d);
    ok(tp_attention_forward_lse(out, lse, q, k, v, T, pos0, H, KV, d, window, NULL), "attention forward");
    ok(tp_attention_backward(dq, dk, dv, dy, q, k, v, out, lse, T, pos0, H, KV, d, window, NULL), "attention");
    char name[64];
    snprintf(name, sizeof name, "%s_meta", pre), save_i64(name, meta, 1, ms);
    snprintf(name, sizeof name, "%s_q", pre), save_f32(name, q, 3, sq);
    snprintf(name, sizeof name, "%s_k", pre), save_f32(name, k, 3, sk);
    snprintf(name, sizeof name, "%s_v", pre), save_f32(name, v, 3, sk);
    snprintf(name, sizeof name, "%s_dy", pre), save_f32(name, dy, 3, sq);
    snprintf(name, sizeof name, "%s_out", pre), save_f32(name, out, 3, sq);
    snprintf(name, sizeof name, "%s_lse", pre), save_f32(name, lse, 2, sl);
    snprintf(name, sizeof name, "%s_dq", pre), save_f32(name, dq, 3, sq);
    snprintf(name, sizeof name, "%s_dk", pre), save_f32(name, dk, 3, sk);
    snprintf(name, sizeof name, "%s_dv", pre), save_f32(name, dv, 3, sk);
    free(q), free(k), free(v), free(dy), free(out), free(lse), free(dq), free(dk), free(dv);
}

int main(int argc, char **argv)
{
    worker_opt opts[] = {{"--out-dir", 1, NULL}};
    int rc = worker_parse("worker_kernel_grad", argc, argv, opts, 1);
    if (rc) return rc;
    if (!opts[0].value) {
        fprintf(stderr, "usage: worker_kernel_grad --out-dir DIR\n");
        return 2;
    }
    dir = opts[0].value;
    tp_rng_seed(&rng, 2024);
    case_rmsnorm();
    case_rope(0, "rope0");
    case_rope(1, "rope1");
    case_rope(2, "rope2");
    case_silu();
    case_linear(12, 20, 24, 0, "lin");
    case_linear(5, 300, 8, 1, "linbf16");
    case_embedding();
    case_cross_entropy();
    case_attention(11, 0, 4, 2, 8, 0, "attn1");
    case_attention(9, 5, 6, 2, 16, 4, "attn2");
    return failed;
}
