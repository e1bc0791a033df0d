/* adapter_config.json, as PEFT's LoraConfig writes it: the fields that
 * decide the adapter's math and which modules it targets. */
#include "tensorpar/lora.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <regex.h>
#include <stdlib.h>
#include <string.h>

static char *read_text(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *buf = NULL;
    if (fseek(f, 0, SEEK_END) == 0) {
        long len = ftell(f);
        if (len >= 0 && fseek(f, 0, SEEK_SET) == 0 && (buf = malloc((size_t)len + 1))) {
            if (fread(buf, 1, (size_t)len, f) != (size_t)len) { free(buf); buf = NULL; }
            else buf[len] = 0;
        }
    }
    fclose(f);
    return buf;
}

/* A key that must be absent, null, false or empty: tensorpar cannot honour it. */
static tp_status refuse_set(const cJSON *root, const char *key, const char *path)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, key);
    if (!v || cJSON_IsNull(v) || cJSON_IsFalse(v)) return TP_OK;
    if ((cJSON_IsArray(v) || cJSON_IsObject(v)) && cJSON_GetArraySize(v) == 0) return TP_OK;
    return tp_fail(TP_ERR_UNSUPPORTED, "%s: '%s' is set; tensorpar's LoRA does not support it", path, key);
}

/* list, a JSON array that must hold only strings, copied into *names
 * (*count: how many are copied so far, also after a failure). */
static tp_status read_names(const cJSON *list, const char *path, const char *key, char ***names, int *count)
{
    int n = cJSON_GetArraySize(list);
    if (n && !(*names = calloc((size_t)n, sizeof **names))) return tp_fail(TP_ERR_NOMEM, "out of memory");
    for (int i = 0; i < n; i++) {
        const cJSON *e = cJSON_GetArrayItem(list, i);
        if (!cJSON_IsString(e)) return tp_fail(TP_ERR_FORMAT, "%s: %s[%d] is not a string", path, key, i);
        if (!((*names)[i] = strdup(e->valuestring))) return tp_fail(TP_ERR_NOMEM, "out of memory");
        *count = i + 1;
    }
    return TP_OK;
}

static tp_status read_targets(tp_lora_config *c, const cJSON *t, const char *path)
{
    if (cJSON_IsString(t)) {
        if (strlen(t->valuestring) + 8 >= sizeof c->target_regex)
            return tp_fail(TP_ERR_UNSUPPORTED, "%s: target_modules regex too long", path);
        snprintf(c->target_regex, sizeof c->target_regex, "^(%s)$", t->valuestring);   /* re.fullmatch */
        return TP_OK;
    }
    if (!cJSON_IsArray(t) || cJSON_GetArraySize(t) == 0)
        return tp_fail(TP_ERR_FORMAT, "%s: target_modules must be a non-empty list of names or a regex", path);
    return read_names(t, path, "target_modules", &c->targets, &c->n_targets);
}

tp_status tp_lora_config_set_bias(tp_lora_config *c, const char *bias, const char *where)
{
    static const char *const names[] = {"none", "all", "lora_only"};
    for (int i = 0; i < 3; i++)
        if (!strcmp(bias, names[i])) { c->bias = (tp_lora_bias)i; return TP_OK; }
    return tp_fail(TP_ERR_UNSUPPORTED, "%s: bias '%s'; it must be \"none\", \"all\" or \"lora_only\"", where, bias);
}

/* A flag's comma-separated names ("q_proj,v_proj", empty items dropped)
 * as the JSON list a config file would hold. */
static cJSON *comma_list(const char *names)
{
    cJSON *list = cJSON_CreateArray();
    char *copy = strdup(names ? names : "");
    for (char *save = NULL, *t = copy ? strtok_r(copy, ",", &save) : NULL; t; t = strtok_r(NULL, ",", &save))
        if (*t) cJSON_AddItemToArray(list, cJSON_CreateString(t));
    free(copy);
    return list;
}

/* modules_to_save: absent, null or a list of module names. */
static tp_status read_saved(tp_lora_config *c, const cJSON *v, const char *path)
{
    if (!v || cJSON_IsNull(v)) return TP_OK;
    if (!cJSON_IsArray(v)) return tp_fail(TP_ERR_FORMAT, "%s: modules_to_save must be a list of names", path);
    return read_names(v, path, "modules_to_save", &c->save, &c->n_save);
}

