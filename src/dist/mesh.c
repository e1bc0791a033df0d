/* DeviceMesh: the world as a row-major grid of named dimensions (§5.5).
 *
 * Row-major with the last dimension innermost, so with ("dp", "tp") the TP
 * groups are runs of consecutive global ranks:
 *     global = (c_0 · size_1 + c_1) · size_2 + c_2 ...
 * Each dimension gets the process group of the ranks that differ only in that
 * coordinate; mesh["tp"] is a 1-D mesh borrowing that group.  A flattened
 * group ("dp" = dp_replicate × dp_shard) is a named 1-D mesh over several
 * dimensions, with a group of its own (tp_mesh_flatten). */
#include "tensorpar/dist.h"

#include <stdlib.h>
#include <string.h>

struct tp_mesh {
    int ndim;
    int sizes[TP_MESH_MAX_DIMS];
    int coords[TP_MESH_MAX_DIMS];
    char names[TP_MESH_MAX_DIMS][TP_MESH_NAME_MAX];
    tp_group *groups[TP_MESH_MAX_DIMS];
    int owns_group[TP_MESH_MAX_DIMS];
    tp_mesh *sub[TP_MESH_MAX_DIMS];   /* 1-D views; NULL in a 1-D mesh */
    tp_mesh *flat[TP_MESH_MAX_FLAT];  /* flattened groups, 1-D, own their group */
    int nflat;
    tp_group *world;                  /* borrowed: flattening splits it */
    int world_rank, world_size;
};

static tp_status check_shape(tp_group *world, int ndim, const char *const *names, const int *sizes)
{
    if (ndim < 1 || ndim > TP_MESH_MAX_DIMS)
        return tp_fail(TP_ERR_INVALID, "a mesh has 1 to %d dimensions, not %d", TP_MESH_MAX_DIMS, ndim);
    long long n = 1;
    for (int d = 0; d < ndim; d++) {
        if (sizes[d] < 1) return tp_fail(TP_ERR_INVALID, "mesh dimension %d has size %d", d, sizes[d]);
        if (!names[d] || !names[d][0] || strlen(names[d]) >= TP_MESH_NAME_MAX)
            return tp_fail(TP_ERR_INVALID, "mesh dimension %d needs a name of 1 to %d characters", d,
                           TP_MESH_NAME_MAX - 1);
        for (int e = 0; e < d; e++)
            if (!strcmp(names[d], names[e]))
                return tp_fail(TP_ERR_INVALID, "mesh dimension name '%s' is used twice", names[d]);
        n *= sizes[d];
    }
    if (n != tp_group_size(world))
        return tp_fail(TP_ERR_INVALID, "The parallel mesh requires %lld processes, but world_size is %d.",
                       n, tp_group_size(world));
    return TP_OK;
}

/* The color of a rank's group along d: its row-major index with coordinate d
 * dropped, so ranks differing only in c_d share it. */
static int color_without(const tp_mesh *m, int d)
{
    int c = 0;
    for (int e = 0; e < m->ndim; e++)
        if (e != d) c = c * m->sizes[e] + m->coords[e];
    return c;
}

static tp_status make_groups(tp_mesh *m, tp_group *world)
{
    for (int d = 0; d < m->ndim; d++) {
        if (m->sizes[d] == m->world_size) {
            /* The dimension spans the world in world order: reuse it
             * rather than build a second segment for the same ranks. */
            m->groups[d] = world;
            continue;
        }
        /* split is collective over the whole world, so every rank makes
         * every dimension's group in the same order. */
        tp_status st = tp_group_split(world, color_without(m, d), m->coords[d], &m->groups[d]);
        if (st) return tp_fail_context(st, "creating the group of mesh dimension '%s'", m->names[d]);
        m->owns_group[d] = 1;
    }
    return TP_OK;
}

static tp_mesh *sub_view(const tp_mesh *m, int d)
{
    tp_mesh *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->ndim = 1;
    s->sizes[0] = m->sizes[d];
    s->coords[0] = m->coords[d];
    memcpy(s->names[0], m->names[d], TP_MESH_NAME_MAX);
    s->groups[0] = m->groups[d];
    s->world_rank = m->world_rank;
    s->world_size = m->world_size;
    return s;
}

