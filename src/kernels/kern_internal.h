/* kernels/kern_internal.h — what the kernel files share with each other and
 * with tests/unit/test_kernels.c: the per-path entry points.  Not public API.
 *
 * Each *_path function runs exactly the given path (SCALAR, AVX2 or AVX512);
 * the caller has checked tp_kernel_path_supported(). */
#ifndef TP_KERN_INTERNAL_H
#define TP_KERN_INTERNAL_H

#include "tensorpar/kernels.h"

/* Which paths this build has.  The SIMD paths (AVX2, AVX-512, AMX) are
 * x86-64 code: CMake compiles the gemm_*avx2/avx512/amx files (CMakeLists.txt
 * names them) there only, and the other kernels keep their SIMD versions
 * under this flag.  Every other architecture (arm64, tested under qemu-aarch64)
 * runs the portable C path, which cpu.c then reports as the only one. */
#if defined(__x86_64__)
#define TP_KERNELS_X86 1
#else
#define TP_KERNELS_X86 0
#endif

/* The path actually run for a request by the element-wise kernels: AUTO
 * becomes the default, and a path above the process's ISA is lowered to it
 * (never raised), so no caller can run an instruction TENSORPAR_ISA or the
 * CPU rules out. */
tp_kernel_path tp_kernel_resolve(tp_kernel_path p);

/* tp_isa_choose with TENSORPAR_ISA, after refusing the knobs it replaced
 * (isa.c). */
tp_status tp_isa_choose_env(const int has[TP_ISA_COUNT], tp_isa *out);

/* Matmul pieces (matmul.c, gemm_avx512.c, gemm_avx2.c).  y = x·Wᵀ, no bias;
 * W is f32 or bf16 [n, k] row-major.  The GEMV functions take T <= 4.
 * They allocate their packing buffers before starting the threads and fail
 * only with TP_ERR_NOMEM. */
/* y = x·dequant(W)ᵀ for block-quantized W (q8_0, q4_0; matmul.c): the
 * path's f32 GEMM, which dequantizes W while packing (d·q is exact in
 * f32), or the scalar loop on the dequantized values; x as it is. */
tp_status tp_matmul_dequant(float *y, const float *x, int64_t T, const tp_tensor *W, tp_kernel_path path,
                            tp_threadpool *pool);
void tp_matmul_scalar(float *y, const float *x, int64_t T, const void *W, tp_dtype wt,
                      int64_t n, int64_t k, tp_threadpool *pool);
/* y = x·Wᵀ (no bias) for an MoE expert's rows: tp_matmul_ex, except on
 * the AVX-512 GEMM path with f32/bf16 W, the exact product (not bf16_dot)
 * and TP_GEMV_MAX_T < T <= TP_ROWS_MAX_T, where W is read in place
 * (gemm_rows_avx512.c; other bits than the packed GEMM's, the same on any
 * thread count).  The bound: one thread, cold bf16 [1536, 2048] weights
 * (Zen 5), the rows kernel ran 1.6-1.9x the packed GEMM at 32 rows, 1.2x
 * at 96, 1.1x at 128, even from 192 on (x no longer in L2 for every W
 * tile). */
#define TP_ROWS_MAX_T 128
tp_status tp_matmul_rows(float *y, const float *x, int64_t T, const tp_tensor *W, tp_threadpool *pool,
                         const tp_matmul_opts *opts);
#if TP_KERNELS_X86
tp_status tp_gemm_avx512(float *y, const float *x, int64_t T, const void *W, tp_dtype wt,
                    int64_t n, int64_t k, int bf16_dot, tp_threadpool *pool);
tp_status tp_gemv_avx512(float *y, const float *x, int64_t T, const void *W, tp_dtype wt,
                    int64_t n, int64_t k, int bf16_dot, tp_threadpool *pool);
/* x [T, k] -> dst [T, kp] (kp a multiple of 32, zero past k), each block of
 * 32 as its 16 even then its 16 odd elements: a 32-bit lane of a bf16
 * weight load holds an (even, odd) pair, widened as (lane << 16) and
 * (lane & 0xffff0000), so a 64-byte load of 32 weights meets x in this
 * order (the AVX-512 GEMV, gemm_avx512.c, and gemm_rows_avx512.c; the AVX2
 * GEMV permutes in blocks of 16 the same way, gemm_avx2.c permute_x). */
void tp_permute_x_avx512(float *dst, const float *x, int64_t T, int64_t k, int64_t kp);
/* A few rows (an MoE expert's in a prefill) with W f32 or bf16 read in
 * place, nothing packed: gemm_rows_avx512.c, through tp_matmul_rows. */