tp_status tp_lora_config_set_saved(tp_lora_config *c, const char *names)
{
    cJSON *list = comma_list(names);
    tp_status s = read_saved(c, list, "--lora-modules-to-save");
    cJSON_Delete(list);
    return s;
}

/* name is `want` or ends with "." + want: PEFT's match of a listed name */
static int name_matches(const char *name, const char *want)
{
    size_t n = strlen(name), k = strlen(want);
    return !strcmp(name, want) || (n > k && name[n - k - 1] == '.' && !strcmp(name + n - k, want));
}

int tp_lora_config_saves(const tp_lora_config *c, const char *name)
{
    for (int i = 0; i < c->n_save; i++)
        if (name_matches(name, c->save[i])) return 1;
    return 0;
}

static tp_status parse(tp_lora_config *c, const cJSON *root, const char *path)
{
    const cJSON *r = cJSON_GetObjectItemCaseSensitive(root, "r");
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(root, "lora_alpha");
    const cJSON *d = cJSON_GetObjectItemCaseSensitive(root, "lora_dropout");
    const cJSON *b = cJSON_GetObjectItemCaseSensitive(root, "bias");
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(root, "target_modules");
    const cJSON *ty = cJSON_GetObjectItemCaseSensitive(root, "peft_type");
    if (ty && cJSON_IsString(ty) && strcmp(ty->valuestring, "LORA"))
        return tp_fail(TP_ERR_UNSUPPORTED, "%s: peft_type '%s'; tensorpar loads LORA adapters only", path,
                       ty->valuestring);
    if (!cJSON_IsNumber(r) || r->valuedouble < 1 || r->valuedouble != floor(r->valuedouble))
        return tp_fail(TP_ERR_FORMAT, "%s: 'r' must be a positive integer", path);
    c->r = (int64_t)r->valuedouble;
    /* absent or null: PEFT's defaults; anything else must be a number */
    if ((a && !cJSON_IsNull(a) && !cJSON_IsNumber(a)) || (d && !cJSON_IsNull(d) && !cJSON_IsNumber(d)))
        return tp_fail(TP_ERR_FORMAT, "%s: '%s' must be a number", path,
                       a && !cJSON_IsNull(a) && !cJSON_IsNumber(a) ? "lora_alpha" : "lora_dropout");
    c->alpha = cJSON_IsNumber(a) ? a->valuedouble : 8.0;   /* PEFT's default lora_alpha */
    c->dropout = cJSON_IsNumber(d) ? d->valuedouble : 0.0;
    if (!(c->dropout >= 0 && c->dropout < 1))   /* p = 1 would scale the kept (none) by 1 / 0 */
        return tp_fail(TP_ERR_FORMAT, "%s: lora_dropout must be in [0, 1), got %g", path, c->dropout);
    c->use_rslora = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(root, "use_rslora"));
    if (b && !cJSON_IsNull(b) && !cJSON_IsString(b))
        return tp_fail(TP_ERR_FORMAT, "%s: bias must be \"none\", \"all\" or \"lora_only\"", path);
    tp_status sb = b && cJSON_IsString(b) ? tp_lora_config_set_bias(c, b->valuestring, path) : TP_OK;
    if (sb) return sb;
    static const char *const unsupported[] = {"rank_pattern", "alpha_pattern", "fan_in_fan_out", "use_dora",
                                              "layers_to_transform"};
    for (size_t i = 0; i < sizeof unsupported / sizeof *unsupported; i++) {
        tp_status s = refuse_set(root, unsupported[i], path);
        if (s) return s;
    }
    if (!t) return tp_fail(TP_ERR_FORMAT, "%s: no target_modules", path);
    tp_status s = read_targets(c, t, path);
    return s ? s : read_saved(c, cJSON_GetObjectItemCaseSensitive(root, "modules_to_save"), path);
}

tp_status tp_lora_config_load(tp_lora_config *c, const char *dir)
{
    memset(c, 0, sizeof *c);
    char path[4096];
    snprintf(path, sizeof path, "%s/adapter_config.json", dir);
    char *text = read_text(path);
    if (!text) return tp_fail(TP_ERR_IO, "%s: cannot read it (is %s a PEFT adapter directory?)", path, dir);
    cJSON *root = cJSON_Parse(text);
    free(text);
    if (!cJSON_IsObject(root)) { cJSON_Delete(root); return tp_fail(TP_ERR_FORMAT, "%s: not a JSON object", path); }
    tp_status s = parse(c, root, path);
    cJSON_Delete(root);
    if (s) tp_lora_config_free(c);
    return s;
}

