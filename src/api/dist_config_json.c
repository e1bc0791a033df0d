/* DistributedConfig's JSON form (tp-semantics.md §5.1): the fields by their
 * Transformers names, null for "not given", tp_plan "auto", a file name or
 * a plan object.  Unknown fields are ignored as the spec says, but named in
 * a warning, since a misspelt size would otherwise pass silently. */
#include "tensorpar/api.h"
#include "tensorpar/io.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

enum { F_SIZE, F_BOOL };

typedef struct {
    const char *name;
    int kind;
    size_t offset;   /* an int field of tp_dist_config */
} field;

static const field fields[] = {
    {"tp_size", F_SIZE, offsetof(tp_dist_config, tp_size)},
    {"ep_size", F_SIZE, offsetof(tp_dist_config, ep_size)},
    {"enable_expert_parallel", F_BOOL, offsetof(tp_dist_config, enable_expert_parallel)},
    {"enable_sequence_parallel", F_BOOL, offsetof(tp_dist_config, enable_sequence_parallel)},
    {"fsdp_size", F_SIZE, offsetof(tp_dist_config, fsdp_size)},
    {"dp_shard_size", F_SIZE, offsetof(tp_dist_config, fsdp_size)},   /* accelerate's name */
    {"dp_replicate_size", F_SIZE, offsetof(tp_dist_config, dp_replicate_size)},
    {"fsdp_cpu_offload", F_BOOL, offsetof(tp_dist_config, fsdp_cpu_offload)},
    {"fsdp_mixed_precision", F_BOOL, offsetof(tp_dist_config, fsdp_mixed_precision)},
    {"pp_size", F_SIZE, offsetof(tp_dist_config, pp_size)},
};
#define N_FIELDS (sizeof fields / sizeof fields[0])

static int *slot(tp_dist_config *c, const field *f) { return (int *)((char *)c + f->offset); }

static tp_status read_field(tp_dist_config *c, const field *f, const cJSON *v)
{
    if (cJSON_IsNull(v)) return TP_OK;
    if (f->kind == F_BOOL) {
        if (!cJSON_IsBool(v)) return tp_fail(TP_ERR_INVALID, "DistributedConfig: `%s` must be true or false", f->name);
        *slot(c, f) = cJSON_IsTrue(v);
        return TP_OK;
    }
    double d = cJSON_IsNumber(v) ? v->valuedouble : NAN;
    if (!(d == floor(d)) || fabs(d) > 1e9)
        return tp_fail(TP_ERR_INVALID, "DistributedConfig: `%s` must be an integer or null", f->name);
    if (d < 1) return tp_fail(TP_ERR_INVALID, "Parallelism sizes must be >= 1, got %d.", (int)d);   /* §5.2 step 1 */
    if (*slot(c, f) && *slot(c, f) != (int)d)
        return tp_fail(TP_ERR_INVALID, "DistributedConfig: fsdp_size and dp_shard_size disagree (%d, %d)",
                       *slot(c, f), (int)d);
    *slot(c, f) = (int)d;
    return TP_OK;
}

static tp_status read_plan(tp_dist_config *c, const cJSON *v)
{
    if (cJSON_IsNull(v)) return TP_OK;
    if (cJSON_IsString(v)) {
        if (!(c->owned_text = strdup(v->valuestring))) return tp_fail(TP_ERR_NOMEM, "out of memory");
        c->tp_plan = c->owned_text;
        return TP_OK;
    }
    /* An object is a plan; anything else gets tp_plan_parse's message (A3). */
    char *text = cJSON_PrintUnformatted(v);
    if (!text) return tp_fail(TP_ERR_NOMEM, "out of memory");
    tp_plan *p = calloc(1, sizeof *p);
    tp_status st = p ? tp_plan_parse(text, "DistributedConfig.tp_plan", p) : tp_fail(TP_ERR_NOMEM, "out of memory");
    free(text);
    if (st) { free(p); return st; }
    c->owned_plan = p;
    c->plan = p;
    return TP_OK;
}

