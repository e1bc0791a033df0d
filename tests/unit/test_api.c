/* api/: DistributedConfig's sizes with every message of §5.2 and scenarios
 * C1-C5, its JSON form, ParallelismConfig's environment variables and
 * constraints (§9.4), Trainer's rule (§9.5), and, as 4 ranks of a job
 * (the test re-runs itself through tp_launch_self), the training mesh with
 * its flattened dp groups and tp_model_from_pretrained at tp 2 x fsdp 2
 * against the unsplit logits. */
#include "check.h"
#include "tmpdir.h"
#include "tensorpar/api.h"
#include "tensorpar/settings.h"

#include <fcntl.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- stderr capture, for the warnings ---------------------------------- */

static int saved_fd = -1;
static char cap_path[] = "/tmp/tp-api-stderr-XXXXXX";

static void capture_begin(void)
{
    fflush(stderr);
    int fd = mkstemp(cap_path);
    saved_fd = dup(2);
    dup2(fd, 2);
    close(fd);
}

/* What was written to stderr since capture_begin (static buffer). */
static const char *capture_end(void)
{
    static char buf[4096];
    fflush(stderr);
    dup2(saved_fd, 2);
    close(saved_fd);
    FILE *f = fopen(cap_path, "r");
    size_t n = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
    buf[n] = '\0';
    if (f) fclose(f);
    unlink(cap_path);
    strcpy(cap_path, "/tmp/tp-api-stderr-XXXXXX");
    return buf;
}

/* ---- DistributedConfig ------------------------------------------------- */

static tp_status resolve(const tp_dist_config *c, int world, tp_dist_sizes *s)
{
    return tp_dist_config_resolve(c, world, 1, s);   /* rank 1: no warning printed */
}

static void test_c1_c3(void)
{
    tp_dist_sizes s;
    tp_dist_config c = {.tp_plan = "auto"};
    CHECK(resolve(&c, 4, &s) == TP_OK && s.tp_size == 4 && !strcmp(s.tp_plan, "auto"));   /* C1 */
    c = (tp_dist_config){.tp_plan = "auto", .fsdp_size = 4};
    CHECK(resolve(&c, 6, &s) == TP_ERR_INVALID);                                           /* C2 */
    CHECK(!strcmp(tp_error(), "WORLD_SIZE (6) must be divisible by fsdp_size * pp_size (4) to derive tp_size."));
    c = (tp_dist_config){.tp_plan = "auto", .fsdp_size = 2};
    CHECK(resolve(&c, 8, &s) == TP_OK && s.tp_size == 4 && s.fsdp_size == 2 && s.pp_size == 1);
    c = (tp_dist_config){.tp_size = -2};                                                   /* C3 */
    CHECK(resolve(&c, 1, &s) == TP_ERR_INVALID && !strcmp(tp_error(), "Parallelism sizes must be >= 1, got -2."));
    c = (tp_dist_config){.fsdp_size = -1};
    CHECK(resolve(&c, 1, &s) == TP_ERR_INVALID && !strcmp(tp_error(), "Parallelism sizes must be >= 1, got -1."));
    c = (tp_dist_config){.tp_plan = "auto"};
    CHECK(resolve(&c, 1, &s) == TP_OK && s.tp_size == 1);
    /* No plan, no size: one rank; a size without a plan gets "auto". */
    c = (tp_dist_config){0};
    CHECK(resolve(&c, 4, &s) == TP_OK && s.tp_size == 1 && s.tp_plan == NULL && s.ep_size == 1);
    c = (tp_dist_config){.tp_size = 2};
    CHECK(resolve(&c, 2, &s) == TP_OK && s.tp_plan && !strcmp(s.tp_plan, "auto"));
    tp_plan p = {0};
    c = (tp_dist_config){.tp_plan = "x.json", .plan = &p};
    CHECK(resolve(&c, 2, &s) == TP_ERR_INVALID && strstr(tp_error(), "both"));
    CHECK(resolve(&c, 0, &s) == TP_ERR_INVALID);
}