tp_status tp_gemm_rows_avx512(float *y, const float *x, int64_t T, const void *W, tp_dtype wt, int64_t n, int64_t k,
                              tp_threadpool *pool);
/* One weight of a GEMM group: y[T, n] = x · W[n, k]ᵀ, the same x and k for
 * every part.  A group packs (or splits) x once for all its parts and
 * gives the same bits as one call per part.  At most TP_GEMM_GROUP_MAX
 * parts (tp_matmul_group groups no more). */
typedef struct {
    float *y;
    const void *w;
    int64_t n;
} tp_gemm_part;
#define TP_GEMM_GROUP_MAX 8
tp_status tp_gemm_avx512_group(const tp_gemm_part *parts, int count, const float *x, int64_t T, tp_dtype wt,
                               int64_t k, int bf16_dot, tp_threadpool *pool);
/* The GEMV (T <= TP_GEMV_MAX_T) of a group: x prepared once, every weight's
 * rows in one parallel region of dynamic chunks (tp_parallel_for); the
 * bits of one tp_gemv_avx512 call per weight. */
tp_status tp_gemv_avx512_group(const tp_gemm_part *parts, int count, const float *x, int64_t T, tp_dtype wt,
                               int64_t k, int bf16_dot, tp_threadpool *pool);
tp_status tp_gemm_amx_group(const tp_gemm_part *parts, int count, const float *x, int64_t T, int64_t k,
                            int passes, tp_threadpool *pool);
/* bf16 W only; the caller has checked tp_kernel_has_amx().  x is split into
 * `passes` (1..3) bf16 parts, see gemm_amx.c. */
tp_status tp_gemm_amx(float *y, const float *x, int64_t T, const uint16_t *W, int64_t n, int64_t k,
                      int passes, tp_threadpool *pool);
tp_status tp_gemm_avx2(float *y, const float *x, int64_t T, const void *W, tp_dtype wt,
                  int64_t n, int64_t k, tp_threadpool *pool);
tp_status tp_gemv_avx2(float *y, const float *x, int64_t T, const void *W, tp_dtype wt,
                  int64_t n, int64_t k, tp_threadpool *pool);
#endif

/* Element-wise kernels with an explicit path. */
void tp_rmsnorm_path(tp_kernel_path p, float *out, const float *x, const float *w,
                     int64_t rows, int64_t n, double eps);
void tp_silu_mul_path(tp_kernel_path p, float *a, const float *b, int64_t n);
void tp_adamw_update_path(tp_kernel_path path, const tp_adamw_consts *c, int decay, float *p, const float *g,
                          float *m, float *v, int64_t n);
void tp_softmax_path(tp_kernel_path p, float *x, int64_t n);
void tp_rope_apply_table_path(tp_kernel_path p, float *x, int64_t T, int64_t n_heads,
                              int64_t head_dim, const float *table);
/* Attention: SCALAR is the row-at-a-time reference; the SIMD paths are the
 * flash-style blocked kernel. */
void tp_attention_path(tp_kernel_path p, float *out, const float *q, const float *k,
                       const float *v, int64_t T, int64_t pos0, int64_t n_heads, int64_t n_kv,
                       int64_t d, int64_t window, tp_threadpool *pool);

/* ---- the packed GEMM (gemm_packed.c) ----------------------------------
 * A strided matrix view: element (i, j) at p[i·rs + j·cs].  dt is TP_F32,
 * or TP_BF16 / TP_Q8_0 / TP_Q4_0 for B (widened / dequantized while
 * packing).  A q4_0 B is Wᵀ (cs = k) and rows is W's row count, which its
 * repacked layout depends on (kern_q4.h); no other dtype reads rows (the
 * forward GEMM sets it for any W, the backward's operands leave it 0). */
typedef struct {
    const void *p;
    tp_dtype dt;
    int64_t rs, cs;
    int64_t rows;
} tp_gemm_operand;

/* The micro-kernel: c[0:mr, 0:nr] (ldc apart) gets the sum over kc of the
 * packed a [kc][MR] times the packed b [kc][NR], summed from zero in k order,
 * then added to c (accumulate) or stored.  mr <= MR, nr <= NR; the panels are
 * full (zero-padded). */
typedef void (*tp_gemm_ukernel_fn)(int64_t kc, const float *a, const float *b, float *c, int64_t ldc, int mr,
                                   int nr, int accumulate);
