/* Which kernel path to run: decided once per process from cpuid and
 * TENSORPAR_ISA (see isa.c for why the path is the process's).  The
 * numerics and library choices (bf16_dot, blas) are the caller's, through
 * tp_kernel_options (kernel_options.c).
 *
 * The decision lives in a static filled under pthread_once, so it is
 * computed exactly once, thread-safely, and never changes after. */
#include "kernels/kern_internal.h"
#include "tensorpar/settings.h"

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
    int has[TP_ISA_COUNT];    /* what the CPU (and, for AMX, the OS) can run */
    int has_bf16;             /* AVX512_BF16 (vdpbf16ps) */
    int has_vnni;             /* AVX512_VNNI (vpdpbusd), for the q8_0/q4_0 kernels; 0 under TENSORPAR_NO_VNNI */
    tp_isa isa;               /* the process's choice; scalar when err[0] */
    char err[512];            /* why TENSORPAR_ISA was refused, or "" */
} cpu_info;

static const char *const path_names[] = {"auto", "scalar", "avx2", "avx512"};

const char *tp_kernel_path_name(tp_kernel_path p)
{
    return (unsigned)p < 4 ? path_names[p] : "?";
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

static int cpu_has_bf16(int has_avx512)
{
#if defined(__clang__) && __clang_major__ < 16
    /* clang 14 does not know the "avx512bf16" feature name: ask cpuid. */
    unsigned a = 7, b = 0, c = 1, d = 0;   /* leaf 7, subleaf 1: EAX bit 5 */
    __asm__("cpuid" : "+a"(a), "=b"(b), "+c"(c), "=d"(d));
    (void)b; (void)d;
    return has_avx512 && ((a >> 5) & 1);
#else
    return has_avx512 && __builtin_cpu_supports("avx512bf16");
#endif
}

/* cpuid directly, as for bf16: compilers spell the feature differently. */
static int cpu_has_vnni(int has_avx512)
{
    unsigned a = 7, b = 0, c = 0, d = 0;   /* leaf 7, subleaf 0: ECX bit 11 */
    __asm__("cpuid" : "+a"(a), "=b"(b), "+c"(c), "=d"(d));
    (void)a; (void)b; (void)d;
    return has_avx512 && ((c >> 11) & 1);
}

static void detect_simd(cpu_info *c)
{
    __builtin_cpu_init();
    c->has[TP_ISA_AVX2] = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    /* The AVX-512 path uses F and BW (16-bit masked loads); VL is implied on
     * every CPU that has both. */
    c->has[TP_ISA_AVX512] = c->has[TP_ISA_AVX2] && __builtin_cpu_supports("avx512f") &&
                            __builtin_cpu_supports("avx512bw");
    c->has_bf16 = cpu_has_bf16(c->has[TP_ISA_AVX512]);
    c->has_vnni = cpu_has_vnni(c->has[TP_ISA_AVX512]);
    /* The AMX GEMM splits x with vcvtneps2bf16, hence has_bf16. */
    c->has[TP_ISA_AMX] = amx_usable(c->has_bf16);
}
#else
/* Any other architecture (arm64, ...): the portable C path only. */
static void detect_simd(cpu_info *c)
{
    c->has[TP_ISA_AVX2] = c->has[TP_ISA_AVX512] = c->has[TP_ISA_AMX] = 0;
    c->has_bf16 = c->has_vnni = 0;
}
#endif

static cpu_info g_info;   /* written once under pthread_once, read-only after */
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static void detect(void)
{
    cpu_info *c = &g_info;
    c->has[TP_ISA_SCALAR] = 1;
    detect_simd(c);
    /* TENSORPAR_NO_VNNI: the AVX-512 CPUs without VNNI (Skylake-X) run the
     * AVX2 q8_0/q4_0 kernels; this makes any CPU take that branch, so it
     * is tested where no such CPU is at hand.  Read here, with the ISA,
     * because it is as much the process's as the path. */
    c->has_vnni = c->has_vnni && !tp_setting_bool(TP_SET_NO_VNNI);
    if (tp_setting_check(TP_SET_NO_VNNI) || tp_isa_choose_env(c->has, &c->isa) != TP_OK) {
        /* Refused: run nothing but the plain loops until the caller sees
         * the error (tp_isa_check), which every status-returning entry
         * point reports. */
        snprintf(c->err, sizeof c->err, "%s", tp_error());
        tp_clear_error();
        c->isa = TP_ISA_SCALAR;
    }
}

static const cpu_info *info(void)
{
    pthread_once(&g_once, detect);
    return &g_info;
}

int tp_isa_cpu_has(tp_isa isa) { return (unsigned)isa < TP_ISA_COUNT && info()->has[isa]; }
tp_isa tp_isa_selected(void) { return info()->isa; }

tp_status tp_isa_check(void)
{
    const cpu_info *c = info();
    return c->err[0] ? tp_fail(TP_ERR_INVALID, "%s", c->err) : TP_OK;
}

tp_kernel_path tp_kernel_path_default(void)
{
    tp_isa i = info()->isa;
    return i == TP_ISA_SCALAR ? TP_KERNEL_SCALAR : i == TP_ISA_AVX2 ? TP_KERNEL_AVX2 : TP_KERNEL_AVX512;
}

int tp_kernel_has_bf16_dot(void) { return info()->has_bf16 && info()->isa >= TP_ISA_AVX512; }
int tp_kernel_has_amx(void) { return info()->isa == TP_ISA_AMX; }
int tp_kernel_has_vnni(void) { return info()->has_vnni && info()->isa >= TP_ISA_AVX512; }

/* The paths are ordered like the ISAs, so the process may run every path
 * up to its own. */
int tp_kernel_path_supported(tp_kernel_path p)
{
    return p == TP_KERNEL_AUTO || (p >= TP_KERNEL_SCALAR && p <= tp_kernel_path_default());
}

tp_kernel_path tp_kernel_resolve(tp_kernel_path p)
{
    tp_kernel_path d = tp_kernel_path_default();
    return p == TP_KERNEL_AUTO || p > d ? d : p;
}

void tp_matmul_opts_init(tp_matmul_opts *o, const tp_kernel_options *k)
{
    o->path = tp_kernel_path_default();
    o->bf16_dot = k ? tp_switch_on(k->bf16_dot, 0) : 0;
    o->blas = k ? tp_switch_on(k->blas, 0) : 0;
    o->amx = 1;   /* where tp_kernel_has_amx(), i.e. TENSORPAR_ISA allows it */
}

void tp_matmul_opts_default(tp_matmul_opts *o)
{
    tp_matmul_opts_init(o, NULL);
}