static void test_c4_ep(void)
{
    tp_dist_sizes s;
    tp_dist_config c = {.enable_expert_parallel = 1, .tp_size = 2};
    capture_begin();
    tp_status st = tp_dist_config_resolve(&c, 2, 0, &s);   /* rank 0 warns */
    const char *err = capture_end();
    CHECK(st == TP_OK && s.ep_size == 2 && s.enable_expert_parallel && s.efsdp_size == 1);
    const char *want = "`enable_expert_parallel` without `ep_size` is deprecated and will be removed in a future "
                       "version. Use ep_size=2 instead.";
    CHECK(!strcmp(s.warning, want));
    CHECK_MSG(strstr(err, "warning: ") && strstr(err, want), "warning: %s", err);
    /* Printed once, by global rank 0 only. */
    CHECK(strstr(err, want) && !strstr(strstr(err, want) + 1, want));
    capture_begin();
    CHECK(tp_dist_config_resolve(&c, 2, 1, &s) == TP_OK);
    CHECK(capture_end()[0] == '\0');
    c = (tp_dist_config){.ep_size = 3, .tp_size = 2};
    CHECK(resolve(&c, 2, &s) == TP_ERR_INVALID && !strcmp(tp_error(), "`ep_size` must be a multiple of `tp_size`."));
    c = (tp_dist_config){.fsdp_size = 2, .tp_size = 2, .ep_size = 4};
    CHECK(resolve(&c, 4, &s) == TP_ERR_UNSUPPORTED);
    CHECK(!strcmp(tp_error(), "tensorpar requires `ep_size` to equal `tp_size` when expert parallelism is enabled "
                              "(got ep_size=4, tp_size=2)."));
    c = (tp_dist_config){.tp_size = 2, .ep_size = 8};
    CHECK(resolve(&c, 2, &s) == TP_ERR_INVALID && !strcmp(tp_error(), "`ep_size` must divide `fsdp_size * tp_size`."));
    c = (tp_dist_config){.tp_size = 2, .ep_size = 2};
    CHECK(resolve(&c, 2, &s) == TP_OK && s.enable_expert_parallel && !s.warning[0]);
}

static void test_c5_pp_world(void)
{
    tp_dist_sizes s;
    tp_dist_config c = {.tp_size = 2, .fsdp_size = 2};
    CHECK(resolve(&c, 4, &s) == TP_OK && tp_dist_check_world(&s, 4) == TP_OK);
    c = (tp_dist_config){.tp_size = 2};
    CHECK(resolve(&c, 4, &s) == TP_OK && tp_dist_check_world(&s, 4) == TP_ERR_INVALID);
    CHECK(!strcmp(tp_error(), "The parallel mesh requires 2 processes, but world_size is 4."));
    c = (tp_dist_config){.tp_size = 2, .dp_replicate_size = 2};
    CHECK(resolve(&c, 4, &s) == TP_OK && tp_dist_check_world(&s, 4) == TP_OK);
    c = (tp_dist_config){0};
    CHECK(resolve(&c, 3, &s) == TP_OK && tp_dist_check_world(&s, 3) == TP_OK);   /* no mesh */
    c = (tp_dist_config){.pp_size = 2};
    CHECK(resolve(&c, 2, &s) == TP_ERR_UNSUPPORTED);
    CHECK(!strcmp(tp_error(), "Pipeline parallelism (`pp_size` > 1) is not supported by tensorpar."));
    c = (tp_dist_config){.pp_size = 2, .fsdp_size = 2, .tp_size = 1};
    CHECK(resolve(&c, 4, &s) == TP_ERR_UNSUPPORTED);
    CHECK(!strcmp(tp_error(), "Combining FSDP with pipeline parallelism is not supported yet. Use "
                              "DistributedConfig(tp_size=N, fsdp_size=M), or combine TP and PP."));
    /* Step 3 runs before step 6: pp_size takes part in the derivation. */
    c = (tp_dist_config){.pp_size = 2, .tp_plan = "auto"};
    CHECK(resolve(&c, 3, &s) == TP_ERR_INVALID && strstr(tp_error(), "fsdp_size * pp_size (2)"));
}

