/* Values of the Jinja interpreter: the arena they live in, the byte buffer
 * text is built in, and Python's semantics for truth, equality, ordering,
 * str(), repr() and json.dumps(), since chat templates are written against
 * Python Jinja and Transformers renders them there. */
#include "text/jinja.h"

#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

/* ---- arena -------------------------------------------------------------- */

typedef struct jchunk { struct jchunk *next; size_t used, cap; _Alignas(16) unsigned char data[]; } jchunk;
struct jarena { jchunk *head; };

jarena *ja_create(void) { return calloc(1, sizeof(jarena)); }

void ja_destroy(jarena *a)
{
    if (!a) return;
    for (jchunk *c = a->head, *next; c; c = next) { next = c->next; free(c); }
    free(a);
}

void *ja_alloc(jarena *a, size_t n)
{
    n = (n + 15) & ~(size_t)15;
    if (!n) n = 16;
    jchunk *c = a->head;
    if (!c || c->cap - c->used < n) {
        size_t cap = n > 65536 ? n : 65536;
        c = malloc(sizeof *c + cap);
        if (!c) return NULL;
        c->cap = cap;
        c->used = 0;
        c->next = a->head;
        a->head = c;
    }
    void *p = c->data + c->used;
    c->used += n;
    memset(p, 0, n);
    return p;
}

/* ---- byte buffer -------------------------------------------------------- */

void jb_put(jbuf *b, const char *s, size_t n)
{
    if (b->oom || !n) return;
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n + 1) cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) { b->oom = 1; return; }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = '\0';
}

void jb_puts(jbuf *b, const char *s) { jb_put(b, s, strlen(s)); }
void jb_putc(jbuf *b, char c) { jb_put(b, &c, 1); }

void jb_printf(jbuf *b, const char *fmt, ...)
{
    char tmp[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n > 0) jb_put(b, tmp, (size_t)n < sizeof tmp ? (size_t)n : sizeof tmp - 1);
}

void jb_free(jbuf *b) { free(b->p); memset(b, 0, sizeof *b); }

/* ---- strings ------------------------------------------------------------ */

jstr js_c(const char *s) { return (jstr){s, strlen(s)}; }
int js_eq(jstr a, jstr b) { return a.n == b.n && (!a.n || !memcmp(a.p, b.p, a.n)); }
int js_eqc(jstr a, const char *s) { return js_eq(a, js_c(s)); }

jstr js_dup(jarena *a, const char *p, size_t n)
{
    char *d = ja_alloc(a, n + 1);
    if (!d) return (jstr){NULL, n};
    if (n) memcpy(d, p, n);
    return (jstr){d, n};
}

size_t ju_len(jstr s)
{
    size_t n = 0;
    for (size_t i = 0; i < s.n; i++) n += ((unsigned char)s.p[i] & 0xc0) != 0x80;
    return n;
}

size_t ju_offset(jstr s, size_t i)
{
    size_t off = 0;
    while (off < s.n) {
        if (((unsigned char)s.p[off] & 0xc0) != 0x80 && i-- == 0) return off;
        off++;
    }
    return s.n;
}

/* ---- constructors ------------------------------------------------------- */

jv jv_undef(jstr name) { jv v = {.k = JV_UNDEFINED}; v.u.s = name; return v; }
jv jv_none(void) { return (jv){.k = JV_NONE}; }
jv jv_bool(int b) { jv v = {.k = JV_BOOL}; v.u.b = !!b; return v; }
jv jv_int(int64_t i) { jv v = {.k = JV_INT}; v.u.i = i; return v; }
jv jv_float(double f) { jv v = {.k = JV_FLOAT}; v.u.f = f; return v; }
jv jv_str(jstr s) { jv v = {.k = JV_STR}; v.u.s = s; return v; }

const char *jv_kind_name(jv_kind k)
{
    static const char *names[] = {"undefined", "none", "bool", "int", "float", "string",
                                  "list", "dict", "namespace", "macro", "function"};
    return names[k];
}

