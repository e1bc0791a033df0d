/* A conversation as one training row: the chat template applied, only the
 * assistant's tokens counted in the loss.
 *
 * How the assistant's tokens are found.  The whole conversation is rendered
 * once (F).  For each assistant message k the prompt that precedes it at
 * inference time, messages [0, k) rendered with add_generation_prompt, must
 * be a prefix of F: the assistant's part starts where that prompt ends.  It
 * ends where messages [0, k] rendered alone end, when that render is a prefix
 * of F; templates that render a turn differently when it is the last one
 * (Qwen3's think block) or always append a generation prompt (Llama 3) give
 * no such prefix, and the part then runs to the next assistant's prompt (or
 * the end).  Inside the part, what the model would generate is counted: the
 * tokens up to and including the first end-of-turn id (any of eos_ids), or
 * the whole part when the template itself bounded it.  A part bounded only
 * by the next prompt and holding no end-of-turn id is refused: it would count
 * the user's text.
 *
 * Each piece (prompt, assistant part) is tokenized on its own, without
 * special tokens added (the template writes them), so that the prompt's
 * tokens are exactly those the model is given at inference time. */
#include "train/data_internal.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
    const tp_data_options *o;
    char **items;             /* each message, printed as JSON */
    int n;
    const char *full;         /* F */
    size_t full_len;
} chat;

/* messages [0, k) through the template; *out malloc'd. */
static tp_status render(const chat *c, int k, int gen, char **out)
{
    size_t len = 3;
    for (int i = 0; i < k; i++) len += strlen(c->items[i]) + 1;
    char *json = malloc(len), *p = json;
    if (!json) return tp_fail(TP_ERR_NOMEM, "out of memory");
    *p++ = '[';
    for (int i = 0; i < k; i++) {
        if (i) *p++ = ',';
        size_t m = strlen(c->items[i]);
        memcpy(p, c->items[i], m);
        p += m;
    }
    *p++ = ']';
    *p = '\0';
    tp_status s = tp_chat_template_render(c->o->chat, json, gen, NULL, out);
    free(json);
    return s;
}

static int is_eos(const tp_data_options *o, int64_t id)
{
    for (int i = 0; i < o->n_eos; i++)
        if (o->eos_ids[i] == id) return 1;
    return 0;
}

/* Tokenizes full[a, b) and appends it.  An assistant part's labels are its
 * ids up to and including the first end-of-turn id (all of them when there
 * is none; *found_eos says which), -100 after it; other pieces are -100. */
static tp_status append_piece(const chat *c, size_t a, size_t b, int assistant, int *found_eos,
                              tp_idvec *ids, tp_idvec *labels)
{
    int32_t *t = NULL;
    size_t n = 0;
    tp_status s = tp_tokenizer_encode(c->o->tok, c->full + a, b - a, 0, &t, &n);
    if (s) return s;
    int counting = assistant;
    int64_t ignore = TP_IGNORE_INDEX;
    *found_eos = 0;
    for (size_t i = 0; i < n && !s; i++) {
        int64_t id = t[i];
        s = tp_idvec_push(ids, &id, 1);
        if (!s) s = tp_idvec_push(labels, counting ? &id : &ignore, 1);
        if (counting && is_eos(c->o, id)) { counting = 0; *found_eos = 1; }
    }
    free(t);
    return s;
}

static int prefix_of(const char *text, size_t len, const chat *c)
{
    return len <= c->full_len && !memcmp(text, c->full, len);
}

/* Where assistant message k's part starts: the end of its prompt. */
static tp_status part_start(const chat *c, int k, size_t *start)
{
    char *g = NULL;
    tp_status s = render(c, k, 1, &g);
    if (s) return tp_fail_context(s, "message %d (assistant): rendering the prompt before it", k);
    size_t len = strlen(g);
    int ok = prefix_of(g, len, c);
    free(g);
    if (!ok)
        return tp_fail(TP_ERR_UNSUPPORTED, "message %d (assistant): the chat template's prompt before it is not a "
                       "prefix of the whole conversation, so its tokens cannot be told apart", k);
    *start = len;
    return TP_OK;
}

