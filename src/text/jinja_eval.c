/* Jinja evaluator: runs the syntax tree against a set of variables.
 *
 * Scoping follows Jinja: `for` bodies and macros get their own scope (each
 * loop iteration a fresh one), so `set` inside them does not leak out, which
 * is why templates carry state across iterations in namespace() objects.
 * Undefined variables behave like Jinja's default Undefined: falsy, render
 * as nothing, iterate as empty, but using one in arithmetic or looking up an
 * attribute on one is an error. */
#include "text/jinja.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct jscope { struct jscope *parent; jdictv vars; } jscope;

enum { CTL_NONE, CTL_BREAK, CTL_CONTINUE };

typedef struct {
    jarena *a;
    jbuf *out;
    jscope *root;          /* template-level variables; macros see these */
    const jdictv *globals;
    int depth;             /* macro call depth */
    int ctl;               /* pending break/continue */
    int located;           /* the error message already names a position */
    uint64_t steps;        /* loop iterations so far (see MAX_LOOP_STEPS) */
} jctx;

/* Loop iterations one render may run.  Chat templates loop over messages
 * and tools, a few thousand steps; nested loops over long strings ran for
 * minutes and gigabytes under the fuzzer before this budget. */
#define MAX_LOOP_STEPS 200000

#define TRY(x) do { tp_status s_ = (x); if (s_) return s_; } while (0)

static tp_status eval(jctx *c, jscope *sc, const jnode *n, jv *out);
static tp_status exec_body(jctx *c, jscope *sc, const jnodes *body);

static tp_status nomem(void) { return tp_fail(TP_ERR_NOMEM, "out of memory"); }


/* Prefixes the current error with the node's position, once. */
static tp_status at(jctx *c, const jnode *n, tp_status s)
{
    if (s == TP_OK || c->located || s == TP_ERR_NOMEM) return s;
    c->located = 1;
    return tp_fail_context(s, "chat template error at line %d, column %d", n->line, n->col);
}

static tp_status count_step(jctx *c, const jnode *n)
{
    if (++c->steps <= MAX_LOOP_STEPS) return TP_OK;
    return at(c, n, tp_fail(TP_ERR_INVALID, "template loops ran more than %d iterations", MAX_LOOP_STEPS));
}

static tp_status undefined_error(jv v)
{
    return tp_fail(TP_ERR_INVALID, "'%.*s' is undefined", (int)v.u.s.n, v.u.s.p ? v.u.s.p : "");
}

/* ---- variables ---------------------------------------------------------- */

static jv lookup(jctx *c, jscope *sc, jstr name)
{
    for (; sc; sc = sc->parent) {
        const jv *v = jd_get(&sc->vars, name);
        if (v) return *v;
    }
    const jv *g = jd_get(c->globals, name);
    if (g) return *g;
    static const struct { const char *name; jfunc fn; } funcs[] = {
        {"raise_exception", JF_RAISE}, {"namespace", JF_NAMESPACE}, {"range", JF_RANGE},
        {"dict", JF_DICT}, {"strftime_now", JF_STRFTIME_NOW},
    };
    for (size_t i = 0; i < sizeof funcs / sizeof funcs[0]; i++)
        if (js_eqc(name, funcs[i].name)) return (jv){.k = JV_FUNC, .u.fn = (int)funcs[i].fn};
    return jv_undef(name);
}

static jscope *new_scope(jctx *c, jscope *parent)
{
    jscope *s = ja_alloc(c->a, sizeof *s);
    if (s) s->parent = parent;
    return s;
}

/* Assigns to `x`, `ns.attr`, or unpacks into `a, b`. */
static tp_status assign(jctx *c, jscope *sc, const jnodes *targets, jv v)
{
    if (targets->n > 1) {
        if (v.k != JV_LIST || v.u.l->n != targets->n)
            return tp_fail(TP_ERR_INVALID, "cannot unpack a %s into %zu variables", jv_kind_name(v.k), targets->n);
        for (size_t i = 0; i < targets->n; i++) {
            jnodes one = {&targets->v[i], 1};
            TRY(assign(c, sc, &one, v.u.l->v[i]));
        }
        return TP_OK;
    }
    const jnode *t = targets->v[0];
    if (t->k == JN_NAME) return jd_set(c->a, &sc->vars, t->name, v);
    jv ns = lookup(c, sc, t->a->name);
    if (ns.k != JV_NS)
        return tp_fail(TP_ERR_INVALID, "cannot set attribute '%.*s' on a %s (only namespace() objects allow it)",
                       (int)t->name.n, t->name.p, jv_kind_name(ns.k));
    return jd_set(c->a, ns.u.d, t->name, v);
}

