/* PCRE2 glue.  tokenizer.json regexes are written for Oniguruma; the
 * constructs they use (\p{L}, \p{N}, \s, (?i:...), (?!...)) mean the same in
 * PCRE2 with PCRE2_UTF | PCRE2_UCP.  Patterns are JIT-compiled once at load;
 * subjects are validated once per encode, so matching skips the UTF check
 * (without that, each match would re-scan the whole subject). */
#include "tok_internal.h"

tp_status tp_tok_regex_compile(pcre2_code **out, const char *pattern, int literal, const char *where)
{
    int err;
    PCRE2_SIZE erroff;
    /* PCRE2_LITERAL admits only a few other options; UCP is not one. */
    uint32_t opts = PCRE2_UTF | (literal ? PCRE2_LITERAL : PCRE2_UCP);
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)pattern, PCRE2_ZERO_TERMINATED, opts, &err, &erroff, NULL);
    if (!re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(err, msg, sizeof msg);
        return tp_fail(TP_ERR_FORMAT, "%s: bad regex at offset %zu: %s", where, (size_t)erroff, (char *)msg);
    }
    /* JIT is an optimisation: the interpreter gives the same matches. */
    pcre2_jit_compile(re, PCRE2_JIT_COMPLETE);
    *out = re;
    return TP_OK;
}

tp_status tp_tok_matcher_init(tok_matcher *m)
{
    /* The big JIT stack is made only when a match needs it (see below):
     * short texts then cost one small allocation here. */
    m->mc = NULL;
    m->js = NULL;
    m->md = pcre2_match_data_create(4, NULL);
    if (!m->md) return tp_fail(TP_ERR_NOMEM, "tokenizer: out of memory for regex matching");
    return TP_OK;
}

/* PCRE2's default JIT stack (32 KiB) can run out on long runs that
 * backtrack (e.g. `\s+(?!\S)` over a page of spaces): switch to a 8 MiB one. */
static int big_stack(tok_matcher *m)
{
    if (m->js) return 0;
    m->mc = pcre2_match_context_create(NULL);
    m->js = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, NULL);
    if (!m->mc || !m->js) return 0;
    pcre2_jit_stack_assign(m->mc, NULL, m->js);
    return 1;
}

void tp_tok_matcher_free(tok_matcher *m)
{
    pcre2_match_data_free(m->md);
    pcre2_match_context_free(m->mc);
    pcre2_jit_stack_free(m->js);
    m->md = NULL; m->mc = NULL; m->js = NULL;
}

int tp_tok_regex_next(const pcre2_code *re, tok_matcher *m, const char *s, size_t len,
                   size_t from, size_t *ms, size_t *me)
{
    if (from > len) return 0;
    int rc = pcre2_match(re, (PCRE2_SPTR)s, len, from, PCRE2_NO_UTF_CHECK, m->md, m->mc);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT && big_stack(m))
        rc = pcre2_match(re, (PCRE2_SPTR)s, len, from, PCRE2_NO_UTF_CHECK, m->md, m->mc);
    if (rc == PCRE2_ERROR_NOMATCH) return 0;
    if (rc < 0) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(rc, msg, sizeof msg);
        tp_fail(TP_ERR_INTERNAL, "tokenizer: regex match failed: %s", (char *)msg);
        return -1;
    }
    PCRE2_SIZE *ov = pcre2_get_ovector_pointer(m->md);
    *ms = ov[0];
    *me = ov[1];
    return 1;
}