static void test_world_from_env(void)
{
    int w = 0;
    unsetenv("RANK");
    unsetenv("WORLD_SIZE");
    CHECK(tp_dist_world_size(&w) == TP_OK && w == 1);
    setenv("WORLD_SIZE", "6", 1);
    setenv("RANK", "5", 1);
    CHECK(tp_dist_world_size(&w) == TP_OK && w == 6);
    int r = -1, lr = -1, ls = -1;
    setenv("LOCAL_RANK", "1", 1);
    setenv("LOCAL_WORLD_SIZE", "3", 1);
    CHECK(tp_comm_job_layout(&r, &w, &lr, &ls) == TP_OK && r == 5 && w == 6 && lr == 1 && ls == 3);
    unsetenv("RANK");
    CHECK(tp_dist_world_size(&w) == TP_ERR_INVALID && strstr(tp_error(), "RANK"));   /* C8 */
    setenv("RANK", "x", 1);
    CHECK(tp_dist_world_size(&w) == TP_ERR_INVALID && strstr(tp_error(), "RANK='x'"));
    unsetenv("RANK");
    unsetenv("WORLD_SIZE");
    unsetenv("LOCAL_RANK");
    unsetenv("LOCAL_WORLD_SIZE");
}

static void test_json(void)
{
    tp_dist_config c;
    tp_dist_sizes s;
    CHECK(tp_dist_config_from_json(&c, "{\"tp_size\": 2, \"tp_plan\": \"auto\", \"fsdp_size\": null,"
                                       " \"enable_expert_parallel\": false, \"pp_size\": 1}") == TP_OK);
    CHECK(c.tp_size == 2 && !strcmp(c.tp_plan, "auto") && c.fsdp_size == 0 && c.pp_size == 1);
    CHECK(resolve(&c, 2, &s) == TP_OK && s.tp_size == 2);
    tp_dist_config_release(&c);
    /* 0 is a given size in JSON: §5.2 step 1 (C3). */
    CHECK(tp_dist_config_from_json(&c, "{\"tp_size\": 0}") == TP_ERR_INVALID);
    CHECK(!strcmp(tp_error(), "Parallelism sizes must be >= 1, got 0."));
    CHECK(tp_dist_config_from_json(&c, "{\"tp_size\": \"2\"}") == TP_ERR_INVALID && strstr(tp_error(), "`tp_size`"));
    CHECK(tp_dist_config_from_json(&c, "{\"tp_size\": 1.5}") == TP_ERR_INVALID && strstr(tp_error(), "`tp_size`"));
    CHECK(tp_dist_config_from_json(&c, "{\"fsdp_cpu_offload\": 1}") == TP_ERR_INVALID &&
          strstr(tp_error(), "`fsdp_cpu_offload` must be true or false"));
    CHECK(tp_dist_config_from_json(&c, "[1]") == TP_ERR_FORMAT);
    CHECK(tp_dist_config_from_json(&c, "{") == TP_ERR_FORMAT);
    /* A plan object (A3: an array is refused by the plan parser). */
    CHECK(tp_dist_config_from_json(&c, "{\"tp_plan\": [\"colwise\"]}") == TP_ERR_INVALID);
    CHECK(strstr(tp_error(), "Can only set a dictionary as `tp_plan`") != NULL);
    CHECK(tp_dist_config_from_json(&c, "{\"tp_plan\": {\"model.layers.*.mlp.up_proj\": \"colwise\"},"
                                       " \"dp_shard_size\": 2}") == TP_OK);
    CHECK(c.plan && c.plan->n == 1 && !strcmp(c.plan->v[0].key, "model.layers.*.mlp.up_proj") && c.fsdp_size == 2);
    CHECK(resolve(&c, 4, &s) == TP_OK && s.tp_size == 2);   /* W / fsdp */
    char *text = tp_dist_config_to_json(&c);
    CHECK(text && strstr(text, "\"fsdp_size\":\t2") && strstr(text, "\"tp_size\":\tnull") &&
          strstr(text, "\"model.layers.*.mlp.up_proj\":\t\"colwise\"") && strstr(text, "\"pp_size\":\tnull") &&
          strstr(text, "\"enable_expert_parallel\":\tfalse"));
    /* What it writes reads back the same. */
    tp_dist_config back;
    CHECK(text && tp_dist_config_from_json(&back, text) == TP_OK && back.fsdp_size == 2 && back.plan &&
          back.plan->n == 1 && back.tp_size == 0);
    tp_dist_config_release(&back);
    free(text);
    tp_dist_config_release(&c);
    CHECK(c.plan == NULL && c.owned_plan == NULL);
    CHECK(tp_dist_config_from_json(&c, "{\"fsdp_size\": 2, \"dp_shard_size\": 4}") == TP_ERR_INVALID);
    /* Unknown keys: ignored (§5.1), named in one warning. */
    capture_begin();
    tp_status st = tp_dist_config_from_json(&c, "{\"tp_sise\": 4, \"tp_size\": 2, \"foo\": 1}");
    const char *err = capture_end();
    CHECK(st == TP_OK && c.tp_size == 2);
    CHECK_MSG(strstr(err, "'tp_sise'") && strstr(err, "'foo'") && strstr(err, "unknown"), "warning: %s", err);
    tp_dist_config_release(&c);
}