/* ---- operators ---------------------------------------------------------- */

static int is_num(jv v) { return v.k == JV_INT || v.k == JV_FLOAT || v.k == JV_BOOL; }
static double num(jv v) { return v.k == JV_FLOAT ? v.u.f : v.k == JV_INT ? (double)v.u.i : v.u.b; }
static int64_t inum(jv v) { return v.k == JV_INT ? v.u.i : v.u.b; }

static tp_status concat_str(jctx *c, jv x, jv y, jv *out)
{
    jbuf b = {0};
    jv_to_str(&b, x);
    jv_to_str(&b, y);
    tp_status s = jv_from_buf(c->a, &b, out);
    jb_free(&b);
    return s;
}

static tp_status concat_list(jctx *c, jv x, jv y, jv *out)
{
    jlistv *l = jl_new(c->a, x.u.l->n + y.u.l->n);
    if (!l) return nomem();
    if (x.u.l->n) memcpy(l->v, x.u.l->v, x.u.l->n * sizeof(jv));
    if (y.u.l->n) memcpy(l->v + x.u.l->n, y.u.l->v, y.u.l->n * sizeof(jv));
    *out = (jv){.k = JV_LIST, .u.l = l};
    return TP_OK;
}

/* A repeated string stays below this: chat templates repeat rules of '='
 * at most, and a fuzzed 'x' * 32 ** 5 took seconds to build. */
#define MAX_REPEAT_BYTES (4u << 20)

/* "ab" * 3, [x] * 3 */
static tp_status repeat(jctx *c, jv seq, int64_t times, jv *out)
{
    if (times < 0) times = 0;
    /* Empty sequences stay empty however large `times` is (the loops below
     * would otherwise spin `times` times doing nothing: '' * 10 ** 18). */
    if (seq.k == JV_STR ? seq.u.s.n == 0 : seq.u.l->n == 0) times = 0;
    if (seq.k == JV_STR) {
        if (times && seq.u.s.n > MAX_REPEAT_BYTES / (uint64_t)times)
            return tp_fail(TP_ERR_INVALID, "string repetition too large");
        jbuf b = {0};
        for (int64_t i = 0; i < times; i++) jb_put(&b, seq.u.s.p, seq.u.s.n);
        tp_status s = jv_from_buf(c->a, &b, out);
        jb_free(&b);
        return s;
    }
    if (times && seq.u.l->n > (1u << 20) / (uint64_t)times) return tp_fail(TP_ERR_INVALID, "list repetition too large");
    jlistv *l = jl_new(c->a, seq.u.l->n * (size_t)times);
    if (!l) return nomem();
    for (int64_t i = 0; i < times; i++)
        if (seq.u.l->n) memcpy(l->v + (size_t)i * seq.u.l->n, seq.u.l->v, seq.u.l->n * sizeof(jv));
    *out = (jv){.k = JV_LIST, .u.l = l};
    return TP_OK;
}

static tp_status arith(jctx *c, char op, int floor_div, jv x, jv y, jv *out)
{
    int ints = x.k != JV_FLOAT && y.k != JV_FLOAT;
    int64_t a = ints ? inum(x) : 0, b = ints ? inum(y) : 0;
    double fa = num(x), fb = num(y);
    switch (op) {
    case '+': *out = ints ? jv_int((int64_t)((uint64_t)a + (uint64_t)b)) : jv_float(fa + fb); return TP_OK;
    case '-': *out = ints ? jv_int((int64_t)((uint64_t)a - (uint64_t)b)) : jv_float(fa - fb); return TP_OK;
    case '*': *out = ints ? jv_int((int64_t)((uint64_t)a * (uint64_t)b)) : jv_float(fa * fb); return TP_OK;
    default: break;
    }
    if (fb == 0 && op != 'p') return tp_fail(TP_ERR_INVALID, "division by zero");
    if (op == '/' && !floor_div) { *out = jv_float(fa / fb); return TP_OK; }
    if (op == '/') {
        if (ints) { int64_t q = a / b; if ((a % b) && ((a < 0) != (b < 0))) q--; *out = jv_int(q); }
        else *out = jv_float(floor(fa / fb));
        return TP_OK;
    }
    if (op == '%') {
        if (ints) { int64_t r = a % b; if (r && ((r < 0) != (b < 0))) r += b; *out = jv_int(r); }
        else { double r = fmod(fa, fb); if (r && ((r < 0) != (fb < 0))) r += fb; *out = jv_float(r); }
        return TP_OK;
    }
    /* ** */
    if (ints && b >= 0) {
        int64_t r = 1;
        for (int64_t i = 0; i < b && i < 64; i++) r = (int64_t)((uint64_t)r * (uint64_t)a);
        *out = jv_int(r);
    } else *out = jv_float(pow(fa, fb));
    (void)c;
    return TP_OK;
}

