/* Jinja parser: recursive descent from tokens to a syntax tree, with Jinja's
 * operator precedence (lowest first):
 *   x if c else y  <  or  <  and  <  not  <  comparisons, in, not in
 *   <  + -  <  ~  <  * / // %  <  **  <  unary - +  <  filters |f, tests is t
 *   <  postfix .attr [item] [a:b:c] (call)
 * Parse functions return NULL after setting the error (tp_fail), so that
 * failures propagate without a status variable at every step. */
#include "text/jinja.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
    const jtokens *t;
    size_t i;
    jarena *a;
    int depth;
} parser;

/* A growable list of nodes (and keyword names) copied into the arena when done. */
typedef struct { jnode **v; jstr *names; size_t n, cap; } nvec;

static int nv_push(nvec *l, jnode *x, jstr name)
{
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 8;
        jnode **v = realloc(l->v, cap * sizeof *v);
        if (v) l->v = v;
        jstr *nm = v ? realloc(l->names, cap * sizeof *nm) : NULL;
        if (nm) l->names = nm;
        if (!v || !nm) { tp_fail(TP_ERR_NOMEM, "out of memory"); return 0; }
        l->cap = cap;
    }
    l->v[l->n] = x;
    l->names[l->n++] = name;
    return 1;
}

static int nv_finish(parser *P, nvec *l, jnodes *out, jstr **names)
{
    out->n = l->n;
    out->v = ja_alloc(P->a, (l->n ? l->n : 1) * sizeof *out->v);
    jstr *nm = names ? ja_alloc(P->a, (l->n ? l->n : 1) * sizeof *nm) : NULL;
    int ok = out->v && (!names || nm);
    if (ok && l->n) {
        memcpy(out->v, l->v, l->n * sizeof *out->v);
        if (names) memcpy(nm, l->names, l->n * sizeof *nm);
    }
    if (names) *names = nm;
    free(l->v);
    free(l->names);
    memset(l, 0, sizeof *l);
    if (!ok) tp_fail(TP_ERR_NOMEM, "out of memory");
    return ok;
}

static void nv_drop(nvec *l) { free(l->v); free(l->names); memset(l, 0, sizeof *l); }

/* ---- token helpers ------------------------------------------------------ */

static const jtoken *cur(parser *P) { return &P->t->v[P->i]; }
static const jtoken *peek2(parser *P) { return P->i + 1 < P->t->n ? &P->t->v[P->i + 1] : cur(P); }
static int is_op(const jtoken *t, const char *op) { return t->k == JT_OP && js_eqc(t->s, op); }
static int is_name(const jtoken *t, const char *n) { return t->k == JT_NAME && js_eqc(t->s, n); }
static const jtoken *advance(parser *P) { const jtoken *t = cur(P); if (t->k != JT_EOF) P->i++; return t; }

static const char *describe(const jtoken *t, char *buf, size_t cap)
{
    switch (t->k) {
    case JT_EOF: return "end of template";
    case JT_TEXT: return "template text";
    case JT_STRING: return "a string";
    case JT_INT: case JT_FLOAT: return "a number";
    case JT_EXPR_OPEN: return "'{{'";
    case JT_EXPR_CLOSE: return "'}}'";
    case JT_STMT_OPEN: return "'{%'";
    case JT_STMT_CLOSE: return "'%}'";
    default: snprintf(buf, cap, "'%.*s'", (int)t->s.n, t->s.p); return buf;
    }
}

static void *syntax_error(const jtoken *t, const char *what)
{
    char buf[80];
    tp_fail(TP_ERR_FORMAT, "template syntax error at line %d, column %d: %s, found %s",
            t->line, t->col, what, describe(t, buf, sizeof buf));
    return NULL;
}

static int expect_op(parser *P, const char *op)
{
    if (is_op(cur(P), op)) { advance(P); return 1; }
    char what[32];
    snprintf(what, sizeof what, "expected '%s'", op);
    syntax_error(cur(P), what);
    return 0;
}

