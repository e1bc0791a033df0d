/* tp_model_from_pretrained: tp-semantics.md §5.6 in one call.  The sizes
 * are derived and checked before the job is joined, so a configuration
 * error costs no process group; the plan is resolved before any weight is
 * read (tp_model_load); the model owns what this file made (mesh, world)
 * through its on_free hook, so tp_model_free is the one teardown. */
#include "tensorpar/api.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
    tp_group *world;        /* the job's world (owned when own_world)      */
    int own_world;
    tp_mesh *mesh;          /* made here (owned), or NULL                   */
    const tp_mesh *layout;  /* the whole mesh: `mesh` or the caller's       */
    const tp_mesh *tp;      /* its "tp" sub-mesh, or NULL on one rank        */
    tp_dist_sizes sizes;
} pretrained_ctx;

static void ctx_free(void *p)
{
    pretrained_ctx *c = p;
    if (!c) return;
    tp_mesh_free(c->mesh);
    if (c->own_world) tp_group_free(c->world);
    free(c);
}

static const pretrained_ctx *ctx_of(const tp_model *m)
{
    return m && m->on_free == ctx_free ? m->on_free_ctx : NULL;
}

/* The sizes of §5.2 for this job.  With a caller's mesh (a ParallelismConfig
 * layout), tp_size comes from its "tp" dimension when the config leaves it
 * null, since the derivation from WORLD_SIZE would count the dp ranks. */
static tp_status job_sizes(const tp_dist_config *cfg, tp_dist_sizes *s, int *world_size, int *rank)
{
    tp_dist_config c = *cfg;
    tp_status st;
    if (cfg->mesh) {
        *world_size = tp_mesh_world_size(cfg->mesh);
        *rank = tp_mesh_world_rank(cfg->mesh);
        const tp_mesh *tp = tp_mesh_sub(cfg->mesh, "tp");
        if (!tp) return tp_fail_context(TP_ERR_INVALID, "the mesh given to tp_model_from_pretrained");
        if (c.tp_size && c.tp_size != tp_mesh_size(tp, 0))
            return tp_fail(TP_ERR_INVALID, "tp_size is %d but the mesh's \"tp\" dimension has %d ranks", c.tp_size,
                           tp_mesh_size(tp, 0));
        c.tp_size = tp_mesh_size(tp, 0);
        return tp_dist_config_resolve(&c, *world_size, *rank, s);
    }
    if (cfg->world) {
        *world_size = tp_group_size(cfg->world);
        *rank = tp_group_rank(cfg->world);
    } else if ((st = tp_comm_job_layout(rank, world_size, NULL, NULL))) {
        return st;
    }
    return tp_dist_config_resolve(&c, *world_size, *rank, s);
}

/* Joins the job and lays it out as ("dp_replicate", "fsdp", "tp").  A
 * single process with nothing to split joins nothing: the model runs
 * unsplit, as §5.5 says, and a plan given at tp_size 1 is only checked. */
static tp_status make_layout(const tp_dist_config *cfg, int world_size, pretrained_ctx *x)
{
    tp_status st;
    x->world = cfg->world;
    if (cfg->mesh) {
        x->layout = cfg->mesh;
        x->tp = tp_mesh_sub(x->layout, "tp");
        return TP_OK;
    }
    if ((st = tp_dist_check_world(&x->sizes, world_size))) return st;
    const tp_dist_sizes *s = &x->sizes;
    if ((long long)s->dp_replicate_size * s->fsdp_size * s->tp_size == 1) return TP_OK;   /* no mesh (§5.5) */
    if (!x->world) {
        if ((st = tp_comm_init(&x->world, NULL))) return st;
        x->own_world = 1;
    }
    static const char *const names[] = {"dp_replicate", "fsdp", "tp"};
    const int sizes[] = {s->dp_replicate_size, s->fsdp_size, s->tp_size};
    if ((st = tp_mesh_new(x->world, 3, names, sizes, &x->mesh))) return st;
    x->layout = x->mesh;
    x->tp = tp_mesh_sub(x->layout, "tp");
    return TP_OK;
}