static tp_status binop(jctx *c, jstr op, jv x, jv y, jv *out)
{
    if (js_eqc(op, "~")) return concat_str(c, x, y, out);
    if (x.k == JV_UNDEFINED) return undefined_error(x);
    if (y.k == JV_UNDEFINED) return undefined_error(y);
    char o = op.p[0];
    if (o == '+' && x.k == JV_STR && y.k == JV_STR) return concat_str(c, x, y, out);
    if (o == '+' && x.k == JV_LIST && y.k == JV_LIST) return concat_list(c, x, y, out);
    if (o == '*' && (x.k == JV_STR || x.k == JV_LIST) && (y.k == JV_INT || y.k == JV_BOOL)) return repeat(c, x, inum(y), out);
    if (o == '*' && (y.k == JV_STR || y.k == JV_LIST) && (x.k == JV_INT || x.k == JV_BOOL)) return repeat(c, y, inum(x), out);
    if (is_num(x) && is_num(y)) return arith(c, op.n == 2 && o == '*' ? 'p' : o, op.n == 2 && o == '/', x, y, out);
    return tp_fail(TP_ERR_INVALID, "unsupported operand types for %.*s: %s and %s", (int)op.n, op.p,
                   jv_kind_name(x.k), jv_kind_name(y.k));
}

static tp_status contains(jv hay, jv needle, int *out)
{
    *out = 0;
    switch (hay.k) {
    case JV_STR:
        if (needle.k != JV_STR) return tp_fail(TP_ERR_INVALID, "'in <string>' requires a string, not a %s", jv_kind_name(needle.k));
        if (!needle.u.s.n) { *out = 1; return TP_OK; }
        for (size_t i = 0; i + needle.u.s.n <= hay.u.s.n && !*out; i++)
            *out = !memcmp(hay.u.s.p + i, needle.u.s.p, needle.u.s.n);
        return TP_OK;
    case JV_LIST:
        for (size_t i = 0; i < hay.u.l->n && !*out; i++) *out = jv_equal(hay.u.l->v[i], needle);
        return TP_OK;
    case JV_DICT: case JV_NS:
        *out = needle.k == JV_STR && jd_get(hay.u.d, needle.u.s) != NULL;
        return TP_OK;
    case JV_UNDEFINED: return TP_OK;
    default: return tp_fail(TP_ERR_INVALID, "argument of type %s is not iterable", jv_kind_name(hay.k));
    }
}

static tp_status compare(jstr op, jv x, jv y, int *out)
{
    if (js_eqc(op, "==")) { *out = jv_equal(x, y); return TP_OK; }
    if (js_eqc(op, "!=")) { *out = !jv_equal(x, y); return TP_OK; }
    if (js_eqc(op, "in")) return contains(y, x, out);
    if (js_eqc(op, "not in")) { TRY(contains(y, x, out)); *out = !*out; return TP_OK; }
    int r;
    TRY(jv_compare(x, y, &r));
    *out = js_eqc(op, "<") ? r < 0 : js_eqc(op, "<=") ? r <= 0 : js_eqc(op, ">") ? r > 0 : r >= 0;
    return TP_OK;
}

/* ---- subscripts --------------------------------------------------------- */

