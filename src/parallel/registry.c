/* The style registry (§3.5): registry objects, each an ordered mapping
 * name -> style instance.  The default registry (the process-wide one, the
 * library's one piece of global mutable state) holds the built-ins; a
 * registry made with tp_style_registry_new layers its own mapping over it,
 * so that a model can use styles the rest of the process does not see. */
#include "parallel_internal.h"

#include <pthread.h>
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

/* A registry: its own ordered mapping, layered over `parent` (the default
 * registry) unless it is the default registry itself.
 *
 * Lifetime: resolved plans and models keep `const tp_style *` into the
 * mapping, and §3.5 lets a name be registered again at any time.  An entry
 * that is replaced or deleted therefore moves to `retired` and is freed only
 * when the registry is destroyed (or reset), never while a plan could still
 * point at it.  This was preferred over reference counts because a style
 * pointer is handed to hooks and copied into per-module records everywhere:
 * counting every holder would touch all of them, while the cost here is one
 * kept copy per re-registration, which is rare (styles are set up before
 * models are built).
 *
 * Locking: `lock` guards map and retired.  Writers take it for writing,
 * readers for reading; the style a lookup returns stays valid after the lock
 * is released (see Lifetime).  No code holds two registries' locks for
 * writing, and a view reads its parent only under its own read lock, so
 * there is no lock-order cycle. */
struct tp_style_registry {
    pthread_rwlock_t lock;
    style_map map;
    style_map retired;
    const tp_style_registry *parent;
};

static tp_style_registry default_registry = {.lock = PTHREAD_RWLOCK_INITIALIZER};
static pthread_once_t default_once = PTHREAD_ONCE_INIT;

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

