/* tensorpar/api.h — the seeds' configuration objects and one-call loading.
 *
 *   tp_dist_config         Transformers' DistributedConfig (tp-semantics.md
 *                          §5.1): the loading-time layout, as a C struct or
 *                          its JSON form; sizes derived and checked as §5.2
 *                          says (tp_dist_config_resolve).
 *   tp_parallelism_config  accelerate's ParallelismConfig (§9.4): the
 *                          training-time layout, its environment variables,
 *                          the mesh ["dp_replicate", "dp_shard", "cp", "tp"]
 *                          with the flattened "dp" groups, and the Trainer
 *                          rule of §9.5.
 *   tp_model_from_pretrained  joins the job (or uses the caller's world),
 *                          builds the mesh and loads the model with
 *                          shard-on-read on its "tp" sub-mesh.
 *
 *     tp_dist_config dc = { .tp_plan = "auto" };     // tp_size from WORLD_SIZE
 *     tp_model *m;
 *     if (tp_model_from_pretrained(&m, "path/to/model", TP_BF16, &dc))
 *         fprintf(stderr, "%s\n", tp_error());
 *     ...                                            // every rank alike
 *     tp_model_free(m);                              // the mesh and world too
 *
 * Sizes in the structs: 0 means "null" (not given), as a zero-initialised
 * struct asks for every default; a given size must be >= 1, so a negative
 * one is the §5.2 error.  The JSON form tells null (or absent) from 0, and
 * refuses 0 with that error, as Transformers does.
 */
#ifndef TENSORPAR_API_H
#define TENSORPAR_API_H

#include "tensorpar/base.h"
#include "tensorpar/comm.h"
#include "tensorpar/dist.h"
#include "tensorpar/models.h"
#include "tensorpar/parallel.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- DistributedConfig (§5.1, §5.2) ------------------------------------- */

typedef struct {
    int tp_size;                  /* 0: derived (§5.2 step 3)                   */
    /* The plan: NULL (null: "auto" when tp_size > 1), "auto", or a JSON
     * file; or `plan`, a plan object (not both).  The config borrows both. */
    const char *tp_plan;
    const tp_plan *plan;
    int ep_size;                  /* 0: 1, or tp_size with the legacy flag      */
    int enable_expert_parallel;   /* deprecated alias of ep_size = tp_size     */
    int enable_sequence_parallel; /* reserved; no effect, as in Transformers    */
    int fsdp_size;                /* 0: 1; the same as dp_shard_size (§9.4)     */
    int dp_replicate_size;        /* 0: 1; replicas holding full TP shards      */
    int fsdp_cpu_offload;         /* accepted; everything is in host memory    */
    int fsdp_mixed_precision;     /* accepted, stored                          */
    int pp_size;                  /* 0: 1; only 1 is supported                 */

    /* How to load (not part of Transformers' DistributedConfig):
     * world   the job's world group; NULL: tp_model_from_pretrained joins
     *         the job from the environment (tp_comm_init) and owns it;
     * mesh    a process layout already built (tp_parallelism_config_mesh):
     *         the model goes onto its "tp" sub-mesh; NULL: the inference mesh
     *         of §5.5 is built on the world;
     * model   threads, pinning and the TENSORPAR_* settings (its mesh and
     *         plan fields are ignored); NULL: the settings from the
     *         environment and the cores divided among the host's ranks;
     * styles  the style registry of the plan (NULL: the default one). */
    tp_group *world;
    const tp_mesh *mesh;
    const tp_model_options *model;
    const tp_style_registry *styles;

    /* Owned by tp_dist_config_from_json (freed by tp_dist_config_release). */
    tp_plan *owned_plan;
    char *owned_text;
} tp_dist_config;

/* The derived sizes (§5.2), every one >= 1. */
typedef struct {
    int tp_size, ep_size, fsdp_size, dp_replicate_size, pp_size;
    int efsdp_size;               /* fsdp_size · tp_size / ep_size              */
    int enable_expert_parallel;   /* ep_size > 1                               */
    /* "auto" when tp_size > 1 and no plan was given; else the config's
     * tp_plan (borrowed) or NULL. */
    const char *tp_plan;
    /* The deprecation warning of step 4, or "" (tp_dist_config_resolve
     * prints it when asked to). */
    char warning[256];
} tp_dist_sizes;

/* §5.2 in its order, for a job of world_size processes (the value of
 * WORLD_SIZE; see tp_dist_world_size).  Errors carry the spec's messages.
 * When `warn_rank` is 0 the warning, if any, is logged (global rank 0
 * warns, other ranks pass their rank).  Checks nothing against the mesh:
 * tp_dist_check_world does (§5.5). */
tp_status tp_dist_config_resolve(const tp_dist_config *c, int world_size, int warn_rank, tp_dist_sizes *out);

/* §5.5: the mesh dp_replicate · pp · fsdp · tp must have world_size
 * processes: "The parallel mesh requires <n> processes, but world_size is
 * <W>."  (All sizes 1: no mesh, always fine.) */
