/* The instruction-set paths by name, and the choice TENSORPAR_ISA makes
 * among the ones this CPU has.  Pure functions of their arguments (and of
 * the environment, for tp_isa_choose_env), so the tests can feed them any
 * CPU; cpu.c asks cpuid what `has` holds and calls them once per process. */
#include "kernels/kern_internal.h"
#include "tensorpar/settings.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const isa_names[TP_ISA_COUNT] = {"scalar", "avx2", "avx512", "amx"};

const char *tp_isa_name(tp_isa isa)
{
    return (unsigned)isa < TP_ISA_COUNT ? isa_names[isa] : "?";
}

tp_status tp_isa_parse(const char *s, tp_isa *out)
{
    for (int i = 0; i < TP_ISA_COUNT; i++)
        if (s && strcmp(s, isa_names[i]) == 0) { *out = (tp_isa)i; return TP_OK; }
    return tp_fail(TP_ERR_INVALID, "unknown instruction-set path '%s' (valid: scalar, avx2, avx512, amx)",
                   s ? s : "(null)");
}

void tp_isa_list(char *buf, size_t cap, const int has[TP_ISA_COUNT])
{
    size_t used = 0;
    buf[0] = '\0';
    for (int i = 0; i < TP_ISA_COUNT; i++) {
        if (!has[i]) continue;
        int n = snprintf(buf + used, cap - used, "%s%s", used ? ", " : "", isa_names[i]);
        if (n < 0 || (size_t)n >= cap - used) return;
        used += (size_t)n;
    }
}

tp_status tp_isa_choose(const char *request, const int has[TP_ISA_COUNT], tp_isa *out)
{
    if (!request || !*request) {
        /* The paths build on each other, so the best one the CPU has is
         * the last one it has (scalar always). */
        *out = TP_ISA_SCALAR;
        for (int i = 0; i < TP_ISA_COUNT; i++)
            if (has[i]) *out = (tp_isa)i;
        return TP_OK;
    }
    char list[64];
    tp_isa_list(list, sizeof list, has);
    tp_isa want = TP_ISA_SCALAR;
    if (tp_isa_parse(request, &want) != TP_OK)
        return tp_fail(TP_ERR_INVALID, "TENSORPAR_ISA=%s: unknown path (valid: scalar, avx2, avx512, amx; "
                       "this CPU supports: %s)", request, list);
    if (!has[want])
        return tp_fail(TP_ERR_INVALID, "TENSORPAR_ISA=%s: this CPU does not support it (valid: scalar, avx2, "
                       "avx512, amx; this CPU supports: %s)", request, list);
    *out = want;
    return TP_OK;
}

/* TENSORPAR_ISA is read here and not through an options struct: the path
 * is a property of the process, not of one model or call.  It is decided
 * once, before any kernel runs, every SIMD function is reached through a
 * dispatch on it, and the AMX tile permission is granted per process; two
 * models of one process on different paths would share the pool's packing
 * scratch and the reduce copies.  tp_matmul_opts.path may still ask for a
 * lower path per call. */
tp_status tp_isa_choose_env(const int has[TP_ISA_COUNT], tp_isa *out)
{
    /* The knobs TENSORPAR_ISA replaced: a user who still sets one would
     * otherwise get a path they did not ask for without a word. */
    tp_status st;
    if ((st = tp_setting_check(TP_SET_KERNEL)) || (st = tp_setting_check(TP_SET_AMX))) return st;
    return tp_isa_choose(tp_setting_string(TP_SET_ISA), has, out);
}