/* Packs one full micro-panel of B = Wᵀ (b->rs = 1): dst[p·nr + j] =
 * B[p0+p, j0+j] for p < kc, j < nr — the same values as the generic
 * packing, with the path's own instructions. */
typedef void (*tp_gemm_pack_bt_fn)(float *dst, const tp_gemm_operand *b, int64_t p0, int64_t kc, int64_t j0);
/* Packs one full micro-panel of A read along p (a->cs = 1, f32): dst[p·mr +
 * i] = A[i0+i, p0+p] for p < kc, i < mr — likewise the generic values. */
typedef void (*tp_gemm_pack_a_fn)(float *dst, const tp_gemm_operand *a, int64_t i0, int64_t p0, int64_t kc);
typedef struct {
    int mr, nr;            /* register tile */
    int64_t mc, kc, nc;    /* cache blocks: A in L2, B micro-panel in L1, B panel in L2/L3 */
    tp_gemm_ukernel_fn fn;
    tp_gemm_pack_bt_fn pack_bt;   /* NULL: the generic packing */
    tp_gemm_pack_a_fn pack_a;     /* NULL: the generic packing */
    /* > 0: where a thread's rows of A, packed for one KC block, take at most
     * TP_GEMM_A_WHOLE_BYTES, A is packed once per KC block and B walked in
     * panels of nc_l2 columns, small enough to stay in L2 beside an A block
     * (gemm_packed.c); 0: the loop order above with nc. */
    int64_t nc_l2;
} tp_gemm_ukernel;

#define TP_GEMM_A_WHOLE_BYTES ((size_t)1 << 20)

/* C[m, n] (ldc apart) = A·B, or += with accumulate.  Bitwise the same
 * result for any number of threads in pool. */
tp_status tp_gemm_packed(const tp_gemm_ukernel *uk, float *c, int64_t ldc, int accumulate, int64_t m, int64_t n,
                         int64_t k, const tp_gemm_operand *a, const tp_gemm_operand *b, tp_threadpool *pool);
#if TP_KERNELS_X86
/* The micro-kernels of the AVX2 (6×16) and AVX-512 paths. */
extern const tp_gemm_ukernel tp_gemm_ukernel_avx2;
extern const tp_gemm_ukernel tp_gemm_ukernel_avx512;
#endif

/* A kernel's working space for one call: the pool's kept scratch
 * (tp_threadpool_scratch), else (no pool, or it could not grow) a fresh
 * buffer, also left in *own for the caller to tp_free; NULL when out of
 * memory (gemm_shared.c). */
void *tp_kernel_scratch(tp_threadpool *pool, size_t bytes, void **own);

/* x[0:T, k0:k0+kc] -> panels [T/mr][kc][mr], rows past T zero (gemm_shared.c). */
void tp_gemm_pack_a(float *dst, const float *x, int64_t T, int64_t ldx, int64_t k0, int64_t kc, int mr);

/* Thread ti's rows [*r0, *r1) of n rows with blocks of R rows, a static
 * split: the quantized GEMMs' and q8_0's AVX-512 decode GEMV (its prefetch
 * runs along the thread's tiles); the f32/bf16 GEMVs, q4_0's and the
 * other q8_0 GEMVs take tp_gemv_chunk_rows chunks dynamically
 * (gemm_shared.c). */
void tp_gemv_thread_rows(int64_t n, int64_t row_bytes, int R, int ti, int nt, int64_t *r0, int64_t *r1);
/* Rows per chunk of a GEMV split dynamically (tp_parallel_for): whole
 * blocks of R rows, about TP_GEMV_CHUNK_BYTES of W (gemm_shared.c). */
int64_t tp_gemv_chunk_rows(int64_t row_bytes, int R);

/* The largest T the GEMV handles. */
#define TP_GEMV_MAX_T 4

/* ---- 8-bit weights (quant_q8.c, gemm_q8.c, gemm_q8_avx2.c, gemm_q8_avx512.c)
 * y = x·Wᵀ with W in TP_Q8_0 blocks.
 *
 * T >= TP_Q8_DEQUANT_MIN_T: the f32 product x·dequant(W)ᵀ, bitwise the
 * f32 product of the path with the dequantized weights, for any thread
 * count.  x is not quantized.  The
 * packed f32 GEMM that runs it is 1.3× faster than the integer tiles at
 * T = 512 on AVX2 (they need more than 16 registers); below ~T = 28 the
 * integer kernels win, reading 1 byte per weight where the GEMM packs 4.
 *
 * T < TP_Q8_DEQUANT_MIN_T: x is quantized per row into blocks
 * of 32 as the weights are, each pair of blocks gives an exact
 * int32 dot product, and the f32 sums keep the order of an 8-lane AVX2
 * vector: lane l of a block is the sum of its elements 4l..4l+3, each lane
 * accumulates lane·(d_w·d_x) with one fused multiply-add per block, and
 * the 8 lanes are added at the end as tp_q8_hsum8 does.  The scalar path
 * does exactly that in C, so every path gives the same bits, whatever the
 * thread count, the tile a row falls in, or whether it runs as a GEMV or
 * a GEMM (tokens 5..31: 4 × 3 tiles, gemm_q8_avx2.c, gemm_q8_avx512.c). */
