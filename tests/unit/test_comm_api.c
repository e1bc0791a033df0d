/* The group API on one rank (self backend), the environment rules of
 * tp-semantics §5.3, backend names, and tp_launch on plain programs. */
#include "check.h"
#include "tensorpar/settings.h"
#include "tensorpar/comm.h"

#include <stdlib.h>
#include <string.h>

static void clear_env(void)
{
    const char *vars[] = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "TENSORPAR_BACKEND",
                          "TENSORPAR_RENDEZVOUS", "TENSORPAR_COMM_TIMEOUT", "TENSORPAR_SHM_FD",
                          "TENSORPAR_HANG_TIMEOUT", "TENSORPAR_SHM_ONESHOT_KB", "TENSORPAR_SHM_CMA",
                          "TENSORPAR_SHM_SLOT_KB", "MASTER_ADDR", "MASTER_PORT", "OMPI_COMM_WORLD_RANK", "PMIX_RANK"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) unsetenv(vars[i]);
    tp_settings_reload();
}

static void test_names(void)
{
    tp_backend b;
    CHECK(tp_backend_parse("shm", &b) == TP_OK && b == TP_BACKEND_SHM);
    CHECK(tp_backend_parse("mpi", &b) == TP_OK && b == TP_BACKEND_MPI);
    CHECK(tp_backend_parse("self", &b) == TP_OK && b == TP_BACKEND_SELF);
    CHECK(tp_backend_parse("nccl", &b) == TP_ERR_INVALID && strstr(tp_error(), "nccl"));
    CHECK(!strcmp(tp_backend_name(TP_BACKEND_SHM), "shm"));
    CHECK(tp_backend_available(TP_BACKEND_SHM) && tp_backend_available(TP_BACKEND_SELF));
}

static void test_env_errors(void)
{
    tp_group *g = NULL;
    clear_env();
    setenv("WORLD_SIZE", "2", 1);
    CHECK(tp_comm_init(&g, NULL) == TP_ERR_INVALID && g == NULL);
    CHECK(strstr(tp_error(), "We tried to initialize the process group for you, but it failed") != NULL);
    CHECK(strstr(tp_error(), "RANK is not set") != NULL);
    setenv("RANK", "abc", 1);
    CHECK(tp_comm_init(&g, NULL) == TP_ERR_INVALID && strstr(tp_error(), "RANK='abc'"));
    setenv("RANK", "2", 1);
    CHECK(tp_comm_init(&g, NULL) == TP_ERR_INVALID && strstr(tp_error(), "RANK=2 must be smaller than WORLD_SIZE=2"));
    setenv("RANK", "1", 1);
    setenv("TENSORPAR_BACKEND", "carrier-pigeon", 1); tp_settings_reload();
    CHECK(tp_comm_init(&g, NULL) == TP_ERR_INVALID && strstr(tp_error(), "carrier-pigeon"));
    setenv("TENSORPAR_BACKEND", "shm", 1); tp_settings_reload();
    CHECK(tp_comm_init(&g, NULL) == TP_ERR_INVALID && strstr(tp_error(), "no rendezvous"));
    setenv("TENSORPAR_COMM_TIMEOUT", "-1", 1); tp_settings_reload();
    CHECK(tp_comm_init(&g, NULL) == TP_ERR_INVALID && strstr(tp_error(), "TENSORPAR_COMM_TIMEOUT"));
    unsetenv("TENSORPAR_COMM_TIMEOUT"); tp_settings_reload();
    /* One rank on each of two hosts: shared memory cannot join them. */
    setenv("LOCAL_RANK", "0", 1);
    setenv("LOCAL_WORLD_SIZE", "1", 1);
    CHECK(tp_comm_init(&g, NULL) == TP_ERR_INVALID && g == NULL);
    CHECK(strstr(tp_error(), "the shm backend needs every rank on one host, but this host runs 1 of the 2 ranks "
                             "(LOCAL_WORLD_SIZE)") != NULL);
    unsetenv("TENSORPAR_BACKEND"); tp_settings_reload();   /* auto picks shm too */
    CHECK(tp_comm_init(&g, NULL) == TP_ERR_INVALID && strstr(tp_error(), "with mpirun and the mpi backend"));
    clear_env();
}