static tp_status map_append(style_map *m, tp_style *c)
{
    if (m->n == m->cap) {
        size_t cap = m->cap ? m->cap * 2 : 32;
        tp_style **nv = realloc(m->v, cap * sizeof *nv);
        if (!nv) return tp_fail(TP_ERR_NOMEM, "out of memory");
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

/* Replaces in place (order kept, as Transformers' ParallelInterface does:
 * a plain mapping update, no error) or appends.  The caller holds the
 * write lock. */
static tp_status put_locked(tp_style_registry *r, tp_style *c)
{
    long i = map_find(&r->map, c->name);
    if (i < 0) return map_append(&r->map, c);
    /* Reserve the retired slot first so that a failure leaves the mapping
     * unchanged. */
    tp_status s = map_append(&r->retired, r->map.v[i]);
    if (!s) r->map.v[i] = c;
    return s;
}

static tp_status registry_put(tp_style_registry *r, const char *name, const tp_style *st)
{
    if (!name || !*name) return tp_fail(TP_ERR_INVALID, "a tensor parallel style needs a non-empty name");
    tp_style *c = copy_style(name, st);
    if (!c) return tp_fail(TP_ERR_NOMEM, "out of memory");
    pthread_rwlock_wrlock(&r->lock);
    tp_status s = put_locked(r, c);
    pthread_rwlock_unlock(&r->lock);
    if (s) free_style(c);
    return s;
}

/* Built-ins are installed on first use, so there is no init call to forget;
 * pthread_once makes that first use safe from any thread. */
static void install_builtins_into(style_map *m)
{
    for (size_t i = 0; i < N_BUILTINS; i++) {
        tp_style *c = copy_style(builtins[i]->name, builtins[i]);
        /* Out of memory at start-up: lookups then fail with "not found". */
        if (!c || map_append(m, c)) { free_style(c); break; }
    }
}

static void install_builtins(void) { install_builtins_into(&default_registry.map); }

static tp_style_registry *default_reg(void)
{
    pthread_once(&default_once, install_builtins);
    return &default_registry;
}

const tp_style_registry *tp_style_registry_default(void) { return default_reg(); }

static const tp_style_registry *or_default(const tp_style_registry *r) { return r ? r : default_reg(); }

void tp_style_registry_reset(void)
{
    tp_style_registry *r = default_reg();
    pthread_rwlock_wrlock(&r->lock);
    map_clear(&r->map);
    map_clear(&r->retired);
    install_builtins_into(&r->map);
    pthread_rwlock_unlock(&r->lock);
}

tp_status tp_style_register(const tp_style *style)
{
    if (!style) return tp_fail(TP_ERR_INVALID, "tp_style_register: NULL style");
    return registry_put(default_reg(), style->name, style);
}

const tp_style *tp_style_lookup(const char *name) { return tp_style_registry_get(NULL, name); }

tp_status tp_style_registry_new(tp_style_registry **out)
{
    *out = calloc(1, sizeof **out);
    if (!*out) return tp_fail(TP_ERR_NOMEM, "out of memory");
    if (pthread_rwlock_init(&(*out)->lock, NULL)) {
        free(*out);
        *out = NULL;
        return tp_fail(TP_ERR_NOMEM, "cannot create the registry's lock");
    }
    (*out)->parent = default_reg();
    return TP_OK;
}

void tp_style_registry_free(tp_style_registry *v)
{
    if (!v || v == &default_registry) return;
    map_clear(&v->map);
    map_clear(&v->retired);
    pthread_rwlock_destroy(&v->lock);
    free(v);
}

/* Local first, then the parent's. */
const tp_style *tp_style_registry_get(const tp_style_registry *v, const char *name)
{
    if (!name) return NULL;
    const tp_style *st = NULL;
    for (const tp_style_registry *r = or_default(v); r && !st; r = r->parent) {
        pthread_rwlock_rdlock((pthread_rwlock_t *)&r->lock);
        long i = map_find(&r->map, name);
        if (i >= 0) st = r->map.v[i];
        pthread_rwlock_unlock((pthread_rwlock_t *)&r->lock);
    }
    return st;
}

int tp_style_registry_contains(const tp_style_registry *v, const char *name)
{
    return tp_style_registry_get(v, name) != NULL;
}

tp_status tp_style_registry_set(tp_style_registry *v, const char *name, const tp_style *style)
{
    if (!v) return tp_fail(TP_ERR_INVALID, "tp_style_registry_set: no registry (use tp_style_register)");
    if (!style) return tp_fail(TP_ERR_INVALID, "tp_style_registry_set: NULL style");
    return registry_put(v, name, style);
}

tp_status tp_style_registry_del(tp_style_registry *v, const char *name)
{
    if (!v || !name) return tp_fail(TP_ERR_INVALID, "tp_style_registry_del: no registry or name");
    pthread_rwlock_wrlock(&v->lock);
    long i = map_find(&v->map, name);
    tp_status s = i < 0 ? TP_ERR_INVALID : map_append(&v->retired, v->map.v[i]);
    if (!s) {
        memmove(&v->map.v[i], &v->map.v[i + 1], (v->map.n - (size_t)i - 1) * sizeof v->map.v[0]);
        v->map.n--;
    }
    pthread_rwlock_unlock(&v->lock);
    if (i < 0) return tp_fail(TP_ERR_INVALID, "style '%s' is not in this registry view's local mapping", name);
    return s;
}

/* Calls fn(name, arg) for valid_keys() in order: the parent's names, then
 * the local names the parent lacks.  Names stay valid after the locks are
 * released (entries are only freed with their registry). */
static void each_name(const tp_style_registry *v, void (*fn)(const char *, void *), void *arg)
{
    v = or_default(v);
    pthread_rwlock_rdlock((pthread_rwlock_t *)&v->lock);
    const tp_style_registry *p = v->parent;
    if (p) pthread_rwlock_rdlock((pthread_rwlock_t *)&p->lock);
    for (size_t i = 0; p && i < p->map.n; i++) fn(p->map.v[i]->name, arg);
    for (size_t i = 0; i < v->map.n; i++)
        if (!p || map_find(&p->map, v->map.v[i]->name) < 0) fn(v->map.v[i]->name, arg);
    if (p) pthread_rwlock_unlock((pthread_rwlock_t *)&p->lock);
    pthread_rwlock_unlock((pthread_rwlock_t *)&v->lock);
}

static void count_one(const char *name, void *arg)
{
    (void)name;
    (*(size_t *)arg)++;
}

size_t tp_style_registry_count(const tp_style_registry *v)
{
    size_t n = 0;
    each_name(v, count_one, &n);
    return n;
}

typedef struct {
    size_t i;
    const char *name;
} nth_name;

static void pick_nth(const char *name, void *arg)
{
    nth_name *q = arg;
    if (q->i-- == 0) q->name = name;
}

const char *tp_style_registry_name(const tp_style_registry *v, size_t i)
{
    nth_name q = {i, NULL};
    each_name(v, pick_nth, &q);
    return q.name;
}

typedef struct {
    tp_par_buf b;
    int first;
} repr_acc;

static void repr_one(const char *name, void *arg)
{
    repr_acc *a = arg;
    if (!a->first) tp_par_buf_puts(&a->b, ", ");
    a->first = 0;
    tp_par_buf_pyrepr(&a->b, name);
}

/* One pass under the locks, so the list is consistent even while another
 * thread registers. */
char *tp_style_registry_names_repr(const tp_style_registry *v)
{
    repr_acc a = {.first = 1};
    tp_par_buf_puts(&a.b, "[");
    each_name(v, repr_one, &a);
    tp_par_buf_puts(&a.b, "]");
    return tp_par_buf_take(&a.b);
}