/* Where the template itself ends message k, or 0 when its render alone is
 * not a prefix of the whole. */
static tp_status part_end(const chat *c, int k, size_t *end)
{
    char *r = NULL;
    tp_status s = render(c, k + 1, 0, &r);
    if (s) return tp_fail_context(s, "message %d (assistant): rendering up to it", k);
    size_t len = strlen(r);
    *end = prefix_of(r, len, c) ? len : 0;
    free(r);
    return TP_OK;
}

static int is_assistant(const cJSON *m)
{
    const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role");
    return cJSON_IsString(role) && !strcmp(role->valuestring, "assistant");
}

/* The next assistant message after k, or n. */
static int next_assistant(const cJSON *messages, int k, int n)
{
    for (int i = k + 1; i < n; i++)
        if (is_assistant(cJSON_GetArrayItem(messages, i))) return i;
    return n;
}

static tp_status build(chat *c, const cJSON *messages, tp_idvec *ids, tp_idvec *labels)
{
    size_t pos = 0;
    int found = 0, any = 0;
    tp_status s = TP_OK;
    for (int k = next_assistant(messages, -1, c->n); k < c->n && !s; k = next_assistant(messages, k, c->n)) {
        size_t start = 0, end = 0, next = c->full_len;
        any = 1;
        s = part_start(c, k, &start);
        if (!s && start < pos)
            s = tp_fail(TP_ERR_UNSUPPORTED, "message %d (assistant): its prompt overlaps the message before it", k);
        if (!s) s = part_end(c, k, &end);
        int k2 = s ? c->n : next_assistant(messages, k, c->n);
        if (!s && k2 < c->n) s = part_start(c, k2, &next);
        int bounded = end > start && end <= next;
        if (!bounded) end = next;
        if (!s) s = append_piece(c, pos, start, 0, &found, ids, labels);
        if (!s) s = append_piece(c, start, end, 1, &found, ids, labels);
        if (!s && !found && !bounded)
            s = tp_fail(TP_ERR_UNSUPPORTED, "message %d (assistant): no end-of-turn token (eos) after it, so "
                        "where it ends is unknown", k);
        pos = end;
    }
    if (!s && !any) s = tp_fail(TP_ERR_FORMAT, "no assistant message: nothing to learn");
    if (!s) s = append_piece(c, pos, c->full_len, 0, &found, ids, labels);
    return s;
}

static tp_status print_items(chat *c, const cJSON *messages)
{
    c->n = cJSON_GetArraySize(messages);
    c->items = calloc((size_t)c->n, sizeof *c->items);
    if (!c->items) return tp_fail(TP_ERR_NOMEM, "out of memory");
    int i = 0;
    const cJSON *m;
    cJSON_ArrayForEach(m, messages) {
        if (!cJSON_IsObject(m) || !cJSON_IsString(cJSON_GetObjectItemCaseSensitive(m, "role")))
            return tp_fail(TP_ERR_FORMAT, "message %d is not an object with a \"role\" string", i);
        c->items[i] = cJSON_PrintUnformatted(m);
        if (!c->items[i++]) return tp_fail(TP_ERR_NOMEM, "out of memory");
    }
    return TP_OK;
}

tp_status tp_data_chat_row(const tp_data_options *o, const cJSON *messages, tp_idvec *ids, tp_idvec *labels)
{
    chat c = { .o = o };
    char *full = NULL;
    tp_status s = print_items(&c, messages);
    if (!s) s = render(&c, c.n, 0, &full);
    if (!s) {
        c.full = full;
        c.full_len = strlen(full);
        s = build(&c, messages, ids, labels);
    }
    for (int i = 0; i < c.n && c.items; i++) free(c.items[i]);
    free(c.items);
    free(full);
    return s;
}
