/* The style registry (§3.5): a process-wide ordered mapping name -> style
 * instance, which is the library's one piece of global mutable state, and
 * registry views that layer a local mapping over it. */
#include "parallel_internal.h"

#include <stdlib.h>
#include <string.h>

/* §2.1, in order: the order of the "Supported styles are [...]" list. */
static const tp_style *const builtins[] = {
    &tp_par_embedding_rowwise, &tp_par_embedding_colwise, &tp_par_colwise_gather_output,
    &tp_par_colwise_rep, &tp_par_colwise, &tp_par_rowwise, &tp_par_rowwise_split_input,
    &tp_par_rowwise_rep, &tp_par_packed_colwise, &tp_par_packed_rowwise, &tp_par_sequence_parallel,
    &tp_par_replicated_with_grad_allreduce, &tp_par_mla_kv_a_proj, &tp_par_all_reduce,
    &tp_par_moe_tp_experts, &tp_par_moe_identity_expert, &tp_par_local_params, &tp_par_grouped_gemm,
    &tp_par_ep_router, &tp_par_local_colwise, &tp_par_local_rowwise, &tp_par_local_packed_rowwise,
    &tp_par_gather, &tp_par_local, &tp_par_replicate,
};
#define N_BUILTINS (sizeof builtins / sizeof builtins[0])

const tp_style *tp_style_builtin(size_t i) { return i < N_BUILTINS ? builtins[i] : NULL; }

/* An ordered mapping; entries are heap copies so that their addresses stay
 * valid while the table grows (plans keep pointers to styles). */
typedef struct {
    tp_style **v;
    size_t n, cap;
} style_map;

struct tp_style_registry { style_map local; };

static style_map global;
static int global_ready;

static tp_style *copy_style(const char *name, const tp_style *st)
{
    tp_style *c = malloc(sizeof *c);
    char *nm = strdup(name);
    if (!c || !nm) { free(c); free(nm); return NULL; }
    *c = *st;
    c->name = nm;
    return c;
}

static void free_style(tp_style *s)
{
    if (!s) return;
    free((char *)s->name);
    free(s);
}

static long map_find(const style_map *m, const char *name)
{
    for (size_t i = 0; i < m->n; i++)
        if (!strcmp(m->v[i]->name, name)) return (long)i;
    return -1;
}

/* Replaces in place (order kept) or appends. */
static tp_status map_put(style_map *m, const char *name, const tp_style *st)
{
    if (!name || !*name) return tp_fail(TP_ERR_INVALID, "a tensor parallel style needs a non-empty name");
    tp_style *c = copy_style(name, st);
    if (!c) return tp_fail(TP_ERR_NOMEM, "out of memory");
    long i = map_find(m, name);
    if (i >= 0) {
        /* Styles are registered before models are built (§3.5), so no
         * resolution still points at the copy being replaced. */
        free_style(m->v[i]);
        m->v[i] = c;
        return TP_OK;
    }
    if (m->n == m->cap) {
        size_t cap = m->cap ? m->cap * 2 : 32;
        tp_style **nv = realloc(m->v, cap * sizeof *nv);
        if (!nv) { free_style(c); return tp_fail(TP_ERR_NOMEM, "out of memory"); }
        m->v = nv;
        m->cap = cap;
    }
    m->v[m->n++] = c;
    return TP_OK;
}

static void map_clear(style_map *m)
{
    for (size_t i = 0; i < m->n; i++) free_style(m->v[i]);
    free(m->v);
    memset(m, 0, sizeof *m);
}

/* Built-ins are installed on first use, so there is no init call to forget. */
static style_map *glob(void)
{
    if (!global_ready) {
        global_ready = 1;
        for (size_t i = 0; i < N_BUILTINS; i++)
            if (map_put(&global, builtins[i]->name, builtins[i])) break;
    }
    return &global;
}

void tp_style_registry_reset(void)
{
    map_clear(&global);
    global_ready = 0;
}

tp_status tp_style_register(const tp_style *style)
{
    if (!style) return tp_fail(TP_ERR_INVALID, "tp_style_register: NULL style");
    return map_put(glob(), style->name, style);
}

const tp_style *tp_style_lookup(const char *name) { return tp_style_registry_get(NULL, name); }

tp_status tp_style_registry_new(tp_style_registry **out)
{
    *out = calloc(1, sizeof **out);
    return *out ? TP_OK : tp_fail(TP_ERR_NOMEM, "out of memory");
}

void tp_style_registry_free(tp_style_registry *v)
{
    if (!v) return;
    map_clear(&v->local);
    free(v);
}

const tp_style *tp_style_registry_get(const tp_style_registry *v, const char *name)
{
    if (!name) return NULL;
    long i;
    if (v && (i = map_find(&v->local, name)) >= 0) return v->local.v[i];
    style_map *g = glob();
    return (i = map_find(g, name)) >= 0 ? g->v[i] : NULL;
}

int tp_style_registry_contains(const tp_style_registry *v, const char *name)
{
    return tp_style_registry_get(v, name) != NULL;
}

tp_status tp_style_registry_set(tp_style_registry *v, const char *name, const tp_style *style)
{
    if (!v) return tp_fail(TP_ERR_INVALID, "tp_style_registry_set: no registry view (use tp_style_register)");
    return map_put(&v->local, name, style);
}

tp_status tp_style_registry_del(tp_style_registry *v, const char *name)
{
    long i = v ? map_find(&v->local, name) : -1;
    if (i < 0) return tp_fail(TP_ERR_INVALID, "style '%s' is not in this registry view's local mapping", name);
    free_style(v->local.v[i]);
    memmove(&v->local.v[i], &v->local.v[i + 1], (v->local.n - (size_t)i - 1) * sizeof v->local.v[0]);
    v->local.n--;
    return TP_OK;
}

/* The i-th local name that the global mapping lacks, or NULL. */
static const char *local_addition(const tp_style_registry *v, size_t i)
{
    if (!v) return NULL;
    for (size_t k = 0; k < v->local.n; k++)
        if (map_find(glob(), v->local.v[k]->name) < 0 && i-- == 0) return v->local.v[k]->name;
    return NULL;
}

size_t tp_style_registry_count(const tp_style_registry *v)
{
    size_t n = glob()->n;
    while (local_addition(v, n - glob()->n)) n++;
    return n;
}

const char *tp_style_registry_name(const tp_style_registry *v, size_t i)
{
    style_map *g = glob();
    return i < g->n ? g->v[i]->name : local_addition(v, i - g->n);
}

char *tp_style_registry_names_repr(const tp_style_registry *v)
{
    tp_par_buf b = {0};
    tp_par_buf_puts(&b, "[");
    size_t n = tp_style_registry_count(v);
    for (size_t i = 0; i < n; i++) {
        if (i) tp_par_buf_puts(&b, ", ");
        tp_par_buf_pyrepr(&b, tp_style_registry_name(v, i));
    }
    tp_par_buf_puts(&b, "]");
    return tp_par_buf_take(&b);
}
