/* Jinja builtins used by chat templates: filters (`x | trim`), tests
 * (`x is string`), Python methods of str and dict (`s.startswith(...)`,
 * `d.get(...)`), and attribute lookup.  Strings are UTF-8; case mapping and
 * whitespace follow Unicode (utf8proc), as Python's str does. */
#include "text/jinja.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#define TRY(x) do { tp_status s_ = (x); if (s_) return s_; } while (0)

static tp_status nomem(void) { return tp_fail(TP_ERR_NOMEM, "out of memory"); }

const jv *jargs_get(const jargs *x, size_t i, const char *name)
{
    if (i < x->npos) return &x->pos[i];
    for (size_t k = 0; k < x->nkw; k++)
        if (js_eqc(x->kwn[k], name)) return &x->kwv[k];
    return NULL;
}

static tp_status want_str(const jv *v, const char *what)
{
    if (v && v->k == JV_STR) return TP_OK;
    return tp_fail(TP_ERR_INVALID, "%s expects a string, got %s", what, v ? jv_kind_name(v->k) : "nothing");
}

static tp_status buf_value(jarena *a, jbuf *b, jv *out)
{
    tp_status s = jv_from_buf(a, b, out);
    jb_free(b);
    return s;
}

jv jinja_getattr(jv obj, jstr key)
{
    if ((obj.k == JV_DICT || obj.k == JV_NS)) {
        const jv *v = jd_get(obj.u.d, key);
        if (v) return *v;
    }
    return jv_undef(key);
}

/* ---- code points -------------------------------------------------------- */

/* The code point at byte i (advancing i); invalid bytes read as themselves. */
static int32_t next_cp(jstr s, size_t *i)
{
    utf8proc_int32_t cp;
    utf8proc_ssize_t n = utf8proc_iterate((const utf8proc_uint8_t *)s.p + *i, (utf8proc_ssize_t)(s.n - *i), &cp);
    if (n <= 0) { cp = (unsigned char)s.p[*i]; n = 1; }
    *i += (size_t)n;
    return cp;
}

static int32_t prev_cp(jstr s, size_t *end)
{
    size_t b = *end - 1;
    while (b > 0 && ((unsigned char)s.p[b] & 0xc0) == 0x80) b--;
    size_t i = b;
    int32_t cp = next_cp(s, &i);
    *end = b;
    return cp;
}

/* Python's str.isspace(). */
static int py_space(int32_t cp)
{
    if ((cp >= 9 && cp <= 13) || (cp >= 0x1c && cp <= 0x20) || cp == 0x85 || cp == 0xa0) return 1;
    if (cp < 0x1680) return 0;
    utf8proc_category_t cat = utf8proc_category(cp);
    return cat == UTF8PROC_CATEGORY_ZS || cat == UTF8PROC_CATEGORY_ZL || cat == UTF8PROC_CATEGORY_ZP;
}

static int in_set(int32_t cp, const jv *chars)
{
    if (!chars || chars->k != JV_STR) return py_space(cp);
    for (size_t i = 0; i < chars->u.s.n;)
        if (next_cp(chars->u.s, &i) == cp) return 1;
    return 0;
}

/* str.strip/lstrip/rstrip([chars]); which: 1 left, 2 right, 3 both. */
static jstr strip(jstr s, const jv *chars, int which)
{
    size_t b = 0, e = s.n;
    while (which & 1 && b < e) { size_t i = b; if (!in_set(next_cp(s, &i), chars)) break; b = i; }
    while (which & 2 && e > b) { size_t i = e; if (!in_set(prev_cp(s, &i), chars)) break; e = i; }
    return (jstr){s.p + b, e - b};
}

/* upper, lower, title (mode 0, 1, 2) and capitalize (3). */
static tp_status change_case(jarena *a, jstr s, int mode, jv *out)
{
    jbuf b = {0};
    int prev_cased = 0;
    for (size_t i = 0; i < s.n;) {
        int32_t cp = next_cp(s, &i), m;
        if (mode == 0) m = utf8proc_toupper(cp);
        else if (mode == 1) m = utf8proc_tolower(cp);
        else if (mode == 2) m = prev_cased ? utf8proc_tolower(cp) : utf8proc_totitle(cp);
        else m = prev_cased ? utf8proc_tolower(cp) : utf8proc_totitle(cp);
        if (mode == 2) prev_cased = utf8proc_toupper(cp) != utf8proc_tolower(cp) || utf8proc_totitle(cp) != cp;
        if (mode == 3) prev_cased = 1;
        utf8proc_uint8_t u[4];
        jb_put(&b, (const char *)u, (size_t)utf8proc_encode_char(m, u));
    }
    return buf_value(a, &b, out);
}