/* ---- ParallelismConfig -------------------------------------------------- */

static const char *const pc_vars[] = {"PARALLELISM_CONFIG_DP_REPLICATE_SIZE", "PARALLELISM_CONFIG_DP_SHARD_SIZE",
                                      "PARALLELISM_CONFIG_CP_SIZE", "PARALLELISM_CONFIG_TP_SIZE"};

static void test_parallelism_env(void)
{
    for (int i = 0; i < 4; i++) unsetenv(pc_vars[i]);
    tp_parallelism_config p = {0};
    CHECK(tp_parallelism_config_from_env(&p) == TP_OK && p.dp_replicate_size == 1 && p.dp_shard_size == 1 &&
          p.cp_size == 1 && p.tp_size == 1);
    setenv("PARALLELISM_CONFIG_DP_SHARD_SIZE", "4", 1);
    setenv("PARALLELISM_CONFIG_TP_SIZE", "2", 1);
    p = (tp_parallelism_config){.tp_size = 3};   /* a given field wins over its variable */
    CHECK(tp_parallelism_config_from_env(&p) == TP_OK && p.dp_shard_size == 4 && p.tp_size == 3 &&
          p.dp_replicate_size == 1);
    p = (tp_parallelism_config){0};
    CHECK(tp_parallelism_config_resolve(&p, 8) == TP_OK && p.dp_shard_size == 4 && p.tp_size == 2);
    setenv("PARALLELISM_CONFIG_CP_SIZE", "two", 1);
    p = (tp_parallelism_config){0};
    CHECK(tp_parallelism_config_from_env(&p) == TP_ERR_INVALID &&
          strstr(tp_error(), "PARALLELISM_CONFIG_CP_SIZE='two'"));
    setenv("PARALLELISM_CONFIG_CP_SIZE", "2", 1);
    p = (tp_parallelism_config){0};
    CHECK(tp_parallelism_config_resolve(&p, 16) == TP_ERR_UNSUPPORTED &&
          !strcmp(tp_error(), "Context parallelism (`cp_size` > 1) is not supported by tensorpar."));
    setenv("PARALLELISM_CONFIG_DP_REPLICATE_SIZE", "0", 1);
    p = (tp_parallelism_config){0};
    CHECK(tp_parallelism_config_resolve(&p, 16) == TP_ERR_INVALID &&
          !strcmp(tp_error(), "Parallelism sizes must be >= 1, got 0."));
    for (int i = 0; i < 4; i++) unsetenv(pc_vars[i]);
}

static void test_parallelism_resolve(void)
{
    tp_parallelism_config p = {.dp_shard_size = 2, .tp_size = 2};
    CHECK(tp_parallelism_config_resolve(&p, 6) == TP_ERR_INVALID);
    CHECK(!strcmp(tp_error(), "ParallelismConfig sizes multiply to 4 (dp_replicate=1, dp_shard=2, cp=1, tp=2), "
                              "but WORLD_SIZE is 6."));
    p = (tp_parallelism_config){0};   /* product 1 in a larger world: all replicas */
    CHECK(tp_parallelism_config_resolve(&p, 4) == TP_OK && p.dp_replicate_size == 4 && p.tp_size == 1);
    /* TP with dp_replicate and no dp_shard: accepted (accelerate refuses it). */
    p = (tp_parallelism_config){.dp_replicate_size = 2, .tp_size = 2};
    CHECK(tp_parallelism_config_resolve(&p, 4) == TP_OK && p.dp_shard_size == 1);
    p = (tp_parallelism_config){.tp_size = -1};
    CHECK(tp_parallelism_config_resolve(&p, 1) == TP_ERR_INVALID && strstr(tp_error(), "got -1."));
}