static int expect_kind(parser *P, jt_kind k, const char *what)
{
    if (cur(P)->k == k) { advance(P); return 1; }
    syntax_error(cur(P), what);
    return 0;
}

static jnode *node(parser *P, jn_kind k, const jtoken *at)
{
    jnode *n = ja_alloc(P->a, sizeof *n);
    if (!n) { tp_fail(TP_ERR_NOMEM, "out of memory"); return NULL; }
    n->k = k;
    n->line = at->line;
    n->col = at->col;
    return n;
}

static jnode *binop(parser *P, jn_kind k, const jtoken *at, jstr op, jnode *l, jnode *r)
{
    if (!l || !r) return NULL;
    jnode *n = node(P, k, at);
    if (n) { n->op = op; n->a = l; n->b = r; }
    return n;
}

/* ---- expressions -------------------------------------------------------- */

static jnode *parse_expr(parser *P);
static jnode *parse_or(parser *P);
static jnode *parse_unary(parser *P, int with_filter);

/* Arguments of a call, filter or test: `(a, b, key=c)`; '(' already read. */
static int parse_args(parser *P, jnode *n)
{
    nvec pos = {0}, kw = {0};
    while (!is_op(cur(P), ")")) {
        if (cur(P)->k == JT_NAME && is_op(peek2(P), "=")) {
            jstr name = advance(P)->s;
            advance(P);
            jnode *v = parse_expr(P);
            if (!v || !nv_push(&kw, v, name)) goto fail;
        } else {
            if (kw.n) { syntax_error(cur(P), "positional argument after keyword argument"); goto fail; }
            jnode *v = parse_expr(P);
            if (!v || !nv_push(&pos, v, (jstr){0})) goto fail;
        }
        if (!is_op(cur(P), ",")) break;
        advance(P);
    }
    if (!expect_op(P, ")")) goto fail;
    return nv_finish(P, &pos, &n->args, NULL) & nv_finish(P, &kw, &n->kwargs, &n->kwnames);
fail:
    nv_drop(&pos);
    nv_drop(&kw);
    return 0;
}

/* `[a, b]`, `(a, b)` or `{k: v}` after the opening bracket. */
static jnode *parse_collection(parser *P, const jtoken *open, jn_kind k, const char *close)
{
    jnode *n = node(P, k, open);
    nvec items = {0}, vals = {0};
    if (!n) return NULL;
    while (!is_op(cur(P), close)) {
        jnode *x = parse_expr(P);
        if (!x || !nv_push(&items, x, (jstr){0})) goto fail;
        if (k == JN_DICT) {
            jnode *v = expect_op(P, ":") ? parse_expr(P) : NULL;
            if (!v || !nv_push(&vals, v, (jstr){0})) goto fail;
        }
        if (!is_op(cur(P), ",")) break;
        advance(P);
    }
    if (!expect_op(P, close)) goto fail;
    if (!nv_finish(P, &items, &n->args, NULL) || !nv_finish(P, &vals, &n->vals, NULL)) return NULL;
    return n;
fail:
    nv_drop(&items);
    nv_drop(&vals);
    return NULL;
}

static jnode *literal(parser *P, const jtoken *at, jv v)
{
    jnode *n = node(P, JN_LITERAL, at);
    if (n) n->lit = v;
    return n;
}

/* Adjacent string literals concatenate, as in Python. */
static jnode *parse_strings(parser *P)
{
    const jtoken *first = advance(P);
    if (cur(P)->k != JT_STRING) return literal(P, first, jv_str(first->s));
    jbuf b = {0};
    jb_put(&b, first->s.p, first->s.n);
    while (cur(P)->k == JT_STRING) { const jtoken *t = advance(P); jb_put(&b, t->s.p, t->s.n); }
    jv v;
    tp_status s = jv_from_buf(P->a, &b, &v);
    jb_free(&b);
    return s ? NULL : literal(P, first, v);
}

