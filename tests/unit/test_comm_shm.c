/* The shm backend through tp_launch_self: this test re-runs itself as N
 * ranks, each of which checks collectives against a serial computation.
 * A run with 4 KiB slots (TENSORPAR_SHM_SLOT_KB) pushes every collective
 * through many chunks. */
#include "check.h"
#include "tensorpar/settings.h"
#include "tensorpar/comm.h"

#include <dirent.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static float input(int rank, size_t i) { return (float)((i * 2654435761u + (size_t)rank * 40503u) % 1000) / 3.0f - 150.0f; }

/* all_reduce and reduce_scatterv against the sum in rank order. */
static void rank_reductions(tp_group *g, size_t count)
{
    int n = tp_group_size(g), me = tp_group_rank(g);
    float *x = malloc(count * sizeof(float) + 4), *want = malloc(count * sizeof(float) + 4);
    for (size_t i = 0; i < count; i++) {
        x[i] = input(tp_group_global_rank(g, me), i);
        float s = input(tp_group_global_rank(g, 0), i);
        for (int r = 1; r < n; r++) s += input(tp_group_global_rank(g, r), i);
        want[i] = s;
    }
    float *y = malloc(count * sizeof(float) + 4);
    CHECK(tp_comm_all_reduce(g, x, y, count, TP_F32, TP_REDUCE_SUM) == TP_OK);
    CHECK(memcmp(y, want, count * sizeof(float)) == 0);
    /* In place, which the single-copy path must handle too. */
    memcpy(y, x, count * sizeof(float));
    CHECK(tp_comm_all_reduce(g, y, y, count, TP_F32, TP_REDUCE_SUM) == TP_OK);
    CHECK(memcmp(y, want, count * sizeof(float)) == 0);
    size_t *counts = calloc((size_t)n, sizeof(size_t)), off = 0;
    counts[n - 1] = count;                   /* everything to the last rank */
    CHECK(tp_comm_reduce_scatterv(g, x, y, counts, TP_F32, TP_REDUCE_SUM) == TP_OK);
    if (me == n - 1) CHECK(memcmp(y, want, count * sizeof(float)) == 0);
    (void)off;
    free(x); free(y); free(want); free(counts);
}

static void rank_gathers(tp_group *g, size_t count)
{
    int n = tp_group_size(g), me = tp_group_rank(g);
    int32_t *mine = malloc((count + 1) * sizeof(int32_t)), *all = malloc(((size_t)n * count + 1) * sizeof(int32_t));
    for (size_t i = 0; i < count; i++) mine[i] = (int32_t)(me * 1000000 + (int)i);
    CHECK(tp_comm_all_gather(g, mine, all, count, TP_I32) == TP_OK);
    int ok = 1;
    for (int r = 0; r < n; r++)
        for (size_t i = 0; i < count; i++) ok &= all[(size_t)r * count + i] == (int32_t)(r * 1000000 + (int)i);
    CHECK(ok);
    if (me == 0) for (size_t i = 0; i < count; i++) mine[i] = (int32_t)i * 3;
    CHECK(tp_comm_broadcast(g, mine, count, TP_I32, 0) == TP_OK);
    ok = 1;
    for (size_t i = 0; i < count; i++) ok &= mine[i] == (int32_t)i * 3;
    CHECK(ok);
    /* Ring exchange: larger than the 64 KiB mailbox when count is large. */
    for (size_t i = 0; i < count; i++) mine[i] = (int32_t)(me + (int)i);
    int to = (me + 1) % n, from = (me + n - 1) % n;
    CHECK(tp_comm_sendrecv(g, mine, count, to, all, count, from, TP_I32) == TP_OK);
    ok = 1;
    for (size_t i = 0; i < count; i++) ok &= all[i] == (int32_t)(from + (int)i);
    CHECK(ok);
    free(mine); free(all);
}

/* all_gatherv with the per-rank counts of the chunk rule (an lm_head's
 * vocabulary split over the ranks: ceil-sized pieces, the last smaller or
 * empty, §10.10): the pieces land in rank order, and an empty one is fine. */
static void rank_gatherv(tp_group *g, size_t total)
{
    int n = tp_group_size(g), me = tp_group_rank(g);
    size_t c = (total + (size_t)n - 1) / (size_t)n, *counts = calloc((size_t)n, sizeof(size_t)), start = 0;
    for (int r = 0; r < n; r++) {
        size_t s = (size_t)r * c < total ? (size_t)r * c : total;
        counts[r] = (s + c < total ? s + c : total) - s;
        if (r == me) start = s;
    }
    int32_t *mine = malloc((counts[me] + 1) * sizeof(int32_t)), *all = malloc((total + 1) * sizeof(int32_t));
    for (size_t i = 0; i < counts[me]; i++) mine[i] = (int32_t)(me * 1000000 + (int)(start + i));
    CHECK(tp_comm_all_gatherv(g, mine, all, counts, TP_I32) == TP_OK);
    int ok = 1;
    for (size_t j = 0; j < total; j++) ok &= all[j] == (int32_t)((int)(j / c) * 1000000 + (int)j);
    CHECK_MSG(ok, "all_gatherv of %zu over %d ranks", total, n);
    free(mine); free(all); free(counts);
}

