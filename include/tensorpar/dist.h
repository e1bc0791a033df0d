/* tensorpar/dist.h — device meshes, placements, DTensors and redistribute.
 *
 * Every byte that crosses between ranks for tensor parallelism is a change of
 * placement (tp-semantics.md §1.2, §1.5), and tp_redistribute() is the one
 * function that performs such changes: strategies state placements, this
 * file picks the collective.
 *
 *   mesh        the world as a row-major grid with named dimensions, e.g.
 *               ("dp", "tp"), tp innermost so TP groups are consecutive
 *               global ranks (§5.5); one process group per dimension.
 *   placement   Replicate, Shard(d), StridedShard(d, s), Partial (sum); one
 *               per mesh dimension.
 *   dtensor     this rank's local shard (contiguous row-major, up to 4-D)
 *               + mesh + placements + global shape.
 *
 * Splits follow the chunk rule of torch.chunk (§1.2): c = ceil(n / P), rank r
 * holds [min(r·c, n), min((r+1)·c, n)), so tail shards may be short or empty.
 * When several mesh dimensions shard the same tensor dimension, they nest in
 * mesh-dimension order (as DTensor does): the inner one splits the outer
 * one's chunk.  A StridedShard dimension must not be sharded by another mesh
 * dimension.
 *
 * Collectives: tp_redistribute and tp_mesh_new are collective over the
 * groups they use; every rank of the mesh must call them in the same order
 * with the same arguments (placements, global shape, dtype).
 */
#ifndef TENSORPAR_DIST_H
#define TENSORPAR_DIST_H

#include "tensorpar/base.h"
#include "tensorpar/comm.h"