static jnode *parse_primary(parser *P)
{
    const jtoken *t = cur(P);
    switch (t->k) {
    case JT_STRING: return parse_strings(P);
    case JT_INT: advance(P); return literal(P, t, jv_int(t->i));
    case JT_FLOAT: advance(P); return literal(P, t, jv_float(t->f));
    case JT_NAME:
        advance(P);
        if (js_eqc(t->s, "true") || js_eqc(t->s, "True")) return literal(P, t, jv_bool(1));
        if (js_eqc(t->s, "false") || js_eqc(t->s, "False")) return literal(P, t, jv_bool(0));
        if (js_eqc(t->s, "none") || js_eqc(t->s, "None")) return literal(P, t, jv_none());
        jnode *n = node(P, JN_NAME, t);
        if (n) n->name = t->s;
        return n;
    default: break;
    }
    if (is_op(t, "(")) {
        advance(P);
        jnode *x = parse_expr(P);
        if (!x) return NULL;
        if (is_op(cur(P), ",")) {
            /* A tuple: re-parse as a collection starting with x. */
            jnode *tup = node(P, JN_TUPLE, t);
            nvec items = {0};
            if (!tup || !nv_push(&items, x, (jstr){0})) { nv_drop(&items); return NULL; }
            while (is_op(cur(P), ",")) {
                advance(P);
                if (is_op(cur(P), ")")) break;
                jnode *y = parse_expr(P);
                if (!y || !nv_push(&items, y, (jstr){0})) { nv_drop(&items); return NULL; }
            }
            if (!expect_op(P, ")")) { nv_drop(&items); return NULL; }
            return nv_finish(P, &items, &tup->args, NULL) ? tup : NULL;
        }
        return expect_op(P, ")") ? x : NULL;
    }
    if (is_op(t, "[")) { advance(P); return parse_collection(P, t, JN_LIST, "]"); }
    if (is_op(t, "{")) { advance(P); return parse_collection(P, t, JN_DICT, "}"); }
    return syntax_error(t, "expected an expression");
}

/* `[i]` or `[start:stop:step]`; '[' already read. */
static jnode *parse_subscript(parser *P, const jtoken *at, jnode *obj)
{
    jnode *parts[3] = {NULL, NULL, NULL};
    int colons = 0;
    for (;;) {
        if (!is_op(cur(P), ":") && !is_op(cur(P), "]")) {
            if (colons > 2) return syntax_error(cur(P), "too many ':' in slice");
            if (!(parts[colons] = parse_expr(P))) return NULL;
        }
        if (is_op(cur(P), ":")) { advance(P); colons++; continue; }
        break;
    }
    if (!expect_op(P, "]")) return NULL;
    jnode *n = node(P, colons ? JN_SLICE : JN_ITEM, at);
    if (!n) return NULL;
    if (!colons && !parts[0]) return syntax_error(at, "empty subscript");
    n->a = obj;
    n->b = parts[0];
    n->c = parts[1];
    if (colons) { n->args.v = ja_alloc(P->a, sizeof *n->args.v); if (n->args.v) { n->args.v[0] = parts[2]; n->args.n = 1; } }
    return n;
}

static jnode *parse_postfix(parser *P, jnode *n)
{
    while (n) {
        const jtoken *t = cur(P);
        if (is_op(t, ".")) {
            advance(P);
            const jtoken *name = cur(P);
            if (name->k == JT_INT) {            /* foo.0 is foo[0] */
                advance(P);
                jnode *idx = literal(P, name, jv_int(name->i));
                jnode *it = idx ? node(P, JN_ITEM, t) : NULL;
                if (it) { it->a = n; it->b = idx; }
                n = it;
                continue;
            }
            if (!expect_kind(P, JT_NAME, "expected an attribute name after '.'")) return NULL;
            jnode *at = node(P, JN_ATTR, t);
            if (at) { at->a = n; at->name = name->s; }
            n = at;
        } else if (is_op(t, "[")) {
            advance(P);
            n = parse_subscript(P, t, n);
        } else if (is_op(t, "(")) {
            advance(P);
            jnode *call = node(P, JN_CALL, t);
            if (call) call->a = n;
            n = call && parse_args(P, call) ? call : NULL;
        } else break;
    }
    return n;
}

