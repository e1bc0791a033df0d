/* Shared by the generate and chat commands (see session.c). */
#ifndef TP_CLI_SESSION_H
#define TP_CLI_SESSION_H

#include "cli.h"
#include "tp_cli.h"
#include "tensorpar/api.h"
#include "tensorpar/models.h"
#include "tensorpar/text.h"

#define SESSION_N_SAMPLING 15
extern const cli_option session_sampling_options[SESSION_N_SAMPLING];

typedef struct {
    tp_model *model;
    tp_tokenizer *tok;           /* NULL when the model directory has none */
    tp_chat_template *tpl;       /* NULL when there is no chat template   */
    tp_generation_config gen;
    tp_generate_options opts;
    tp_kv_cache kv;
    cli_tp tp;                   /* the job's ranks (size 1 without --tp) */
} session;

/* What session_open must find beside the weights. */
enum { SESSION_NEED_NOTHING, SESSION_NEED_TOKENIZER, SESSION_NEED_TEMPLATE };

/* Loads model, tokenizer, template and options.  Returns 0, -1 (tp_error)
 * or -2 (an error every rank met, already reported once).  tp comes from
 * cli_tp_begin; the session owns it from here on. */
int session_open(session *s, const char *cmd, const char *dir, const cli_option *o, int n, int need,
                 const cli_tp *tp);
void session_close(session *s);
int session_read_options(session *s, const cli_option *o, int n);
/* session_read_options over default generation settings, before any model
 * is loaded: -1 (tp_error) for a value no model could accept. */
int session_check_options(const cli_option *o, int n);
int session_encode(session *s, const char *text, int add_special, int64_t **ids, int64_t *n);
char *session_messages_json(const char *const *roles, const char *const *contents, int n);
int session_render_chat(session *s, const char *messages_json, char **prompt);
int session_ensure_cache(session *s);
void session_print_stats(const tp_generate_stats *st);

#endif
