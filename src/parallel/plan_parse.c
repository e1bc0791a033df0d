/* Plans as data (§4.1): an ordered list of key -> style name, parsed from a
 * user's JSON object or built from the built-in tables.  Order matters: it
 * is the order of the coverage report and of `tensorpar plan`. */
#include "parallel_internal.h"

#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

void tp_plan_free(tp_plan *p)
{
    if (!p) return;
    for (size_t i = 0; i < p->n; i++) {
        free(p->v[i].key);
        free(p->v[i].style);
        free(p->v[i].value_json);
    }
    free(p->v);
    memset(p, 0, sizeof *p);
}

int tp_plan_find(const tp_plan *p, const char *key)
{
    for (size_t i = 0; i < p->n; i++)
        if (!strcmp(p->v[i].key, key)) return (int)i;
    return -1;
}

/* value_json is what messages print where a style name is expected:
 * 'name' for strings (Python's repr), the JSON text otherwise (§4.7). */
static tp_status set_entry(tp_plan *p, const char *key, const char *style, const char *json)
{
    char *st = style ? strdup(style) : NULL, *vj;
    if (style) {
        tp_par_buf b = {0};
        tp_par_buf_pyrepr(&b, style);
        vj = tp_par_buf_take(&b);
    } else {
        vj = strdup(json);
    }
    if ((style && !st) || !vj) { free(st); free(vj); return tp_fail(TP_ERR_NOMEM, "out of memory"); }
    int i = tp_plan_find(p, key);
    if (i >= 0) {                               /* replace in place: keeps the order */
        free(p->v[i].style);
        free(p->v[i].value_json);
        p->v[i].style = st;
        p->v[i].value_json = vj;
        return TP_OK;
    }
    char *k = strdup(key);
    tp_plan_entry *nv = k ? realloc(p->v, (p->n + 1) * sizeof *nv) : NULL;
    if (!nv) { free(k); free(st); free(vj); return tp_fail(TP_ERR_NOMEM, "out of memory"); }
    p->v = nv;
    p->v[p->n++] = (tp_plan_entry){k, st, vj};
    return TP_OK;
}

tp_status tp_plan_set(tp_plan *p, const char *key, const char *style)
{
    if (!key || !style) return tp_fail(TP_ERR_INVALID, "tp_plan_set: NULL key or style");
    return set_entry(p, key, style, NULL);
}

tp_status tp_plan_copy(tp_plan *dst, const tp_plan *src)
{
    memset(dst, 0, sizeof *dst);
    for (size_t i = 0; i < src->n; i++) {
        tp_status s = set_entry(dst, src->v[i].key, src->v[i].style, src->v[i].value_json);
        if (s) { tp_plan_free(dst); return s; }
    }
    dst->is_user = src->is_user;
    return TP_OK;
}

tp_status tp_plan_parse(const char *json_text, const char *origin, tp_plan *out)
{
    memset(out, 0, sizeof *out);
    cJSON *root = cJSON_Parse(json_text);
    if (!root) return tp_fail(TP_ERR_FORMAT, "%s: not valid JSON", origin);
    tp_status s = TP_OK;
    if (!cJSON_IsObject(root)) {
        s = tp_fail(TP_ERR_INVALID, "Can only set a dictionary as `tp_plan`");
    } else {
        for (cJSON *it = root->child; it && !s; it = it->next) {
            /* A non-string value is kept and reported as an invalid style
             * together with the others (§4.4 step 1). */
            char *txt = cJSON_IsString(it) ? NULL : cJSON_PrintUnformatted(it);
            if (!cJSON_IsString(it) && !txt) s = tp_fail(TP_ERR_NOMEM, "out of memory");
            else s = set_entry(out, it->string, cJSON_IsString(it) ? it->valuestring : NULL, txt);
            free(txt);
        }
    }
    cJSON_Delete(root);
    if (s) tp_plan_free(out);
    else out->is_user = 1;
    return s;
}

tp_status tp_plan_load(const char *spec, const tp_model_config *cfg, tp_plan *out)
{
    return tp_plan_load_mode(spec, cfg, 0, out);
}

tp_status tp_plan_load_mode(const char *spec, const tp_model_config *cfg, int expert_parallel, tp_plan *out)
{
    if (!spec || !strcmp(spec, "auto")) return expert_parallel ? tp_plan_builtin_ep(cfg, out) : tp_plan_builtin(cfg, out);
    char *text;
    size_t len;
    tp_status s = tp_read_file(spec, &text, &len);
    if (s) return s;
    s = tp_plan_parse(text, spec, out);
    free(text);
    return s;
}

char *tp_plan_to_json(const tp_plan *p)
{
    cJSON *o = cJSON_CreateObject();
    for (size_t i = 0; o && i < p->n; i++) {
        cJSON *v = p->v[i].style ? cJSON_CreateString(p->v[i].style) : cJSON_Parse(p->v[i].value_json);
        if (!v) { cJSON_Delete(o); return NULL; }
        cJSON_AddItemToObject(o, p->v[i].key, v);
    }
    char *s = o ? cJSON_Print(o) : NULL;
    cJSON_Delete(o);
    return s;
}

char *tp_plan_repr(const tp_plan *p, const unsigned char *only)
{
    tp_par_buf b = {0};
    tp_par_buf_puts(&b, "{");
    int first = 1;
    for (size_t i = 0; i < p->n; i++) {
        if (only && !only[i]) continue;
        if (!first) tp_par_buf_puts(&b, ", ");
        first = 0;
        tp_par_buf_pyrepr(&b, p->v[i].key);
        tp_par_buf_puts(&b, ": ");
        tp_par_buf_puts(&b, p->v[i].value_json);
    }
    tp_par_buf_puts(&b, "}");
    return tp_par_buf_take(&b);
}