static void test_trainer_rule(void)
{
    tp_parallelism_config p = {0};
    int over = -1;
    CHECK(tp_parallelism_config_for_model(&p, 2, 0, &over) == TP_OK && over == 0 && p.tp_size == 2 &&
          p.dp_shard_size == 0);
    p = (tp_parallelism_config){.dp_shard_size = 4, .tp_size = 4};
    capture_begin();
    tp_status st = tp_parallelism_config_for_model(&p, 2, 0, &over);
    const char *err = capture_end();
    CHECK(st == TP_OK && over == 1 && p.tp_size == 2 && p.dp_shard_size == 4);
    CHECK_MSG(strstr(err, "tp_size=4") && strstr(err, "tp_size=2"), "warning: %s", err);
    p = (tp_parallelism_config){.dp_shard_size = 4, .tp_size = 2};
    capture_begin();
    CHECK(tp_parallelism_config_for_model(&p, 2, 0, &over) == TP_OK && over == 0);
    CHECK(capture_end()[0] == '\0');
    p = (tp_parallelism_config){.dp_shard_size = 4, .tp_size = 1};   /* rank 1: no warning */
    capture_begin();
    CHECK(tp_parallelism_config_for_model(&p, 2, 1, &over) == TP_OK && over == 1 && p.tp_size == 2);
    CHECK(capture_end()[0] == '\0');
}

/* ---- 4 ranks ------------------------------------------------------------- */

/* The global ranks of group g, in group order, as "0,2". */
static void members(tp_group *g, char *buf, size_t cap)
{
    size_t n = 0;
    buf[0] = '\0';
    for (int r = 0; r < tp_group_size(g); r++)
        n += (size_t)snprintf(buf + n, cap - n, "%s%d", r ? "," : "", tp_group_global_rank(g, r));
}

static int group_is(const tp_mesh *m, const char *name, const char *want, int rank)
{
    const tp_mesh *s = tp_mesh_sub(m, name);
    char got[64] = "(none)";
    if (s) members(tp_mesh_group(s, 0), got, sizeof got);
    if (!strcmp(got, want)) return 1;
    fprintf(stderr, "rank %d: group '%s' is {%s}, expected {%s}\n", rank, name, got, want);
    return 0;
}

/* The model's logits [3, V] for ids 1, 2, 3 (malloc'd): what the parent
 * writes as the unsplit logits and every rank's model must give. */
static float *logits_123(tp_model *m)
{
    int64_t ids[3] = {1, 2, 3};
    float *out = malloc((size_t)(3 * m->cfg.vocab_size) * sizeof(float));
    tp_kv_cache kv;
    CHECK(tp_kv_cache_init(&kv, m, 3) == TP_OK && tp_model_forward(m, &kv, ids, 3, out, 1) == TP_OK);
    tp_kv_cache_release(&kv);
    return out;
}

/* DIR/unsplit.f32, the parent's logits file, opened in mode. */
static FILE *open_unsplit(const char *dir, const char *mode)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/unsplit.f32", dir);
    return fopen(path, mode);
}

/* The model's logits for ids 1, 2, 3 against the unsplit ones the parent
 * wrote, within 1e-5. */
static void check_logits(tp_model *m, const char *dir, int me, const char *what)
{
    int64_t V = m->cfg.vocab_size;
    float *got = logits_123(m), *want = malloc((size_t)(3 * V) * sizeof(float));
    FILE *f = open_unsplit(dir, "rb");
    CHECK(f && fread(want, sizeof(float), (size_t)(3 * V), f) == (size_t)(3 * V));
    if (f) fclose(f);
    double err = 0;
    for (int64_t i = 0; i < 3 * V; i++) err = fmax(err, fabs(got[i] - want[i]));
    CHECK_MSG(err < 1e-5, "rank %d, %s: max |logits - unsplit| = %g", me, what, err);
    free(got);
    free(want);
}

