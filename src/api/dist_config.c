/* DistributedConfig's sizes (tp-semantics.md §5.2): derived and checked in
 * the spec's order, each failure with the spec's sentence, so that a user
 * who knows Transformers' messages recognises them. */
#include "tensorpar/api.h"

#include <string.h>

/* Step 1: a given size (non-zero here; 0 is "null") must be >= 1. */
static tp_status check_given(const tp_dist_config *c)
{
    const int given[] = {c->tp_size, c->ep_size, c->fsdp_size, c->dp_replicate_size, c->pp_size};
    for (size_t i = 0; i < sizeof given / sizeof given[0]; i++)
        if (given[i] < 0) return tp_fail(TP_ERR_INVALID, "Parallelism sizes must be >= 1, got %d.", given[i]);
    return TP_OK;
}

static int has_plan(const tp_dist_config *c) { return c->tp_plan != NULL || c->plan != NULL; }

/* Step 3: every process fsdp and pp do not use is a TP rank. */
static tp_status derive_tp(const tp_dist_config *c, int world_size, tp_dist_sizes *s)
{
    if (c->tp_size) { s->tp_size = c->tp_size; return TP_OK; }
    if (!has_plan(c)) { s->tp_size = 1; return TP_OK; }
    long long other = (long long)s->fsdp_size * s->pp_size;
    if (world_size % other)
        return tp_fail(TP_ERR_INVALID,
                       "WORLD_SIZE (%d) must be divisible by fsdp_size * pp_size (%lld) to derive tp_size.",
                       world_size, other);
    s->tp_size = (int)(world_size / other);
    return TP_OK;
}

/* Steps 4 and 5: expert parallelism. */
static tp_status derive_ep(const tp_dist_config *c, tp_dist_sizes *s)
{
    s->ep_size = c->ep_size ? c->ep_size : 1;
    if (c->enable_expert_parallel && !c->ep_size) {
        s->ep_size = s->tp_size;
        snprintf(s->warning, sizeof s->warning,
                 "`enable_expert_parallel` without `ep_size` is deprecated and will be removed in a future "
                 "version. Use ep_size=%d instead.", s->tp_size);
    }
    s->enable_expert_parallel = s->ep_size > 1;
    if (s->ep_size <= 1) return TP_OK;
    if (s->ep_size % s->tp_size) return tp_fail(TP_ERR_INVALID, "`ep_size` must be a multiple of `tp_size`.");
    if (((long long)s->fsdp_size * s->tp_size) % s->ep_size)
        return tp_fail(TP_ERR_INVALID, "`ep_size` must divide `fsdp_size * tp_size`.");
    if (s->ep_size != s->tp_size)
        return tp_fail(TP_ERR_UNSUPPORTED,
                       "tensorpar requires `ep_size` to equal `tp_size` when expert parallelism is enabled "
                       "(got ep_size=%d, tp_size=%d).", s->ep_size, s->tp_size);
    return TP_OK;
}

/* Step 6: pipeline parallelism, alone or with FSDP. */
static tp_status check_pp(const tp_dist_sizes *s)
{
    if (s->fsdp_size > 1 && s->pp_size > 1)
        return tp_fail(TP_ERR_UNSUPPORTED, "Combining FSDP with pipeline parallelism is not supported yet. Use "
                       "DistributedConfig(tp_size=N, fsdp_size=M), or combine TP and PP.");
    if (s->pp_size > 1)
        return tp_fail(TP_ERR_UNSUPPORTED, "Pipeline parallelism (`pp_size` > 1) is not supported by tensorpar.");
    return TP_OK;
}

tp_status tp_dist_config_resolve(const tp_dist_config *c, int world_size, int warn_rank, tp_dist_sizes *out)
{
    static const tp_dist_config none;
    if (!c) c = &none;
    memset(out, 0, sizeof *out);
    if (world_size < 1) return tp_fail(TP_ERR_INVALID, "world size %d: a job has at least one process", world_size);
    if (c->tp_plan && c->plan)
        return tp_fail(TP_ERR_INVALID, "tp_plan is given both as a name and as a plan object; give one");
    tp_status st = check_given(c);
    if (st) return st;
    out->fsdp_size = c->fsdp_size ? c->fsdp_size : 1;                 /* step 2 */
    out->pp_size = c->pp_size ? c->pp_size : 1;
    out->dp_replicate_size = c->dp_replicate_size ? c->dp_replicate_size : 1;
    if ((st = derive_tp(c, world_size, out)) || (st = derive_ep(c, out)) || (st = check_pp(out))) return st;
    out->efsdp_size = (int)((long long)out->fsdp_size * out->tp_size / out->ep_size);
    out->tp_plan = c->tp_plan;                                          /* step 7 */
    if (out->tp_size > 1 && !has_plan(c)) out->tp_plan = "auto";
    if (out->warning[0] && warn_rank == 0) tp_log(TP_LOG_WARN, "%s", out->warning);
    return TP_OK;
}

tp_status tp_dist_check_world(const tp_dist_sizes *s, int world_size)
{
    long long n = (long long)s->dp_replicate_size * s->pp_size * s->fsdp_size * s->tp_size;
    if (n == 1) return TP_OK;   /* no mesh: the model runs unsplit */
    if (n != world_size)
        return tp_fail(TP_ERR_INVALID, "The parallel mesh requires %lld processes, but world_size is %d.", n,
                       world_size);
    return TP_OK;
}

tp_status tp_dist_world_size(int *world_size)
{
    return tp_comm_job_layout(NULL, world_size, NULL, NULL);
}