static int find(jstr hay, jstr needle, size_t from, size_t *at)
{
    for (size_t i = from; i + needle.n <= hay.n; i++)
        if (!needle.n || !memcmp(hay.p + i, needle.p, needle.n)) { *at = i; return 1; }
    return 0;
}

static tp_status replace(jarena *a, jstr s, jstr old, jstr new, int64_t count, jv *out)
{
    jbuf b = {0};
    size_t pos = 0, at;
    if (!old.n) {   /* Python inserts `new` between all characters */
        for (size_t i = 0; i <= s.n && count != 0; count--) {
            jb_put(&b, new.p, new.n);
            if (i == s.n) { pos = s.n; break; }
            size_t j = i;
            next_cp(s, &j);
            jb_put(&b, s.p + i, j - i);
            pos = i = j;
        }
    } else {
        while (count != 0 && find(s, old, pos, &at)) {
            jb_put(&b, s.p + pos, at - pos);
            jb_put(&b, new.p, new.n);
            pos = at + old.n;
            count--;
        }
    }
    jb_put(&b, s.p + pos, s.n - pos);
    return buf_value(a, &b, out);
}

/* str.split([sep[, maxsplit]]) */
static tp_status split(jarena *a, jstr s, const jv *sep, const jv *maxv, jv *out)
{
    int64_t max = maxv && maxv->k == JV_INT ? maxv->u.i : -1;
    if (sep && sep->k != JV_NONE) TRY(want_str(sep, "split"));
    if (sep && sep->k == JV_STR && !sep->u.s.n) return tp_fail(TP_ERR_INVALID, "split: empty separator");
    jlistv *l = jl_new(a, s.n + 1);
    if (!l) return nomem();
    l->n = 0;
    if (sep && sep->k == JV_STR) {
        size_t pos = 0, at;
        while (max-- != 0 && find(s, sep->u.s, pos, &at)) {
            l->v[l->n++] = jv_str((jstr){s.p + pos, at - pos});
            pos = at + sep->u.s.n;
        }
        l->v[l->n++] = jv_str((jstr){s.p + pos, s.n - pos});
    } else {
        size_t i = 0;
        for (;;) {
            jstr rest = strip((jstr){s.p + i, s.n - i}, NULL, 1);
            i = (size_t)(rest.p - s.p);
            if (i >= s.n) break;
            if (max-- == 0) { l->v[l->n++] = jv_str(strip(rest, NULL, 2)); break; }
            size_t e = i;
            while (e < s.n) { size_t j = e; if (py_space(next_cp(s, &j))) break; e = j; }
            l->v[l->n++] = jv_str((jstr){s.p + i, e - i});
            i = e;
        }
    }
    *out = (jv){.k = JV_LIST, .u.l = l};
    return TP_OK;
}

/* str.startswith / endswith with a string or a list of them. */
static tp_status affix(jstr s, const jv *arg, int end, jv *out)
{
    if (arg && arg->k == JV_LIST) {
        for (size_t i = 0; i < arg->u.l->n; i++) {
            TRY(affix(s, &arg->u.l->v[i], end, out));
            if (out->u.b) return TP_OK;
        }
        *out = jv_bool(0);
        return TP_OK;
    }
    TRY(want_str(arg, end ? "endswith" : "startswith"));
    jstr p = arg->u.s;
    *out = jv_bool(p.n <= s.n && (!p.n || !memcmp(end ? s.p + s.n - p.n : s.p, p.p, p.n)));
    return TP_OK;
}

static tp_status join(jarena *a, jv seq, jstr sep, const jv *attr, jv *out)
{
    if (seq.k == JV_UNDEFINED) { *out = jv_str(js_c("")); return TP_OK; }
    if (seq.k != JV_LIST) return tp_fail(TP_ERR_INVALID, "join expects a list, got %s", jv_kind_name(seq.k));
    jbuf b = {0};
    for (size_t i = 0; i < seq.u.l->n; i++) {
        if (i) jb_put(&b, sep.p, sep.n);
        jv x = seq.u.l->v[i];
        if (attr && attr->k == JV_STR) x = jinja_getattr(x, attr->u.s);
        jv_to_str(&b, x);
    }
    return buf_value(a, &b, out);
}