static void test_self_group(void)
{
    clear_env();
    CHECK(!tp_launch_in_job());
    tp_group *g = NULL;
    CHECK(tp_comm_init(&g, NULL) == TP_OK && g);
    if (!g) return;
    CHECK(tp_group_rank(g) == 0 && tp_group_size(g) == 1 && tp_group_backend(g) == TP_BACKEND_SELF);
    CHECK(tp_group_global_rank(g, 0) == 0 && tp_group_global_rank(g, 1) == -1);
    CHECK(tp_group_timeout(g) == 30.0);
    float x[3] = {1, 2, 3}, y[3];
    CHECK(tp_comm_all_reduce(g, x, y, 3, TP_F32, TP_REDUCE_SUM) == TP_OK && !memcmp(x, y, sizeof x));
    CHECK(tp_comm_all_reduce(g, x, x, 3, TP_F32, TP_REDUCE_SUM) == TP_OK && x[2] == 3);
    CHECK(tp_comm_all_gather(g, x, y, 3, TP_F32) == TP_OK && !memcmp(x, y, sizeof x));
    size_t counts[1] = {0};
    CHECK(tp_comm_all_gatherv(g, x, y, counts, TP_F32) == TP_OK);
    counts[0] = 3;
    memset(y, 0, sizeof y);
    CHECK(tp_comm_all_gatherv(g, x, y, counts, TP_F32) == TP_OK && !memcmp(x, y, sizeof x));
    CHECK(tp_comm_reduce_scatter(g, x, y, 3, TP_F32, TP_REDUCE_SUM) == TP_OK && !memcmp(x, y, sizeof x));
    CHECK(tp_comm_broadcast(g, x, 3, TP_F32, 0) == TP_OK);
    CHECK(tp_comm_broadcast(g, x, 3, TP_F32, 1) == TP_ERR_INVALID && strstr(tp_error(), "root rank 1"));
    CHECK(tp_comm_barrier(g) == TP_OK);
    CHECK(tp_comm_all_to_all(g, x, y, 3, TP_F32) == TP_OK && !memcmp(x, y, sizeof x));
    CHECK(tp_comm_sendrecv(g, x, 3, 0, y, 3, 0, TP_F32) == TP_OK);
    CHECK(tp_comm_send(g, x, 3, TP_F32, 1) == TP_ERR_INVALID);
    uint8_t u[2] = {1, 2};
    CHECK(tp_comm_all_reduce(g, u, u, 2, TP_U8, TP_REDUCE_SUM) == TP_ERR_UNSUPPORTED);
    /* A failed argument check does not poison the group. */
    CHECK(tp_comm_barrier(g) == TP_OK);
    int zero = 0, one = 1;
    tp_group *sub = NULL, *split = NULL, *bad = NULL;
    CHECK(tp_group_new_sub(g, &zero, 1, &sub) == TP_OK && sub && tp_group_size(sub) == 1);
    CHECK(tp_group_new_sub(g, &one, 1, &bad) == TP_ERR_INVALID && bad == NULL);
    CHECK(tp_group_split(g, 5, 0, &split) == TP_OK && split && tp_group_size(split) == 1);
    tp_group *none = (tp_group *)&zero;
    CHECK(tp_group_split(g, -1, 0, &none) == TP_OK && none == NULL);
    tp_group_free(sub);
    tp_group_free(split);
    tp_group_free(g);
    tp_group_free(NULL);

    tp_comm_options o;
    tp_comm_options_default(&o);
    o.timeout_s = 2.5;
    CHECK(tp_comm_init(&g, &o) == TP_OK && tp_group_timeout(g) == 2.5);
    tp_group_free(g);
}

/* The settings reach tp_comm_init through tp_comm_options: from_env reads
 * the table, explicit options ignore the environment, NULL is from_env. */
static void test_options(void)
{
    clear_env();
    setenv("TENSORPAR_COMM_TIMEOUT", "7", 1);
    setenv("TENSORPAR_HANG_TIMEOUT", "0", 1);
    setenv("TENSORPAR_SHM_ONESHOT_KB", "0", 1);
    setenv("TENSORPAR_SHM_CMA", "0", 1);
    setenv("TENSORPAR_BACKEND", "self", 1);
    tp_settings_reload();
    tp_comm_options o;
    CHECK(tp_comm_options_from_env(&o) == TP_OK);
    CHECK(o.timeout_s == 7.0 && o.hang_timeout_s < 0 && o.backend == TP_BACKEND_SELF);
    CHECK(o.shm.slot_kb == 256 && o.shm.oneshot_max_kb < 0 && o.shm.cma == TP_OFF && o.shm.cma_min_kb == 16);
    CHECK(o.rendezvous == NULL && o.shm_fd == 0 && o.rank < 0);
    tp_group *g = NULL;
    CHECK(tp_comm_init(&g, &o) == TP_OK && g && tp_group_timeout(g) == 7.0);
    tp_group_free(g);
    CHECK(tp_comm_init(&g, NULL) == TP_OK && g && tp_group_timeout(g) == 7.0);
    tp_group_free(g);
    tp_comm_options_default(&o);   /* the defaults, whatever the environment says */
    CHECK(tp_comm_init(&g, &o) == TP_OK && g && tp_group_timeout(g) == 30.0);
    tp_group_free(g);
    tp_comm_options zero = {0};    /* zero-initialised: the same defaults */
    CHECK(tp_comm_init(&g, &zero) == TP_OK && g && tp_group_timeout(g) == 30.0);
    tp_group_free(g);
    o.shm.slot_kb = 2;             /* below the table's range */
    CHECK(tp_comm_init(&g, &o) == TP_ERR_INVALID && g == NULL && strstr(tp_error(), "slot_kb"));
    setenv("TENSORPAR_SHM_SLOT_KB", "3", 1); tp_settings_reload();
    CHECK(tp_comm_options_from_env(&o) == TP_ERR_INVALID && strstr(tp_error(), "TENSORPAR_SHM_SLOT_KB='3'"));
    CHECK(o.timeout_s == 0 && o.shm.slot_kb == 0);   /* left at the defaults */
    clear_env();
}

static void test_launch_programs(void)
{
    clear_env();
    int code = -1;
    tp_launch_options o = {.nprocs = 3, .backend = TP_BACKEND_SHM, .name = "test"};
    char *ok[] = {"sh", "-c", "test \"$WORLD_SIZE\" = 3 && test \"$RANK\" -lt 3 && test -n \"$TENSORPAR_SHM_FD\"", NULL};
    CHECK(tp_launch(&o, ok, &code) == TP_OK && code == 0);
    char *fail[] = {"sh", "-c", "exit $((RANK + 4))", NULL};
    o.nprocs = 1;
    CHECK(tp_launch(&o, fail, &code) == TP_OK && code == 4);
    o.nprocs = 0;
    CHECK(tp_launch(&o, ok, &code) == TP_ERR_INVALID);
}

int main(void)
{
    test_names();
    test_env_errors();
    test_self_group();
    test_options();
    test_launch_programs();
    return check_summary();
}