/* The single argument of a test written without parentheses: `is divisibleby 3`. */
static int test_arg_follows(const jtoken *t)
{
    if (t->k == JT_NAME)
        return !js_eqc(t->s, "else") && !js_eqc(t->s, "or") && !js_eqc(t->s, "and") &&
               !js_eqc(t->s, "if") && !js_eqc(t->s, "in") && !js_eqc(t->s, "is") && !js_eqc(t->s, "not");
    return t->k == JT_STRING || t->k == JT_INT || t->k == JT_FLOAT || is_op(t, "[") || is_op(t, "{");
}

static jnode *parse_filter_or_test(parser *P, jnode *n)
{
    const jtoken *t = advance(P);
    int test = is_name(t, "is");
    jnode *f = node(P, test ? JN_TEST : JN_FILTER, t);
    if (!f) return NULL;
    f->a = n;
    if (test && is_name(cur(P), "not")) { advance(P); f->negate = 1; }
    const jtoken *name = cur(P);
    if (!expect_kind(P, JT_NAME, test ? "expected a test name after 'is'" : "expected a filter name after '|'"))
        return NULL;
    f->name = name->s;
    if (is_op(cur(P), "(")) { advance(P); return parse_args(P, f) ? f : NULL; }
    if (test && test_arg_follows(cur(P))) {
        jnode *arg = parse_unary(P, 0);
        if (!arg) return NULL;
        f->args.v = ja_alloc(P->a, sizeof *f->args.v);
        if (!f->args.v) { tp_fail(TP_ERR_NOMEM, "out of memory"); return NULL; }
        f->args.v[0] = arg;
        f->args.n = 1;
    }
    return f;
}

static jnode *parse_unary(parser *P, int with_filter)
{
    if (++P->depth > 200) { P->depth--; return syntax_error(cur(P), "expression nested too deeply"); }
    const jtoken *t = cur(P);
    jnode *n;
    if (is_op(t, "-") || is_op(t, "+")) {
        advance(P);
        jnode *x = parse_unary(P, 0);
        n = x ? node(P, is_op(t, "-") ? JN_NEG : JN_POS, t) : NULL;
        if (n) n->a = x;
    } else {
        n = parse_primary(P);
    }
    n = parse_postfix(P, n);
    while (n && with_filter && (is_op(cur(P), "|") || is_name(cur(P), "is")))
        n = parse_filter_or_test(P, n);
    P->depth--;
    return n;
}

static jnode *parse_pow(parser *P)
{
    jnode *l = parse_unary(P, 1);
    while (l && is_op(cur(P), "**")) { const jtoken *t = advance(P); l = binop(P, JN_BINOP, t, t->s, l, parse_unary(P, 1)); }
    return l;
}

static jnode *parse_math2(parser *P)
{
    jnode *l = parse_pow(P);
    while (l && (is_op(cur(P), "*") || is_op(cur(P), "/") || is_op(cur(P), "//") || is_op(cur(P), "%"))) {
        const jtoken *t = advance(P);
        l = binop(P, JN_BINOP, t, t->s, l, parse_pow(P));
    }
    return l;
}

static jnode *parse_concat(parser *P)
{
    jnode *l = parse_math2(P);
    while (l && is_op(cur(P), "~")) { const jtoken *t = advance(P); l = binop(P, JN_BINOP, t, t->s, l, parse_math2(P)); }
    return l;
}

static jnode *parse_math1(parser *P)
{
    jnode *l = parse_concat(P);
    while (l && (is_op(cur(P), "+") || is_op(cur(P), "-"))) {
        const jtoken *t = advance(P);
        l = binop(P, JN_BINOP, t, t->s, l, parse_concat(P));
    }
    return l;
}

static int compare_op(parser *P, jstr *op)
{
    const jtoken *t = cur(P);
    static const char *const cmp[] = {"==", "!=", "<", "<=", ">", ">="};
    for (size_t i = 0; i < sizeof cmp / sizeof cmp[0]; i++)
        if (is_op(t, cmp[i])) { advance(P); *op = t->s; return 1; }
    if (is_name(t, "in")) { advance(P); *op = js_c("in"); return 1; }
    if (is_name(t, "not") && is_name(peek2(P), "in")) { P->i += 2; *op = js_c("not in"); return 1; }
    return 0;
}