tp_status tp_mesh_new(tp_group *world, int ndim, const char *const *names, const int *sizes,
                      tp_mesh **out)
{
    *out = NULL;
    tp_status st = check_shape(world, ndim, names, sizes);
    if (st) return st;
    tp_mesh *m = calloc(1, sizeof *m);
    if (!m) return tp_fail(TP_ERR_NOMEM, "out of memory");
    m->ndim = ndim;
    m->world = world;
    m->world_rank = tp_group_rank(world);
    m->world_size = tp_group_size(world);
    int rest = m->world_rank;
    for (int d = ndim - 1; d >= 0; d--) {
        m->sizes[d] = sizes[d];
        m->coords[d] = rest % sizes[d];
        rest /= sizes[d];
        strcpy(m->names[d], names[d]);
    }
    st = make_groups(m, world);
    for (int d = 0; st == TP_OK && ndim > 1 && d < ndim; d++)
        if (!(m->sub[d] = sub_view(m, d))) st = tp_fail(TP_ERR_NOMEM, "out of memory");
    if (st) { tp_mesh_free(m); return st; }
    *out = m;
    return TP_OK;
}

tp_status tp_mesh_new_1d(tp_group *world, const char *name, tp_mesh **out)
{
    int size = tp_group_size(world);
    return tp_mesh_new(world, 1, &name, &size, out);
}

void tp_mesh_free(tp_mesh *m)
{
    if (!m) return;
    for (int d = 0; d < m->ndim; d++) {
        if (m->owns_group[d]) tp_group_free(m->groups[d]);
        free(m->sub[d]);
    }
    for (int i = 0; i < m->nflat; i++) tp_mesh_free(m->flat[i]);
    free(m);
}

int tp_mesh_ndim(const tp_mesh *m) { return m->ndim; }
int tp_mesh_size(const tp_mesh *m, int d) { return d >= 0 && d < m->ndim ? m->sizes[d] : 0; }
const char *tp_mesh_dim_name(const tp_mesh *m, int d) { return d >= 0 && d < m->ndim ? m->names[d] : NULL; }
int tp_mesh_coord(const tp_mesh *m, int d) { return d >= 0 && d < m->ndim ? m->coords[d] : -1; }
const int *tp_mesh_sizes(const tp_mesh *m) { return m->sizes; }
const int *tp_mesh_coords(const tp_mesh *m) { return m->coords; }
tp_group *tp_mesh_group(const tp_mesh *m, int d) { return d >= 0 && d < m->ndim ? m->groups[d] : NULL; }
int tp_mesh_world_rank(const tp_mesh *m) { return m->world_rank; }
int tp_mesh_world_size(const tp_mesh *m) { return m->world_size; }

int tp_mesh_dim_index(const tp_mesh *m, const char *name)
{
    for (int d = 0; name && d < m->ndim; d++)
        if (!strcmp(m->names[d], name)) return d;
    return -1;
}

const tp_mesh *tp_mesh_sub(const tp_mesh *m, const char *name)
{
    int d = tp_mesh_dim_index(m, name);
    for (int i = 0; d < 0 && name && i < m->nflat; i++)
        if (!strcmp(m->flat[i]->names[0], name)) return m->flat[i];
    if (d < 0) {
        tp_fail(TP_ERR_INVALID, "the mesh has no dimension named '%s'", name ? name : "(null)");
        return NULL;
    }
    return m->ndim == 1 ? m : m->sub[d];
}

/* Which dimensions a flattened group covers, as a mask; they must be named
 * in mesh order, each once, and the name must be new. */
static tp_status dims_mask(const tp_mesh *m, const char *const *dims, int n, const char *name, unsigned *mask);

