/* The arena: one block, bump allocation, mark and rewind (llm.c's way with
 * activations: size once, carve, reuse).  Buffers of a pass are carved in
 * the order they are needed and dropped together, so the pages a pass
 * touched stay faulted in for the next one, and an allocation is an add. */
#include "tensorpar/base.h"

#include <stdint.h>

#define GROW_GRAIN ((size_t)2 << 20)   /* whole 2 MiB pages, as tp_alloc gives them */
#define NO_LAST SIZE_MAX

/* A rewound buffer is still mapped, so AddressSanitizer would not see a
 * use after rewind: the free part of the block is poisoned instead. */
#if defined(__SANITIZE_ADDRESS__)
#define ARENA_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define ARENA_ASAN 1
#endif
#endif

#ifdef ARENA_ASAN
#include <sanitizer/asan_interface.h>
#define POISON(p, n) ASAN_POISON_MEMORY_REGION((p), (n))
#define UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION((p), (n))
#else
#define POISON(p, n) ((void)(p), (void)(n))
#define UNPOISON(p, n) ((void)(p), (void)(n))
#endif

void tp_arena_init(tp_arena *a)
{
    *a = (tp_arena){.last = NO_LAST};
}

static size_t round_up(size_t n, size_t grain)
{
    return (n + grain - 1) / grain * grain;
}

tp_status tp_arena_reserve(tp_arena *a, size_t bytes)
{
    if (bytes <= a->capacity) return TP_OK;
    if (a->used)
        return tp_fail(TP_ERR_INTERNAL, "arena: cannot grow to %zu bytes while %zu of its %zu are in use "
                       "(it grows only between uses)", bytes, a->used, a->capacity);
    if (bytes > (size_t)PTRDIFF_MAX - GROW_GRAIN)
        return tp_fail(TP_ERR_NOMEM, "arena: %zu bytes is more than the address space holds", bytes);
    size_t cap = round_up(bytes, GROW_GRAIN);
    /* The new block first: if it cannot be had, the old one stays. */
    unsigned char *p = tp_alloc(cap);
    if (!p) return tp_fail(TP_ERR_NOMEM, "arena: out of memory reserving %zu bytes", cap);
    if (a->base) UNPOISON(a->base, a->capacity);
    tp_free(a->base);
    a->base = p;
    a->capacity = cap;
    a->last = NO_LAST;
    POISON(a->base, a->capacity);
    return TP_OK;
}

void *tp_arena_alloc(tp_arena *a, size_t bytes)
{
    size_t need = round_up(bytes ? bytes : 1, TP_ARENA_ALIGN);
    int wraps = need < bytes || need > SIZE_MAX - a->used;
    if (wraps || a->used + need > a->capacity) {
        size_t want = wraps ? SIZE_MAX : a->used + need;
        if (want > a->peak) a->peak = want;
        tp_fail(TP_ERR_NOMEM, "arena: %zu bytes requested, %zu of its %zu free", bytes, a->capacity - a->used,
                a->capacity);
        return NULL;
    }
    void *p = a->base + a->used;
    UNPOISON(p, bytes ? bytes : 1);
    a->last = a->used;
    a->used += need;
    if (a->used > a->peak) a->peak = a->used;
    return p;
}

void tp_arena_rewind(tp_arena *a, size_t mark)
{
    if (mark >= a->used) return;
    POISON(a->base + mark, a->used - mark);
    a->used = mark;
    if (a->last != NO_LAST && a->last >= mark) a->last = NO_LAST;
}

void tp_arena_free(tp_arena *a, void *p)
{
    if (p && a->last != NO_LAST && (unsigned char *)p == a->base + a->last) tp_arena_rewind(a, a->last);
}

int tp_arena_owns(const tp_arena *a, const void *p)
{
    /* Compared as integers: the block is one object only when p is in it. */
    uintptr_t b = (uintptr_t)a->base, q = (uintptr_t)p;
    return a->base && q >= b && q < b + a->capacity;
}

void tp_arena_release(tp_arena *a)
{
    if (a->base) UNPOISON(a->base, a->capacity);
    tp_free(a->base);
    tp_arena_init(a);
}
