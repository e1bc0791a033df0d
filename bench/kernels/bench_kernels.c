/* Stand-alone driver for tp_kernel_bench (the lead may call it from
 * `tensorpar bench` instead).  Build against the library:
 *   cc -O2 -Iinclude bench/kernels/bench_kernels.c build-kern/libtensorpar.a \
 *      $(pkg-config --libs openblas libcjson libpcre2-8 libutf8proc) -lpthread -lm -lrt -o build-kern/bench_kernels
 * Usage: bench_kernels [threads] [quick] */
#include "tensorpar/kernels.h"

#include <stdlib.h>

int main(int argc, char **argv)
{
    int nt = argc > 1 ? atoi(argv[1]) : 2;
    tp_threadpool *pool = NULL;
    if (tp_threadpool_create(&pool, nt) != TP_OK) { fprintf(stderr, "%s\n", tp_error()); return 1; }
    tp_status st = tp_kernel_bench(stdout, pool, argc > 2);
    if (st) fprintf(stderr, "bench: %s\n", tp_error());
    tp_threadpool_destroy(pool);
    return st ? 1 : 0;
}