static tp_status flatten_dims(const tp_mesh *m, const char *const *dims, int n, const char *name, unsigned *mask)
{
    if (!name || !name[0] || strlen(name) >= TP_MESH_NAME_MAX)
        return tp_fail(TP_ERR_INVALID, "a flattened group needs a name of 1 to %d characters", TP_MESH_NAME_MAX - 1);
    if (tp_mesh_dim_index(m, name) >= 0) return tp_fail(TP_ERR_INVALID, "'%s' is already a mesh dimension", name);
    for (int i = 0; i < m->nflat; i++)
        if (!strcmp(m->flat[i]->names[0], name))
            return tp_fail(TP_ERR_INVALID, "the mesh already has a flattened group '%s'", name);
    if (m->nflat == TP_MESH_MAX_FLAT)
        return tp_fail(TP_ERR_INVALID, "a mesh has at most %d flattened groups", TP_MESH_MAX_FLAT);
    return dims_mask(m, dims, n, name, mask);
}

/* The dimensions dims[0 .. n) as a mask: named in mesh order, each once. */
static tp_status dims_mask(const tp_mesh *m, const char *const *dims, int n, const char *name, unsigned *mask)
{
    if (n < 1 || n > m->ndim) return tp_fail(TP_ERR_INVALID, "flattening '%s': 1 to %d dimensions, not %d", name, m->ndim, n);
    *mask = 0;
    int last = -1;
    for (int i = 0; i < n; i++) {
        int d = tp_mesh_dim_index(m, dims[i]);
        if (d < 0) return tp_fail(TP_ERR_INVALID, "flattening '%s': the mesh has no dimension named '%s'", name,
                                  dims[i] ? dims[i] : "(null)");
        if (d <= last) return tp_fail(TP_ERR_INVALID, "flattening '%s': dimensions must be named once, in mesh order", name);
        last = d;
        *mask |= 1u << d;
    }
    return TP_OK;
}

/* The group a flattening over mask gives this rank: its size, this
 * rank's place in it (row-major over the chosen dimensions) and the color
 * that tells the groups apart (the other coordinates, row-major). */
static void flat_place(const tp_mesh *m, unsigned mask, int *size, int *coord, int *color)
{
    *size = 1, *coord = 0, *color = 0;
    for (int d = 0; d < m->ndim; d++) {
        if (mask & (1u << d)) {
            *size *= m->sizes[d];
            *coord = *coord * m->sizes[d] + m->coords[d];
        } else {
            *color = *color * m->sizes[d] + m->coords[d];
        }
    }
}

tp_status tp_mesh_group_new(const tp_mesh *m, const char *const *dims, int n, tp_group **out)
{
    *out = NULL;
    unsigned mask = 0;
    tp_status st = dims_mask(m, dims, n, "a group", &mask);
    if (st) return st;
    int size, coord, color;
    flat_place(m, mask, &size, &coord, &color);
    st = tp_group_split(m->world, color, coord, out);
    return st ? tp_fail_context(st, "creating a group over %d mesh dimensions", n) : TP_OK;
}

tp_status tp_mesh_flatten(tp_mesh *m, const char *const *dims, int n, const char *name)
{
    unsigned mask = 0;
    tp_status st = flatten_dims(m, dims, n, name, &mask);
    if (st) return st;
    int size, coord, color;
    flat_place(m, mask, &size, &coord, &color);
    tp_mesh *f = calloc(1, sizeof *f);
    if (!f) return tp_fail(TP_ERR_NOMEM, "out of memory");
    f->ndim = 1;
    f->sizes[0] = size;
    f->coords[0] = coord;
    strcpy(f->names[0], name);
    f->world = m->world;
    f->world_rank = m->world_rank;
    f->world_size = m->world_size;
    if (size == m->world_size) {
        f->groups[0] = m->world;   /* the whole world, in world order */
    } else {
        /* Collective over the world, like the dimensions' groups. */
        st = tp_group_split(m->world, color, coord, &f->groups[0]);
        if (st) { free(f); return tp_fail_context(st, "creating the flattened group '%s'", name); }
        f->owns_group[0] = 1;
    }
    m->flat[m->nflat++] = f;
    return TP_OK;
}