tp_status tp_lora_config_make(tp_lora_config *c, int64_t r, double alpha, double dropout, const char *targets)
{
    memset(c, 0, sizeof *c);
    if (r < 1) return tp_fail(TP_ERR_INVALID, "--lora-r must be >= 1");
    if (!(dropout >= 0 && dropout < 1)) return tp_fail(TP_ERR_INVALID, "--lora-dropout must be in [0, 1)");
    c->r = r;
    c->alpha = alpha;
    c->dropout = dropout;
    cJSON *list = comma_list(targets);
    tp_status s = read_targets(c, list, "--lora-target");
    cJSON_Delete(list);
    if (s) tp_lora_config_free(c);
    return s;
}

void tp_lora_config_free(tp_lora_config *c)
{
    for (int i = 0; i < c->n_targets; i++) free(c->targets[i]);
    free(c->targets);
    c->targets = NULL;
    c->n_targets = 0;
    for (int i = 0; i < c->n_save; i++) free(c->save[i]);
    free(c->save);
    c->save = NULL;
    c->n_save = 0;
}

int tp_lora_config_matches(const tp_lora_config *c, const char *name)
{
    if (c->target_regex[0]) {
        regex_t re;
        if (regcomp(&re, c->target_regex, REG_EXTENDED | REG_NOSUB)) {
            tp_fail(TP_ERR_FORMAT, "target_modules: the regex %s does not compile", c->target_regex);
            return -1;
        }
        int hit = regexec(&re, name, 0, NULL, 0) == 0;
        regfree(&re);
        return hit;
    }
    for (int i = 0; i < c->n_targets; i++)
        if (name_matches(name, c->targets[i])) return 1;
    return 0;
}

double tp_lora_config_scale(const tp_lora_config *c)
{
    return c->use_rslora ? c->alpha / sqrt((double)c->r) : c->alpha / (double)c->r;
}

/* The targets as one comma-separated text (a regex as itself). */
static void targets_text(const tp_lora_config *c, char *buf, size_t cap)
{
    if (c->target_regex[0]) { snprintf(buf, cap, "%s", c->target_regex); return; }
    size_t at = 0;
    buf[0] = 0;
    for (int i = 0; i < c->n_targets && at < cap; i++)
        at += (size_t)snprintf(buf + at, cap - at, "%s%s", i ? "," : "", c->targets[i]);
}

tp_status tp_lora_config_same(const tp_lora_config *run, const tp_lora_config *saved, const char *where)
{
    if (run->r != saved->r)
        return tp_fail(TP_ERR_INVALID, "%s: the adapter has r %lld, this run's --lora-r is %lld", where,
                       (long long)saved->r, (long long)run->r);
    if (run->alpha != saved->alpha)
        return tp_fail(TP_ERR_INVALID, "%s: the adapter has lora_alpha %g, this run's --lora-alpha is %g", where,
                       saved->alpha, run->alpha);
    if (run->dropout != saved->dropout)
        return tp_fail(TP_ERR_INVALID, "%s: the adapter has lora_dropout %g, this run's --lora-dropout is %g",
                       where, saved->dropout, run->dropout);
    char a[1024], b[1024];
    targets_text(run, a, sizeof a);
    targets_text(saved, b, sizeof b);
    if (strcmp(a, b) || run->use_rslora != saved->use_rslora)
        return tp_fail(TP_ERR_INVALID, "%s: the adapter targets %s%s, this run's --lora-target %s", where, b,
                       saved->use_rslora ? " (rslora)" : "", a);
    static const char *const bias[] = {"none", "all", "lora_only"};
    if (run->bias != saved->bias)
        return tp_fail(TP_ERR_INVALID, "%s: the adapter has bias %s, this run's --lora-bias is %s", where,
                       bias[saved->bias], bias[run->bias]);
    int same = run->n_save == saved->n_save;
    for (int i = 0; same && i < run->n_save; i++) same = !strcmp(run->save[i], saved->save[i]);
    if (!same)
        return tp_fail(TP_ERR_INVALID, "%s: the adapter's modules_to_save differ from this run's "
                       "--lora-modules-to-save", where);
    return TP_OK;
}
