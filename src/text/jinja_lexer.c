/* Jinja lexer: splits a template into text and tag tokens.
 *
 * Whitespace control happens here, so that the parser sees final text:
 * `{%-`/`-%}` (and the `{{ }}`/`{# #}` forms) strip whitespace on that side,
 * and, as in Transformers' Jinja environment, trim_blocks drops the first
 * newline after a block or comment tag and lstrip_blocks drops the spaces and
 * tabs before one at the start of a line (`{%+` opts out of the latter).
 * Comments are dropped.  Positions are 1-based line and column. */
#include "text/jinja.h"

#include <ctype.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    const char *src;
    size_t len, pos;
    size_t at_off;      /* line/col below describe this offset */
    int at_line, at_col;
    jarena *a;
    jtoken *v;
    size_t n, cap;
} lexer;

static void where(lexer *L, size_t off, int *line, int *col)
{
    if (off < L->at_off) { L->at_off = 0; L->at_line = 1; L->at_col = 1; }
    for (; L->at_off < off; L->at_off++) {
        if (L->src[L->at_off] == '\n') { L->at_line++; L->at_col = 1; }
        else if (((unsigned char)L->src[L->at_off] & 0xc0) != 0x80) L->at_col++;
    }
    *line = L->at_line;
    *col = L->at_col;
}

static tp_status lex_error(lexer *L, size_t off, const char *what)
{
    int line, col;
    where(L, off, &line, &col);
    return tp_fail(TP_ERR_FORMAT, "template syntax error at line %d, column %d: %s", line, col, what);
}

static tp_status push(lexer *L, jt_kind k, size_t off, jstr s)
{
    if (L->n == L->cap) {
        size_t cap = L->cap ? L->cap * 2 : 256;
        jtoken *v = realloc(L->v, cap * sizeof *v);
        if (!v) return tp_fail(TP_ERR_NOMEM, "out of memory");
        L->v = v;
        L->cap = cap;
    }
    jtoken *t = &L->v[L->n++];
    memset(t, 0, sizeof *t);
    t->k = k;
    t->s = s;
    where(L, off, &t->line, &t->col);
    return TP_OK;
}

static int is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

/* ---- text between tags -------------------------------------------------- */

/* Emits the text [start, end) that precedes a tag opening at `end`. */
static tp_status emit_text(lexer *L, size_t start, size_t end)
{
    size_t stop = end;
    char kind = L->src[end + 1], mod = end + 2 < L->len ? L->src[end + 2] : 0;
    if (mod == '-') {
        while (stop > start && is_space(L->src[stop - 1])) stop--;
    } else if ((kind == '%' || kind == '#') && mod != '+') {
        /* lstrip_blocks: only spaces/tabs between a line start and the tag. */
        size_t p = stop;
        while (p > start && (L->src[p - 1] == ' ' || L->src[p - 1] == '\t')) p--;
        if (p == 0 || L->src[p - 1] == '\n') stop = p;
    }
    if (stop == start) return TP_OK;
    return push(L, JT_TEXT, start, (jstr){L->src + start, stop - start});
}

/* After a closing tag: `-` strips all whitespace, trim_blocks one newline. */
static void after_close(lexer *L, int strip, int trim_newline)
{
    if (strip) {
        while (L->pos < L->len && is_space(L->src[L->pos])) L->pos++;
    } else if (trim_newline) {
        if (L->pos < L->len && L->src[L->pos] == '\n') L->pos++;
        else if (L->pos + 1 < L->len && L->src[L->pos] == '\r' && L->src[L->pos + 1] == '\n') L->pos += 2;
    }
}

static tp_status skip_comment(lexer *L)
{
    size_t open = L->pos;
    const char *end = NULL;
    for (size_t p = L->pos + 2; p + 1 < L->len; p++)
        if (L->src[p] == '#' && L->src[p + 1] == '}') { end = L->src + p; break; }
    if (!end) return lex_error(L, open, "unclosed comment");
    int strip = end > L->src + open + 2 && end[-1] == '-';
    L->pos = (size_t)(end - L->src) + 2;
    after_close(L, strip, 1);
    return TP_OK;
}

/* ---- inside tags -------------------------------------------------------- */