/* The fewest tokens that run as the f32 product (measured: bench/README.md,
 * "8-bit weights"). */
#define TP_Q8_DEQUANT_MIN_T 32

/* x[T, k] -> quants q[T, k] and scales d[T, k/32], per block of 32:
 * d = amax/127 (kept in f32), q = round-to-even(x/d).  The scales are apart
 * from the quants so that the kernels load 8 blocks' scales at once. */
void tp_q8_quantize_act(int8_t *q, float *d, const float *x, int64_t T, int64_t k);

/* f16 -> f32 for finite values without F16C: the bits shifted into an f32
 * sign, exponent and mantissa, rebiased by a multiply by 2^112 (exact, f16
 * subnormals included; a weight scale is never inf or NaN). */
static inline float tp_q8_scale(uint16_t h)
{
    union { uint32_t u; float f; } v = {((uint32_t)(h & 0x8000u) << 16) | ((uint32_t)(h & 0x7fffu) << 13)};
    return v.f * 0x1p112f;
}

/* The 8 lanes' sum in the order the AVX2 code adds them. */
static inline float tp_q8_hsum8(const float a[8])
{
    float s0 = a[0] + a[4], s1 = a[1] + a[5], s2 = a[2] + a[6], s3 = a[3] + a[7];
    return (s0 + s2) + (s1 + s3);
}

/* One product: W [n, nb·32] in q8_0, x [T, nb·32] quantized (xq, xd). */
typedef struct {
    float *y;
    const int8_t *xq;
    const float *xd;
    const tp_q8_block *w;
    int64_t T, n, nb;
} tp_q8_job;

void tp_q8_matmul_scalar(const tp_q8_job *j, tp_threadpool *pool);
#if TP_KERNELS_X86
void tp_q8_matmul_avx2(const tp_q8_job *j, tp_threadpool *pool);
/* AVX-512 VNNI (gemm_q8_avx512.c): the AVX2 kernel's bits; only where
 * tp_kernel_has_vnni(). */
void tp_q8_matmul_avx512(const tp_q8_job *j, tp_threadpool *pool);
#endif
/* The CPU has AVX512_VNNI, TENSORPAR_NO_VNNI does not hide it, and the
 * process runs the avx512 (or amx) path (cpu.c). */
int tp_kernel_has_vnni(void);
/* x quantized, then the path's kernel (gemm_q8.c).  k = W's row length, a
 * multiple of 32. */
tp_status tp_q8_matmul(float *y, const float *x, int64_t T, const tp_tensor *W, tp_kernel_path path,
                       tp_threadpool *pool);

/* Slot indices (t·k + j) grouped by expert: expert e's slots are
 * order[start[e] .. start[e + 1]), in slot order.  Ids outside [0, E) (the
 * EP sentinel) are left out (grouped_gemm.c, for both expert kernels). */
tp_status tp_grouped_sort_slots(const int32_t *ids, int64_t n, int64_t E, int64_t *start, int64_t *order);

/* An expert's n rows in the backward (slots[r] = t·k + j, y its unweighted
 * output rows [n, H]): each slot's weight gradient dweights[slot] = dy_t · y_r
 * (summed in double) and its output gradient dyr_r = w_slot · dy_t, for
 * both expert kernels' backward (grouped_gemm.c). */
void tp_grouped_slot_grads(const float *dy, const float *weights, const int64_t *slots, int64_t n, int64_t k,
                           int64_t H, const float *y, float *dyr, float *dweights);

/* y [n, out] = x [n, in] @ W for an expert weight W [in, out] (f32 or bf16
 * streamed once for a decode's few rows, else the packed GEMM's dx = dy·W
 * product), y overwritten; the bits do not depend on the thread count
 * (expert_xw.c, for Llama 4's and gpt_oss's experts). */
tp_status tp_expert_xw(float *y, const float *x, int64_t n, const tp_tensor *w, tp_threadpool *pool,
                       const tp_matmul_opts *opts);

#endif