#ifdef __cplusplus
extern "C" {
#endif

#define TP_MESH_MAX_DIMS 4
#define TP_MESH_NAME_MAX 24
#define TP_MESH_MAX_FLAT 4

/* ---- chunk rule --------------------------------------------------------- */

/* Rank r's part of a length-n dimension split over P ranks (torch.chunk):
 * *start = min(r·c, n), *size = min((r+1)·c, n) - *start, c = ceil(n / P). */
void tp_chunk_range(int64_t n, int P, int r, int64_t *start, int64_t *size);

/* ---- placements --------------------------------------------------------- */

typedef enum {
    TP_REPLICATE = 0,
    TP_SHARD,           /* dim                                             */
    TP_STRIDED_SHARD,   /* dim, split: `split` packed blocks, each chunked */
    TP_PARTIAL          /* sum over the group                              */
} tp_placement_kind;

typedef struct {
    tp_placement_kind kind;
    int dim;            /* Shard/StridedShard: tensor dim, < 0 from the end */
    int split;          /* StridedShard: number of packed blocks (>= 1)     */
} tp_placement;

static inline tp_placement tp_replicate(void) { tp_placement p = {TP_REPLICATE, 0, 0}; return p; }
static inline tp_placement tp_shard(int dim) { tp_placement p = {TP_SHARD, dim, 0}; return p; }
static inline tp_placement tp_strided_shard(int dim, int split)
{ tp_placement p = {TP_STRIDED_SHARD, dim, split}; return p; }
static inline tp_placement tp_partial(void) { tp_placement p = {TP_PARTIAL, 0, 0}; return p; }

/* 1 if a and b are the same placement for a tensor of ndim dims (Shard(-1)
 * equals Shard(ndim-1)). */
int tp_placement_equal(tp_placement a, tp_placement b, int ndim);
/* "Replicate()", "Shard(1)", "StridedShard(0, 2)", "Partial(sum)" into buf. */
const char *tp_placement_str(tp_placement p, char *buf, size_t cap);

/* Checks one placement per mesh dimension against a global shape, and
 * writes them to out (may equal pl) with negative dims made non-negative. */
tp_status tp_placements_normalize(int mesh_ndim, const tp_placement *pl, int ndim,
                                  const int64_t *gshape, tp_placement *out);

/* Where one rank's shard lies along one tensor dimension, in global indices:
 * `nblocks` blocks (1, or s for StridedShard), block b covering
 * [b·block_len + start, b·block_len + start + size).  Local length is
 * nblocks·size; local index l is global (l / size)·block_len + start + l % size. */
typedef struct {
    int64_t nblocks, block_len, start, size;
} tp_dim_layout;

/* The layout of the shard of the rank at mesh coordinates `coords` (mesh of
 * `mesh_ndim` dims with sizes `mesh_sizes`), for every tensor dimension.
 * Pure arithmetic, no communication; placements are normalized first. */
tp_status tp_placement_layout(int mesh_ndim, const int *mesh_sizes, const int *coords,
                              const tp_placement *pl, int ndim, const int64_t *gshape,
                              tp_dim_layout *out);
/* The local shape only (out[i] = nblocks·size of dimension i). */
tp_status tp_placement_local_shape(int mesh_ndim, const int *mesh_sizes, const int *coords,
                                   const tp_placement *pl, int ndim, const int64_t *gshape,
                                   int64_t *out);

/* ---- redistribution plans (pure; what tp_redistribute will do) ---------- */

typedef enum {
    TP_COLL_NONE = 0,      /* identity                                        */
    TP_COLL_LOCAL_SLICE,   /* Replicate -> Shard/StridedShard: keep own chunk  */
    TP_COLL_ZERO_NONROOT,  /* Replicate -> Partial: group rank 0 keeps values */
    TP_COLL_ALL_REDUCE,    /* Partial -> Replicate                            */
    TP_COLL_REDUCE_SCATTER,/* Partial -> Shard(d)                             */
    TP_COLL_ALL_GATHER,    /* Shard/StridedShard -> Replicate                 */
    TP_COLL_ALL_TO_ALL     /* Shard(i) -> Shard(j)                            */
} tp_collective;

const char *tp_collective_name(tp_collective c);
/* 1 when c moves data between ranks (not none, local_slice, zero_nonroot). */
int tp_collective_communicates(tp_collective c);

/* The one rule for changing one mesh dimension's placement (§1.5; the table
 * is in src/dist/plan.c): the operation that starts the move from `from` to
 * `to`, and in *via the placement it lands on: `to` itself, or Replicate
 * when the pair takes two steps (a sharded source that cannot reach `to`
 * in one all-to-all is gathered first).  Both placements normalized for a
 * tensor of ndim dims.  tp_redistribute_plan and the plan report both ask
 * this function; nothing else decides a collective. */
tp_collective tp_placement_step(tp_placement from, tp_placement to, int ndim, tp_placement *via);

/* One step changes the placement of one mesh dimension. */
typedef struct {
    int mesh_dim;
    tp_collective coll;
    tp_placement from, to;
} tp_redist_step;

#define TP_REDIST_MAX_STEPS (2 * TP_MESH_MAX_DIMS)

/* The steps turning placements `src` into `dst` (both normalized and valid
 * for a tensor of ndim dims); *nsteps = 0 when nothing changes. */
tp_status tp_redistribute_plan(int mesh_ndim, const tp_placement *src, const tp_placement *dst,
                               int ndim, tp_redist_step *steps, int *nsteps);

/* ---- device mesh -------------------------------------------------------- */

typedef struct tp_mesh tp_mesh;

/* Arranges the ranks of `world` as a row-major grid of ndim named dims; the
 * product of the sizes must equal the world size.  Creates one group per
 * dimension (the ranks that differ only in that coordinate); a dimension that
 * spans the whole world reuses `world`.  Collective over `world`, which must
 * outlive the mesh. */
tp_status tp_mesh_new(tp_group *world, int ndim, const char *const *names, const int *sizes,
                      tp_mesh **out);
/* The common case: one dimension named `name` over the whole world. */
tp_status tp_mesh_new_1d(tp_group *world, const char *name, tp_mesh **out);
/* Frees the mesh and its groups; not collective; NULL is fine. */
void tp_mesh_free(tp_mesh *m);

int tp_mesh_ndim(const tp_mesh *m);
/* Size / name / this rank's coordinate of dimension d. */
int tp_mesh_size(const tp_mesh *m, int d);
const char *tp_mesh_dim_name(const tp_mesh *m, int d);
int tp_mesh_coord(const tp_mesh *m, int d);
/* All sizes (int[ndim]) and this rank's coordinates, for tp_placement_*. */
const int *tp_mesh_sizes(const tp_mesh *m);
const int *tp_mesh_coords(const tp_mesh *m);
/* The index of the dimension called `name`, or -1. */
int tp_mesh_dim_index(const tp_mesh *m, const char *name);
/* The process group along dimension d (borrowed from the mesh). */
tp_group *tp_mesh_group(const tp_mesh *m, int d);
/* mesh["tp"]: the 1-D sub-mesh along the named dimension (this rank's row),
 * or the flattened group of that name (tp_mesh_flatten), owned by the
 * parent, or NULL (with tp_error set) when there is no such
 * dimension. */
const tp_mesh *tp_mesh_sub(const tp_mesh *m, const char *name);
/* DeviceMesh's flattening: a group named `name` over the dimensions dims[0
 * .. n) (named in mesh order): the ranks whose other coordinates equal this
 * rank's, ranked row-major over those dimensions, so ("dp_replicate",
 * "dp_shard") gives the "dp" group of §9.4.  tp_mesh_sub(m, name) returns
 * it as a 1-D mesh owned by m.  At most TP_MESH_MAX_FLAT per mesh.
 * Collective over the world the mesh was made on. */
tp_status tp_mesh_flatten(tp_mesh *m, const char *const *dims, int n, const char *name);
/* A new group over the dimensions dims[0 .. n) as tp_mesh_flatten makes
 * it, not kept by the mesh: the caller frees it (tp_group_free).  E.g.
 * ("dp_shard", "tp"): the ranks that save one replica's checkpoint.
 * Collective over the world the mesh was made on. */
tp_status tp_mesh_group_new(const tp_mesh *m, const char *const *dims, int n, tp_group **out);
int tp_mesh_world_rank(const tp_mesh *m);
int tp_mesh_world_size(const tp_mesh *m);

/* ---- DTensor ------------------------------------------------------------ */

typedef struct {
    const tp_mesh *mesh;                         /* borrowed                 */
    tp_placement placements[TP_MESH_MAX_DIMS];   /* normalized, one per dim  */
    int ndim;                                    /* of the global tensor     */
    int64_t shape[TP_MAX_DIMS];                  /* global shape             */
    tp_tensor local;                             /* this rank's shard        */
} tp_dtensor;

/* A zero-filled DTensor with an owned local buffer of the right shape. */
tp_status tp_dtensor_init(tp_dtensor *dt, const tp_mesh *mesh, const tp_placement *pl,
                          tp_dtype dtype, int ndim, const int64_t *gshape);
/* Wraps this rank's local shard (borrowed: `local_data` must outlive dt and
 * hold the local shape that the placements give).  No communication. */
tp_status tp_dtensor_from_local(tp_dtensor *dt, const tp_mesh *mesh, const tp_placement *pl,
                                tp_dtype dtype, int ndim, const int64_t *gshape, void *local_data);
/* distribute_tensor: every rank holds the same full tensor and keeps its own
 * shard of it (Partial: mesh-rank 0 of that dimension keeps the values, the
 * others zeros).  No communication; dt owns its buffer. */
tp_status tp_dtensor_distribute(tp_dtensor *dt, const tp_mesh *mesh, const tp_placement *pl,
                                const tp_tensor *full);
/* full_tensor(): redistributes to Replicate everywhere and hands the result
 * to *full (owned).  Collective. */
tp_status tp_dtensor_full(const tp_dtensor *dt, tp_tensor *full);
/* The layout of the shard held at mesh coordinates `coords` (NULL: this
 * rank), per tensor dimension; offset of a plain shard = layout[i].start. */
tp_status tp_dtensor_layout(const tp_dtensor *dt, const int *coords, tp_dim_layout *out);
void tp_dtensor_release(tp_dtensor *dt);

/* ---- redistribute ------------------------------------------------------- */

/* Changes src's placements to dst_pl, writing a new DTensor to *out (owned
 * local buffer; out must not be src).  Collective over the mesh groups of the
 * dimensions that change. */
tp_status tp_redistribute(const tp_dtensor *src, const tp_placement *dst_pl, tp_dtensor *out);

/* The same on raw local buffers: src_local holds this rank's shard under
 * src_pl, dst_local receives the shard under dst_pl (sized by
 * tp_placement_local_shape).  dst_local may equal src_local when both local
 * shapes are equal; Partial -> Replicate is then one in-place all_reduce with
 * no copy (the per-layer activation all-reduce).  Otherwise the buffers must
 * not overlap. */
tp_status tp_redistribute_local(const tp_mesh *mesh, tp_dtype dtype, int ndim, const int64_t *gshape,
                                const tp_placement *src_pl, const void *src_local,
                                const tp_placement *dst_pl, void *dst_local);

/* ---- redistribute with a row-wise epilogue (src/dist/redistribute_rows.c)
 * Partial -> Replicate of an f32 matrix [rows, row_len] on a 1-D mesh, as
 * two moves with a step between: Partial -> Shard(0) (each rank sums its own
 * rows, torch.chunk's split, over every rank's summand in rank order), then
 * fn(ctx, first_row, nrows, rows) on those rows — in one or more calls,
 * ascending, rewriting them in place — then Shard(0) -> Replicate.  For the
 * residual add and norm after a row-parallel module: each rank does its own
 * rows while they are in its cache.  With src and dst apart this is one
 * collective (tp_comm_all_reduce_rows); otherwise the two moves run through
 * tp_redistribute_local.  The bits are the same either way. */
typedef void (*tp_redist_rows_fn)(void *ctx, int64_t first_row, int64_t nrows, float *rows);
typedef struct {
    tp_redist_rows_fn fn;
    void *ctx;
} tp_redist_epilogue;
tp_status tp_redistribute_rows(const tp_mesh *mesh, const int64_t gshape[2], const float *src_partial,
                               float *dst_replicated, const tp_redist_epilogue *ep);

/* ---- backward (src/dist/backward.c) ------------------------------------ */

/* The conjugate of tp_redistribute for gradients, as DTensor's
 * Redistribute.backward: the gradient `grad_out` (placed as the forward's
 * output, or Partial when it is a per-rank partial sum) goes back to the
 * forward's source placements `fwd_src_pl`, except that a Partial source
 * becomes Replicate unless the gradient itself is Partial.  The global value
 * is unchanged (the adjoint of an identity); only the layout, and so the
 * collective, changes.  Collective like tp_redistribute. */
tp_status tp_redistribute_backward(const tp_dtensor *grad_out, const tp_placement *fwd_src_pl,
                                   tp_dtensor *grad_in);
/* The same on raw local buffers (see tp_redistribute_local). */
tp_status tp_redistribute_backward_local(const tp_mesh *mesh, tp_dtype dtype, int ndim, const int64_t *gshape,
                                         const tp_placement *grad_pl, const void *grad_local,
                                         const tp_placement *fwd_src_pl, void *grad_in_local);
/* Where the gradient lands: the rule above, per mesh dimension, no
 * communication. */
void tp_redistribute_backward_placements(int mesh_ndim, const tp_placement *fwd_src,
                                         const tp_placement *grad_pl, tp_placement *out);

#ifdef __cplusplus
}
#endif
#endif
