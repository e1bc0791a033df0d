/* Post-processors (what add_special_tokens adds around the ids) and the
 * add_bos_token / add_eos_token fallback from tokenizer_config.json.
 *
 * Only single sequences are encoded, so a template reduces to the ids
 * before the sequence and the ids after it. */
#include "tok_internal.h"

#include <string.h>

/* Appends a post-processor's token id, which must be a token the file
 * defines: the ids go straight to the model's embedding.  (A fuzzed id of
 * 3.5e90 was converted to int32 with undefined behaviour.) */
static tp_status push_id(tp_tokenizer *t, const cJSON *e, const char *key, const char *what, tok_ids *dst)
{
    double v = cJSON_IsNumber(e) ? e->valuedouble : -1;
    if (!(v >= 0 && v <= INT32_MAX - 1) || v != (double)(int32_t)v || !tp_tokenizer_id_to_token(t, (int32_t)v))
        return tp_tok_bad(t, TP_ERR_FORMAT, key, "'%s' has an id that is not a token of this file", what);
    return tp_tok_ids_push(dst, (int32_t)v);
}

/* The ids of one template item {"SpecialToken": {"id": NAME}}. */
static tp_status special_item(tp_tokenizer *t, const cJSON *item, const cJSON *specials, tok_ids *dst)
{
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(item, "id");
    if (!cJSON_IsString(name))
        return tp_tok_bad(t, TP_ERR_FORMAT, "post_processor.single", "SpecialToken without an \"id\"");
    const cJSON *sp = cJSON_GetObjectItemCaseSensitive(specials, name->valuestring);
    const cJSON *ids = cJSON_GetObjectItemCaseSensitive(sp, "ids");
    if (!cJSON_IsArray(ids))
        return tp_tok_bad(t, TP_ERR_FORMAT, "post_processor.special_tokens", "'%s' is missing or has no \"ids\"",
                       name->valuestring);
    const cJSON *e;
    cJSON_ArrayForEach(e, ids) {
        tp_status st = push_id(t, e, "post_processor.special_tokens", name->valuestring, dst);
        if (st) return st;
    }
    return TP_OK;
}

static tp_status parse_template(tp_tokenizer *t, const cJSON *j)
{
    const cJSON *single = cJSON_GetObjectItemCaseSensitive(j, "single");
    const cJSON *specials = cJSON_GetObjectItemCaseSensitive(j, "special_tokens");
    if (!cJSON_IsArray(single)) return tp_tok_bad(t, TP_ERR_FORMAT, "post_processor.single", "must be an array");
    t->prefix.len = t->suffix.len = 0;
    int seen_seq = 0;
    const cJSON *item;
    cJSON_ArrayForEach(item, single) {
        const cJSON *sp = cJSON_GetObjectItemCaseSensitive(item, "SpecialToken");
        if (cJSON_GetObjectItemCaseSensitive(item, "Sequence")) {
            if (seen_seq++)
                return tp_tok_bad(t, TP_ERR_UNSUPPORTED, "post_processor.single", "more than one Sequence");
            continue;
        }
        if (!sp) return tp_tok_bad(t, TP_ERR_FORMAT, "post_processor.single", "item is neither SpecialToken nor Sequence");
        tp_status st = special_item(t, sp, specials, seen_seq ? &t->suffix : &t->prefix);
        if (st) return st;
    }
    t->has_template = 1;
    return TP_OK;
}

/* Bert/Roberta: [cls] A [sep], with "cls": [TOKEN, ID], "sep": [TOKEN, ID]. */
static tp_status parse_cls_sep(tp_tokenizer *t, const cJSON *j)
{
    const cJSON *cls = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(j, "cls"), 1);
    const cJSON *sep = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(j, "sep"), 1);
    if (!cJSON_IsNumber(cls) || !cJSON_IsNumber(sep))
        return tp_tok_bad(t, TP_ERR_FORMAT, "post_processor", "\"cls\" and \"sep\" must be [token, id]");
    t->prefix.len = t->suffix.len = 0;
    tp_status st = push_id(t, cls, "post_processor.cls", "cls", &t->prefix);
    if (!st) st = push_id(t, sep, "post_processor.sep", "sep", &t->suffix);
    t->has_template = 1;
    return st;
}

tp_status tp_tok_postprocessor_parse(tp_tokenizer *t, const cJSON *j)
{
    if (!j || cJSON_IsNull(j)) return TP_OK;
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(j, "type");
    if (!cJSON_IsString(type)) return tp_tok_bad(t, TP_ERR_FORMAT, "post_processor", "missing \"type\"");
    const char *ty = type->valuestring;
    if (!strcmp(ty, "ByteLevel")) return TP_OK;   /* only trims offsets */
    if (!strcmp(ty, "TemplateProcessing")) return parse_template(t, j);
    if (!strcmp(ty, "BertProcessing") || !strcmp(ty, "RobertaProcessing")) return parse_cls_sep(t, j);
    if (!strcmp(ty, "Sequence")) {
        const cJSON *e;
        cJSON_ArrayForEach(e, cJSON_GetObjectItemCaseSensitive(j, "processors")) {
            tp_status st = tp_tok_postprocessor_parse(t, e);
            if (st) return st;
        }
        return TP_OK;
    }
    return tp_tok_bad(t, TP_ERR_UNSUPPORTED, "post_processor.type", "'%s' is not supported", ty);
}

/* "bos_token": "<s>" or {"content": "<s>", ...}. */
static tp_status config_token(tp_tokenizer *t, const cJSON *cfg, const char *key, tok_ids *dst)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(cfg, key);
    if (cJSON_IsObject(v)) v = cJSON_GetObjectItemCaseSensitive(v, "content");
    if (!cJSON_IsString(v))
        return tp_fail(TP_ERR_FORMAT, "tokenizer_config.json: add_%s is set but %s is missing", key, key);
    int32_t id = tp_tokenizer_token_to_id(t, v->valuestring);
    if (id < 0)
        return tp_fail(TP_ERR_FORMAT, "tokenizer_config.json: %s '%s' is not in the vocabulary", key, v->valuestring);
    return tp_tok_ids_push(dst, id);
}

tp_status tp_tok_config_apply(tp_tokenizer *t, const char *config_json)
{
    if (!config_json || t->has_template) return TP_OK;
    cJSON *cfg = cJSON_Parse(config_json);
    if (!cfg) return tp_fail(TP_ERR_FORMAT, "tokenizer_config.json: not valid JSON");
    tp_status st = TP_OK;
    if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(cfg, "add_bos_token")))
        st = config_token(t, cfg, "bos_token", &t->prefix);
    if (!st && cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(cfg, "add_eos_token")))
        st = config_token(t, cfg, "eos_token", &t->suffix);
    cJSON_Delete(cfg);
    return st;
}