jlistv *jl_new(jarena *a, size_t n)
{
    jlistv *l = ja_alloc(a, sizeof *l);
    if (!l) return NULL;
    l->n = n;
    l->v = ja_alloc(a, (n ? n : 1) * sizeof(jv));
    return l->v ? l : NULL;
}

jdictv *jd_new(jarena *a) { return ja_alloc(a, sizeof(jdictv)); }

const jv *jd_get(const jdictv *d, jstr key)
{
    for (size_t i = 0; i < d->n; i++)
        if (js_eq(d->k[i], key)) return &d->v[i];
    return NULL;
}

tp_status jd_set(jarena *a, jdictv *d, jstr key, jv val)
{
    for (size_t i = 0; i < d->n; i++)
        if (js_eq(d->k[i], key)) { d->v[i] = val; return TP_OK; }
    if (d->n == d->cap) {
        /* The arena cannot grow a block in place; copy to a doubled one. */
        size_t cap = d->cap ? d->cap * 2 : 8;
        jstr *k = ja_alloc(a, cap * sizeof *k);
        jv *v = ja_alloc(a, cap * sizeof *v);
        if (!k || !v) return tp_fail(TP_ERR_NOMEM, "out of memory");
        if (d->n) { memcpy(k, d->k, d->n * sizeof *k); memcpy(v, d->v, d->n * sizeof *v); }
        d->k = k; d->v = v; d->cap = cap;
    }
    d->k[d->n] = key;
    d->v[d->n++] = val;
    return TP_OK;
}

/* ---- truth, equality, order -------------------------------------------- */

int jv_truthy(jv v)
{
    switch (v.k) {
    case JV_UNDEFINED: case JV_NONE: return 0;
    case JV_BOOL: return v.u.b;
    case JV_INT: return v.u.i != 0;
    case JV_FLOAT: return v.u.f != 0;
    case JV_STR: return v.u.s.n != 0;
    case JV_LIST: return v.u.l->n != 0;
    case JV_DICT: return v.u.d->n != 0;
    default: return 1;
    }
}

static int is_num(jv v) { return v.k == JV_INT || v.k == JV_FLOAT || v.k == JV_BOOL; }
static double num(jv v) { return v.k == JV_FLOAT ? v.u.f : v.k == JV_INT ? (double)v.u.i : v.u.b; }

int jv_equal(jv a, jv b)
{
    if (is_num(a) && is_num(b)) {
        if (a.k != JV_FLOAT && b.k != JV_FLOAT) {
            int64_t x = a.k == JV_INT ? a.u.i : a.u.b, y = b.k == JV_INT ? b.u.i : b.u.b;
            return x == y;
        }
        return num(a) == num(b);
    }
    if (a.k != b.k) return 0;
    switch (a.k) {
    case JV_UNDEFINED: case JV_NONE: return 1;
    case JV_STR: return js_eq(a.u.s, b.u.s);
    case JV_LIST:
        if (a.u.l->n != b.u.l->n) return 0;
        for (size_t i = 0; i < a.u.l->n; i++)
            if (!jv_equal(a.u.l->v[i], b.u.l->v[i])) return 0;
        return 1;
    case JV_DICT:
        if (a.u.d->n != b.u.d->n) return 0;
        for (size_t i = 0; i < a.u.d->n; i++) {
            const jv *o = jd_get(b.u.d, a.u.d->k[i]);
            if (!o || !jv_equal(a.u.d->v[i], *o)) return 0;
        }
        return 1;
    case JV_NS: return a.u.d == b.u.d;
    case JV_MACRO: return a.u.m == b.u.m;
    case JV_FUNC: return a.u.fn == b.u.fn;
    default: return 0;
    }
}