/* ParallelismConfig (dp_replicate 2, dp_shard 2, cp 1, tp 1) and (1, 2, 1, 2). */
static void rank_meshes(tp_group *world, const char *dir)
{
    int me = tp_group_rank(world);
    tp_parallelism_config p = {.dp_replicate_size = 2, .dp_shard_size = 2, .tp_size = 1};
    tp_mesh *m;
    CHECK(tp_parallelism_config_mesh(&p, world, &m) == TP_OK);
    if (!m) return;
    CHECK(tp_mesh_ndim(m) == 4 && !strcmp(tp_mesh_dim_name(m, 2), "cp") && tp_mesh_size(m, 2) == 1);
    CHECK(tp_mesh_coord(m, 0) == me / 2 && tp_mesh_coord(m, 1) == me % 2 && tp_mesh_coord(m, 3) == 0);
    static const char *rep[] = {"0,2", "1,3", "0,2", "1,3"}, *shard[] = {"0,1", "0,1", "2,3", "2,3"};
    static const char *self[] = {"0", "1", "2", "3"};
    CHECK(group_is(m, "dp_replicate", rep[me], me) && group_is(m, "dp_shard", shard[me], me));
    CHECK(group_is(m, "tp", self[me], me) && group_is(m, "cp", self[me], me));
    CHECK(group_is(m, "dp", "0,1,2,3", me) && group_is(m, "dp_cp", "0,1,2,3", me));
    CHECK(group_is(m, "dp_shard_cp", shard[me], me));
    const tp_mesh *dp = tp_mesh_sub(m, "dp");
    CHECK(dp && tp_mesh_coord(dp, 0) == me && tp_mesh_size(dp, 0) == 4);
    /* The dp group works: a sum over it. */
    int64_t one = me + 1, sum = 0;
    CHECK(dp && tp_comm_all_reduce(tp_mesh_group(dp, 0), &one, &sum, 1, TP_I64, TP_REDUCE_SUM) == TP_OK && sum == 10);
    const char *bad[] = {"tp", "dp_shard"};
    CHECK(tp_mesh_flatten(m, bad, 2, "x") == TP_ERR_INVALID && strstr(tp_error(), "mesh order"));
    /* A caller's own group over dp_shard x tp (a checkpoint's savers): this
     * rank's dp_shard pair, ranked as the flattening ranks them. */
    static const char *const saver_dims[] = {"dp_shard", "tp"};
    tp_group *g = NULL;
    CHECK(tp_mesh_group_new(m, saver_dims, 2, &g) == TP_OK && g);
    if (g) {
        CHECK(tp_group_size(g) == 2 && tp_group_rank(g) == me % 2);
        CHECK(tp_group_global_rank(g, 0) == me / 2 * 2 && tp_group_global_rank(g, 1) == me / 2 * 2 + 1);
        tp_group_free(g);
    }
    CHECK(tp_mesh_group_new(m, bad, 2, &g) == TP_ERR_INVALID && !g);
    tp_mesh_free(m);

    p = (tp_parallelism_config){.dp_shard_size = 2, .tp_size = 2};
    CHECK(tp_parallelism_config_mesh(&p, world, &m) == TP_OK && p.dp_replicate_size == 1);
    if (!m) return;
    static const char *tp[] = {"0,1", "0,1", "2,3", "2,3"}, *dps[] = {"0,2", "1,3", "0,2", "1,3"};
    CHECK(group_is(m, "tp", tp[me], me) && group_is(m, "dp_shard", dps[me], me));
    CHECK(group_is(m, "dp", dps[me], me) && group_is(m, "dp_replicate", self[me], me));
    CHECK(tp_mesh_coord(tp_mesh_sub(m, "dp"), 0) == me / 2);
    /* The model loads onto the layout's "tp" sub-mesh (§9.4). */
    tp_model_options mo = {.threads = 1};
    tp_dist_config c = {.world = world, .mesh = m, .model = &mo};
    tp_model *model;
    CHECK_MSG(tp_model_from_pretrained(&model, dir, TP_F32, &c) == TP_OK, "rank %d: %s", me, tp_error());
    if (model) {
        CHECK(tp_model_tp_mesh(model) == tp_mesh_sub(m, "tp") && tp_model_dist_sizes(model)->tp_size == 2);
        check_logits(model, dir, me, "ParallelismConfig mesh");
        tp_model_free(model);
    }
    c.tp_size = 4;
    CHECK(tp_model_from_pretrained(&model, dir, TP_F32, &c) == TP_ERR_INVALID && strstr(tp_error(), "has 2 ranks"));
    tp_mesh_free(m);
}

/* C5 through the loader: tp 2 x fsdp 2 on 4 ranks, against the unsplit
 * logits the parent wrote. */