/* ---- methods ------------------------------------------------------------ */

static tp_status str_method(jarena *a, jstr s, jstr name, const jargs *x, jv *out, int *found)
{
    const jv *a0 = jargs_get(x, 0, "chars"), *a1 = x->npos > 1 ? &x->pos[1] : NULL;
    *found = 1;
    if (js_eqc(name, "strip")) { *out = jv_str(strip(s, a0, 3)); return TP_OK; }
    if (js_eqc(name, "lstrip")) { *out = jv_str(strip(s, a0, 1)); return TP_OK; }
    if (js_eqc(name, "rstrip")) { *out = jv_str(strip(s, a0, 2)); return TP_OK; }
    if (js_eqc(name, "startswith")) return affix(s, a0, 0, out);
    if (js_eqc(name, "endswith")) return affix(s, a0, 1, out);
    if (js_eqc(name, "split")) return split(a, s, jargs_get(x, 0, "sep"), jargs_get(x, 1, "maxsplit"), out);
    if (js_eqc(name, "upper")) return change_case(a, s, 0, out);
    if (js_eqc(name, "lower")) return change_case(a, s, 1, out);
    if (js_eqc(name, "title")) return change_case(a, s, 2, out);
    if (js_eqc(name, "capitalize")) return change_case(a, s, 3, out);
    if (js_eqc(name, "replace")) {
        TRY(want_str(a0, "replace"));
        TRY(want_str(a1, "replace"));
        const jv *cnt = jargs_get(x, 2, "count");
        return replace(a, s, a0->u.s, a1->u.s, cnt && cnt->k == JV_INT ? cnt->u.i : -1, out);
    }
    if (js_eqc(name, "find") || js_eqc(name, "count")) {
        TRY(want_str(a0, "find"));
        size_t at, pos = 0;
        int64_t n = 0;
        if (js_eqc(name, "find")) { *out = jv_int(find(s, a0->u.s, 0, &at) ? (int64_t)ju_len((jstr){s.p, at}) : -1); return TP_OK; }
        while (find(s, a0->u.s, pos, &at)) { n++; pos = at + (a0->u.s.n ? a0->u.s.n : 1); if (!a0->u.s.n && at == s.n) break; }
        *out = jv_int(n);
        return TP_OK;
    }
    if (js_eqc(name, "join")) return a0 ? join(a, *a0, s, NULL, out) : tp_fail(TP_ERR_INVALID, "join expects a list");
    *found = 0;
    return TP_OK;
}

static tp_status dict_view(jarena *a, const jdictv *d, int what, jv *out)
{
    jlistv *l = jl_new(a, d->n);
    if (!l) return nomem();
    for (size_t i = 0; i < d->n; i++) {
        if (what == 0) { l->v[i] = jv_str(d->k[i]); continue; }
        if (what == 1) { l->v[i] = d->v[i]; continue; }
        jlistv *pair = jl_new(a, 2);
        if (!pair) return nomem();
        pair->v[0] = jv_str(d->k[i]);
        pair->v[1] = d->v[i];
        l->v[i] = (jv){.k = JV_LIST, .u.l = pair};
    }
    *out = (jv){.k = JV_LIST, .u.l = l};
    return TP_OK;
}

tp_status jinja_method(jarena *a, jv self, jstr name, const jargs *x, jv *out, int *found)
{
    *found = 0;
    if (self.k == JV_STR) return str_method(a, self.u.s, name, x, out, found);
    if (self.k != JV_DICT) return TP_OK;
    *found = 1;
    if (js_eqc(name, "keys")) return dict_view(a, self.u.d, 0, out);
    if (js_eqc(name, "values")) return dict_view(a, self.u.d, 1, out);
    if (js_eqc(name, "items")) return dict_view(a, self.u.d, 2, out);
    if (js_eqc(name, "get")) {
        const jv *k = jargs_get(x, 0, "key"), *def = jargs_get(x, 1, "default");
        TRY(want_str(k, "get"));
        const jv *v = jd_get(self.u.d, k->u.s);
        *out = v ? *v : def ? *def : jv_none();
        return TP_OK;
    }
    *found = 0;
    return TP_OK;
}

