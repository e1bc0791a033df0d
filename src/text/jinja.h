/* src/text/jinja.h — private interface of the Jinja-subset interpreter that
 * renders chat templates (chat_template.c is its only user).
 *
 * Pipeline: jinja_lex (text -> tokens, whitespace control applied) ->
 * jinja_parse (tokens -> AST) -> jinja_render (AST + variables -> text).
 *
 * Memory: everything a template or a render creates lives in an arena that is
 * freed at once.  Values are immutable (except namespace() objects), so they
 * can share storage freely and need no reference counting.
 *
 * Whitespace follows Transformers' environment: trim_blocks and lstrip_blocks
 * on, a single trailing newline of the template dropped.
 */
#ifndef TP_TEXT_JINJA_H
#define TP_TEXT_JINJA_H

#include "tensorpar/base.h"

#include <cjson/cJSON.h>

/* ---- arena and string buffer ------------------------------------------- */

typedef struct jarena jarena;
jarena *ja_create(void);
void ja_destroy(jarena *a);
/* Zeroed, 16-byte aligned; NULL when out of memory. */
void *ja_alloc(jarena *a, size_t n);

/* A growable byte buffer on malloc.  Appends never fail loudly: they set
 * `oom`, which the owner checks once at the end. */
typedef struct { char *p; size_t n, cap; int oom; } jbuf;
void jb_put(jbuf *b, const char *s, size_t n);
void jb_puts(jbuf *b, const char *s);
void jb_putc(jbuf *b, char c);
void jb_printf(jbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void jb_free(jbuf *b);

/* ---- values ------------------------------------------------------------- */

typedef struct { const char *p; size_t n; } jstr;

typedef enum {
    JV_UNDEFINED, JV_NONE, JV_BOOL, JV_INT, JV_FLOAT, JV_STR,
    JV_LIST, JV_DICT, JV_NS, JV_MACRO, JV_FUNC
} jv_kind;

struct jnode;
typedef struct jv {
    jv_kind k;
    union {
        int b;
        int64_t i;
        double f;
        jstr s;                 /* JV_STR; JV_UNDEFINED: the missing name */
        struct jlistv *l;
        struct jdictv *d;       /* JV_DICT and JV_NS */
        const struct jnode *m;  /* JV_MACRO */
        int fn;                 /* JV_FUNC: a jfunc */
    } u;
} jv;

typedef struct jlistv { size_t n; jv *v; } jlistv;
/* Insertion-ordered, string keys only (all chat templates need). */
typedef struct jdictv { size_t n, cap; jstr *k; jv *v; } jdictv;

/* Global functions a template can call. */
typedef enum { JF_RAISE, JF_NAMESPACE, JF_RANGE, JF_DICT, JF_STRFTIME_NOW } jfunc;

jstr js_c(const char *s);
int js_eq(jstr a, jstr b);
int js_eqc(jstr a, const char *s);
jstr js_dup(jarena *a, const char *p, size_t n);  /* .p NULL on OOM when n>0 */

jv jv_undef(jstr name);
jv jv_none(void);
jv jv_bool(int b);
jv jv_int(int64_t i);
jv jv_float(double f);
jv jv_str(jstr s);
const char *jv_kind_name(jv_kind k);

jlistv *jl_new(jarena *a, size_t n);            /* n slots, all undefined */
jdictv *jd_new(jarena *a);
const jv *jd_get(const jdictv *d, jstr key);
tp_status jd_set(jarena *a, jdictv *d, jstr key, jv val);

int jv_truthy(jv v);
int jv_equal(jv a, jv b);
/* -1/0/1 in *out; TP_ERR_INVALID for values that do not order. */
tp_status jv_compare(jv a, jv b, int *out);
/* Python's str(): what {{ v }} prints. */
void jv_to_str(jbuf *b, jv v);
/* Python's repr(), used inside lists and dicts. */
void jv_repr(jbuf *b, jv v);
/* json.dumps(v, ensure_ascii=False, indent=indent, sort_keys=sort_keys);
 * indent < 0 means none. */
tp_status jv_to_json(jbuf *b, jv v, int indent, int sort_keys);
/* A JSON document as a value tree in the arena. */
tp_status jv_from_cjson(jarena *a, const cJSON *j, jv *out);
/* Copies buffer contents into the arena as a string value. */
tp_status jv_from_buf(jarena *a, const jbuf *b, jv *out);

/* UTF-8 helpers: code point count and byte offset of code point i. */
size_t ju_len(jstr s);
size_t ju_offset(jstr s, size_t i);

/* ---- tokens ------------------------------------------------------------- */

typedef enum {
    JT_TEXT, JT_EXPR_OPEN, JT_EXPR_CLOSE, JT_STMT_OPEN, JT_STMT_CLOSE,
    JT_NAME, JT_STRING, JT_INT, JT_FLOAT, JT_OP, JT_EOF
} jt_kind;

typedef struct {
    jt_kind k;
    int line, col;
    jstr s;        /* text, name, operator, or the decoded string literal */
    int64_t i;
    double f;
} jtoken;

typedef struct { jtoken *v; size_t n; } jtokens;

/* Tokenizes a template; v is malloc'd (free it), strings live in `a`. */
tp_status jinja_lex(const char *src, size_t len, jarena *a, jtokens *out);

/* ---- syntax tree -------------------------------------------------------- */

typedef enum {
    /* statements */
    JN_TEXT, JN_OUTPUT, JN_IF, JN_FOR, JN_SET, JN_SET_BLOCK, JN_MACRO,
    JN_BREAK, JN_CONTINUE,
    /* expressions */
    JN_LITERAL, JN_NAME, JN_ATTR, JN_ITEM, JN_SLICE, JN_CALL, JN_FILTER,
    JN_TEST, JN_BINOP, JN_NOT, JN_NEG, JN_POS, JN_AND, JN_OR, JN_COND,
    JN_COMPARE, JN_LIST, JN_TUPLE, JN_DICT
} jn_kind;

typedef struct { struct jnode **v; size_t n; } jnodes;

typedef struct jnode {
    jn_kind k;
    int line, col;
    jstr name;        /* NAME, ATTR, FILTER, TEST, MACRO; TEXT: the text    */
    jstr op;          /* BINOP; COMPARE: the operators, one per args entry  */
    jstr *ops;
    int negate;       /* TEST: "is not"                                    */
    jv lit;           /* LITERAL                                           */
    struct jnode *a, *b, *c;  /* operands: object/left/cond/slice parts    */
    jnodes args;      /* call/filter/test args, list/tuple items, dict keys,
                         COMPARE right-hand sides, SET/FOR targets,
                         MACRO parameter defaults (NULL = none)            */
    jnodes vals;      /* DICT values                                       */
    jstr *kwnames;    /* CALL/FILTER/TEST keyword args; MACRO param names  */
    jnodes kwargs;
    jnodes body, alt; /* statement bodies: then/else, loop/else            */
} jnode;

/* Parses tokens into a JN_... statement list (root->body).  Nodes live in `a`. */
tp_status jinja_parse(const jtokens *t, jarena *a, jnode **root);

/* ---- evaluation --------------------------------------------------------- */

/* Renders `root` with the variables of dict `globals`, appending to `out`.
 * Scratch values live in `a`. */
tp_status jinja_render(const jnode *root, jarena *a, jdictv *globals, jbuf *out);

/* Builtins (jinja_builtins.c): filters, tests and methods of str/dict/list. */
typedef struct { const jv *pos; size_t npos; const jstr *kwn; const jv *kwv; size_t nkw; } jargs;
/* Positional argument i, else keyword `name`, else NULL. */
const jv *jargs_get(const jargs *x, size_t i, const char *name);

tp_status jinja_filter(jarena *a, jstr name, jv in, const jargs *x, jv *out);
tp_status jinja_test(jstr name, jv in, const jargs *x, int *out);
/* Method `name` of `self`; *found = 0 when `self` has no such method. */
tp_status jinja_method(jarena *a, jv self, jstr name, const jargs *x, jv *out, int *found);
/* Attribute or item `key` of `obj` (Jinja's getattr then getitem). */
jv jinja_getattr(jv obj, jstr key);

#endif