static void put_utf8(jbuf *b, unsigned long cp)
{
    char u[4];
    if (cp < 0x80) { u[0] = (char)cp; jb_put(b, u, 1); }
    else if (cp < 0x800) { u[0] = (char)(0xc0 | (cp >> 6)); u[1] = (char)(0x80 | (cp & 0x3f)); jb_put(b, u, 2); }
    else if (cp < 0x10000) {
        u[0] = (char)(0xe0 | (cp >> 12)); u[1] = (char)(0x80 | ((cp >> 6) & 0x3f));
        u[2] = (char)(0x80 | (cp & 0x3f)); jb_put(b, u, 3);
    } else {
        u[0] = (char)(0xf0 | (cp >> 18)); u[1] = (char)(0x80 | ((cp >> 12) & 0x3f));
        u[2] = (char)(0x80 | ((cp >> 6) & 0x3f)); u[3] = (char)(0x80 | (cp & 0x3f)); jb_put(b, u, 4);
    }
}

/* One escape after a backslash at L->pos; Python's rules (unknown escapes
 * keep their backslash). */
static tp_status unescape(lexer *L, jbuf *b)
{
    char c = L->src[L->pos++];
    static const char from[] = "ntrbfva0\\'\"", to[] = "\n\t\r\b\f\v\a\0\\'\"";
    const char *hit = c ? strchr(from, c) : NULL;
    if (hit) { jb_put(b, &to[hit - from], 1); return TP_OK; }
    int digits = c == 'x' ? 2 : c == 'u' ? 4 : c == 'U' ? 8 : 0;
    if (!digits) { jb_putc(b, '\\'); jb_putc(b, c); return TP_OK; }
    unsigned long cp = 0;
    for (int i = 0; i < digits; i++, L->pos++) {
        if (L->pos >= L->len || !isxdigit((unsigned char)L->src[L->pos]))
            return lex_error(L, L->pos, "bad \\x/\\u escape in string literal");
        char h = L->src[L->pos];
        cp = cp * 16 + (unsigned long)(isdigit((unsigned char)h) ? h - '0' : (tolower((unsigned char)h) - 'a' + 10));
    }
    if (cp > 0x10ffff) return lex_error(L, L->pos, "escape out of Unicode range");
    put_utf8(b, cp);
    return TP_OK;
}

static tp_status lex_string(lexer *L)
{
    size_t open = L->pos;
    char q = L->src[L->pos++];
    jbuf b = {0};
    tp_status s = TP_OK;
    while (!s) {
        if (L->pos >= L->len) { s = lex_error(L, open, "unterminated string literal"); break; }
        char c = L->src[L->pos];
        if (c == q) { L->pos++; break; }
        if (c == '\\' && L->pos + 1 < L->len) { L->pos++; s = unescape(L, &b); continue; }
        jb_putc(&b, c);
        L->pos++;
    }
    if (!s && b.oom) s = tp_fail(TP_ERR_NOMEM, "out of memory");
    if (!s) {
        jstr str = js_dup(L->a, b.p ? b.p : "", b.n);
        s = str.p ? push(L, JT_STRING, open, str) : tp_fail(TP_ERR_NOMEM, "out of memory");
    }
    jb_free(&b);
    return s;
}

static tp_status lex_number(lexer *L)
{
    size_t start = L->pos;
    char buf[64];
    size_t n = 0;
    int is_float = 0;
    int after_dot = L->n && L->v[L->n - 1].k == JT_OP && js_eqc(L->v[L->n - 1].s, ".");
    /* Room for two more characters and the NUL: an exponent adds two at
     * once (a fuzzed 62-digit "...e5" wrote buf[64]). */
    while (L->pos < L->len && n < sizeof buf - 2) {
        char c = L->src[L->pos];
        if (isdigit((unsigned char)c)) buf[n++] = c;
        else if (c == '_') {}
        else if (c == '.' && !is_float && !after_dot && L->pos + 1 < L->len &&
                 isdigit((unsigned char)L->src[L->pos + 1])) { buf[n++] = c; is_float = 1; }
        else if ((c == 'e' || c == 'E') && L->pos + 1 < L->len &&
                 (isdigit((unsigned char)L->src[L->pos + 1]) ||
                  ((L->src[L->pos + 1] == '-' || L->src[L->pos + 1] == '+') && L->pos + 2 < L->len &&
                   isdigit((unsigned char)L->src[L->pos + 2])))) {
            buf[n++] = c; buf[n++] = L->src[++L->pos]; is_float = 1;
        } else break;
        L->pos++;
    }
    buf[n] = '\0';
    tp_status s = push(L, is_float ? JT_FLOAT : JT_INT, start, (jstr){L->src + start, L->pos - start});
    if (s) return s;
    if (is_float) L->v[L->n - 1].f = strtod(buf, NULL);
    else L->v[L->n - 1].i = strtoll(buf, NULL, 10);
    return TP_OK;
}

