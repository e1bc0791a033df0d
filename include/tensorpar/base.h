/* tensorpar/base.h — the ground every other subsystem stands on.
 *
 * Offers:
 *   - status codes and the per-thread error message (tp_error()),
 *   - logging to stderr,
 *   - dtypes, bf16/f16 conversion (round to nearest even),
 *   - tensors of up to 4 dimensions over an owned or borrowed buffer,
 *   - large aligned allocations that ask the kernel for 2 MiB pages,
 *   - a thread pool.
 * The TENSORPAR_* settings table is base/ too, with its own header
 * (tensorpar/settings.h).
 *
 * Convention: every fallible function returns tp_status.  On failure it has
 * written a one-line human message to the calling thread's error buffer, which
 * tp_error() returns.  The library never calls exit() or abort().
 */
#ifndef TENSORPAR_BASE_H
#define TENSORPAR_BASE_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- status and errors ------------------------------------------------ */

typedef enum {
    TP_OK = 0,
    TP_ERR_INVALID,     /* bad argument or bad user input                    */
    TP_ERR_IO,          /* open/read/write/mmap failed                       */
    TP_ERR_FORMAT,      /* a file's content is malformed                     */
    TP_ERR_NOMEM,       /* allocation failed                                 */
    TP_ERR_UNSUPPORTED, /* valid, but not something tensorpar does           */
    TP_ERR_COMM,        /* a peer rank failed or a collective went wrong     */
    TP_ERR_TIMEOUT,     /* a peer did not answer in time                     */
    TP_ERR_INTERNAL     /* a bug in tensorpar                                */
} tp_status;

/* The last error message set on this thread ("" if none). */
const char *tp_error(void);
/* Sets the thread's message (printf-style) and returns `code`, so that
 * `return tp_fail(TP_ERR_IO, "%s: %s", path, strerror(errno));` reads well. */