/* The caller's loading options, or the settings from the environment with
 * the host's cores shared among its ranks (as the CLI does). */
static tp_status model_options(const tp_dist_config *cfg, const pretrained_ctx *x, tp_dtype dtype,
                               tp_model_options *mo)
{
    if (cfg->model) {
        *mo = *cfg->model;
    } else {
        memset(mo, 0, sizeof *mo);
        tp_status st = tp_model_options_from_env(mo);
        if (st) return st;
        int cores = tp_cpu_count(), local_rank = 0, local_size = 1;
        if (x->world) {
            local_rank = tp_group_local_rank(x->world);
            local_size = tp_group_local_size(x->world) > 0 ? tp_group_local_size(x->world) : 1;
        }
        mo->threads = cores / local_size > 0 ? cores / local_size : 1;
        mo->first_cpu = (int)((long long)local_rank * mo->threads % cores);
    }
    mo->weight_dtype = dtype;
    int tp_wanted = x->sizes.tp_size > 1 || cfg->tp_plan || cfg->plan;
    mo->mesh = tp_wanted ? x->tp : NULL;
    mo->tp_plan = x->sizes.tp_plan;
    /* ep_size = tp_size (§5.2): the experts split over the same ranks */
    mo->expert_parallel = x->sizes.enable_expert_parallel;
    mo->plan = cfg->plan;
    mo->styles = cfg->styles;
    if (x->layout && tp_mesh_world_rank(x->layout) != 0) mo->show_progress = 0;   /* one bar per job */
    return TP_OK;
}

tp_status tp_model_from_pretrained(tp_model **out, const char *dir, tp_dtype dtype, const tp_dist_config *cfg)
{
    static const tp_dist_config none;
    *out = NULL;
    if (!cfg) cfg = &none;
    if (dtype != TP_F32 && dtype != TP_BF16 && dtype != TP_Q8_0 && dtype != TP_Q4_0 && dtype != TP_DTYPE_COUNT)
        return tp_fail(TP_ERR_INVALID, "tp_model_from_pretrained: dtype %s: f32, bf16, q8_0, q4_0 or TP_DTYPE_COUNT "
                       "(as stored)", tp_dtype_name(dtype));
    pretrained_ctx *x = calloc(1, sizeof *x);
    if (!x) return tp_fail(TP_ERR_NOMEM, "out of memory");
    int world_size, rank;
    tp_model_options mo;
    tp_status st = job_sizes(cfg, &x->sizes, &world_size, &rank);
    if (!st) st = make_layout(cfg, world_size, x);
    if (!st) st = model_options(cfg, x, dtype, &mo);
    if (!st) st = tp_model_load(out, dir, &mo);
    if (st) { ctx_free(x); return st; }
    (*out)->on_free = ctx_free;
    (*out)->on_free_ctx = x;
    return TP_OK;
}

tp_group *tp_model_world(const tp_model *m)
{
    const pretrained_ctx *x = ctx_of(m);
    return x ? x->world : NULL;
}

const tp_mesh *tp_model_device_mesh(const tp_model *m)
{
    const pretrained_ctx *x = ctx_of(m);
    return x ? x->layout : NULL;
}

const tp_mesh *tp_model_tp_mesh(const tp_model *m)
{
    const pretrained_ctx *x = ctx_of(m);
    return x ? x->tp : NULL;
}

const tp_dist_sizes *tp_model_dist_sizes(const tp_model *m)
{
    const pretrained_ctx *x = ctx_of(m);
    return x ? &x->sizes : NULL;
}

tp_status tp_model_choose_tp_rank0(void *ctx, int64_t *id)
{
    const tp_mesh *tp = tp_model_tp_mesh(ctx);
    if (!tp || tp_mesh_size(tp, 0) == 1) return TP_OK;
    return tp_comm_broadcast(tp_mesh_group(tp, 0), id, 1, TP_I64, 0);
}