static tp_status item(jctx *c, jv obj, jv key, jv *out)
{
    (void)c;
    if (obj.k == JV_UNDEFINED) return undefined_error(obj);
    if ((obj.k == JV_DICT || obj.k == JV_NS) && key.k == JV_STR) {
        const jv *v = jd_get(obj.u.d, key.u.s);
        *out = v ? *v : jv_undef(key.u.s);
        return TP_OK;
    }
    if ((obj.k == JV_LIST || obj.k == JV_STR) && (key.k == JV_INT || key.k == JV_BOOL)) {
        int64_t n = obj.k == JV_LIST ? (int64_t)obj.u.l->n : (int64_t)ju_len(obj.u.s), i = inum(key);
        if (i < 0) i += n;
        if (i < 0 || i >= n) { *out = jv_undef(js_c("index")); return TP_OK; }
        if (obj.k == JV_LIST) { *out = obj.u.l->v[i]; return TP_OK; }
        size_t b = ju_offset(obj.u.s, (size_t)i), e = ju_offset(obj.u.s, (size_t)i + 1);
        *out = jv_str((jstr){obj.u.s.p + b, e - b});
        return TP_OK;
    }
    *out = jv_undef(key.k == JV_STR ? key.u.s : js_c("item"));
    return TP_OK;
}

static tp_status slice_bound(jv v, int64_t n, int64_t step, int is_start, int64_t *out)
{
    if (v.k == JV_NONE || v.k == JV_UNDEFINED) {
        *out = step > 0 ? (is_start ? 0 : n) : (is_start ? n - 1 : -1);
        return TP_OK;
    }
    if (v.k != JV_INT && v.k != JV_BOOL) return tp_fail(TP_ERR_INVALID, "slice indices must be integers");
    int64_t i = inum(v);
    if (i < 0) i += n;
    if (step > 0) i = i < 0 ? 0 : i > n ? n : i;
    else i = i < -1 ? -1 : i > n - 1 ? n - 1 : i;
    *out = i;
    return TP_OK;
}

/* Python slicing for lists and strings (strings by code point). */
static tp_status slice(jctx *c, jv obj, jv lo, jv hi, jv st, jv *out)
{
    if (obj.k == JV_UNDEFINED) return undefined_error(obj);
    if (obj.k != JV_LIST && obj.k != JV_STR) return tp_fail(TP_ERR_INVALID, "cannot slice a %s", jv_kind_name(obj.k));
    int64_t step = 1, n = obj.k == JV_LIST ? (int64_t)obj.u.l->n : (int64_t)ju_len(obj.u.s), b = 0, e = 0;
    if (st.k == JV_INT) step = st.u.i;
    else if (st.k != JV_NONE && st.k != JV_UNDEFINED) return tp_fail(TP_ERR_INVALID, "slice step must be an integer");
    if (step == 0) return tp_fail(TP_ERR_INVALID, "slice step cannot be zero");
    TRY(slice_bound(lo, n, step, 1, &b));
    TRY(slice_bound(hi, n, step, 0, &e));
    size_t count = 0;
    for (int64_t i = b; step > 0 ? i < e : i > e; i += step) count++;
    if (obj.k == JV_LIST) {
        jlistv *l = jl_new(c->a, count);
        if (!l) return nomem();
        size_t k = 0;
        for (int64_t i = b; step > 0 ? i < e : i > e; i += step) l->v[k++] = obj.u.l->v[i];
        *out = (jv){.k = JV_LIST, .u.l = l};
        return TP_OK;
    }
    jbuf buf = {0};
    for (int64_t i = b; step > 0 ? i < e : i > e; i += step) {
        size_t x = ju_offset(obj.u.s, (size_t)i), y = ju_offset(obj.u.s, (size_t)i + 1);
        jb_put(&buf, obj.u.s.p + x, y - x);
    }
    tp_status s = jv_from_buf(c->a, &buf, out);
    jb_free(&buf);
    return s;
}

/* ---- calls -------------------------------------------------------------- */

static tp_status eval_args(jctx *c, jscope *sc, const jnode *n, jargs *x)
{
    jv *pos = ja_alloc(c->a, (n->args.n + 1) * sizeof *pos);
    jv *kwv = ja_alloc(c->a, (n->kwargs.n + 1) * sizeof *kwv);
    if (!pos || !kwv) return nomem();
    for (size_t i = 0; i < n->args.n; i++) TRY(eval(c, sc, n->args.v[i], &pos[i]));
    for (size_t i = 0; i < n->kwargs.n; i++) TRY(eval(c, sc, n->kwargs.v[i], &kwv[i]));
    *x = (jargs){pos, n->args.n, n->kwnames, kwv, n->kwargs.n};
    return TP_OK;
}