static jnode *parse_compare(parser *P)
{
    const jtoken *at = cur(P);
    jnode *l = parse_math1(P);
    jstr op;
    if (!l || !compare_op(P, &op)) return l;
    jnode *n = node(P, JN_COMPARE, at);
    nvec rhs = {0};
    if (!n) return NULL;
    n->a = l;
    do {
        jnode *r = parse_math1(P);
        if (!r || !nv_push(&rhs, r, op)) { nv_drop(&rhs); return NULL; }
    } while (compare_op(P, &op));
    return nv_finish(P, &rhs, &n->args, &n->ops) ? n : NULL;
}

static jnode *parse_not(parser *P)
{
    if (!is_name(cur(P), "not")) return parse_compare(P);
    const jtoken *t = advance(P);
    jnode *x = parse_not(P);
    jnode *n = x ? node(P, JN_NOT, t) : NULL;
    if (n) n->a = x;
    return n;
}

static jnode *parse_and(parser *P)
{
    jnode *l = parse_not(P);
    while (l && is_name(cur(P), "and")) { const jtoken *t = advance(P); l = binop(P, JN_AND, t, t->s, l, parse_not(P)); }
    return l;
}

static jnode *parse_or(parser *P)
{
    jnode *l = parse_and(P);
    while (l && is_name(cur(P), "or")) { const jtoken *t = advance(P); l = binop(P, JN_OR, t, t->s, l, parse_and(P)); }
    return l;
}

static jnode *parse_expr(parser *P)
{
    jnode *n = parse_or(P);
    while (n && is_name(cur(P), "if")) {
        const jtoken *t = advance(P);
        jnode *cond = parse_or(P), *other = NULL;
        if (!cond) return NULL;
        if (is_name(cur(P), "else")) { advance(P); if (!(other = parse_expr(P))) return NULL; }
        jnode *c = node(P, JN_COND, t);
        if (!c) return NULL;
        c->a = n; c->b = cond; c->c = other;
        n = c;
    }
    return n;
}

/* `a, b` without brackets (set values, for-loop iterables). */
static jnode *parse_tuple(parser *P, jnode *(*item)(parser *))
{
    const jtoken *at = cur(P);
    jnode *first = item(P);
    if (!first || !is_op(cur(P), ",")) return first;
    jnode *tup = node(P, JN_TUPLE, at);
    nvec items = {0};
    if (!tup || !nv_push(&items, first, (jstr){0})) { nv_drop(&items); return NULL; }
    while (is_op(cur(P), ",")) {
        advance(P);
        jnode *x = item(P);
        if (!x || !nv_push(&items, x, (jstr){0})) { nv_drop(&items); return NULL; }
    }
    return nv_finish(P, &items, &tup->args, NULL) ? tup : NULL;
}

/* ---- statements --------------------------------------------------------- */

static int parse_body(parser *P, const char *const *ends, jnodes *out, jstr *ended);

static int close_stmt(parser *P) { return expect_kind(P, JT_STMT_CLOSE, "expected '%}'"); }

/* Assignment targets: `x`, `ns.attr` or `a, b`. */
static int parse_targets(parser *P, jnodes *out, int allow_attr)
{
    nvec v = {0};
    do {
        const jtoken *t = cur(P);
        if (!expect_kind(P, JT_NAME, "expected a variable name")) goto fail;
        jnode *n = node(P, JN_NAME, t);
        if (!n) goto fail;
        n->name = t->s;
        if (allow_attr && is_op(cur(P), ".")) {
            advance(P);
            const jtoken *attr = cur(P);
            if (!expect_kind(P, JT_NAME, "expected an attribute name")) goto fail;
            jnode *a = node(P, JN_ATTR, attr);
            if (!a) goto fail;
            a->a = n;
            a->name = attr->s;
            n = a;
        }
        if (!nv_push(&v, n, (jstr){0})) goto fail;
    } while (is_op(cur(P), ",") && advance(P));
    return nv_finish(P, &v, out, NULL);
fail:
    nv_drop(&v);
    return 0;
}

