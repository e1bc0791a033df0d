/* tensorpar chat-template: renders a tokenizer's chat template for a
 * conversation and prints the text exactly (no newline added). */
#include "cli.h"
#include "tensorpar/io.h"
#include "tensorpar/text.h"

#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

/* Collects the --set key=json options into one JSON object. */
static tp_status kwargs_json(const cli_option *set, char **out)
{
    *out = NULL;
    cJSON *obj = cJSON_CreateObject();
    if (!obj) return tp_fail(TP_ERR_NOMEM, "out of memory");
    for (int i = 0; i < set->count; i++) {
        const char *kv = set->values[i], *eq = strchr(kv, '=');
        if (!eq || eq == kv) {
            cJSON_Delete(obj);
            return tp_fail(TP_ERR_INVALID, "--set expects key=json, got '%s'", kv);
        }
        cJSON *v = cJSON_Parse(eq + 1);
        if (!v) {
            cJSON_Delete(obj);
            return tp_fail(TP_ERR_INVALID, "--set %.*s: value is not valid JSON: '%s'", (int)(eq - kv), kv, eq + 1);
        }
        char key[256];
        snprintf(key, sizeof key, "%.*s", (int)(eq - kv), kv);
        cJSON_DeleteItemFromObjectCaseSensitive(obj, key);   /* the last one wins */
        cJSON_AddItemToObject(obj, key, v);
    }
    *out = cJSON_PrintUnformatted(obj);
    cJSON_Delete(obj);
    return *out ? TP_OK : tp_fail(TP_ERR_NOMEM, "out of memory");
}

static tp_status run(const char *tok, const char *msgs_path, int add_gen, const cli_option *set)
{
    char *msgs = NULL, *kwargs = NULL, *text = NULL;
    size_t len;
    tp_chat_template *t = NULL;
    tp_status s = tp_read_file(msgs_path, &msgs, &len);
    if (!s) s = kwargs_json(set, &kwargs);
    if (!s) s = tp_chat_template_load(&t, tok);
    if (!s) s = tp_chat_template_render(t, msgs, add_gen, kwargs, &text);
    if (!s && fwrite(text, 1, strlen(text), stdout) != strlen(text))
        s = tp_fail(TP_ERR_IO, "cannot write to stdout");
    if (!s && fflush(stdout)) s = tp_fail(TP_ERR_IO, "cannot write to stdout");
    free(text);
    tp_chat_template_free(t);
    free(kwargs);
    free(msgs);
    return s;
}

int cmd_chat_template(int argc, char **argv)
{
    cli_option o[] = {
        {"--tokenizer", "PATH", "tokenizer directory or its tokenizer_config.json (required)", 0, {0}},
        {"--messages", "FILE", "JSON array of {\"role\", \"content\"} messages (required)", 0, {0}},
        {"--add-generation-prompt", NULL, "end with the assistant turn's header", 0, {0}},
        {"--set", "KEY=JSON", "extra template variable, e.g. enable_thinking=false (repeatable)", 0, {0}},
    };
    int n = (int)(sizeof o / sizeof o[0]);
    int rc = cli_parse(argc, argv, o, n,
                       "tensorpar chat-template --tokenizer PATH --messages FILE [--add-generation-prompt] [--set KEY=JSON]...",
                       "Renders the tokenizer's chat template for a conversation and prints the text.", NULL, NULL);
    if (rc) return rc == 1 ? 0 : 2;
    const char *tok = cli_value(o, n, "--tokenizer"), *msgs = cli_value(o, n, "--messages");
    if (!tok || !msgs) {
        fprintf(stderr, "tensorpar chat-template: error: --tokenizer and --messages are required (see --help)\n");
        return 2;
    }
    if (run(tok, msgs, cli_flag(o, n, "--add-generation-prompt"), &o[3])) return cli_report("chat-template");
    return 0;
}
