/* Name matching (§4.3).  Keys are literal strings: a key matches a name
 * when it equals the name or the name with its all-digit components
 * replaced by "*".  No globbing, no prefixes, no longest match, and one
 * function serves applying, the unmatched-key warning and the coverage
 * report (§10.9). */
#include "parallel_internal.h"

#include <string.h>

void tp_plan_normalize(const char *name, char *out, size_t cap)
{
    size_t o = 0;
    const char *p = name;
    while (cap && o + 1 < cap) {
        const char *e = strchr(p, '.');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        int digits = len > 0;
        for (size_t i = 0; i < len; i++)
            if (p[i] < '0' || p[i] > '9') digits = 0;
        const char *src = digits ? "*" : p;
        size_t n = digits ? 1 : len;
        if (o + n >= cap) n = cap - 1 - o;
        memcpy(out + o, src, n);
        o += n;
        if (!e || o + 1 >= cap) break;
        out[o++] = '.';
        p = e + 1;
    }
    if (cap) out[o < cap ? o : cap - 1] = 0;
}

/* Exact key first, then the normalised one: an indexed key overrides the
 * wildcard key at the same level (§10.9). */
static int match_level(const tp_plan *p, const char *name)
{
    int i = tp_plan_find(p, name);
    if (i >= 0) return i;
    char norm[256];
    tp_plan_normalize(name, norm, sizeof norm);
    return strcmp(norm, name) ? tp_plan_find(p, norm) : -1;
}

int tp_plan_match_module(const tp_plan *p, const char *module_name)
{
    return match_level(p, module_name);
}

int tp_plan_match_param(const tp_plan *p, const char *param_name, int *via_module)
{
    int dummy;
    if (!via_module) via_module = &dummy;
    *via_module = 0;
    int i = match_level(p, param_name);
    if (i >= 0) return i;
    /* Only the direct parent is consulted. */
    char parent[256];
    tp_par_parent_name(param_name, parent, sizeof parent);
    if (!strchr(param_name, '.')) return -1;
    i = match_level(p, parent);
    if (i >= 0) *via_module = 1;
    return i;
}
