/* tensorpar chat: an interactive conversation with history.  Line editing
 * comes from libedit on a terminal; piped input is read line by line, so
 * the command can be scripted.  Ctrl-D (end of input) exits. */
#include "session.h"

#include <editline/readline.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define N_OWN 2
#define MAX_TURNS 512

typedef struct {
    const char *roles[MAX_TURNS];
    char *contents[MAX_TURNS];
    int n;
    char *reply;          /* the assistant's text being streamed */
    size_t reply_len;
    int speaker;          /* rank 0 prints */
} history;

static void on_text(void *ctx, const char *text, size_t len)
{
    history *h = ctx;
    char *r = realloc(h->reply, h->reply_len + len + 1);
    if (r) {
        memcpy(r + h->reply_len, text, len);
        h->reply_len += len;
        r[h->reply_len] = '\0';
        h->reply = r;
    }
    if (h->speaker) {
        fwrite(text, 1, len, stdout);
        fflush(stdout);
    }
}

static int add_turn(history *h, const char *role, const char *content)
{
    if (h->n == MAX_TURNS) { tp_fail(TP_ERR_INVALID, "the conversation is too long"); return -1; }
    h->roles[h->n] = role;
    h->contents[h->n] = strdup(content);
    if (!h->contents[h->n]) { tp_fail(TP_ERR_NOMEM, "out of memory"); return -1; }
    h->n++;
    return 0;
}

static void history_free(history *h)
{
    for (int i = 0; i < h->n; i++) free(h->contents[i]);
    free(h->reply);
}

/* Renders the whole conversation and generates the next assistant turn; the
 * KV cache keeps the earlier turns, so only the new text is computed. */
static int reply(session *s, history *h)
{
    char *messages = session_messages_json(h->roles, (const char *const *)h->contents, h->n), *prompt = NULL;
    int64_t *ids = NULL, np = 0, n_out = 0;
    int rc = messages ? session_render_chat(s, messages, &prompt) : -1;
    if (!rc) rc = session_encode(s, prompt, 0, &ids, &np);
    if (!rc) rc = session_ensure_cache(s);
    int64_t *out = malloc(((size_t)s->opts.max_new_tokens + 1) * sizeof *out);
    h->reply_len = 0;
    if (h->reply) h->reply[0] = '\0';
    tp_generate_stats st;
    if (!rc && (!out || tp_generate(s->model, &s->kv, ids, np, &s->opts, out, &n_out, &st))) rc = -1;
    if (!rc && h->speaker) {
        printf("\n");
        session_print_stats(&st);
        if (!strcmp(st.stop_reason, "context full"))
            tp_log(TP_LOG_WARN, "the conversation fills the context (%lld positions): the reply was cut and no "
                   "further turn fits", (long long)s->kv.capacity);
    }
    if (!rc) {
        rc = add_turn(h, "assistant", h->reply ? h->reply : "");
    }
    free(out);
    free(ids);
    free(prompt);
    free(messages);
    return rc;
}

static char *read_local_line(int interactive)
{
    if (interactive) {
        char *line = readline("> ");
        if (line && *line) add_history(line);
        return line;
    }
    char *line = NULL;
    size_t cap = 0;
    ssize_t n = getline(&line, &cap, stdin);
    if (n < 0) { free(line); return NULL; }
    if (n > 0 && line[n - 1] == '\n') line[n - 1] = '\0';
    return line;
}

/* Rank 0 reads the terminal; under TP the other ranks receive each line
 * (length first, -1 for end of input) so that all run the same turns. */
static char *read_line(session *s, int interactive)
{
    if (!s->tp.world) return read_local_line(interactive);
    char *line = s->tp.rank == 0 ? read_local_line(interactive) : NULL;
    int64_t len = line ? (int64_t)strlen(line) : -1;
    if (tp_comm_broadcast(s->tp.world, &len, 1, TP_I64, 0)) { free(line); return NULL; }
    if (len < 0) return NULL;
    if (!line && !(line = calloc((size_t)len + 1, 1))) return NULL;
    if (tp_comm_broadcast(s->tp.world, line, (size_t)len, TP_U8, 0)) { free(line); return NULL; }
    return line;
}

static int chat_loop(session *s, const char *system)
{
    history h = {0};
    h.speaker = s->tp.rank == 0;
    s->opts.on_text = on_text;
    s->opts.ctx = &h;
    int interactive = isatty(0) && s->tp.rank == 0, rc = 0;
    if (system && add_turn(&h, "system", system)) rc = -1;
    if (interactive && !rc) fprintf(stderr, "Chatting with the model; Ctrl-D exits.\n");
    char *line;
    while (!rc && (line = read_line(s, interactive)) != NULL) {
        if (*line) rc = add_turn(&h, "user", line);
        if (*line && !rc) rc = reply(s, &h);
        free(line);
    }
    history_free(&h);
    return rc;
}

int cmd_chat(int argc, char **argv)
{
    cli_option o[N_OWN + SESSION_N_SAMPLING + CLI_TP_N_OPTIONS] = {
        {"--model", "DIR", "model directory with tokenizer files (required)", 0, {0}},
        {"--system", "TEXT", "system message", 0, {0}},
    };
    memcpy(o + N_OWN, session_sampling_options, sizeof session_sampling_options);
    memcpy(o + N_OWN + SESSION_N_SAMPLING, cli_tp_options, sizeof cli_tp_options);
    int n = N_OWN + SESSION_N_SAMPLING + CLI_TP_N_OPTIONS;
    int rc = cli_parse(argc, argv, o, n, "tensorpar chat --model DIR [--system TEXT] [options]",
                       "An interactive chat through the model's chat template, keeping the history.\n"
                       "Each line you type is a user turn; Ctrl-D exits.", NULL, NULL);
    if (rc) return rc == 1 ? 0 : CLI_EXIT_USAGE;
    const char *dir = cli_value(o, n, "--model");
    if (!dir) {
        tp_fail(TP_ERR_INVALID, "--model is required (see --help)");
        return cli_usage_error("chat");
    }
    if (session_check_options(o, n)) return cli_usage_error("chat");
    cli_tp tp;
    if (cli_tp_begin("chat", argc, argv, o, n, dir, &tp, &rc)) { cli_tp_end(&tp); return rc; }
    session s;
    int r = session_open(&s, "chat", dir, o, n, SESSION_NEED_TEMPLATE, &tp);
    if (!r) r = chat_loop(&s, cli_value(o, n, "--system"));
    if (r == -1) cli_report("chat");
    session_close(&s);
    return r ? CLI_EXIT_RUNTIME : 0;
}