/* Rank 0 calls all_reduce while the others call all_gather: everyone
 * must fail with a message that names both calls. */
static int rank_mismatch(void)
{
    tp_group *world;
    if (tp_comm_init(&world, NULL) != TP_OK) return 1;
    float x[1000] = {0}, y[4000];
    tp_status st = tp_group_rank(world) == 0
                       ? tp_comm_all_reduce(world, x, y, 1000, TP_F32, TP_REDUCE_SUM)
                       : tp_comm_all_gather(world, x, y, 1000, TP_F32);
    CHECK(st != TP_OK);
    const char *e = tp_error();
    CHECK_MSG(strstr(e, "called all_gather(") && strstr(e, "called all_reduce(1000 x f32, sum)"),
              "message: %s", e);
    tp_group_free(world);
    return check_failed ? 1 : 0;
}

static int rank_main(void)
{
    if (getenv("TEST_MISMATCH")) return rank_mismatch();
    tp_group *world;
    if (tp_comm_init(&world, NULL) != TP_OK) {
        fprintf(stderr, "rank: %s\n", tp_error());
        return 1;
    }
    CHECK(tp_group_backend(world) == TP_BACKEND_SHM);
    static const size_t sizes[] = {0, 1, 1000, 20000, 70000};
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        rank_reductions(world, sizes[s]);
        rank_gathers(world, sizes[s]);
        rank_gatherv(world, sizes[s] + 1);    /* 1001 over 3: 334, 334, 333; 2 over 4: 1, 1, 0, 0 */
    }
    /* Sub-groups: consecutive pairs and the even/odd split. */
    int me = tp_group_rank(world), n = tp_group_size(world);
    int pair[2] = {me / 2 * 2, me / 2 * 2 + 1};
    tp_group *tp = NULL, *dp = NULL;
    CHECK(tp_group_new_sub(world, pair, pair[1] < n ? 2 : 1, &tp) == TP_OK);
    CHECK(tp_group_split(world, me % 2, -me, &dp) == TP_OK);   /* key -me: reversed order */
    if (tp && dp) {
        rank_reductions(tp, 5000);
        rank_reductions(dp, 5000);
        rank_gathers(dp, 3000);
        rank_gatherv(dp, 3001);
        CHECK(tp_group_global_rank(dp, 0) == (n - 1 - me % 2) / 2 * 2 + me % 2);
    }
    tp_group_free(tp);
    tp_group_free(dp);
    CHECK(tp_comm_barrier(world) == TP_OK);
    tp_group_free(world);
    if (check_failed) fprintf(stderr, "rank %d: %d checks failed\n", me, check_failed);
    return check_failed ? 1 : 0;
}

static int count_job_segments(void)
{
    DIR *d = opendir("/dev/shm");
    char prefix[64];
    snprintf(prefix, sizeof prefix, "tensorpar-%u-j%d-", (unsigned)getuid(), (int)getpid());
    int k = 0;
    for (struct dirent *e; d && (e = readdir(d));) k += !strncmp(e->d_name, prefix, strlen(prefix));
    if (d) closedir(d);
    return k;
}

int main(int argc, char **argv)
{
    (void)argc;
    if (tp_launch_in_job()) return rank_main();
    unsetenv("TENSORPAR_BACKEND"); tp_settings_reload();
    for (int n = 2; n <= 4; n++) {
        int code = -1;
        CHECK(tp_launch_self(n, TP_BACKEND_SHM, argv, &code) == TP_OK);
        CHECK_MSG(code == 0, "%d ranks: exit code %d", n, code);
    }
    /* Everything through the slots, as where process_vm_readv is denied. */
    setenv("TENSORPAR_SHM_CMA", "0", 1); tp_settings_reload();
    int code = -1;
    CHECK(tp_launch_self(2, TP_BACKEND_SHM, argv, &code) == TP_OK);
    CHECK_MSG(code == 0, "2 ranks without CMA: exit code %d", code);
    unsetenv("TENSORPAR_SHM_CMA"); tp_settings_reload();
    /* Single copy from the smallest message on, in 4 KiB slots (so 8 KiB
     * scratch chunks), and everything through chunked slots. */
    setenv("TENSORPAR_SHM_SLOT_KB", "4", 1); tp_settings_reload();
    setenv("TENSORPAR_SHM_CMA_KB", "0", 1); tp_settings_reload();
    CHECK(tp_launch_self(3, TP_BACKEND_SHM, argv, &code) == TP_OK);
    CHECK_MSG(code == 0, "3 ranks, CMA always, 4 KiB slots: exit code %d", code);
    unsetenv("TENSORPAR_SHM_CMA_KB"); tp_settings_reload();
    CHECK(tp_launch_self(3, TP_BACKEND_SHM, argv, &code) == TP_OK);
    CHECK_MSG(code == 0, "3 ranks with 4 KiB slots: exit code %d", code);
    unsetenv("TENSORPAR_SHM_SLOT_KB"); tp_settings_reload();
    setenv("TEST_MISMATCH", "1", 1);
    CHECK(tp_launch_self(2, TP_BACKEND_SHM, argv, &code) == TP_OK);
    CHECK_MSG(code == 0, "mismatched collectives: exit code %d", code);
    unsetenv("TEST_MISMATCH");
    CHECK(count_job_segments() == 0);
    return check_summary();
}