/* ---- tests -------------------------------------------------------------- */

tp_status jinja_test(jstr name, jv v, const jargs *x, int *out)
{
    const jv *arg = jargs_get(x, 0, "value");
    jv_kind k = v.k;
#define IS(n) js_eqc(name, n)
    if (IS("defined")) *out = k != JV_UNDEFINED;
    else if (IS("undefined")) *out = k == JV_UNDEFINED;
    else if (IS("none")) *out = k == JV_NONE;
    else if (IS("string")) *out = k == JV_STR;
    else if (IS("number")) *out = k == JV_INT || k == JV_FLOAT;
    else if (IS("integer")) *out = k == JV_INT;
    else if (IS("float")) *out = k == JV_FLOAT;
    else if (IS("boolean")) *out = k == JV_BOOL;
    else if (IS("true")) *out = k == JV_BOOL && v.u.b;
    else if (IS("false")) *out = k == JV_BOOL && !v.u.b;
    else if (IS("mapping")) *out = k == JV_DICT;
    else if (IS("iterable")) *out = k == JV_LIST || k == JV_DICT || k == JV_STR;
    else if (IS("sequence")) *out = k == JV_LIST || k == JV_DICT || k == JV_STR;
    else if (IS("callable")) *out = k == JV_MACRO || k == JV_FUNC;
    else if (IS("odd") || IS("even")) {
        if (k != JV_INT) return tp_fail(TP_ERR_INVALID, "test '%.*s' expects an integer", (int)name.n, name.p);
        *out = (v.u.i % 2 != 0) == IS("odd");
    } else if (IS("divisibleby")) {
        if (k != JV_INT || !arg || arg->k != JV_INT || !arg->u.i) return tp_fail(TP_ERR_INVALID, "divisibleby expects non-zero integers");
        *out = v.u.i % arg->u.i == 0;
    } else if (IS("lower") || IS("upper")) {
        if (k != JV_STR) { *out = 0; return TP_OK; }
        int any = 0;
        *out = 1;
        for (size_t i = 0; i < v.u.s.n;) {
            int32_t cp = next_cp(v.u.s, &i);
            if (utf8proc_toupper(cp) == utf8proc_tolower(cp)) continue;
            any = 1;
            if (cp != (IS("lower") ? utf8proc_tolower(cp) : utf8proc_toupper(cp))) *out = 0;
        }
        *out = *out && any;
    } else if (IS("eq") || IS("equalto") || IS("==") || IS("sameas")) *out = arg && jv_equal(v, *arg);
    else if (IS("ne") || IS("!=")) *out = !arg || !jv_equal(v, *arg);
    else if (IS("in")) {
        if (!arg) return tp_fail(TP_ERR_INVALID, "test 'in' needs an argument");
        if (arg->k == JV_STR && k == JV_STR) {
            size_t at;
            *out = find(arg->u.s, v.u.s, 0, &at);
        } else if (arg->k == JV_LIST) {
            *out = 0;
            for (size_t i = 0; i < arg->u.l->n && !*out; i++) *out = jv_equal(arg->u.l->v[i], v);
        } else if (arg->k == JV_DICT) {
            *out = k == JV_STR && jd_get(arg->u.d, v.u.s);
        } else { return tp_fail(TP_ERR_INVALID, "test 'in' expects a string, list or dict"); }
    } else if (IS("gt") || IS("lt") || IS("ge") || IS("le") || IS("greaterthan") || IS("lessthan")) {
        int r;
        if (!arg) return tp_fail(TP_ERR_INVALID, "comparison test needs an argument");
        TRY(jv_compare(v, *arg, &r));
        *out = IS("gt") || IS("greaterthan") ? r > 0 : IS("lt") || IS("lessthan") ? r < 0 : IS("ge") ? r >= 0 : r <= 0;
    } else return tp_fail(TP_ERR_INVALID, "unknown test '%.*s'", (int)name.n, name.p);
#undef IS
    return TP_OK;
}

/* ---- filters ------------------------------------------------------------ */