tp_status jv_compare(jv a, jv b, int *out)
{
    if (is_num(a) && is_num(b)) {
        double x = num(a), y = num(b);
        if (a.k == JV_INT && b.k == JV_INT) *out = (a.u.i > b.u.i) - (a.u.i < b.u.i);
        else *out = (x > y) - (x < y);
        return TP_OK;
    }
    if (a.k == JV_STR && b.k == JV_STR) {
        size_t n = a.u.s.n < b.u.s.n ? a.u.s.n : b.u.s.n;
        int c = n ? memcmp(a.u.s.p, b.u.s.p, n) : 0;
        *out = c ? (c > 0) - (c < 0) : (a.u.s.n > b.u.s.n) - (a.u.s.n < b.u.s.n);
        return TP_OK;
    }
    if (a.k == JV_LIST && b.k == JV_LIST) {
        for (size_t i = 0; i < a.u.l->n && i < b.u.l->n; i++) {
            tp_status s = jv_compare(a.u.l->v[i], b.u.l->v[i], out);
            if (s || *out) return s;
        }
        *out = (a.u.l->n > b.u.l->n) - (a.u.l->n < b.u.l->n);
        return TP_OK;
    }
    return tp_fail(TP_ERR_INVALID, "cannot order %s and %s", jv_kind_name(a.k), jv_kind_name(b.k));
}

/* ---- str() and repr() --------------------------------------------------- */

/* Python's float repr: the shortest digits that read back to the same double. */
static void put_float(jbuf *b, double f, int json)
{
    if (isnan(f)) { jb_puts(b, json ? "NaN" : "nan"); return; }
    if (isinf(f)) { jb_puts(b, f > 0 ? (json ? "Infinity" : "inf") : (json ? "-Infinity" : "-inf")); return; }
    char tmp[40];
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(tmp, sizeof tmp, "%.*g", prec, f);
        if (strtod(tmp, NULL) == f) break;
    }
    /* Python writes exponents as e+16 / e-05 -> e-05 and keeps ".0" on
     * integral values printed without an exponent. */
    char *e = strchr(tmp, 'e');
    if (e) {
        char mant[40], *x = e + 1;
        memcpy(mant, tmp, (size_t)(e - tmp));
        mant[e - tmp] = '\0';
        char sign = *x == '-' ? '-' : '+';
        if (*x == '-' || *x == '+') x++;
        while (*x == '0' && x[1]) x++;
        jb_printf(b, "%se%c%s%s", mant, sign, strlen(x) < 2 ? "0" : "", x);
        return;
    }
    jb_puts(b, tmp);
    if (!strpbrk(tmp, ".ni")) jb_puts(b, ".0");
}

static void repr_str(jbuf *b, jstr s)
{
    int has_sq = memchr(s.p, '\'', s.n) != NULL, has_dq = memchr(s.p, '"', s.n) != NULL;
    char q = has_sq && !has_dq ? '"' : '\'';
    jb_putc(b, q);
    for (size_t i = 0; i < s.n; i++) {
        unsigned char c = (unsigned char)s.p[i];
        if (c == (unsigned char)q || c == '\\') { jb_putc(b, '\\'); jb_putc(b, (char)c); }
        else if (c == '\n') jb_puts(b, "\\n");
        else if (c == '\r') jb_puts(b, "\\r");
        else if (c == '\t') jb_puts(b, "\\t");
        else if (c < 0x20 || c == 0x7f) jb_printf(b, "\\x%02x", c);
        else jb_putc(b, (char)c);
    }
    jb_putc(b, q);
}

static void repr_container(jbuf *b, jv v)
{
    if (v.k == JV_LIST) {
        jb_putc(b, '[');
        for (size_t i = 0; i < v.u.l->n; i++) {
            if (i) jb_puts(b, ", ");
            jv_repr(b, v.u.l->v[i]);
        }
        jb_putc(b, ']');
        return;
    }
    if (v.k == JV_NS) jb_puts(b, "<Namespace ");
    jb_putc(b, '{');
    for (size_t i = 0; i < v.u.d->n; i++) {
        if (i) jb_puts(b, ", ");
        repr_str(b, v.u.d->k[i]);
        jb_puts(b, ": ");
        jv_repr(b, v.u.d->v[i]);
    }
    jb_putc(b, '}');
    if (v.k == JV_NS) jb_putc(b, '>');
}