static const field *find_field(const char *name)
{
    for (size_t i = 0; i < N_FIELDS; i++)
        if (!strcmp(fields[i].name, name)) return &fields[i];
    return NULL;
}

/* One warning naming every key that is not a field. */
static void warn_unknown(const cJSON *root)
{
    char names[512] = "";
    size_t len = 0;
    for (const cJSON *it = root->child; it; it = it->next) {
        if (find_field(it->string) || !strcmp(it->string, "tp_plan") || !strcmp(it->string, "efsdp_size")) continue;
        len += (size_t)snprintf(names + len, len < sizeof names ? sizeof names - len : 0, "%s'%s'", len ? ", " : "",
                                it->string);
        if (len >= sizeof names) break;
    }
    if (names[0]) tp_log(TP_LOG_WARN, "DistributedConfig: unknown field(s) ignored: %s", names);
}

tp_status tp_dist_config_from_json(tp_dist_config *c, const char *json_text)
{
    memset(c, 0, sizeof *c);
    cJSON *root = cJSON_Parse(json_text ? json_text : "");
    if (!root) return tp_fail(TP_ERR_FORMAT, "DistributedConfig: not valid JSON");
    tp_status st = cJSON_IsObject(root) ? TP_OK : tp_fail(TP_ERR_FORMAT, "DistributedConfig: expected a JSON object");
    for (const cJSON *it = root->child; !st && it; it = it->next) {
        const field *f = find_field(it->string);
        if (f) st = read_field(c, f, it);
        else if (!strcmp(it->string, "tp_plan")) st = read_plan(c, it);
    }
    if (!st) warn_unknown(root);
    cJSON_Delete(root);
    if (st) tp_dist_config_release(c);
    return st;
}

tp_status tp_dist_config_load(tp_dist_config *c, const char *path)
{
    memset(c, 0, sizeof *c);
    char *text;
    size_t n;
    tp_status st = tp_read_file(path, &text, &n);
    if (st) return st;
    st = tp_dist_config_from_json(c, text);
    free(text);
    return st ? tp_fail_context(st, "%s", path) : TP_OK;
}

char *tp_dist_config_to_json(const tp_dist_config *c)
{
    cJSON *o = cJSON_CreateObject();
    if (!o) return NULL;
    for (size_t i = 0; i < N_FIELDS; i++) {
        const field *f = &fields[i];
        int v = *slot((tp_dist_config *)c, f);
        if (!strcmp(f->name, "dp_shard_size")) continue;   /* an alias: written once, as fsdp_size */
        if (f->kind == F_BOOL) cJSON_AddBoolToObject(o, f->name, v);
        else if (v) cJSON_AddNumberToObject(o, f->name, v);
        else cJSON_AddNullToObject(o, f->name);
    }
    if (c->plan) {
        char *text = tp_plan_to_json(c->plan);
        cJSON *p = text ? cJSON_Parse(text) : NULL;
        free(text);
        if (p) cJSON_AddItemToObject(o, "tp_plan", p);
        else cJSON_AddNullToObject(o, "tp_plan");
    } else if (c->tp_plan) {
        cJSON_AddStringToObject(o, "tp_plan", c->tp_plan);
    } else {
        cJSON_AddNullToObject(o, "tp_plan");
    }
    char *text = cJSON_Print(o);
    cJSON_Delete(o);
    return text;
}

void tp_dist_config_release(tp_dist_config *c)
{
    if (!c) return;
    if (c->owned_plan) tp_plan_free(c->owned_plan);
    free(c->owned_plan);
    free(c->owned_text);
    if (c->plan == c->owned_plan) c->plan = NULL;
    if (c->tp_plan == c->owned_text) c->tp_plan = NULL;
    c->owned_plan = NULL;
    c->owned_text = NULL;
}
