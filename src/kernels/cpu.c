/* Which kernel path to run: decided once per process from cpuid and the
 * environment (TENSORPAR_KERNEL, TENSORPAR_BF16_DOT, TENSORPAR_BLAS,
 * TENSORPAR_AMX).
 *
 * The decision lives in a function-local static filled under pthread_once,
 * so it is computed exactly once, thread-safely, and never changes after. */
#include "kernels/kern_internal.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#if TP_KERNELS_X86
#include <sys/syscall.h>
#include <unistd.h>

/* Linux: asm/prctl.h and the xstate number of the AMX tile data. */
#define ARCH_GET_XCOMP_PERM 0x1022
#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18
#endif

typedef struct {
    int has_avx2, has_avx512, has_bf16;
    int has_amx;              /* AMX-TILE + AMX-BF16, and the kernel let us use them */
    tp_kernel_path best;      /* the CPU's best path */
    tp_kernel_path dflt;      /* after TENSORPAR_KERNEL */
    int bf16_dot, blas, amx;
} cpu_info;

static const char *const path_names[] = {"auto", "scalar", "avx2", "avx512"};

const char *tp_kernel_path_name(tp_kernel_path p)
{
    return (unsigned)p < 4 ? path_names[p] : "?";
}

tp_status tp_kernel_path_parse(const char *s, tp_kernel_path *out)
{
    for (int i = 0; i < 4; i++)
        if (strcmp(s, path_names[i]) == 0) { *out = (tp_kernel_path)i; return TP_OK; }
    return tp_fail(TP_ERR_INVALID, "unknown kernel path '%s' (scalar, avx2, avx512 or auto)", s);
}

static int env_flag(const char *name)
{
    const char *v = getenv(name);
    return v && *v && strcmp(v, "0") != 0;
}

/* ---- which paths the CPU has: the one place that knows, per architecture ---- */

#if TP_KERNELS_X86
/* AMX tile data is a large xstate component the kernel hands out only on
 * request (arch_prctl, Linux 5.16+); without the grant the first tile
 * instruction faults.  The grant is per process and permanent, so asking
 * once here, under pthread_once, covers every thread. */
static int amx_usable(int has_bf16)
{
    unsigned a = 7, b = 0, c = 0, d = 0;   /* leaf 7, subleaf 0: EDX 22 AMX-BF16, 24 AMX-TILE */
    __asm__("cpuid" : "+a"(a), "=b"(b), "+c"(c), "=d"(d));
    (void)b;
    if (!has_bf16 || !((d >> 22) & 1) || !((d >> 24) & 1)) return 0;
    unsigned long perm = 0;
    if (syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) != 0) return 0;
    if (syscall(SYS_arch_prctl, ARCH_GET_XCOMP_PERM, &perm) != 0) return 0;
    return (perm >> XFEATURE_XTILEDATA) & 1;
}

static void detect_simd(cpu_info *c)
{
    __builtin_cpu_init();
    c->has_avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    /* The AVX-512 path uses F and BW (16-bit masked loads); VL is implied on
     * every CPU that has both. */
    c->has_avx512 = c->has_avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw");
#if defined(__clang__) && __clang_major__ < 16
    /* clang 14 does not know the "avx512bf16" feature name: ask cpuid. */
    {
        unsigned a = 7, b = 0, cc = 1, d = 0;   /* leaf 7, subleaf 1: EAX bit 5 */
        __asm__("cpuid" : "+a"(a), "=b"(b), "+c"(cc), "=d"(d));
        (void)b; (void)d;
        c->has_bf16 = c->has_avx512 && ((a >> 5) & 1);
    }
#else
    c->has_bf16 = c->has_avx512 && __builtin_cpu_supports("avx512bf16");
#endif
}
#else
/* Any other architecture (arm64, ...): the portable C path only. */
static int amx_usable(int has_bf16)
{
    (void)has_bf16;
    return 0;
}

static void detect_simd(cpu_info *c)
{
    c->has_avx2 = c->has_avx512 = c->has_bf16 = 0;
}
#endif

static cpu_info g_info;   /* written once under pthread_once, read-only after */
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static void detect(void)
{
    cpu_info *c = &g_info;
    detect_simd(c);
    c->best = c->has_avx512 ? TP_KERNEL_AVX512 : c->has_avx2 ? TP_KERNEL_AVX2 : TP_KERNEL_SCALAR;
    c->dflt = c->best;
    const char *e = getenv("TENSORPAR_KERNEL");
    tp_kernel_path want = TP_KERNEL_AUTO;
    if (e && *e) {
        if (tp_kernel_path_parse(e, &want) == TP_OK) {
            if (want != TP_KERNEL_AUTO && want < c->best) c->dflt = want;
        } else {
            tp_log(TP_LOG_WARN, "TENSORPAR_KERNEL=%s is not scalar|avx2|avx512; using %s", e,
                   tp_kernel_path_name(c->best));
            tp_clear_error();
        }
    }
    c->bf16_dot = env_flag("TENSORPAR_BF16_DOT");
    c->blas = env_flag("TENSORPAR_BLAS");
    /* The AMX GEMM splits x with vcvtneps2bf16, hence has_bf16. */
    c->has_amx = amx_usable(c->has_bf16);
    /* TENSORPAR_AMX: unset = on, 0 = off, 2 = the two-pass split (experiment). */
    const char *amx = getenv("TENSORPAR_AMX");
    c->amx = !amx || !*amx ? 1 : strcmp(amx, "0") == 0 ? 0 : strcmp(amx, "2") == 0 ? 2 : 1;
}

static const cpu_info *info(void)
{
    pthread_once(&g_once, detect);
    return &g_info;
}

tp_kernel_path tp_kernel_path_default(void) { return info()->dflt; }
int tp_kernel_has_bf16_dot(void) { return info()->has_bf16; }
int tp_kernel_has_amx(void) { return info()->has_amx; }

int tp_kernel_path_supported(tp_kernel_path p)
{
    const cpu_info *c = info();
    switch (p) {
    case TP_KERNEL_AUTO: case TP_KERNEL_SCALAR: return 1;
    case TP_KERNEL_AVX2: return c->has_avx2;
    case TP_KERNEL_AVX512: return c->has_avx512;
    }
    return 0;
}

tp_kernel_path tp_kernel_resolve(tp_kernel_path p)
{
    const cpu_info *c = info();
    if (p == TP_KERNEL_AUTO) return c->dflt;
    if (p > c->best) return c->best;
    return p;
}

void tp_matmul_opts_default(tp_matmul_opts *o)
{
    const cpu_info *c = info();
    o->path = c->dflt;
    o->bf16_dot = c->bf16_dot;
    o->blas = c->blas;
    o->amx = c->amx;
}