static tp_status call_macro(jctx *c, const jnode *m, const jargs *x, jv *out)
{
    if (c->depth >= 100) return tp_fail(TP_ERR_INVALID, "macro calls nested too deeply");
    if (x->npos > m->args.n)
        return tp_fail(TP_ERR_INVALID, "macro '%.*s' takes %zu arguments, %zu given", (int)m->name.n, m->name.p,
                       m->args.n, x->npos);
    jscope *sc = new_scope(c, c->root);
    if (!sc) return nomem();
    for (size_t i = 0; i < m->args.n; i++) {
        jv v = jv_undef(m->kwnames[i]);
        const jv *given = i < x->npos ? &x->pos[i] : NULL;
        for (size_t k = 0; k < x->nkw && !given; k++)
            if (js_eq(x->kwn[k], m->kwnames[i])) given = &x->kwv[k];
        if (given) v = *given;
        else if (m->args.v[i]) TRY(eval(c, sc, m->args.v[i], &v));
        TRY(jd_set(c->a, &sc->vars, m->kwnames[i], v));
    }
    jbuf buf = {0}, *saved = c->out;
    c->out = &buf;
    c->depth++;
    tp_status s = exec_body(c, sc, &m->body);
    c->depth--;
    c->out = saved;
    if (!s) s = jv_from_buf(c->a, &buf, out);
    jb_free(&buf);
    return s;
}

static tp_status call_range(jctx *c, const jargs *x, jv *out)
{
    int64_t v[3] = {0, 0, 1};
    if (x->npos < 1 || x->npos > 3) return tp_fail(TP_ERR_INVALID, "range expects 1 to 3 arguments");
    for (size_t i = 0; i < x->npos; i++) {
        if (x->pos[i].k != JV_INT) return tp_fail(TP_ERR_INVALID, "range arguments must be integers");
        v[x->npos == 1 ? 1 : i] = x->pos[i].u.i;
    }
    if (!v[2]) return tp_fail(TP_ERR_INVALID, "range step cannot be zero");
    size_t count = 0;
    for (int64_t i = v[0]; v[2] > 0 ? i < v[1] : i > v[1]; i += v[2])
        if (++count > 1000000) return tp_fail(TP_ERR_INVALID, "range too large");
    jlistv *l = jl_new(c->a, count);
    if (!l) return nomem();
    for (size_t k = 0; k < count; k++) l->v[k] = jv_int(v[0] + (int64_t)k * v[2]);
    *out = (jv){.k = JV_LIST, .u.l = l};
    return TP_OK;
}

/* namespace(...) and dict(...): keyword arguments, or one dict to copy. */
static tp_status call_mapping(jctx *c, const jargs *x, jv_kind k, jv *out)
{
    jdictv *d = jd_new(c->a);
    if (!d) return nomem();
    for (size_t i = 0; i < x->npos; i++) {
        if (x->pos[i].k != JV_DICT) return tp_fail(TP_ERR_INVALID, "expected keyword arguments or a dict");
        for (size_t j = 0; j < x->pos[i].u.d->n; j++)
            TRY(jd_set(c->a, d, x->pos[i].u.d->k[j], x->pos[i].u.d->v[j]));
    }
    for (size_t i = 0; i < x->nkw; i++) TRY(jd_set(c->a, d, x->kwn[i], x->kwv[i]));
    *out = (jv){.k = k, .u.d = d};
    return TP_OK;
}

static tp_status call_func(jctx *c, jfunc fn, const jargs *x, jv *out)
{
    switch (fn) {
    case JF_RAISE: {
        jbuf b = {0};
        if (x->npos) jv_to_str(&b, x->pos[0]);
        tp_fail(TP_ERR_INVALID, "chat template raised an exception: %s", b.p ? b.p : "");
        jb_free(&b);
        c->located = 1;
        return TP_ERR_INVALID;
    }
    case JF_NAMESPACE: return call_mapping(c, x, JV_NS, out);
    case JF_DICT: return call_mapping(c, x, JV_DICT, out);
    case JF_RANGE: return call_range(c, x, out);
    case JF_STRFTIME_NOW: {
        const jv *f = jargs_get(x, 0, "format");
        if (!f || f->k != JV_STR) return tp_fail(TP_ERR_INVALID, "strftime_now expects a format string");
        char fmt[256], buf[512];
        snprintf(fmt, sizeof fmt, "%.*s", (int)f->u.s.n, f->u.s.p);
        time_t now = time(NULL);
        struct tm tm;
        localtime_r(&now, &tm);
        size_t n = strftime(buf, sizeof buf, fmt, &tm);
        jstr s = js_dup(c->a, buf, n);
        if (!s.p) return nomem();
        *out = jv_str(s);
        return TP_OK;
    }
    }
    return tp_fail(TP_ERR_INTERNAL, "unknown builtin function");
}