tp_status tp_fail(tp_status code, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* Prepends context to the current message: "<context>: <old message>". */
tp_status tp_fail_context(tp_status code, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
void tp_clear_error(void);
const char *tp_status_name(tp_status s);

/* ---- options ---------------------------------------------------------- */

/* An on/off option whose zero value is "the documented default", so that a
 * zero-initialised options struct asks for every default. */
typedef enum { TP_DEFAULT = 0, TP_ON = 1, TP_OFF = -1 } tp_switch;

/* 1 for TP_ON, 0 for TP_OFF, `dflt` for TP_DEFAULT. */
static inline int tp_switch_on(tp_switch s, int dflt) { return s == TP_DEFAULT ? dflt : s == TP_ON; }

/* ---- logging ---------------------------------------------------------- */

typedef enum { TP_LOG_DEBUG, TP_LOG_INFO, TP_LOG_WARN, TP_LOG_ERROR } tp_log_level;

/* Writes "[rank r] tensorpar: level: message\n" to stderr.  The threshold
 * comes from TENSORPAR_LOG (debug|info|warn|error, default info), read by
 * log.c itself: logging is a property of the process, used before any
 * options struct exists and by code that has none; the rank
 * prefix is there when the process is one of several ranks (§5.3). */
void tp_log(tp_log_level level, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* "[rank r] " when this process is rank r of a job of more than one rank
 * (RANK and WORLD_SIZE, or mpirun's OMPI_COMM_WORLD_RANK/SIZE), else "":
 * the prefix of every rank-specific message. */
void tp_rank_prefix(char *buf, size_t cap);

/* ---- dtypes ----------------------------------------------------------- */

typedef enum {
    TP_F32 = 0, TP_BF16, TP_F16, TP_F64,
    TP_I64, TP_I32, TP_I16, TP_I8, TP_U8, TP_BOOL,
    TP_Q8_0,   /* weights only: blocks of 32 int8 with one f16 scale (below) */
    TP_Q4_0,   /* weights only: blocks of 32 4-bit values with one f16 scale (below) */
    TP_DTYPE_COUNT
} tp_dtype;

/* TP_Q8_0 stores each row of a matrix as its K/32 blocks, one after the
 * other, as llama.cpp's Q8_0 does: d = amax/127 of the block's 32 values,
 * held as f16, and q[i] = round(x[i]/d) in [-127, 127], so that x ≈ d·q.
 * A row's length must be a multiple of TP_Q8_BLOCK (kernels/quant_q8.c). */
#define TP_Q8_BLOCK 32
typedef struct {
    uint16_t d;                 /* f16 scale */
    int8_t q[TP_Q8_BLOCK];
} tp_q8_block;                  /* 34 bytes, 2-byte aligned */
#ifndef __cplusplus
_Static_assert(sizeof(tp_q8_block) == 34, "tp_q8_block is llama.cpp's block_q8_0");
#endif

/* TP_Q4_0 is llama.cpp's Q4_0: per block of 32 values an f16 scale d and 16
 * bytes, byte j holding value j in its low nibble and value j + 16 in its
 * high one; value = (nibble - 8)·d.  d = -m/8, m the block's value of
 * largest magnitude, so that m itself is exactly -8·d (kernels/quant_q4.c). */
#define TP_Q4_BLOCK 32
typedef struct {
    uint16_t d;                     /* f16 scale */
    uint8_t qs[TP_Q4_BLOCK / 2];
} tp_q4_block;                      /* 18 bytes, 2-byte aligned */
#ifndef __cplusplus
_Static_assert(sizeof(tp_q4_block) == 18, "tp_q4_block is llama.cpp's block_q4_0");
#endif

/* Bytes per element; 0 for TP_Q8_0 and TP_Q4_0, whose size is per block: use
 * tp_dtype_row_bytes for a row of any dtype. */
size_t tp_dtype_size(tp_dtype t);
/* The bytes of n consecutive elements of one row: n·size, or for TP_Q8_0
 * (n/32)·34 and for TP_Q4_0 (n/32)·18 (n a multiple of 32). */
size_t tp_dtype_row_bytes(tp_dtype t, int64_t n);
/* Lower-case name used in CLI options and messages: "f32", "bf16", ... */
const char *tp_dtype_name(tp_dtype t);
/* Parses "f32"/"float32", "bf16"/"bfloat16", "f16"/"float16", "q8_0", "q4_0". */
tp_status tp_dtype_parse(const char *s, tp_dtype *out);
int tp_dtype_is_float(tp_dtype t);

uint16_t tp_bf16_from_f32(float f);  /* round to nearest even, NaN kept */
float tp_f32_from_bf16(uint16_t h);
uint16_t tp_f16_from_f32(float f);   /* round to nearest even, NaN kept */
float tp_f32_from_f16(uint16_t h);

/* Converts n elements of `src` (type st) into `dst` (type dt).  Floating
 * targets accept every source dtype; integer targets accept integer sources.
 * Returns TP_ERR_UNSUPPORTED for a float source into an integer target. */
tp_status tp_convert(void *dst, tp_dtype dt, const void *src, tp_dtype st, size_t n);

/* ---- memory ----------------------------------------------------------- */

/* Allocates `bytes` aligned to 64 bytes; allocations of 2 MiB or more are
 * aligned to 2 MiB and advised MADV_HUGEPAGE, since weights are streamed at
 * memory bandwidth and 4 KiB pages cost a third of it.  Free with tp_free. */
void *tp_alloc(size_t bytes);
void tp_free(void *p);
/* Bytes of [p, p + n) backed by transparent huge pages now (AnonHugePages
 * of /proc/self/smaps); 0 where the kernel does not say. */
size_t tp_huge_page_bytes(const void *p, size_t n);

/* ---- arena -------------------------------------------------------------
 * A bump allocator over one block from tp_alloc (so 2 MiB pages from 2 MiB
 * on): allocations are 64-byte aligned offsets into the block, freed all at
 * once by rewinding to a mark.  The block is sized before use and grows only
 * while nothing is allocated from it, so a live buffer never moves.  Under
 * AddressSanitizer the free part of the block is poisoned: a read of a
 * rewound buffer is reported as a use after free. */
typedef struct {
    unsigned char *base;
    size_t capacity;   /* bytes in the block                                */
    size_t used;       /* bytes handed out (the next allocation's offset)   */
    size_t peak;       /* the most `used` has been, or would have been had a
                          failed allocation fitted                          */
    size_t last;       /* offset of the latest allocation; SIZE_MAX: none   */
} tp_arena;

#define TP_ARENA_ALIGN 64

/* A zeroed struct is an empty arena; so is one after tp_arena_release. */
void tp_arena_init(tp_arena *a);
/* Makes the block at least `bytes` long.  Growing needs an empty arena
 * (used == 0): TP_ERR_INTERNAL otherwise, and the block stays as it was. */
tp_status tp_arena_reserve(tp_arena *a, size_t bytes);
/* `bytes` from the block, or NULL (TP_ERR_NOMEM, the sizes in the message)
 * when they do not fit; the peak then counts them, so reserving
 * tp_arena_peak() before the next use makes them fit. */
void *tp_arena_alloc(tp_arena *a, size_t bytes);
/* Gives p back when it is the latest allocation; otherwise it stays until a
 * rewind below it.  p may be NULL. */
void tp_arena_free(tp_arena *a, void *p);
static inline size_t tp_arena_mark(const tp_arena *a) { return a->used; }
/* Frees everything allocated since `mark` was taken. */
void tp_arena_rewind(tp_arena *a, size_t mark);
static inline size_t tp_arena_peak(const tp_arena *a) { return a->peak; }
/* 1 if p points into the block. */
int tp_arena_owns(const tp_arena *a, const void *p);
void tp_arena_release(tp_arena *a);

/* ---- tensors ---------------------------------------------------------- */

#define TP_MAX_DIMS 4

typedef struct {
    tp_dtype dtype;
    int ndim;
    int64_t shape[TP_MAX_DIMS];
    void *data;
    int owns_data;   /* data came from tp_alloc and is freed with the tensor */
} tp_tensor;

int64_t tp_tensor_numel(const tp_tensor *t);
size_t tp_tensor_nbytes(const tp_tensor *t);
/* Allocates an owned, zero-filled tensor. */
tp_status tp_tensor_init(tp_tensor *t, tp_dtype dtype, int ndim, const int64_t *shape);
void tp_tensor_release(tp_tensor *t);
/* Writes "[a, b, c]" into buf. */
const char *tp_shape_str(int ndim, const int64_t *shape, char *buf, size_t cap);

/* ---- spinning ---------------------------------------------------------- */

/* The pause hint for spin-wait loops (thread pool, shared-memory waits):
 * eases the sibling hyperthread and the memory bus while polling. */
static inline void tp_cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

/* ---- thread pool ------------------------------------------------------ */

typedef struct tp_threadpool tp_threadpool;
/* fn(ctx, thread_index, thread_count); every index runs exactly once. */
typedef void (*tp_parallel_fn)(void *ctx, int ti, int nt);

tp_status tp_threadpool_create(tp_threadpool **out, int nthreads);
void tp_threadpool_destroy(tp_threadpool *pool);
int tp_threadpool_size(const tp_threadpool *pool);
/* Runs fn(ctx, ti, nt) once for every ti in [0, nt) and waits for all.
 * The caller runs ti = 0 and, when it is done, every index whose worker
 * has not started yet (a worker descheduled by the OS or the host then
 * delays nothing): fn must not wait for another index or depend on which
 * OS thread runs it.  pool may be NULL: fn then runs once on the caller
 * with nt = 1. */
void tp_parallel_run(tp_threadpool *pool, tp_parallel_fn fn, void *ctx);
/* As tp_parallel_run, but index ti runs on the pool's thread ti (for what
 * acts on the calling thread itself: pinning). */
void tp_parallel_run_each(tp_threadpool *pool, tp_parallel_fn fn, void *ctx);
/* fn(ctx, begin, end, ti) on consecutive ranges of `chunk` items (the last
 * one shorter) covering [0, n), each exactly once, over the pool: thread ti
 * takes the chunks of its own tp_split_range share in order, then helps the
 * others with the chunks they have not reached, so a thread slowed by the
 * OS or the host hands its work over.  Which thread runs a chunk varies
 * from call to call: fn's result for a range must not depend on ti (use ti
 * only to pick scratch).  One chunk, or one thread: fn(ctx, 0, n, 0) on
 * the caller. */
typedef void (*tp_range_fn)(void *ctx, int64_t begin, int64_t end, int ti);
void tp_parallel_for(tp_threadpool *pool, int64_t n, int64_t chunk, tp_range_fn fn, void *ctx);
/* How long an idle thread of the pool (and the caller waiting for them)
 * spins before it sleeps on a condition variable.  The default is 100 µs
 * when the pool's threads fit on the CPUs the process may use, else 0.
 * Spinning makes a parallel region cost ~1 µs instead of a futex round
 * trip, but burns the core meanwhile: set 0 when several processes (ranks)
 * together run more threads than there are cores. */
void tp_threadpool_set_spin(tp_threadpool *pool, double seconds);
/* The [begin, end) share of n items that thread ti of nt takes. */
void tp_split_range(int64_t n, int ti, int nt, int64_t *begin, int64_t *end);

/* The number of CPUs the calling thread may run on (its affinity mask,
 * which processes it starts inherit), >= 1. */
int tp_cpu_count(void);
/* Pins thread i of the pool (the caller is thread 0) to the (first + i)-th
 * allowed CPU, modulo their count: rank r of T threads passes r·T and gets
 * cores [r·T, (r+1)·T) mod ncores.  The caller's thread stays pinned after
 * the call. */
tp_status tp_threadpool_pin(tp_threadpool *pool, int first);
/* Pins the calling thread to the index-th allowed CPU (modulo their count). */
tp_status tp_pin_thread(int index);
/* A buffer of at least `bytes` that the pool keeps for its caller until the
 * next call or tp_threadpool_destroy: the kernels' packing space, faulted in
 * once instead of per call.  Only the thread that runs the pool's regions
 * may use it.  NULL for a NULL pool or when out of memory. */
void *tp_threadpool_scratch(tp_threadpool *pool, size_t bytes);

/* ---- random numbers --------------------------------------------------- */

/* xoshiro256** seeded through splitmix64: small, fast, and the same stream
 * on every platform, so a seed names one model and one sample exactly. */
typedef struct { uint64_t s[4]; } tp_rng;

void tp_rng_seed(tp_rng *r, uint64_t seed);
uint64_t tp_rng_next(tp_rng *r);
double tp_rng_uniform(tp_rng *r);           /* [0, 1) */
double tp_rng_normal(tp_rng *r);            /* N(0, 1) */
/* Counter-based: a 64-bit value that depends only on (key, counter), for
 * numbers that must not depend on the order in which ranks draw them
 * (dropout masks by an element's global index).  splitmix64's finaliser
 * of key + (counter + 1) * 0x9e3779b97f4a7c15; chain it to key several
 * counters: tp_rng_hash(tp_rng_hash(seed, a), b). */
uint64_t tp_rng_hash(uint64_t key, uint64_t counter);

/* ---- progress bar ----------------------------------------------------- */

/* A bar on stderr, drawn only when stderr is a terminal. */
typedef struct {
    const char *label;
    uint64_t total, done;
    int enabled;
    double last_draw;
} tp_progress;

void tp_progress_begin(tp_progress *p, const char *label, uint64_t total);
void tp_progress_advance(tp_progress *p, uint64_t n);
void tp_progress_end(tp_progress *p);

/* Monotonic seconds. */
double tp_now(void);

/* ---- gnuplot (base/gnuplot.c): the charts' one way to draw --------------- */

/* 1 when a gnuplot is on PATH. */
int tp_gnuplot_available(void);
/* Writes s as a gnuplot single-quoted string (a quote inside doubled). */
void tp_gnuplot_quote(FILE *f, const char *s);
/* Runs `gnuplot script`, its stdout and stderr into output_path (NULL:
 * discarded); 0 when it exits 0, -1 otherwise. */
int tp_gnuplot_run(const char *script, const char *output_path);

#ifdef __cplusplus
}
#endif
#endif
