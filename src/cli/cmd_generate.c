/* tensorpar generate: decode from token ids (printing new ids as JSON) or
 * from a text prompt (streaming text), greedy or sampled. */
#include "session.h"

#include <stdlib.h>
#include <string.h>

#define N_OWN 6

static void print_text(void *ctx, const char *text, size_t len)
{
    (void)ctx;
    fwrite(text, 1, len, stdout);
    fflush(stdout);
}

/* The prompt ids: given ids, or the text (through the chat template with
 * --chat), encoded by the model's tokenizer. */
static int prompt_ids(session *s, const cli_option *o, int n, int64_t **ids, int64_t *np)
{
    const char *toks = cli_value(o, n, "--tokens"), *text = cli_value(o, n, "--prompt");
    if (toks) {
        int k;
        if (cli_parse_ids(toks, ids, &k)) return -1;
        *np = k;
        return 0;
    }
    if (!cli_flag(o, n, "--chat")) return session_encode(s, text, 1, ids, np);
    const char *roles[2] = {"system", "user"}, *contents[2] = {cli_value(o, n, "--system"), text};
    int first = contents[0] ? 0 : 1;
    char *messages = session_messages_json(roles + first, contents + first, 2 - first), *rendered = NULL;
    int rc = messages ? session_render_chat(s, messages, &rendered) : -1;
    /* The template writes the special tokens itself, as apply_chat_template. */
    if (!rc) rc = session_encode(s, rendered, 0, ids, np);
    free(messages);
    free(rendered);
    return rc;
}

/* The cache holds prompt + new tokens, but never more positions than the
 * model has (max_position_embeddings): past them generation stops, with one
 * warning, instead of running on positions the model was not made for. */
static int context_size(const session *s, int64_t np, int64_t *ctx)
{
    int64_t max_pos = s->model->cfg.max_position_embeddings, want = np + s->opts.max_new_tokens;
    if (np > max_pos) {
        tp_fail(TP_ERR_INVALID, "the prompt has %lld tokens, more than max_position_embeddings (%lld)",
                (long long)np, (long long)max_pos);
        return -1;
    }
    *ctx = want < max_pos ? want : max_pos;
    if (want > max_pos && s->tp.rank == 0)
        tp_log(TP_LOG_WARN, "%lld prompt tokens + %lld new tokens exceed max_position_embeddings (%lld): "
               "generation stops after %lld new tokens", (long long)np, (long long)s->opts.max_new_tokens,
               (long long)max_pos, (long long)(max_pos - np));
    return 0;
}

/* -1: error (tp_error); -2: error already reported. */
static int run(session *s, const cli_option *o, int n)
{
    int64_t *ids = NULL, np = 0, n_out = 0, ctx = 0;
    /* Every rank encodes the same prompt: a prompt too long for the model
     * is everybody's error, reported once. */
    int bad = prompt_ids(s, o, n, &ids, &np) || context_size(s, np, &ctx);
    if (cli_tp_agree("generate", &s->tp, bad)) { free(ids); return -2; }
    int text_mode = cli_value(o, n, "--prompt") != NULL, speaker = s->tp.rank == 0;
    s->opts.on_text = text_mode && speaker ? print_text : NULL;
    s->opts.tok = text_mode ? s->tok : NULL;
    int64_t *out = malloc(((size_t)s->opts.max_new_tokens + 1) * sizeof *out);
    tp_generate_stats st;
    int rc = -1;
    if (out && !tp_kv_cache_init(&s->kv, s->model, ctx) &&
        !tp_generate(s->model, &s->kv, ids, np, &s->opts, out, &n_out, &st)) {
        rc = 0;
        if (!speaker) {
            /* every rank generated the same ids; rank 0 alone prints them */
        } else if (text_mode) {
            printf("\n");
            session_print_stats(&st);
        } else {
            printf("[");
            for (int64_t i = 0; i < n_out; i++) printf("%s%lld", i ? ", " : "", (long long)out[i]);
            printf("]\n");
        }
    }
    free(out);
    free(ids);
    return rc;
}

int cmd_generate(int argc, char **argv)
{
    cli_option o[N_OWN + SESSION_N_SAMPLING + CLI_TP_N_OPTIONS] = {
        {"--model", "DIR", "model directory (required)", 0, {0}},
        {"--tokens", "IDS", "prompt as comma-separated token ids; prints new ids as JSON", 0, {0}},
        {"--prompt", "TEXT", "prompt as text (needs tokenizer.json beside the weights); streams text", 0, {0}},
        {"--chat", NULL, "wrap the prompt in the model's chat template", 0, {0}},
        {"--system", "TEXT", "system message for --chat", 0, {0}},
        {"--verbose", NULL, "print timing also for --tokens", 0, {0}},
    };
    memcpy(o + N_OWN, session_sampling_options, sizeof session_sampling_options);
    memcpy(o + N_OWN + SESSION_N_SAMPLING, cli_tp_options, sizeof cli_tp_options);
    int n = N_OWN + SESSION_N_SAMPLING + CLI_TP_N_OPTIONS;
    int rc = cli_parse(argc, argv, o, n,
                       "tensorpar generate --model DIR (--tokens 1,2,3 | --prompt TEXT [--chat]) [options]",
                       "Generates a continuation. With --tokens the new ids are printed as a JSON array;\n"
                       "with --prompt the text streams to stdout and timing goes to stderr.\n"
                       "Sampling defaults come from the model's generation_config.json.", NULL, NULL);
    if (rc) return rc == 1 ? 0 : CLI_EXIT_USAGE;
    const char *dir = cli_value(o, n, "--model");
    int has_tokens = cli_value(o, n, "--tokens") != NULL, has_prompt = cli_value(o, n, "--prompt") != NULL;
    if (!dir || has_tokens == has_prompt) {
        tp_fail(TP_ERR_INVALID, "--model and exactly one of --tokens or --prompt are required (see --help)");
        return cli_usage_error("generate");
    }
    if (cli_flag(o, n, "--chat") && !has_prompt) {
        tp_fail(TP_ERR_INVALID, "--chat needs --prompt");
        return cli_usage_error("generate");
    }
    if (session_check_options(o, n)) return cli_usage_error("generate");
    cli_tp tp;
    if (cli_tp_begin("generate", argc, argv, o, n, dir, &tp, &rc)) { cli_tp_end(&tp); return rc; }
    session s;
    int r = session_open(&s, "generate", dir, o, n, has_prompt ? SESSION_NEED_TOKENIZER : SESSION_NEED_NOTHING, &tp);
    if (!r) r = run(&s, o, n);
    if (r == -1) cli_report("generate");
    session_close(&s);
    return r ? CLI_EXIT_RUNTIME : 0;
}