static tp_status call(jctx *c, jscope *sc, const jnode *n, jv *out)
{
    jargs x;
    const jnode *callee = n->a;
    if (callee->k == JN_ATTR) {
        /* obj.method(...): Python methods of str/list/dict come first. */
        jv obj;
        TRY(eval(c, sc, callee->a, &obj));
        if (obj.k == JV_UNDEFINED) return undefined_error(obj);
        TRY(eval_args(c, sc, n, &x));
        int found;
        TRY(jinja_method(c->a, obj, callee->name, &x, out, &found));
        if (found) return TP_OK;
        jv f = jinja_getattr(obj, callee->name);
        if (f.k == JV_MACRO) return call_macro(c, f.u.m, &x, out);
        return tp_fail(TP_ERR_INVALID, "%s has no method '%.*s'", jv_kind_name(obj.k), (int)callee->name.n, callee->name.p);
    }
    jv f;
    TRY(eval(c, sc, callee, &f));
    TRY(eval_args(c, sc, n, &x));
    if (f.k == JV_MACRO) return call_macro(c, f.u.m, &x, out);
    if (f.k == JV_FUNC) return call_func(c, (jfunc)f.u.fn, &x, out);
    if (f.k == JV_UNDEFINED) return tp_fail(TP_ERR_INVALID, "'%.*s' is undefined", (int)f.u.s.n, f.u.s.p);
    return tp_fail(TP_ERR_INVALID, "a %s is not callable", jv_kind_name(f.k));
}

/* ---- expressions -------------------------------------------------------- */

static tp_status eval_collection(jctx *c, jscope *sc, const jnode *n, jv *out)
{
    if (n->k == JN_DICT) {
        jdictv *d = jd_new(c->a);
        if (!d) return nomem();
        for (size_t i = 0; i < n->args.n; i++) {
            jv k, v;
            TRY(eval(c, sc, n->args.v[i], &k));
            TRY(eval(c, sc, n->vals.v[i], &v));
            if (k.k != JV_STR) return tp_fail(TP_ERR_UNSUPPORTED, "dict keys must be strings");
            TRY(jd_set(c->a, d, k.u.s, v));
        }
        *out = (jv){.k = JV_DICT, .u.d = d};
        return TP_OK;
    }
    jlistv *l = jl_new(c->a, n->args.n);
    if (!l) return nomem();
    for (size_t i = 0; i < n->args.n; i++) TRY(eval(c, sc, n->args.v[i], &l->v[i]));
    *out = (jv){.k = JV_LIST, .u.l = l};
    return TP_OK;
}

static tp_status eval_compare(jctx *c, jscope *sc, const jnode *n, jv *out)
{
    jv left;
    TRY(eval(c, sc, n->a, &left));
    for (size_t i = 0; i < n->args.n; i++) {
        jv right;
        int r;
        TRY(eval(c, sc, n->args.v[i], &right));
        TRY(compare(n->ops[i], left, right, &r));
        if (!r) { *out = jv_bool(0); return TP_OK; }
        left = right;
    }
    *out = jv_bool(1);
    return TP_OK;
}