static jnode *parse_if(parser *P, const jtoken *at)
{
    static const char *const ends[] = {"elif", "else", "endif", NULL};
    static const char *const endif[] = {"endif", NULL};
    jnode *n = node(P, JN_IF, at);
    jstr ended;
    if (!n || !(n->a = parse_expr(P)) || !close_stmt(P) || !parse_body(P, ends, &n->body, &ended)) return NULL;
    if (js_eqc(ended, "elif")) {
        /* elif is an if nested in the else branch; it consumes the endif. */
        jnode *inner = parse_if(P, &P->t->v[P->i - 1]);
        if (!inner || !(n->alt.v = ja_alloc(P->a, sizeof *n->alt.v))) return NULL;
        n->alt.v[0] = inner;
        n->alt.n = 1;
        return n;
    }
    if (js_eqc(ended, "else") && (!close_stmt(P) || !parse_body(P, endif, &n->alt, &ended))) return NULL;
    return close_stmt(P) ? n : NULL;
}

static jnode *parse_for(parser *P, const jtoken *at)
{
    static const char *const ends[] = {"else", "endfor", NULL};
    static const char *const endfor[] = {"endfor", NULL};
    jnode *n = node(P, JN_FOR, at);
    jstr ended;
    if (!n || !parse_targets(P, &n->args, 0)) return NULL;
    if (!is_name(cur(P), "in")) return syntax_error(cur(P), "expected 'in' in for loop");
    advance(P);
    if (!(n->a = parse_tuple(P, parse_or))) return NULL;
    if (is_name(cur(P), "if")) { advance(P); if (!(n->b = parse_or(P))) return NULL; }
    if (is_name(cur(P), "recursive")) return syntax_error(cur(P), "recursive loops are not supported");
    if (!close_stmt(P) || !parse_body(P, ends, &n->body, &ended)) return NULL;
    if (js_eqc(ended, "else") && (!close_stmt(P) || !parse_body(P, endfor, &n->alt, &ended))) return NULL;
    return close_stmt(P) ? n : NULL;
}

static jnode *parse_set(parser *P, const jtoken *at)
{
    static const char *const ends[] = {"endset", NULL};
    jnode *n = node(P, JN_SET, at);
    jstr ended;
    if (!n || !parse_targets(P, &n->args, 1)) return NULL;
    if (is_op(cur(P), "=")) {
        advance(P);
        if (!(n->a = parse_tuple(P, parse_expr))) return NULL;
        return close_stmt(P) ? n : NULL;
    }
    n->k = JN_SET_BLOCK;
    if (!close_stmt(P) || !parse_body(P, ends, &n->body, &ended)) return NULL;
    return close_stmt(P) ? n : NULL;
}

static jnode *parse_macro(parser *P, const jtoken *at)
{
    static const char *const ends[] = {"endmacro", NULL};
    jnode *n = node(P, JN_MACRO, at);
    const jtoken *name = cur(P);
    if (!n || !expect_kind(P, JT_NAME, "expected a macro name") || !expect_op(P, "(")) return NULL;
    n->name = name->s;
    nvec params = {0};
    while (!is_op(cur(P), ")")) {
        const jtoken *p = cur(P);
        jnode *def = NULL;
        if (!expect_kind(P, JT_NAME, "expected a parameter name")) goto fail;
        if (is_op(cur(P), "=")) { advance(P); if (!(def = parse_expr(P))) goto fail; }
        if (!nv_push(&params, def, p->s)) goto fail;
        if (!is_op(cur(P), ",")) break;
        advance(P);
    }
    jstr ended;
    if (!expect_op(P, ")") || !nv_finish(P, &params, &n->args, &n->kwnames)) goto fail;
    if (!close_stmt(P) || !parse_body(P, ends, &n->body, &ended)) return NULL;
    if (cur(P)->k == JT_NAME) advance(P);    /* {% endmacro name %} */
    return close_stmt(P) ? n : NULL;
fail:
    nv_drop(&params);
    return NULL;
}

