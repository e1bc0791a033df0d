/* How much of a buffer the kernel backs with transparent huge pages, from
 * /proc/self/smaps: the benchmarks say so next to a bandwidth figure, since
 * 4 KiB pages cost a read stream a large share of its rate (TLB misses and
 * the hardware prefetchers stopping at every page). */
#include "tensorpar/base.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

/* The part of mapping [lo, hi) that overlaps [b, e), in bytes. */
static uint64_t overlap(uint64_t lo, uint64_t hi, uint64_t b, uint64_t e)
{
    uint64_t s = lo > b ? lo : b, t = hi < e ? hi : e;
    return t > s ? t - s : 0;
}

size_t tp_huge_page_bytes(const void *p, size_t n)
{
    FILE *f = fopen("/proc/self/smaps", "r");
    if (!f) return 0;
    uint64_t b = (uint64_t)(uintptr_t)p, e = b + n, lo = 0, hi = 0, total = 0;
    char line[512];
    while (fgets(line, sizeof line, f)) {
        uint64_t x, y, kb;
        if (sscanf(line, "%" SCNx64 "-%" SCNx64 " ", &x, &y) == 2 && strchr(line, '-') < strchr(line, ' ')) {
            lo = x, hi = y;
            continue;
        }
        /* A mapping's huge pages may lie anywhere in it: never count more
         * than its overlap with the buffer. */
        if (sscanf(line, "AnonHugePages: %" SCNu64 " kB", &kb) == 1) {
            uint64_t o = overlap(lo, hi, b, e);
            total += kb * 1024 < o ? kb * 1024 : o;
        }
    }
    fclose(f);
    return (size_t)total;
}