static tp_status length(jv v, jv *out)
{
    switch (v.k) {
    case JV_STR: *out = jv_int((int64_t)ju_len(v.u.s)); return TP_OK;
    case JV_LIST: *out = jv_int((int64_t)v.u.l->n); return TP_OK;
    case JV_DICT: case JV_NS: *out = jv_int((int64_t)v.u.d->n); return TP_OK;
    case JV_UNDEFINED: *out = jv_int(0); return TP_OK;
    default: return tp_fail(TP_ERR_INVALID, "object of type %s has no length", jv_kind_name(v.k));
    }
}

static tp_status tojson(jarena *a, jv v, const jargs *x, jv *out)
{
    const jv *ind = jargs_get(x, 0, "indent"), *sk = jargs_get(x, 99, "sort_keys");
    jbuf b = {0};
    tp_status s = jv_to_json(&b, v, ind && ind->k == JV_INT ? (int)ind->u.i : -1, sk && jv_truthy(*sk));
    if (s) { jb_free(&b); return s; }
    return buf_value(a, &b, out);
}

static tp_status to_list(jarena *a, jv v, jv *out)
{
    if (v.k == JV_LIST) { *out = v; return TP_OK; }
    if (v.k == JV_DICT) return dict_view(a, v.u.d, 0, out);
    if (v.k == JV_STR) {
        size_t n = ju_len(v.u.s);
        jlistv *l = jl_new(a, n);
        if (!l) return nomem();
        for (size_t i = 0; i < n; i++) {
            size_t b = ju_offset(v.u.s, i), e = ju_offset(v.u.s, i + 1);
            l->v[i] = jv_str((jstr){v.u.s.p + b, e - b});
        }
        *out = (jv){.k = JV_LIST, .u.l = l};
        return TP_OK;
    }
    if (v.k == JV_UNDEFINED) return (*out = (jv){.k = JV_LIST, .u.l = jl_new(a, 0)}).u.l ? TP_OK : nomem();
    return tp_fail(TP_ERR_INVALID, "a %s is not iterable", jv_kind_name(v.k));
}

/* selectattr/rejectattr(attr[, test[, arg]]) and select/reject(test[, arg]). */
static tp_status select_items(jarena *a, jv seq, const jargs *x, int by_attr, int keep, jv *out)
{
    jlistv *src;
    jv lv;
    TRY(to_list(a, seq, &lv));
    src = lv.u.l;
    size_t first = by_attr ? 1 : 0;
    if (by_attr && (x->npos < 1 || x->pos[0].k != JV_STR)) return tp_fail(TP_ERR_INVALID, "selectattr expects an attribute name");
    jstr test = x->npos > first && x->pos[first].k == JV_STR ? x->pos[first].u.s : js_c("");
    jargs targs = {x->pos + first + 1, x->npos > first + 1 ? x->npos - first - 1 : 0, NULL, NULL, 0};
    jlistv *l = jl_new(a, src->n);
    if (!l) return nomem();
    l->n = 0;
    for (size_t i = 0; i < src->n; i++) {
        jv item = by_attr ? jinja_getattr(src->v[i], x->pos[0].u.s) : src->v[i];
        int r;
        if (test.n) TRY(jinja_test(test, item, &targs, &r));
        else r = jv_truthy(item);
        if (r == keep) l->v[l->n++] = src->v[i];
    }
    *out = (jv){.k = JV_LIST, .u.l = l};
    return TP_OK;
}

/* map(attribute='x') or map('filter', args...). */
static tp_status map_items(jarena *a, jv seq, const jargs *x, jv *out)
{
    jv lv;
    TRY(to_list(a, seq, &lv));
    const jv *attr = jargs_get(x, 99, "attribute");
    if (!attr && (x->npos < 1 || x->pos[0].k != JV_STR)) return tp_fail(TP_ERR_INVALID, "map expects a filter name or attribute=");
    jlistv *l = jl_new(a, lv.u.l->n);
    if (!l) return nomem();
    jargs fargs = {x->npos > 1 ? x->pos + 1 : NULL, x->npos > 1 ? x->npos - 1 : 0, NULL, NULL, 0};
    for (size_t i = 0; i < lv.u.l->n; i++) {
        if (attr && attr->k == JV_STR) {
            l->v[i] = jinja_getattr(lv.u.l->v[i], attr->u.s);
            const jv *def = jargs_get(x, 99, "default");
            if (l->v[i].k == JV_UNDEFINED && def) l->v[i] = *def;
        } else TRY(jinja_filter(a, x->pos[0].u.s, lv.u.l->v[i], &fargs, &l->v[i]));
    }
    *out = (jv){.k = JV_LIST, .u.l = l};
    return TP_OK;
}