tp_status tp_dist_check_world(const tp_dist_sizes *s, int world_size);

/* The job's size as a launcher set it, without joining: WORLD_SIZE, else
 * mpirun's OMPI_COMM_WORLD_SIZE, else 1 (tp_comm_job_layout). */
tp_status tp_dist_world_size(int *world_size);

/* The JSON form: an object with the fields above (null or absent: not
 * given).  tp_plan is "auto", a file name, an object (a plan, parsed with
 * tp_plan_parse) or null; dp_shard_size is accepted as fsdp_size's name.
 * Unknown keys are ignored, as §5.1 says, and named in one warning.  A
 * field of the wrong type, or a size of 0 or less, is an error naming it.
 * *c is zeroed first; tp_dist_config_release frees what it owns. */
tp_status tp_dist_config_from_json(tp_dist_config *c, const char *json_text);
/* The same from a file. */
tp_status tp_dist_config_load(tp_dist_config *c, const char *path);
/* Every field, null where not given (malloc'd text). */
char *tp_dist_config_to_json(const tp_dist_config *c);
void tp_dist_config_release(tp_dist_config *c);

/* ---- ParallelismConfig (§9.4, §9.5) ------------------------------------- */

typedef struct {
    /* 0: the environment variable (PARALLELISM_CONFIG_DP_REPLICATE_SIZE,
     * _DP_SHARD_SIZE, _CP_SIZE, _TP_SIZE), else 1. */
    int dp_replicate_size, dp_shard_size, cp_size, tp_size;
} tp_parallelism_config;

/* Fills the fields left 0 from the environment variables, else 1.  A
 * variable that is not an integer is an error naming it and its value. */
tp_status tp_parallelism_config_from_env(tp_parallelism_config *c);

/* §9.4's constraints for a job of world_size processes, in place: sizes
 * >= 1, cp_size 1, a product of 1 with a larger world becomes
 * dp_replicate_size = world_size, and the product must equal world_size.
 * Fields left 0 read the environment first. */
tp_status tp_parallelism_config_resolve(tp_parallelism_config *c, int world_size);

/* The mesh ["dp_replicate", "dp_shard", "cp", "tp"] over `world`, every
 * dimension kept, size 1 included (so mesh["dp_shard"] always exists), tp
 * innermost; plus the flattened groups "dp" (dp_replicate × dp_shard),
 * "dp_shard_cp" and "dp_cp" as named sub-meshes (tp_mesh_sub).  Resolves
 * *c first.  Collective over world. */
tp_status tp_parallelism_config_mesh(tp_parallelism_config *c, tp_group *world, tp_mesh **out);

/* Trainer's rule (§9.5): an all-zero c means "none given" and becomes
 * tp_size = model_tp_size.  Otherwise c's fields are read as given (the
 * environment filling those left 0), and a tp_size other than the model's
 * is overwritten with it while rank `warn_rank` 0 warns, naming both;
 * *overwrote (may be NULL) says whether it did. */
tp_status tp_parallelism_config_for_model(tp_parallelism_config *c, int model_tp_size, int warn_rank,
                                          int *overwrote);

/* ---- loading ------------------------------------------------------------- */

/* §5.6 in one call: resolve the config's sizes (§5.2) for the job, join
 * the job (cfg->world NULL: tp_comm_init from the environment), check the
 * world against them (§5.5), build the mesh ("dp_replicate", "fsdp", "tp")
 * (pp is 1), or take cfg->mesh, and load `dir` onto its "tp" sub-mesh, each
 * rank reading only its slices.  dtype: TP_F32, TP_BF16, TP_Q8_0, TP_Q4_0 or
 * TP_DTYPE_COUNT ("as stored").  cfg NULL: a zero config (tp_size from WORLD_SIZE only
 * with a plan, so one rank unless launched).  Expert parallelism is refused
 * (§5.2's checks pass first).  Collective over the world.  tp_model_free
 * then frees what this call made: the mesh and, when it joined the job,
 * the world group. */
tp_status tp_model_from_pretrained(tp_model **out, const char *dir, tp_dtype dtype, const tp_dist_config *cfg);

/* What a model from tp_model_from_pretrained runs on (NULL / 0 for a model
 * loaded otherwise): the job's world group, the whole mesh, its "tp"
 * sub-mesh, and the derived sizes. */
tp_group *tp_model_world(const tp_model *m);
const tp_mesh *tp_model_device_mesh(const tp_model *m);
const tp_mesh *tp_model_tp_mesh(const tp_model *m);
const tp_dist_sizes *tp_model_dist_sizes(const tp_model *m);

/* A tp_choose_callback (ctx: the model) that gives every rank of the
 * model's TP group its TP rank 0's token (§10.7). */
tp_status tp_model_choose_tp_rank0(void *ctx, int64_t *id);

#ifdef __cplusplus
}
#endif
#endif
