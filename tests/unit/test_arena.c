/* base/arena.c: alignment, mark and rewind, free of the latest allocation,
 * peak, growth only while empty, the out-of-memory message, and (under
 * AddressSanitizer) poisoning of what was rewound. */
#include "check.h"
#include "tensorpar/base.h"

#include <stdint.h>
#include <string.h>

#if defined(__SANITIZE_ADDRESS__)
#define TEST_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define TEST_ASAN 1
#endif
#endif
#ifdef TEST_ASAN
#include <sanitizer/asan_interface.h>
#endif

#define MIB ((size_t)1 << 20)

static void test_alignment(void)
{
    tp_arena a;
    tp_arena_init(&a);
    CHECK(tp_arena_reserve(&a, 1000) == TP_OK);
    CHECK(a.capacity == 2 * MIB);   /* whole 2 MiB pages */
    size_t sizes[] = {1, 3, 64, 65, 100, 4096, 7};
    unsigned char *prev = NULL;
    for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
        unsigned char *p = tp_arena_alloc(&a, sizes[i]);
        CHECK(p != NULL);
        CHECK((uintptr_t)p % TP_ARENA_ALIGN == 0);
        /* each allocation starts at the previous one's end, rounded up */
        if (prev) CHECK(p - prev == (ptrdiff_t)((sizes[i - 1] + 63) / 64 * 64));
        memset(p, 0xab, sizes[i]);
        prev = p;
    }
    CHECK(a.used == 64 + 64 + 64 + 128 + 128 + 4096 + 64);
    void *zero = tp_arena_alloc(&a, 0);   /* a distinct, valid pointer */
    CHECK(zero != NULL && zero != prev);
    tp_arena_release(&a);
    CHECK(a.base == NULL && a.capacity == 0 && a.used == 0);
}

static void test_mark_rewind(void)
{
    tp_arena a;
    tp_arena_init(&a);
    CHECK(tp_arena_reserve(&a, MIB) == TP_OK);
    float *keep = tp_arena_alloc(&a, 10 * sizeof(float));
    keep[9] = 42.0f;
    size_t mark = tp_arena_mark(&a);
    CHECK(mark == 64);
    float *b1 = tp_arena_alloc(&a, 1000);
    tp_arena_alloc(&a, 5000);
    tp_arena_rewind(&a, mark);
    CHECK(a.used == mark);
    /* the same space is handed out again, and what was kept is intact */
    float *b2 = tp_arena_alloc(&a, 1000);
    CHECK(b2 == b1);
    CHECK(keep[9] == 42.0f);
    /* a rewind above the top does nothing */
    tp_arena_rewind(&a, a.used + 640);
    CHECK(a.used == 64 + 1024);
    tp_arena_release(&a);
}

static void test_free_latest(void)
{
    tp_arena a;
    tp_arena_init(&a);
    CHECK(tp_arena_reserve(&a, MIB) == TP_OK);
    void *x = tp_arena_alloc(&a, 100), *y = tp_arena_alloc(&a, 100);
    tp_arena_free(&a, x);          /* not the latest: stays */
    CHECK(a.used == 256);
    tp_arena_free(&a, y);          /* the latest: given back */
    CHECK(a.used == 128);
    tp_arena_free(&a, x);          /* the latest is unknown now: stays */
    CHECK(a.used == 128);
    tp_arena_free(&a, NULL);
    CHECK(a.used == 128);
    /* after a rewind below it, a stale latest pointer frees nothing */
    void *z = tp_arena_alloc(&a, 64);
    tp_arena_rewind(&a, 0);
    void *w = tp_arena_alloc(&a, 500);
    CHECK(w == x);
    tp_arena_alloc(&a, 64);
    tp_arena_free(&a, z);          /* z's offset (128) is not the latest (512) */
    CHECK(a.used == 576);
    tp_arena_release(&a);
}