/* indent(width=4, first=False, blank=False) */
static tp_status indent(jarena *a, jv v, const jargs *x, jv *out)
{
    TRY(want_str(&v, "indent"));
    const jv *w = jargs_get(x, 0, "width"), *first = jargs_get(x, 1, "first"), *blank = jargs_get(x, 2, "blank");
    jbuf pad = {0}, b = {0};
    if (w && w->k == JV_STR) jb_put(&pad, w->u.s.p, w->u.s.n);
    else for (int64_t i = 0; i < (w && w->k == JV_INT ? w->u.i : 4); i++) jb_putc(&pad, ' ');
    jstr s = v.u.s;
    for (size_t i = 0, line = 0; i <= s.n; line++) {
        size_t e = i;
        while (e < s.n && s.p[e] != '\n') e++;
        int empty = e == i;
        if ((line > 0 || (first && jv_truthy(*first))) && (!empty || (blank && jv_truthy(*blank))) &&
            !(e == s.n && empty && line > 0 && !(blank && jv_truthy(*blank))))
            jb_put(&b, pad.p, pad.n);
        jb_put(&b, s.p + i, e - i);
        if (e == s.n) break;
        jb_putc(&b, '\n');
        i = e + 1;
    }
    jb_free(&pad);
    return buf_value(a, &b, out);
}

static tp_status to_int(jv v, const jv *def, jv *out)
{
    if (v.k == JV_INT) { *out = v; return TP_OK; }
    if (v.k == JV_BOOL) { *out = jv_int(v.u.b); return TP_OK; }
    if (v.k == JV_FLOAT && isfinite(v.u.f)) { *out = jv_int((int64_t)v.u.f); return TP_OK; }
    if (v.k == JV_STR) {
        char tmp[64], *end;
        snprintf(tmp, sizeof tmp, "%.*s", (int)(v.u.s.n < 63 ? v.u.s.n : 63), v.u.s.p);
        double d = strtod(tmp, &end);
        if (end != tmp && !*end) { *out = jv_int((int64_t)d); return TP_OK; }
    }
    *out = def ? *def : jv_int(0);
    return TP_OK;
}

static tp_status filter_str(jarena *a, jstr name, jv v, const jargs *x, jv *out, int *found)
{
    *found = 1;
    if (js_eqc(name, "trim")) { TRY(want_str(&v, "trim")); *out = jv_str(strip(v.u.s, jargs_get(x, 0, "chars"), 3)); return TP_OK; }
    if (js_eqc(name, "upper")) { TRY(want_str(&v, "upper")); return change_case(a, v.u.s, 0, out); }
    if (js_eqc(name, "lower")) { TRY(want_str(&v, "lower")); return change_case(a, v.u.s, 1, out); }
    if (js_eqc(name, "title")) { TRY(want_str(&v, "title")); return change_case(a, v.u.s, 2, out); }
    if (js_eqc(name, "capitalize")) { TRY(want_str(&v, "capitalize")); return change_case(a, v.u.s, 3, out); }
    if (js_eqc(name, "replace")) {
        const jv *o = jargs_get(x, 0, "old"), *n = jargs_get(x, 1, "new"), *c = jargs_get(x, 2, "count");
        TRY(want_str(&v, "replace")); TRY(want_str(o, "replace")); TRY(want_str(n, "replace"));
        return replace(a, v.u.s, o->u.s, n->u.s, c && c->k == JV_INT ? c->u.i : -1, out);
    }
    if (js_eqc(name, "indent")) return indent(a, v, x, out);
    if (js_eqc(name, "string")) {
        jbuf b = {0};
        jv_to_str(&b, v);
        return buf_value(a, &b, out);
    }
    *found = 0;
    return TP_OK;
}

