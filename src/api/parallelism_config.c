/* accelerate's ParallelismConfig (tp-semantics.md §9.4): the training
 * layout's sizes, from the struct or accelerate's environment variables,
 * its constraints, the mesh ["dp_replicate", "dp_shard", "cp", "tp"] with
 * its flattened groups, and Trainer's tp_size rule (§9.5). */
#include "tensorpar/api.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    const char *env;
    size_t offset;
} size_var;

static const size_var vars[] = {
    {"PARALLELISM_CONFIG_DP_REPLICATE_SIZE", offsetof(tp_parallelism_config, dp_replicate_size)},
    {"PARALLELISM_CONFIG_DP_SHARD_SIZE", offsetof(tp_parallelism_config, dp_shard_size)},
    {"PARALLELISM_CONFIG_CP_SIZE", offsetof(tp_parallelism_config, cp_size)},
    {"PARALLELISM_CONFIG_TP_SIZE", offsetof(tp_parallelism_config, tp_size)},
};

static int *slot(tp_parallelism_config *c, const size_var *v) { return (int *)((char *)c + v->offset); }

/* accelerate's variables are not TENSORPAR_* settings (they belong to the
 * launch, like WORLD_SIZE), so they are read here, where they are used. */
static tp_status env_size(const char *name, int *out)
{
    const char *s = getenv(name);
    if (!s || !*s) { *out = 1; return TP_OK; }
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < -1000000000L || v > 1000000000L)
        return tp_fail(TP_ERR_INVALID, "environment variable %s='%s' is not an integer", name, s);
    *out = (int)v;   /* a value < 1 is resolve's §9.4 error, as a given one */
    return TP_OK;
}

tp_status tp_parallelism_config_from_env(tp_parallelism_config *c)
{
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
        if (*slot(c, &vars[i])) continue;
        tp_status st = env_size(vars[i].env, slot(c, &vars[i]));
        if (st) return st;
    }
    return TP_OK;
}

tp_status tp_parallelism_config_resolve(tp_parallelism_config *c, int world_size)
{
    tp_status st = tp_parallelism_config_from_env(c);
    if (st) return st;
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++)
        if (*slot(c, &vars[i]) < 1)
            return tp_fail(TP_ERR_INVALID, "Parallelism sizes must be >= 1, got %d.", *slot(c, &vars[i]));
    if (c->cp_size > 1)
        return tp_fail(TP_ERR_UNSUPPORTED, "Context parallelism (`cp_size` > 1) is not supported by tensorpar.");
    long long n = (long long)c->dp_replicate_size * c->dp_shard_size * c->cp_size * c->tp_size;
    if (n == 1 && world_size > 1) {   /* nothing asked: every process a replica */
        c->dp_replicate_size = world_size;
        n = world_size;
    }
    if (n != world_size)
        return tp_fail(TP_ERR_INVALID,
                       "ParallelismConfig sizes multiply to %lld (dp_replicate=%d, dp_shard=%d, cp=%d, tp=%d), "
                       "but WORLD_SIZE is %d.", n, c->dp_replicate_size, c->dp_shard_size, c->cp_size, c->tp_size,
                       world_size);
    return TP_OK;
}

tp_status tp_parallelism_config_mesh(tp_parallelism_config *c, tp_group *world, tp_mesh **out)
{
    *out = NULL;
    tp_status st = tp_parallelism_config_resolve(c, tp_group_size(world));
    if (st) return st;
    static const char *const names[] = {"dp_replicate", "dp_shard", "cp", "tp"};
    const int sizes[] = {c->dp_replicate_size, c->dp_shard_size, c->cp_size, c->tp_size};
    tp_mesh *m;
    if ((st = tp_mesh_new(world, 4, names, sizes, &m))) return st;
    /* accelerate's flattened groups: gradients are averaged over "dp";
     * the other two matter once context parallelism exists. */
    static const char *const dp[] = {"dp_replicate", "dp_shard"};
    static const char *const dp_shard_cp[] = {"dp_shard", "cp"};
    static const char *const dp_cp[] = {"dp_replicate", "dp_shard", "cp"};
    if ((st = tp_mesh_flatten(m, dp, 2, "dp")) || (st = tp_mesh_flatten(m, dp_shard_cp, 2, "dp_shard_cp")) ||
        (st = tp_mesh_flatten(m, dp_cp, 3, "dp_cp"))) {
        tp_mesh_free(m);
        return st;
    }
    *out = m;
    return TP_OK;
}

tp_status tp_parallelism_config_for_model(tp_parallelism_config *c, int model_tp_size, int warn_rank,
                                          int *overwrote)
{
    if (overwrote) *overwrote = 0;
    if (model_tp_size < 1) return tp_fail(TP_ERR_INVALID, "Parallelism sizes must be >= 1, got %d.", model_tp_size);
    if (!c->dp_replicate_size && !c->dp_shard_size && !c->cp_size && !c->tp_size) {
        c->tp_size = model_tp_size;   /* none given: ParallelismConfig(tp_size = model's) */
        return TP_OK;
    }
    tp_status st = tp_parallelism_config_from_env(c);   /* what the config says, env included */
    if (st || c->tp_size == model_tp_size) return st;
    if (warn_rank == 0)
        tp_log(TP_LOG_WARN, "ParallelismConfig has tp_size=%d but the model was loaded with tp_size=%d: using the "
               "model's tp_size=%d", c->tp_size, model_tp_size, model_tp_size);
    c->tp_size = model_tp_size;
    if (overwrote) *overwrote = 1;
    return TP_OK;
}