static tp_status eval_inner(jctx *c, jscope *sc, const jnode *n, jv *out)
{
    jv x, y, z;
    jargs args;
    int r;
    switch (n->k) {
    case JN_LITERAL: *out = n->lit; return TP_OK;
    case JN_NAME: *out = lookup(c, sc, n->name); return TP_OK;
    case JN_ATTR:
        TRY(eval(c, sc, n->a, &x));
        if (x.k == JV_UNDEFINED) return undefined_error(x);
        *out = jinja_getattr(x, n->name);
        return TP_OK;
    case JN_ITEM:
        TRY(eval(c, sc, n->a, &x));
        TRY(eval(c, sc, n->b, &y));
        return item(c, x, y, out);
    case JN_SLICE:
        TRY(eval(c, sc, n->a, &x));
        y = z = jv_none();
        jv st = jv_none();
        if (n->b) TRY(eval(c, sc, n->b, &y));
        if (n->c) TRY(eval(c, sc, n->c, &z));
        if (n->args.n && n->args.v[0]) TRY(eval(c, sc, n->args.v[0], &st));
        return slice(c, x, y, z, st, out);
    case JN_CALL: return call(c, sc, n, out);
    case JN_FILTER:
        TRY(eval(c, sc, n->a, &x));
        TRY(eval_args(c, sc, n, &args));
        return jinja_filter(c->a, n->name, x, &args, out);
    case JN_TEST:
        TRY(eval(c, sc, n->a, &x));
        TRY(eval_args(c, sc, n, &args));
        TRY(jinja_test(n->name, x, &args, &r));
        *out = jv_bool(n->negate ? !r : r);
        return TP_OK;
    case JN_BINOP:
        TRY(eval(c, sc, n->a, &x));
        TRY(eval(c, sc, n->b, &y));
        return binop(c, n->op, x, y, out);
    case JN_NOT: TRY(eval(c, sc, n->a, &x)); *out = jv_bool(!jv_truthy(x)); return TP_OK;
    case JN_NEG: case JN_POS:
        TRY(eval(c, sc, n->a, &x));
        if (!is_num(x)) return tp_fail(TP_ERR_INVALID, "bad operand type for unary %c: %s", n->k == JN_NEG ? '-' : '+', jv_kind_name(x.k));
        *out = n->k == JN_POS ? x : x.k == JV_FLOAT ? jv_float(-x.u.f) : jv_int((int64_t)(0 - (uint64_t)inum(x)));
        return TP_OK;
    case JN_AND: case JN_OR:
        /* Python semantics: the deciding operand itself, not a bool. */
        TRY(eval(c, sc, n->a, &x));
        if (jv_truthy(x) == (n->k == JN_OR)) { *out = x; return TP_OK; }
        return eval(c, sc, n->b, out);
    case JN_COND:
        TRY(eval(c, sc, n->b, &x));
        if (jv_truthy(x)) return eval(c, sc, n->a, out);
        if (n->c) return eval(c, sc, n->c, out);
        *out = jv_undef(js_c("else"));
        return TP_OK;
    case JN_COMPARE: return eval_compare(c, sc, n, out);
    case JN_LIST: case JN_TUPLE: case JN_DICT: return eval_collection(c, sc, n, out);
    default: return tp_fail(TP_ERR_INTERNAL, "not an expression");
    }
}

static tp_status eval(jctx *c, jscope *sc, const jnode *n, jv *out)
{
    return at(c, n, eval_inner(c, sc, n, out));
}

/* ---- statements --------------------------------------------------------- */

/* The items a for loop visits: list items, dict keys, string characters. */
static tp_status iter_items(jctx *c, jv v, jlistv **out)
{
    switch (v.k) {
    case JV_LIST: *out = v.u.l; return TP_OK;
    case JV_UNDEFINED: return (*out = jl_new(c->a, 0)) ? TP_OK : nomem();
    case JV_DICT: {
        jlistv *l = jl_new(c->a, v.u.d->n);
        if (!l) return nomem();
        for (size_t i = 0; i < v.u.d->n; i++) l->v[i] = jv_str(v.u.d->k[i]);
        *out = l;
        return TP_OK;
    }
    case JV_STR: {
        size_t n = ju_len(v.u.s);
        jlistv *l = jl_new(c->a, n);
        if (!l) return nomem();
        for (size_t i = 0; i < n; i++) {
            size_t b = ju_offset(v.u.s, i), e = ju_offset(v.u.s, i + 1);
            l->v[i] = jv_str((jstr){v.u.s.p + b, e - b});
        }
        *out = l;
        return TP_OK;
    }
    default: return tp_fail(TP_ERR_INVALID, "a %s is not iterable", jv_kind_name(v.k));
    }
}

static tp_status loop_var(jctx *c, const jlistv *items, size_t i, jv *out)
{
    jdictv *d = jd_new(c->a);
    if (!d) return nomem();
    size_t n = items->n;
    TRY(jd_set(c->a, d, js_c("index"), jv_int((int64_t)i + 1)));
    TRY(jd_set(c->a, d, js_c("index0"), jv_int((int64_t)i)));
    TRY(jd_set(c->a, d, js_c("revindex"), jv_int((int64_t)(n - i))));
    TRY(jd_set(c->a, d, js_c("revindex0"), jv_int((int64_t)(n - i - 1))));
    TRY(jd_set(c->a, d, js_c("first"), jv_bool(i == 0)));
    TRY(jd_set(c->a, d, js_c("last"), jv_bool(i + 1 == n)));
    TRY(jd_set(c->a, d, js_c("length"), jv_int((int64_t)n)));
    TRY(jd_set(c->a, d, js_c("previtem"), i ? items->v[i - 1] : jv_undef(js_c("previtem"))));
    TRY(jd_set(c->a, d, js_c("nextitem"), i + 1 < n ? items->v[i + 1] : jv_undef(js_c("nextitem"))));
    *out = (jv){.k = JV_DICT, .u.d = d};
    return TP_OK;
}