static tp_status filter_seq(jarena *a, jstr name, jv v, const jargs *x, jv *out, int *found)
{
    *found = 1;
    if (js_eqc(name, "length") || js_eqc(name, "count")) return length(v, out);
    if (js_eqc(name, "list")) return to_list(a, v, out);
    if (js_eqc(name, "first") || js_eqc(name, "last")) {
        jv l;
        TRY(to_list(a, v, &l));
        int last = js_eqc(name, "last");
        *out = l.u.l->n ? l.u.l->v[last ? l.u.l->n - 1 : 0] : jv_undef(name);
        return TP_OK;
    }
    if (js_eqc(name, "reverse")) {
        if (v.k == JV_STR) {
            jbuf b = {0};
            for (size_t e = v.u.s.n; e > 0;) { size_t s = e; prev_cp(v.u.s, &s); jb_put(&b, v.u.s.p + s, e - s); e = s; }
            return buf_value(a, &b, out);
        }
        jv l;
        TRY(to_list(a, v, &l));
        jlistv *r = jl_new(a, l.u.l->n);
        if (!r) return nomem();
        for (size_t i = 0; i < r->n; i++) r->v[i] = l.u.l->v[r->n - 1 - i];
        *out = (jv){.k = JV_LIST, .u.l = r};
        return TP_OK;
    }
    if (js_eqc(name, "join")) {
        const jv *sep = jargs_get(x, 0, "d");
        if (sep && sep->k != JV_STR) return want_str(sep, "join");
        return join(a, v, sep ? sep->u.s : js_c(""), jargs_get(x, 1, "attribute"), out);
    }
    if (js_eqc(name, "items")) {
        if (v.k == JV_UNDEFINED) return to_list(a, v, out);
        if (v.k != JV_DICT) return tp_fail(TP_ERR_INVALID, "items expects a dict, got %s", jv_kind_name(v.k));
        return dict_view(a, v.u.d, 2, out);
    }
    if (js_eqc(name, "selectattr") || js_eqc(name, "rejectattr")) return select_items(a, v, x, 1, name.p[0] == 's', out);
    if (js_eqc(name, "select") || js_eqc(name, "reject")) return select_items(a, v, x, 0, name.p[0] == 's', out);
    if (js_eqc(name, "map")) return map_items(a, v, x, out);
    *found = 0;
    return TP_OK;
}

tp_status jinja_filter(jarena *a, jstr name, jv v, const jargs *x, jv *out)
{
    int found;
    TRY(filter_str(a, name, v, x, out, &found));
    if (found) return TP_OK;
    TRY(filter_seq(a, name, v, x, out, &found));
    if (found) return TP_OK;
    if (js_eqc(name, "tojson")) return tojson(a, v, x, out);
    if (js_eqc(name, "safe")) { *out = v; return TP_OK; }   /* no autoescaping */
    if (js_eqc(name, "default") || js_eqc(name, "d")) {
        const jv *def = jargs_get(x, 0, "default_value"), *boolean = jargs_get(x, 1, "boolean");
        int use = v.k == JV_UNDEFINED || (boolean && jv_truthy(*boolean) && !jv_truthy(v));
        *out = use ? (def ? *def : jv_str(js_c(""))) : v;
        return TP_OK;
    }
    if (js_eqc(name, "int")) return to_int(v, jargs_get(x, 0, "default"), out);
    if (js_eqc(name, "float")) {
        jv i;
        if (v.k == JV_FLOAT) { *out = v; return TP_OK; }
        if (v.k == JV_STR) {
            char tmp[64], *end;
            snprintf(tmp, sizeof tmp, "%.*s", (int)(v.u.s.n < 63 ? v.u.s.n : 63), v.u.s.p);
            double d = strtod(tmp, &end);
            *out = jv_float(end != tmp && !*end ? d : 0.0);
            return TP_OK;
        }
        TRY(to_int(v, NULL, &i));
        *out = jv_float((double)i.u.i);
        return TP_OK;
    }
    if (js_eqc(name, "abs")) {
        if (v.k == JV_INT) { *out = jv_int(v.u.i < 0 ? -v.u.i : v.u.i); return TP_OK; }
        if (v.k == JV_FLOAT) { *out = jv_float(fabs(v.u.f)); return TP_OK; }
        return tp_fail(TP_ERR_INVALID, "abs expects a number");
    }
    return tp_fail(TP_ERR_INVALID, "unknown filter '%.*s'", (int)name.n, name.p);
}