/* {% generation %}...{% endgeneration %} (Transformers' assistant-mask
 * marker) renders its body as is: an always-true if. */
static jnode *parse_generation(parser *P, const jtoken *at)
{
    static const char *const ends[] = {"endgeneration", NULL};
    jnode *n = node(P, JN_IF, at);
    jstr ended;
    if (!n || !(n->a = literal(P, at, jv_bool(1)))) return NULL;
    if (!close_stmt(P) || !parse_body(P, ends, &n->body, &ended)) return NULL;
    return close_stmt(P) ? n : NULL;
}

static jnode *parse_statement(parser *P)
{
    const jtoken *kw = cur(P);
    if (kw->k != JT_NAME) return syntax_error(kw, "expected a statement name");
    advance(P);
    if (js_eqc(kw->s, "if")) return parse_if(P, kw);
    if (js_eqc(kw->s, "for")) return parse_for(P, kw);
    if (js_eqc(kw->s, "set")) return parse_set(P, kw);
    if (js_eqc(kw->s, "macro")) return parse_macro(P, kw);
    if (js_eqc(kw->s, "generation")) return parse_generation(P, kw);
    if (js_eqc(kw->s, "break") || js_eqc(kw->s, "continue")) {
        jnode *n = node(P, js_eqc(kw->s, "break") ? JN_BREAK : JN_CONTINUE, kw);
        return n && close_stmt(P) ? n : NULL;
    }
    char what[96];
    snprintf(what, sizeof what, "unknown or unsupported statement '%.*s'", (int)kw->s.n, kw->s.p);
    tp_fail(TP_ERR_FORMAT, "template syntax error at line %d, column %d: %s", kw->line, kw->col, what);
    return NULL;
}

static int is_end(const jtoken *t, const char *const *ends)
{
    for (; ends && *ends; ends++)
        if (is_name(t, *ends)) return 1;
    return 0;
}

/* Statements until one of `ends` (its name is consumed, its '%}' is not) or,
 * when ends is NULL, the end of the template. */
static int parse_body(parser *P, const char *const *ends, jnodes *out, jstr *ended)
{
    nvec v = {0};
    if (++P->depth > 200) { syntax_error(cur(P), "blocks nested too deeply"); return 0; }
    for (;;) {
        const jtoken *t = cur(P);
        jnode *n = NULL;
        if (t->k == JT_EOF) {
            if (!ends) break;
            const char *const *e = ends;
            while (e[1]) e++;                  /* the last one is the end tag */
            char what[64];
            snprintf(what, sizeof what, "missing '{%% %s %%}'", *e);
            syntax_error(t, what);
            goto fail;
        }
        if (t->k == JT_TEXT) {
            advance(P);
            if ((n = node(P, JN_TEXT, t))) n->name = t->s;
        } else if (t->k == JT_EXPR_OPEN) {
            advance(P);
            if ((n = node(P, JN_OUTPUT, t)) && (!(n->a = parse_expr(P)) ||
                !expect_kind(P, JT_EXPR_CLOSE, "expected '}}'"))) n = NULL;
        } else if (t->k == JT_STMT_OPEN) {
            advance(P);
            if (is_end(cur(P), ends)) { *ended = advance(P)->s; break; }
            n = parse_statement(P);
        } else {
            syntax_error(t, "unexpected token");
        }
        if (!n || !nv_push(&v, n, (jstr){0})) goto fail;
    }
    P->depth--;
    return nv_finish(P, &v, out, NULL);
fail:
    P->depth--;
    nv_drop(&v);
    return 0;
}

tp_status jinja_parse(const jtokens *t, jarena *a, jnode **root)
{
    parser P = {.t = t, .a = a};
    jnode *n = node(&P, JN_IF, &t->v[0]);
    jstr ended;
    if (!n || !(n->a = literal(&P, &t->v[0], jv_bool(1))) || !parse_body(&P, NULL, &n->body, &ended))
        return TP_ERR_FORMAT;
    *root = n;
    return TP_OK;
}
