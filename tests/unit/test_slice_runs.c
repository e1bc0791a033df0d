/* tp_slice_runs (parallel/slice_runs.c): a range of a rank's flat shard as
 * runs contiguous in the shard and in the global tensor.  Hand-worked
 * cases (Replicate, Shard(0), Shard(1), packed ranges, 3-D, merging), the
 * errors, and every range of every shard of a few layouts against the
 * element-by-element map: the runs cover the range exactly, each element
 * where the shard's layout puts it, and no two runs could have merged. */
#include "check.h"

#include "tensorpar/parallel.h"

#include <string.h>

#define MAX_RUNS 256

typedef struct {
    int64_t local[MAX_RUNS], global[MAX_RUNS], count[MAX_RUNS];
    int n, fail_at;    /* fail_at: the run whose callback fails (-1: none) */
} runs;

static tp_status collect(void *ctx, int64_t local, int64_t global, int64_t count)
{
    runs *r = ctx;
    if (r->n == r->fail_at) return tp_fail(TP_ERR_IO, "run %d refused", r->n);
    if (r->n == MAX_RUNS) return tp_fail(TP_ERR_INTERNAL, "too many runs");
    r->local[r->n] = local, r->global[r->n] = global, r->count[r->n] = count;
    r->n++;
    return TP_OK;
}

static tp_param_slice slice(int dim, int n, const int64_t *start, const int64_t *len)
{
    tp_param_slice s;
    memset(&s, 0, sizeof s);
    s.dim = dim;
    s.n = n;
    for (int i = 0; i < n; i++) s.start[i] = start[i], s.len[i] = len[i];
    return s;
}

/* The runs of [first, first + n) equal want (triples). */
static void expect(int ndim, const int64_t *shape, const tp_param_slice *s, int64_t first, int64_t n,
                   const int64_t *want, int nwant)
{
    runs r = {.fail_at = -1};
    CHECK(tp_slice_runs(ndim, shape, s, first, n, collect, &r) == TP_OK);
    CHECK_MSG(r.n == nwant, "dim %d [%lld, +%lld): %d runs, want %d", s->dim, (long long)first, (long long)n, r.n,
              nwant);
    for (int i = 0; i < r.n && i < nwant; i++)
        CHECK_MSG(r.local[i] == want[3 * i] && r.global[i] == want[3 * i + 1] && r.count[i] == want[3 * i + 2],
                  "run %d: (%lld, %lld, %lld), want (%lld, %lld, %lld)", i, (long long)r.local[i],
                  (long long)r.global[i], (long long)r.count[i], (long long)want[3 * i], (long long)want[3 * i + 1],
                  (long long)want[3 * i + 2]);
}

static void test_cases(void)
{
    int64_t s35[] = {3, 5}, s64[] = {6, 4}, s28[] = {2, 8}, s234[] = {2, 3, 4};
    tp_param_slice whole = slice(-1, 0, NULL, NULL);
    expect(2, s35, &whole, 4, 7, (int64_t[]){4, 4, 7}, 1);
    /* Shard(0) rows [2, 5) of [6, 4]: one range of the tensor. */
    tp_param_slice rows = slice(0, 1, (int64_t[]){2}, (int64_t[]){3});
    expect(2, s64, &rows, 3, 6, (int64_t[]){3, 11, 6}, 1);
    /* Shard(1) columns [2, 5) of [3, 5]: one run per row, cut at the ends. */
    tp_param_slice cols = slice(1, 1, (int64_t[]){2}, (int64_t[]){3});
    expect(2, s35, &cols, 0, 9, (int64_t[]){0, 2, 3, 3, 7, 3, 6, 12, 3}, 3);
    expect(2, s35, &cols, 4, 4, (int64_t[]){4, 8, 2, 6, 12, 2}, 2);
    /* Packed ranges {[0, 2), [4, 6)} of each row of [2, 8]. */
    tp_param_slice packed = slice(1, 2, (int64_t[]){0, 4}, (int64_t[]){2, 2});
    expect(2, s28, &packed, 1, 6, (int64_t[]){1, 1, 1, 2, 4, 2, 4, 8, 2, 6, 12, 1}, 4);
    /* A slice covering its dimension, or ranges that touch: merged runs. */
    tp_param_slice all_cols = slice(1, 1, (int64_t[]){0}, (int64_t[]){5});
    expect(2, s35, &all_cols, 0, 15, (int64_t[]){0, 0, 15}, 1);
    tp_param_slice touching = slice(1, 2, (int64_t[]){0, 2}, (int64_t[]){2, 3});
    expect(2, s35, &touching, 2, 10, (int64_t[]){2, 2, 10}, 1);
    /* 3-D, the middle dimension: one run of 2 x 4 per outer index. */
    tp_param_slice mid = slice(1, 1, (int64_t[]){1}, (int64_t[]){2});
    expect(3, s234, &mid, 0, 16, (int64_t[]){0, 4, 8, 8, 16, 8}, 2);
    expect(2, s35, &cols, 5, 0, NULL, 0);
    /* Errors: past the shard's end, a bad dimension, a failing callback. */
    runs r = {.fail_at = -1};
    CHECK(tp_slice_runs(2, s35, &cols, 5, 5, collect, &r) == TP_ERR_INVALID && r.n == 0);
    tp_param_slice bad = slice(2, 1, (int64_t[]){0}, (int64_t[]){1});
    CHECK(tp_slice_runs(2, s35, &bad, 0, 1, collect, &r) == TP_ERR_INVALID);
    r = (runs){.fail_at = 1};
    CHECK(tp_slice_runs(2, s35, &cols, 0, 9, collect, &r) == TP_ERR_IO && r.n == 1);
}