static void rank_from_pretrained(tp_group *world, const char *dir)
{
    int me = tp_group_rank(world);
    tp_dist_config c = {.tp_size = 2, .fsdp_size = 2, .world = world};
    tp_model_options mo = {.threads = 1};
    c.model = &mo;
    tp_model *m;
    CHECK_MSG(tp_model_from_pretrained(&m, dir, TP_F32, &c) == TP_OK, "rank %d: %s", me, tp_error());
    if (!m) return;
    const tp_mesh *tp = tp_model_tp_mesh(m);
    static const char *tpg[] = {"0,1", "0,1", "2,3", "2,3"};
    CHECK(tp && group_is(tp_model_device_mesh(m), "tp", tpg[me], me) && tp_mesh_coord(tp, 0) == me % 2);
    CHECK(tp_model_world(m) == world && tp_model_dist_sizes(m)->fsdp_size == 2);
    CHECK(!strcmp(tp_mesh_dim_name(tp_model_device_mesh(m), 1), "fsdp"));
    check_logits(m, dir, me, "tp 2 x fsdp 2");
    /* The token choice is TP rank 0's. */
    int64_t id = 100 + me;
    CHECK(tp_model_choose_tp_rank0(m, &id) == TP_OK && id == 100 + (me / 2) * 2);
    tp_model_free(m);
    /* The same job at tp 2 only: C5's mesh error, before anything is built. */
    c = (tp_dist_config){.tp_size = 2, .world = world};
    CHECK(tp_model_from_pretrained(&m, dir, TP_F32, &c) == TP_ERR_INVALID && m == NULL &&
          !strcmp(tp_error(), "The parallel mesh requires 2 processes, but world_size is 4."));
    /* Expert parallelism on a dense model: A9's refusal. */
    c = (tp_dist_config){.tp_size = 4, .enable_expert_parallel = 1, .world = world};
    CHECK(tp_model_from_pretrained(&m, dir, TP_F32, &c) != TP_OK &&
          strstr(tp_error(), "does not define an expert-parallel plan"));
}

static int rank_main(const char *dir)
{
    tp_group *world;
    if (tp_comm_init(&world, NULL)) { fprintf(stderr, "%s\n", tp_error()); return 1; }
    rank_meshes(world, dir);
    rank_from_pretrained(world, dir);
    tp_group_free(world);
    return check_summary();
}

/* The parent: a tiny model and its unsplit logits for the ranks. */
static void run_ranks(char **argv)
{
    char dir[] = "/tmp/tp-api-XXXXXX";
    if (!mkdtemp(dir)) { CHECK(0); return; }
    tp_model_config cfg;
    tp_make_options mk = {.dtype = TP_F32, .seed = 5, .std = 0.02, .qk_std = 0.02, .shards = 1};
    CHECK(tp_preset_config(&cfg, TP_ARCH_LLAMA, "tiny") == TP_OK && tp_make_model(&cfg, &mk, dir) == TP_OK);
    tp_model *m;
    tp_dist_config c = {0};   /* one process, nothing to split: no job joined */
    CHECK(tp_model_from_pretrained(&m, dir, TP_F32, &c) == TP_OK && tp_model_world(m) == NULL &&
          tp_model_tp_mesh(m) == NULL);
    if (m) {
        int64_t V = m->cfg.vocab_size;
        float *logits = logits_123(m);
        FILE *f = open_unsplit(dir, "wb");
        CHECK(f && fwrite(logits, sizeof(float), (size_t)(3 * V), f) == (size_t)(3 * V));
        if (f) fclose(f);
        free(logits);
        tp_model_free(m);
    }
    CHECK(tp_model_from_pretrained(&m, dir, TP_F16, &c) == TP_ERR_INVALID);
    c.tp_size = 2;   /* one process cannot hold 2 ranks */
    CHECK(tp_model_from_pretrained(&m, dir, TP_F32, &c) == TP_ERR_INVALID &&
          !strcmp(tp_error(), "The parallel mesh requires 2 processes, but world_size is 1."));
    unsetenv("TENSORPAR_BACKEND");
    tp_settings_reload();
    char *args[] = {argv[0], dir, NULL};
    int code = -1;
    CHECK(tp_launch_self(4, TP_BACKEND_SHM, args, &code) == TP_OK);
    CHECK_MSG(code == 0, "4 ranks: exit code %d", code);
    remove_tree(dir);
}

int main(int argc, char **argv)
{
    if (tp_launch_in_job()) return argc == 2 ? rank_main(argv[1]) : 2;
    test_c1_c3();
    test_c4_ep();
    test_c5_pp_world();
    test_world_from_env();
    test_json();
    test_parallelism_env();
    test_parallelism_resolve();
    test_trainer_rule();
    run_ranks(argv);
    return check_summary();
}