/* Applies the loop's `if` filter; loop.length and friends count what is left. */
static tp_status filter_items(jctx *c, jscope *sc, const jnode *n, jlistv **items)
{
    jlistv *kept = jl_new(c->a, (*items)->n);
    if (!kept) return nomem();
    kept->n = 0;
    for (size_t i = 0; i < (*items)->n; i++) {
        TRY(count_step(c, n));
        jscope *it = new_scope(c, sc);
        jv ok;
        if (!it) return nomem();
        TRY(assign(c, it, &n->args, (*items)->v[i]));
        TRY(eval(c, it, n->b, &ok));
        if (jv_truthy(ok)) kept->v[kept->n++] = (*items)->v[i];
    }
    *items = kept;
    return TP_OK;
}

static tp_status exec_for(jctx *c, jscope *sc, const jnode *n)
{
    jv seq;
    jlistv *items;
    TRY(eval(c, sc, n->a, &seq));
    TRY(at(c, n->a, iter_items(c, seq, &items)));
    if (n->b) TRY(filter_items(c, sc, n, &items));
    for (size_t i = 0; i < items->n; i++) {
        TRY(count_step(c, n));
        jscope *it = new_scope(c, sc);
        jv loop;
        if (!it) return nomem();
        TRY(loop_var(c, items, i, &loop));
        TRY(jd_set(c->a, &it->vars, js_c("loop"), loop));
        TRY(at(c, n, assign(c, it, &n->args, items->v[i])));
        TRY(exec_body(c, it, &n->body));
        int ctl = c->ctl;
        c->ctl = CTL_NONE;
        if (ctl == CTL_BREAK) break;
    }
    if (!items->n && n->alt.n) {
        jscope *it = new_scope(c, sc);
        if (!it) return nomem();
        return exec_body(c, it, &n->alt);
    }
    return TP_OK;
}

static tp_status exec_stmt(jctx *c, jscope *sc, const jnode *n)
{
    jv v;
    switch (n->k) {
    case JN_TEXT: jb_put(c->out, n->name.p, n->name.n); return TP_OK;
    case JN_OUTPUT: TRY(eval(c, sc, n->a, &v)); jv_to_str(c->out, v); return TP_OK;
    case JN_IF:
        TRY(eval(c, sc, n->a, &v));
        return exec_body(c, sc, jv_truthy(v) ? &n->body : &n->alt);
    case JN_FOR: return exec_for(c, sc, n);
    case JN_SET:
        TRY(eval(c, sc, n->a, &v));
        return at(c, n, assign(c, sc, &n->args, v));
    case JN_SET_BLOCK: {
        jbuf buf = {0}, *saved = c->out;
        c->out = &buf;
        tp_status s = exec_body(c, sc, &n->body);
        c->out = saved;
        if (!s) s = jv_from_buf(c->a, &buf, &v);
        jb_free(&buf);
        TRY(s);
        return at(c, n, assign(c, sc, &n->args, v));
    }
    case JN_MACRO: return jd_set(c->a, &sc->vars, n->name, (jv){.k = JV_MACRO, .u.m = n});
    case JN_BREAK: c->ctl = CTL_BREAK; return TP_OK;
    case JN_CONTINUE: c->ctl = CTL_CONTINUE; return TP_OK;
    default: return tp_fail(TP_ERR_INTERNAL, "not a statement");
    }
}

static tp_status exec_body(jctx *c, jscope *sc, const jnodes *body)
{
    for (size_t i = 0; i < body->n && c->ctl == CTL_NONE; i++) {
        TRY(exec_stmt(c, sc, body->v[i]));
        if (c->out->oom) return nomem();
    }
    return TP_OK;
}

tp_status jinja_render(const jnode *root, jarena *a, jdictv *globals, jbuf *out)
{
    jctx c = {.a = a, .out = out, .globals = globals};
    c.root = new_scope(&c, NULL);
    if (!c.root) return nomem();
    tp_status s = exec_body(&c, c.root, &root->body);
    if (!s && out->oom) s = nomem();
    return s;
}
