/* models/act_arena.c: a model's forward takes every activation from its
 * arena, within the bound reserved at load, and leaves it empty; a longer
 * forward grows it first; an allocation beyond the bound spills and makes
 * the next forward reserve more.  On a tiny model made in a temporary
 * directory, one rank. */
#include "check.h"
#include "tmpdir.h"
#include "models/tp_module.h"
#include "tensorpar/models.h"

#include <dirent.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Logits of all T positions of `ids` on a fresh cache. */
static tp_status prefill(tp_model *m, const int64_t *ids, int64_t T, float *logits)
{
    tp_kv_cache kv;
    tp_status s = tp_kv_cache_init(&kv, m, T + 1);
    if (s) return s;
    s = tp_model_forward(m, &kv, ids, T, logits, 1);
    tp_kv_cache_release(&kv);
    return s;
}

static void test_forwards(tp_model *m)
{
    int64_t V = m->cfg.vocab_size, T = 1200;   /* beyond the block reserved at load for 512 */
    int64_t *ids = malloc((size_t)T * sizeof *ids);
    float *a = malloc((size_t)(T * V) * sizeof(float)), *b = malloc((size_t)(T * V) * sizeof(float));
    for (int64_t t = 0; t < T; t++) ids[t] = (t * 37 + 11) % V;
    tp_act_stats st0 = tp_act_arena_stats(m);
    CHECK(st0.capacity > 0 && st0.used == 0 && st0.peak == 0);

    /* A short prompt, then one decode step: the arena is empty after each. */
    tp_kv_cache kv;
    CHECK(tp_kv_cache_init(&kv, m, 8) == TP_OK);
    CHECK(tp_model_forward(m, &kv, ids, 5, a, 1) == TP_OK);
    tp_act_stats st1 = tp_act_arena_stats(m);
    CHECK(st1.used == 0 && st1.peak > 0 && st1.capacity == st0.capacity);
    CHECK(tp_model_forward(m, &kv, ids + 5, 1, b, 0) == TP_OK);
    CHECK(tp_act_arena_stats(m).used == 0);
    tp_kv_cache_release(&kv);
    /* The decode step's logits are the prefill's of the same position. */
    CHECK(prefill(m, ids, 6, a) == TP_OK);
    float diff = 0;
    for (int64_t i = 0; i < V; i++) diff = fmaxf(diff, fabsf(a[5 * V + i] - b[i]));
    CHECK_MSG(diff < 1e-4f, "decode vs prefill: %g", diff);

    /* 1200 tokens grow the block before the forward; the logits are those
     * of the same forward run again on the grown arena. */
    CHECK(prefill(m, ids, T, a) == TP_OK);
    tp_act_stats st2 = tp_act_arena_stats(m);
    CHECK_MSG(st2.capacity > st0.capacity && st2.used == 0 && st2.peak <= st2.capacity,
              "capacity %zu -> %zu, used %zu, peak %zu", st0.capacity, st2.capacity, st2.used, st2.peak);
    CHECK(prefill(m, ids, T, b) == TP_OK);
    CHECK(memcmp(a, b, (size_t)(T * V) * sizeof(float)) == 0);
    CHECK(tp_act_arena_stats(m).capacity == st2.capacity);
    /* The bound held: nothing was taken outside the arena. */
    CHECK(tp_act_arena_stats(m).spilled == 0);
    free(ids); free(a); free(b);
}

static void test_spill(tp_model *m)
{
    size_t cap = tp_act_arena_stats(m).capacity;
    int64_t big = (int64_t)(cap / sizeof(float)) + 1000;
    CHECK(tp_act_begin(m, 1, 1) == TP_OK);
    float *small = tp_act_alloc(m, 16);
    float *p = tp_act_alloc(m, big);   /* beyond the block: from tp_alloc */
    CHECK(small != NULL && p != NULL);
    if (p) { p[0] = 1.0f; p[big - 1] = 2.0f; }
    CHECK(tp_act_arena_stats(m).spilled == (size_t)big * sizeof(float));
    tp_act_free(m, p);
    tp_act_end(m);
    CHECK(tp_act_arena_stats(m).used == 0);
    /* the next forward reserves what this one needed */
    CHECK(tp_act_begin(m, 1, 1) == TP_OK);
    CHECK(tp_act_arena_stats(m).capacity >= cap + (size_t)big * sizeof(float));
    float *q = tp_act_alloc(m, big);
    CHECK(q != NULL);
    CHECK(tp_act_arena_stats(m).spilled == (size_t)big * sizeof(float));   /* no new spill */
    tp_act_end(m);
}

int main(void)
{
    char dir[] = "/tmp/tp_act_arena_XXXXXX";
    if (!mkdtemp(dir)) { perror("mkdtemp"); return 1; }
    tp_model_config cfg;
    tp_make_options mo = {.dtype = TP_F32, .seed = 3, .std = 0.02, .qk_std = 0.02, .shards = 1};
    tp_model *m = NULL;
    tp_model_options lo = {.weight_dtype = TP_DTYPE_COUNT, .threads = 1};
    int ok = tp_preset_config(&cfg, TP_ARCH_LLAMA, "tiny") == TP_OK && tp_make_model(&cfg, &mo, dir) == TP_OK &&
             tp_model_load(&m, dir, &lo) == TP_OK;
    CHECK_MSG(ok, "%s", tp_error());
    if (ok) {
        test_forwards(m);
        test_spill(m);
    }
    tp_model_free(m);
    remove_tree(dir);
    return check_summary();
}
