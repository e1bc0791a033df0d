/* Chat templates: tokenizer_config.json's `chat_template` rendered for a
 * conversation, as Transformers' apply_chat_template does.  The template is
 * lexed and parsed once at load; each render evaluates it in a fresh arena
 * with the conversation and the keyword arguments as variables. */
#include "tensorpar/io.h"
#include "tensorpar/text.h"
#include "text/jinja.h"

#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

struct tp_chat_template {
    jarena *arena;     /* AST, token strings, source copy */
    jnode *root;
    char *bos, *eos;   /* "" when the config names none */
};

/* Transformers' default when the caller passes no date_string. */
#define DEFAULT_DATE_STRING "26 Jul 2024"

static char *dup_str(const char *s)
{
    size_t n = strlen(s ? s : "");
    char *d = malloc(n + 1);
    if (d) memcpy(d, s ? s : "", n + 1);
    return d;
}

tp_status tp_chat_template_from_string(tp_chat_template **out, const char *source,
                                       const char *bos_token, const char *eos_token)
{
    *out = NULL;
    tp_chat_template *t = calloc(1, sizeof *t);
    if (!t) return tp_fail(TP_ERR_NOMEM, "out of memory");
    t->arena = ja_create();
    t->bos = dup_str(bos_token);
    t->eos = dup_str(eos_token);
    size_t len = strlen(source);
    char *src = t->arena ? ja_alloc(t->arena, len + 1) : NULL;
    if (!t->arena || !t->bos || !t->eos || !src) {
        tp_chat_template_free(t);
        return tp_fail(TP_ERR_NOMEM, "out of memory");
    }
    memcpy(src, source, len);   /* tokens point into the source */
    jtokens toks = {0};
    tp_status s = jinja_lex(src, len, t->arena, &toks);
    if (!s) s = jinja_parse(&toks, t->arena, &t->root);
    free(toks.v);
    if (s) { tp_chat_template_free(t); return s; }
    *out = t;
    return TP_OK;
}

/* bos_token / eos_token are strings or AddedToken objects {"content": ...}. */
static const char *token_text(const cJSON *cfg, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(cfg, key);
    if (cJSON_IsObject(v)) v = cJSON_GetObjectItemCaseSensitive(v, "content");
    return cJSON_IsString(v) ? v->valuestring : "";
}

/* The template text: a string, or a list of {"name", "template"} of which
 * Transformers picks "default". */
static const char *template_text(const cJSON *cfg)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(cfg, "chat_template");
    if (cJSON_IsString(v)) return v->valuestring;
    if (!cJSON_IsArray(v)) return NULL;
    const cJSON *e;
    cJSON_ArrayForEach(e, v) {
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(e, "name");
        const cJSON *tpl = cJSON_GetObjectItemCaseSensitive(e, "template");
        if (cJSON_IsString(name) && !strcmp(name->valuestring, "default") && cJSON_IsString(tpl))
            return tpl->valuestring;
    }
    return NULL;
}

tp_status tp_chat_template_load(tp_chat_template **out, const char *path)
{
    *out = NULL;
    char file[4096];
    struct stat st;
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode))
        snprintf(file, sizeof file, "%s/tokenizer_config.json", path);
    else
        snprintf(file, sizeof file, "%s", path);
    char *text;
    size_t len;
    tp_status s = tp_read_file(file, &text, &len);
    if (s) return s;
    cJSON *cfg = cJSON_ParseWithLength(text, len);
    free(text);
    if (!cfg) return tp_fail(TP_ERR_FORMAT, "%s: not valid JSON", file);
    const char *tpl = template_text(cfg);
    if (!tpl) s = tp_fail(TP_ERR_FORMAT, "%s: no chat_template", file);
    else s = tp_chat_template_from_string(out, tpl, token_text(cfg, "bos_token"), token_text(cfg, "eos_token"));
    if (s && tpl) tp_fail_context(s, "%s: chat_template", file);
    cJSON_Delete(cfg);
    return s;
}

void tp_chat_template_free(tp_chat_template *t)
{
    if (!t) return;
    ja_destroy(t->arena);
    free(t->bos);
    free(t->eos);
    free(t);
}

static tp_status set_str(jarena *a, jdictv *vars, const char *key, const char *val)
{
    jstr s = js_dup(a, val, strlen(val));
    if (!s.p) return tp_fail(TP_ERR_NOMEM, "out of memory");
    return jd_set(a, vars, js_c(key), jv_str(s));
}

/* Parses `json` and stores it under `key`, or merges an object's members. */
static tp_status set_json(jarena *a, jdictv *vars, const char *key, const char *json, const char *what)
{
    cJSON *j = cJSON_Parse(json);
    if (!j) return tp_fail(TP_ERR_INVALID, "%s: not valid JSON", what);
    jv v;
    tp_status s = jv_from_cjson(a, j, &v);
    cJSON_Delete(j);
    if (s) return s;
    if (key) return jd_set(a, vars, js_c(key), v);
    if (v.k != JV_DICT) return tp_fail(TP_ERR_INVALID, "%s: expected a JSON object", what);
    for (size_t i = 0; i < v.u.d->n && !s; i++) s = jd_set(a, vars, v.u.d->k[i], v.u.d->v[i]);
    return s;
}

static tp_status build_vars(const tp_chat_template *t, jarena *a, jdictv *vars, const char *messages_json,
                            int add_generation_prompt, const char *extra)
{
    tp_status s = set_json(a, vars, "messages", messages_json, "messages");
    if (s) return s;
    const jv *m = jd_get(vars, js_c("messages"));
    if (m->k != JV_LIST) return tp_fail(TP_ERR_INVALID, "messages: expected a JSON array");
    if ((s = jd_set(a, vars, js_c("add_generation_prompt"), jv_bool(add_generation_prompt))) ||
        (s = set_str(a, vars, "bos_token", t->bos)) || (s = set_str(a, vars, "eos_token", t->eos)) ||
        (s = set_str(a, vars, "date_string", DEFAULT_DATE_STRING)))
        return s;
    /* Keyword arguments come last so that they override the defaults. */
    return extra && *extra ? set_json(a, vars, NULL, extra, "template arguments") : TP_OK;
}

tp_status tp_chat_template_render(const tp_chat_template *t, const char *messages_json,
                                  int add_generation_prompt, const char *extra_kwargs_json,
                                  char **out_text)
{
    *out_text = NULL;
    jarena *a = ja_create();
    jdictv *vars = a ? jd_new(a) : NULL;
    if (!vars) { ja_destroy(a); return tp_fail(TP_ERR_NOMEM, "out of memory"); }
    jbuf out = {0};
    tp_status s = build_vars(t, a, vars, messages_json, add_generation_prompt, extra_kwargs_json);
    if (!s) s = jinja_render(t->root, a, vars, &out);
    if (!s) jb_put(&out, "", 0);
    if (!s && !out.p) out.p = calloc(1, 1);     /* empty output is "" */
    if (!s && !out.p) s = tp_fail(TP_ERR_NOMEM, "out of memory");
    ja_destroy(a);
    if (s) { jb_free(&out); return s; }
    *out_text = out.p;
    return TP_OK;
}