/* The global index of local element e of the shard, element by element. */
static int64_t global_of(int ndim, const int64_t *shape, const tp_param_slice *s, int64_t e)
{
    if (s->dim < 0) return e;
    int64_t inner = 1, ldim = 0;
    for (int i = s->dim + 1; i < ndim; i++) inner *= shape[i];
    for (int r = 0; r < s->n; r++) ldim += s->len[r];
    int64_t in = e % inner, l = e / inner % ldim, o = e / inner / ldim, g = -1;
    for (int r = 0, at = 0; r < s->n; at += (int)s->len[r], r++)
        if (l >= at && l < at + s->len[r]) g = s->start[r] + (l - at);
    return (o * shape[s->dim] + g) * inner + in;
}

/* Every chunk of S (torch.chunk's rule) of the shard: the runs map each
 * element as global_of does, cover it once, and are maximal. */
static void check_chunks(int ndim, const int64_t *shape, const tp_param_slice *s, int S)
{
    int64_t numel = 1, ldim = 0;
    for (int r = 0; s->dim >= 0 && r < s->n; r++) ldim += s->len[r];
    for (int i = 0; i < ndim; i++) numel *= i == s->dim ? ldim : shape[i];
    int64_t c = (numel + S - 1) / S;
    for (int k = 0; k < S; k++) {
        int64_t first = k * c < numel ? k * c : numel, n = first + c < numel ? c : numel - first;
        runs r = {.fail_at = -1};
        CHECK(tp_slice_runs(ndim, shape, s, first, n, collect, &r) == TP_OK);
        int64_t next = first, bad = 0;
        for (int i = 0; i < r.n; i++) {
            bad += r.local[i] != next || r.count[i] <= 0;
            for (int64_t e = 0; e < r.count[i]; e++) bad += global_of(ndim, shape, s, r.local[i] + e) != r.global[i] + e;
            if (i) bad += r.global[i - 1] + r.count[i - 1] == r.global[i];
            next = r.local[i] + r.count[i];
        }
        CHECK_MSG(!bad && next == first + n, "dim %d, chunk %d of %d: %lld bad, covered to %lld of %lld", s->dim, k, S,
                  (long long)bad, (long long)next, (long long)(first + n));
    }
}

static void test_chunks(void)
{
    int64_t s2[] = {6, 10}, s3[] = {3, 7, 5};
    tp_param_slice layouts[] = {
        slice(-1, 0, NULL, NULL),
        slice(0, 1, (int64_t[]){3}, (int64_t[]){3}),
        slice(1, 1, (int64_t[]){5}, (int64_t[]){5}),
        slice(1, 1, (int64_t[]){3}, (int64_t[]){3}),
        slice(1, 3, (int64_t[]){1, 4, 8}, (int64_t[]){1, 2, 1}),
    };
    for (size_t i = 0; i < sizeof layouts / sizeof *layouts; i++)
        for (int S = 1; S <= 7; S++) check_chunks(2, s2, &layouts[i], S);
    tp_param_slice mid = slice(1, 2, (int64_t[]){0, 4}, (int64_t[]){2, 3});
    for (int S = 1; S <= 7; S++) check_chunks(3, s3, &mid, S);
}

int main(void)
{
    test_cases();
    test_chunks();
    return check_summary();
}