static void test_peak(void)
{
    tp_arena a;
    tp_arena_init(&a);
    CHECK(tp_arena_reserve(&a, MIB) == TP_OK);
    CHECK(tp_arena_peak(&a) == 0);
    tp_arena_alloc(&a, 1000);
    tp_arena_alloc(&a, 3000);
    tp_arena_rewind(&a, 0);
    tp_arena_alloc(&a, 100);
    CHECK(tp_arena_peak(&a) == 1024 + 3008);
    CHECK(a.used == 128);
    /* a request that does not fit raises the peak to what it would have needed */
    CHECK(tp_arena_alloc(&a, 3 * MIB) == NULL);
    CHECK(tp_arena_peak(&a) == 128 + 3 * MIB);
    CHECK(a.used == 128);
    tp_arena_release(&a);
}

static void test_growth(void)
{
    tp_arena a;
    tp_arena_init(&a);
    CHECK(tp_arena_reserve(&a, MIB) == TP_OK);
    CHECK(tp_arena_reserve(&a, 2 * MIB) == TP_OK);   /* already that large */
    CHECK(a.capacity == 2 * MIB);
    int *live = tp_arena_alloc(&a, 64);
    live[0] = 7;
    unsigned char *base = a.base;
    /* growing under a live buffer would move it: refused, nothing changes */
    CHECK(tp_arena_reserve(&a, 5 * MIB) == TP_ERR_INTERNAL);
    CHECK(strstr(tp_error(), "only between uses") != NULL);
    CHECK(a.base == base && a.capacity == 2 * MIB && live[0] == 7);
    /* empty again: it grows to the peak of the failed use */
    CHECK(tp_arena_alloc(&a, 4 * MIB) == NULL);
    tp_arena_rewind(&a, 0);
    CHECK(tp_arena_reserve(&a, tp_arena_peak(&a)) == TP_OK);
    CHECK(a.capacity == 6 * MIB);
    CHECK(tp_arena_alloc(&a, 64) != NULL && tp_arena_alloc(&a, 4 * MIB) != NULL);
    tp_arena_release(&a);
}

static void test_out_of_memory(void)
{
    tp_arena a;
    tp_arena_init(&a);
    /* an empty arena has nothing to give */
    CHECK(tp_arena_alloc(&a, 16) == NULL);
    CHECK(strstr(tp_error(), "16 bytes requested, 0 of its 0 free") != NULL);
    CHECK(tp_arena_reserve(&a, MIB) == TP_OK);
    CHECK(tp_arena_alloc(&a, MIB) != NULL);
    CHECK(tp_arena_alloc(&a, MIB + 1) == NULL);
    CHECK(strstr(tp_error(), "1048577 bytes requested, 1048576 of its 2097152 free") != NULL);
    /* sizes beyond the address space fail without wrapping around */
    CHECK(tp_arena_alloc(&a, SIZE_MAX - 3) == NULL);
    CHECK(tp_arena_peak(&a) == SIZE_MAX);
    tp_arena_rewind(&a, 0);
    CHECK(tp_arena_reserve(&a, SIZE_MAX - 3) == TP_ERR_NOMEM);
    CHECK(strstr(tp_error(), "address space") != NULL);
    CHECK(a.capacity == 2 * MIB);
    tp_arena_release(&a);
}

static void test_poison(void)
{
#ifdef TEST_ASAN
    tp_arena a;
    tp_arena_init(&a);
    CHECK(tp_arena_reserve(&a, MIB) == TP_OK);
    CHECK(__asan_address_is_poisoned(a.base));   /* nothing handed out yet */
    char *p = tp_arena_alloc(&a, 100);
    CHECK(!__asan_address_is_poisoned(p) && !__asan_address_is_poisoned(p + 99));
    CHECK(__asan_address_is_poisoned(p + 100));   /* the padding up to 128 */
    tp_arena_rewind(&a, 0);
    CHECK(__asan_address_is_poisoned(p));
    tp_arena_release(&a);
#endif
}

int main(void)
{
    test_alignment();
    test_mark_rewind();
    test_free_latest();
    test_peak();
    test_growth();
    test_out_of_memory();
    test_poison();
    return check_summary();
}
