/* For the kernel tests: say which paths a run leaves out, and why, so that a
 * pass on a CPU without AVX-512 (or under TENSORPAR_ISA=scalar) reads as
 * what it is. */
#ifndef TP_TEST_SKIP_PATHS_H
#define TP_TEST_SKIP_PATHS_H

#include "tensorpar/kernels.h"

#include <stdio.h>

static inline void print_skipped_paths(const char *test)
{
    static const struct { tp_kernel_path path; tp_isa isa; } paths[] = {
        {TP_KERNEL_AVX2, TP_ISA_AVX2}, {TP_KERNEL_AVX512, TP_ISA_AVX512}};
    for (size_t i = 0; i < sizeof paths / sizeof *paths; i++)
        if (!tp_kernel_path_supported(paths[i].path))
            printf("%s: skipped the %s path: %s\n", test, tp_kernel_path_name(paths[i].path),
                   tp_isa_cpu_has(paths[i].isa) ? "TENSORPAR_ISA chose a lower one" : "this CPU lacks it");
}

#endif