void jv_to_str(jbuf *b, jv v)
{
    switch (v.k) {
    case JV_UNDEFINED: return;
    case JV_NONE: jb_puts(b, "None"); return;
    case JV_BOOL: jb_puts(b, v.u.b ? "True" : "False"); return;
    case JV_INT: jb_printf(b, "%lld", (long long)v.u.i); return;
    case JV_FLOAT: put_float(b, v.u.f, 0); return;
    case JV_STR: jb_put(b, v.u.s.p, v.u.s.n); return;
    case JV_LIST: case JV_DICT: case JV_NS: repr_container(b, v); return;
    case JV_MACRO: jb_puts(b, "<macro>"); return;
    case JV_FUNC: jb_puts(b, "<function>"); return;
    }
}

void jv_repr(jbuf *b, jv v)
{
    if (v.k == JV_STR) repr_str(b, v.u.s);
    else jv_to_str(b, v);
}

/* ---- JSON --------------------------------------------------------------- */

static void json_str(jbuf *b, jstr s)
{
    jb_putc(b, '"');
    for (size_t i = 0; i < s.n; i++) {
        unsigned char c = (unsigned char)s.p[i];
        switch (c) {
        case '"': jb_puts(b, "\\\""); break;
        case '\\': jb_puts(b, "\\\\"); break;
        case '\n': jb_puts(b, "\\n"); break;
        case '\r': jb_puts(b, "\\r"); break;
        case '\t': jb_puts(b, "\\t"); break;
        case '\b': jb_puts(b, "\\b"); break;
        case '\f': jb_puts(b, "\\f"); break;
        default:
            if (c < 0x20) jb_printf(b, "\\u%04x", c);
            else jb_putc(b, (char)c);   /* ensure_ascii=False, as Transformers */
        }
    }
    jb_putc(b, '"');
}

static void json_newline(jbuf *b, int indent, int depth)
{
    jb_putc(b, '\n');
    for (int i = 0; i < indent * depth; i++) jb_putc(b, ' ');
}

static int cmp_keys(const void *x, const void *y)
{
    const jstr *a = *(const jstr *const *)x, *b = *(const jstr *const *)y;
    size_t n = a->n < b->n ? a->n : b->n;
    int c = n ? memcmp(a->p, b->p, n) : 0;
    return c ? c : (a->n > b->n) - (a->n < b->n);
}

static tp_status json_value(jbuf *b, jv v, int indent, int sort_keys, int depth);

static tp_status json_dict(jbuf *b, const jdictv *d, int indent, int sort_keys, int depth)
{
    if (!d->n) { jb_puts(b, "{}"); return TP_OK; }
    size_t *order = malloc(d->n * sizeof *order);
    const jstr **keys = malloc(d->n * sizeof *keys);
    if (!order || !keys) { free(order); free(keys); return tp_fail(TP_ERR_NOMEM, "out of memory"); }
    for (size_t i = 0; i < d->n; i++) keys[i] = &d->k[i];
    if (sort_keys) qsort(keys, d->n, sizeof *keys, cmp_keys);
    for (size_t i = 0; i < d->n; i++) order[i] = (size_t)(keys[i] - d->k);
    free(keys);
    tp_status s = TP_OK;
    jb_putc(b, '{');
    for (size_t i = 0; i < d->n && !s; i++) {
        if (i) jb_puts(b, indent >= 0 ? "," : ", ");
        if (indent >= 0) json_newline(b, indent, depth + 1);
        json_str(b, d->k[order[i]]);
        jb_puts(b, ": ");
        s = json_value(b, d->v[order[i]], indent, sort_keys, depth + 1);
    }
    if (indent >= 0) json_newline(b, indent, depth);
    jb_putc(b, '}');
    free(order);
    return s;
}