static const char *const ops[] = {"==", "!=", "<=", ">=", "//", "**", "+", "-", "*", "/", "%", "~",
                                  "|", ".", ",", ":", "(", ")", "[", "]", "{", "}", "<", ">", "="};

/* Tokens of one tag, up to and including its closing delimiter. */
static tp_status lex_tag(lexer *L, int is_stmt)
{
    size_t open = L->pos;
    char mod = L->pos + 2 < L->len ? L->src[L->pos + 2] : 0;
    tp_status s = push(L, is_stmt ? JT_STMT_OPEN : JT_EXPR_OPEN, open, (jstr){L->src + open, 2});
    L->pos += 2 + (mod == '-' || mod == '+');
    int depth = 0;
    while (!s) {
        while (L->pos < L->len && is_space(L->src[L->pos])) L->pos++;
        if (L->pos >= L->len) return lex_error(L, open, is_stmt ? "unclosed '{%'" : "unclosed '{{'");
        const char *p = L->src + L->pos;
        size_t left = L->len - L->pos;
        char close = is_stmt ? '%' : '}';
        int strip = left >= 3 && p[0] == '-' && p[1] == close && p[2] == '}';
        int plus = left >= 3 && p[0] == '+' && p[1] == close && p[2] == '}';
        if (strip || plus || (left >= 2 && p[0] == close && p[1] == '}' && depth == 0)) {
            s = push(L, is_stmt ? JT_STMT_CLOSE : JT_EXPR_CLOSE, L->pos, (jstr){p, 2});
            L->pos += 2 + (strip || plus);
            after_close(L, strip, is_stmt && !plus);
            return s;
        }
        char c = *p;
        if (c == '\'' || c == '"') { s = lex_string(L); continue; }
        if (isdigit((unsigned char)c)) { s = lex_number(L); continue; }
        if (isalpha((unsigned char)c) || c == '_') {
            size_t st = L->pos;
            while (L->pos < L->len && (isalnum((unsigned char)L->src[L->pos]) || L->src[L->pos] == '_')) L->pos++;
            s = push(L, JT_NAME, st, (jstr){L->src + st, L->pos - st});
            continue;
        }
        size_t k = 0;
        while (k < sizeof ops / sizeof ops[0] && strncmp(p, ops[k], strlen(ops[k]))) k++;
        if (k == sizeof ops / sizeof ops[0]) return lex_error(L, L->pos, "unexpected character");
        if (c == '{') depth++;
        if (c == '}') depth--;
        s = push(L, JT_OP, L->pos, js_c(ops[k]));
        L->pos += strlen(ops[k]);
    }
    return s;
}

/* ---- driver ------------------------------------------------------------- */

static tp_status lex_all(lexer *L)
{
    while (L->pos < L->len) {
        size_t start = L->pos, tag = start;
        while (tag + 1 < L->len && !(L->src[tag] == '{' &&
               (L->src[tag + 1] == '{' || L->src[tag + 1] == '%' || L->src[tag + 1] == '#'))) tag++;
        if (tag + 1 >= L->len) tag = L->len;
        tp_status s = tag < L->len ? emit_text(L, start, tag)
                                   : push(L, JT_TEXT, start, (jstr){L->src + start, L->len - start});
        if (s) return s;
        L->pos = tag;
        if (tag == L->len) break;
        char kind = L->src[tag + 1];
        s = kind == '#' ? skip_comment(L) : lex_tag(L, kind == '%');
        if (s) return s;
    }
    return push(L, JT_EOF, L->len, (jstr){"", 0});
}

tp_status jinja_lex(const char *src, size_t len, jarena *a, jtokens *out)
{
    /* keep_trailing_newline=False: one final newline is not part of the text. */
    if (len && src[len - 1] == '\n') len--;
    lexer L = {.src = src, .len = len, .at_line = 1, .at_col = 1, .a = a};
    tp_status s = lex_all(&L);
    if (s) { free(L.v); return s; }
    out->v = L.v;
    out->n = L.n;
    return TP_OK;
}