static tp_status json_value(jbuf *b, jv v, int indent, int sort_keys, int depth)
{
    if (depth > 100) return tp_fail(TP_ERR_INVALID, "tojson: value nested too deeply");
    switch (v.k) {
    case JV_NONE: case JV_UNDEFINED: jb_puts(b, "null"); return TP_OK;
    case JV_BOOL: jb_puts(b, v.u.b ? "true" : "false"); return TP_OK;
    case JV_INT: jb_printf(b, "%lld", (long long)v.u.i); return TP_OK;
    case JV_FLOAT: put_float(b, v.u.f, 1); return TP_OK;
    case JV_STR: json_str(b, v.u.s); return TP_OK;
    case JV_LIST:
        if (!v.u.l->n) { jb_puts(b, "[]"); return TP_OK; }
        jb_putc(b, '[');
        for (size_t i = 0; i < v.u.l->n; i++) {
            if (i) jb_puts(b, indent >= 0 ? "," : ", ");
            if (indent >= 0) json_newline(b, indent, depth + 1);
            tp_status s = json_value(b, v.u.l->v[i], indent, sort_keys, depth + 1);
            if (s) return s;
        }
        if (indent >= 0) json_newline(b, indent, depth);
        jb_putc(b, ']');
        return TP_OK;
    case JV_DICT: return json_dict(b, v.u.d, indent, sort_keys, depth);
    default: return tp_fail(TP_ERR_INVALID, "tojson: a %s is not JSON serializable", jv_kind_name(v.k));
    }
}

tp_status jv_to_json(jbuf *b, jv v, int indent, int sort_keys)
{
    return json_value(b, v, indent, sort_keys, 0);
}

tp_status jv_from_cjson(jarena *a, const cJSON *j, jv *out)
{
    if (cJSON_IsNull(j)) { *out = jv_none(); return TP_OK; }
    if (cJSON_IsBool(j)) { *out = jv_bool(cJSON_IsTrue(j)); return TP_OK; }
    if (cJSON_IsNumber(j)) {
        double d = j->valuedouble;
        /* cJSON keeps one double: integral values become ints, as json.loads
         * does for numbers written without '.' or an exponent. */
        if (d == floor(d) && fabs(d) < 9e15) *out = jv_int((int64_t)d);
        else *out = jv_float(d);
        return TP_OK;
    }
    if (cJSON_IsString(j)) {
        jstr s = js_dup(a, j->valuestring, strlen(j->valuestring));
        if (!s.p) return tp_fail(TP_ERR_NOMEM, "out of memory");
        *out = jv_str(s);
        return TP_OK;
    }
    if (cJSON_IsArray(j)) {
        jlistv *l = jl_new(a, (size_t)cJSON_GetArraySize(j));
        if (!l) return tp_fail(TP_ERR_NOMEM, "out of memory");
        size_t i = 0;
        for (const cJSON *c = j->child; c; c = c->next) {
            tp_status s = jv_from_cjson(a, c, &l->v[i++]);
            if (s) return s;
        }
        *out = (jv){.k = JV_LIST, .u.l = l};
        return TP_OK;
    }
    if (cJSON_IsObject(j)) {
        jdictv *d = jd_new(a);
        if (!d) return tp_fail(TP_ERR_NOMEM, "out of memory");
        for (const cJSON *c = j->child; c; c = c->next) {
            jv v;
            jstr k = js_dup(a, c->string, strlen(c->string));
            if (!k.p) return tp_fail(TP_ERR_NOMEM, "out of memory");
            tp_status s = jv_from_cjson(a, c, &v);
            if (!s) s = jd_set(a, d, k, v);
            if (s) return s;
        }
        *out = (jv){.k = JV_DICT, .u.d = d};
        return TP_OK;
    }
    return tp_fail(TP_ERR_INVALID, "unsupported JSON value");
}

tp_status jv_from_buf(jarena *a, const jbuf *b, jv *out)
{
    if (b->oom) return tp_fail(TP_ERR_NOMEM, "out of memory");
    jstr s = js_dup(a, b->p ? b->p : "", b->n);
    if (!s.p) return tp_fail(TP_ERR_NOMEM, "out of memory");
    *out = jv_str(s);
    return TP_OK;
}
