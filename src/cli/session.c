/* What generate and chat share: the sampling options, loading a model with
 * the tokenizer and chat template beside it, and turning a conversation
 * into prompt ids. */
#include "session.h"

#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

const cli_option session_sampling_options[SESSION_N_SAMPLING] = {
    {"--do-sample", NULL, "sample (default: the model's generation_config.json)", 0, {0}},
    {"--greedy", NULL, "always take the most likely token", 0, {0}},
    {"--temperature", "F", "softmax temperature", 0, {0}},
    {"--top-k", "K", "keep the K most likely tokens (0 = off)", 0, {0}},
    {"--top-p", "P", "keep the most likely tokens up to probability P", 0, {0}},
    {"--min-p", "P", "drop tokens below P times the top probability", 0, {0}},
    {"--repetition-penalty", "F", "penalise tokens already in the sequence", 0, {0}},
    {"--seed", "N", "random seed for sampling (default 0)", 0, {0}},
    {"--stop", "TEXT", "stop when TEXT is generated; repeatable", 0, {0}},
    {"--max-new-tokens", "N", "tokens to generate (default: generation_config.json, else 256)", 0, {0}},
    {"--dtype", "f32|bf16|q8_0|q4_0", "weight dtype in memory (default: as stored; f16 is converted to f32; q8_0/q4_0: 8-/4-bit Linear weights)", 0, {0}},
    CLI_MATMUL_OPTION,
    {"--threads", "N", "threads per rank (default: cores / local ranks)", 0, {0}},
    {"--adapter", "DIR", "a PEFT LoRA adapter (adapter_config.json, adapter_model.safetensors) on the model", 0, {0}},
    {"--merge-adapter", NULL, "fold the adapter into the weights at load (f32 weights; no cost per token)", 0, {0}},
};

int session_read_options(session *s, const cli_option *o, int n)
{
    const tp_generation_config *g = &s->gen;
    tp_sampling *sp = &s->opts.sampling;
    tp_sampling_defaults(sp);
    sp->do_sample = g->do_sample;
    sp->temperature = g->temperature;
    sp->top_k = g->top_k;
    sp->top_p = g->top_p;
    sp->min_p = g->min_p;
    sp->repetition_penalty = g->repetition_penalty;
    long long top_k = sp->top_k, seed = 0, max_new = g->max_new_tokens;
    if (cli_double(o, n, "--temperature", &sp->temperature) || cli_double(o, n, "--top-p", &sp->top_p) ||
        cli_double(o, n, "--min-p", &sp->min_p) || cli_double(o, n, "--repetition-penalty", &sp->repetition_penalty) ||
        cli_int(o, n, "--top-k", &top_k) || cli_int(o, n, "--seed", &seed) ||
        cli_int(o, n, "--max-new-tokens", &max_new))
        return -1;
    if (cli_flag(o, n, "--do-sample")) sp->do_sample = 1;
    if (cli_flag(o, n, "--greedy")) sp->do_sample = 0;
    sp->top_k = top_k;
    sp->seed = (uint64_t)seed;
    if (max_new < 0) { tp_fail(TP_ERR_INVALID, "--max-new-tokens must be >= 0"); return -1; }
    s->opts.max_new_tokens = max_new;
    memcpy(s->opts.eos_ids, g->eos_token_ids, sizeof s->opts.eos_ids);
    s->opts.n_eos = g->n_eos;
    for (int i = 0; i < n; i++)
        if (!strcmp(o[i].name, "--stop")) { s->opts.stop = o[i].values; s->opts.n_stop = o[i].count; }
    return tp_sampling_validate(sp) ? -1 : 0;
}

int session_check_options(const cli_option *o, int n)
{
    /* The sampling options over generation_config.json's defaults: a value
     * wrong whatever the model says (--top-p 2) is a usage error. */
    session s;
    memset(&s, 0, sizeof s);
    s.gen.temperature = 1.0;
    s.gen.top_p = 1.0;
    s.gen.repetition_penalty = 1.0;
    s.gen.max_new_tokens = 256;
    return session_read_options(&s, o, n);
}

static int exists(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0;
}

/* tokenizer.json and the chat template beside the weights, as far as
 * `need` asks (SESSION_NEED_*).  -1 with tp_error(). */
static int load_text(session *s, const char *dir, int need)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    if (!exists(path)) {
        if (need == SESSION_NEED_NOTHING) return 0;
        tp_fail(TP_ERR_INVALID, "%s: no tokenizer.json beside the weights (make-model --tokenizer puts one there)", dir);
        return -1;
    }
    if (tp_tokenizer_load(&s->tok, dir)) return -1;
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    if (exists(path) && tp_chat_template_load(&s->tpl, dir)) {
        /* A model without a usable template can still complete text. */
        if (need == SESSION_NEED_TEMPLATE) return -1;
        tp_log(TP_LOG_DEBUG, "no chat template: %s", tp_error());
        s->tpl = NULL;
    }
    if (need == SESSION_NEED_TEMPLATE && !s->tpl) {
        tp_fail(TP_ERR_INVALID, "%s: the tokenizer has no chat_template", dir);
        return -1;
    }
    return 0;
}

int session_open(session *s, const char *cmd, const char *dir, const cli_option *o, int n, int need,
                 const cli_tp *tp)
{
    memset(s, 0, sizeof *s);
    s->tp = *tp;
    tp_model_options mo = {.weight_dtype = TP_DTYPE_COUNT, .threads = 1, .show_progress = isatty(2) && tp->rank == 0};
    const char *dt = cli_value(o, n, "--dtype");
    if (cli_tp_threads(o, n, &s->tp, &mo) || (dt && tp_dtype_parse(dt, &mo.weight_dtype))) return -1;
    /* Every rank reads the same files: what is wrong with them is reported
     * once (cli_tp_agree). */
    if (cli_tp_agree(cmd, &s->tp, load_text(s, dir, need) != 0)) return -2;
    /* The job is already joined (cli_tp_begin checked the model on every
     * rank first); the API builds the mesh on it and loads. */
    tp_dist_config dc = {.tp_size = s->tp.size, .tp_plan = s->tp.plan, .world = s->tp.world, .model = &mo,
                         .ep_size = s->tp.ep ? s->tp.size : 0};
    if (tp_model_from_pretrained(&s->model, dir, mo.weight_dtype, &dc)) return -1;
    int bad = tp_generation_config_load(&s->gen, dir, &s->model->cfg) || session_read_options(s, o, n) ||
              cli_adapter_load(o, n, s->model);
    if (cli_tp_agree(cmd, &s->tp, bad)) return -2;
    s->opts.tok = s->tok;
    if (s->tp.world) {   /* rank 0 chooses every token and broadcasts it */
        s->opts.choose = tp_model_choose_tp_rank0;
        s->opts.choose_ctx = s->model;
    }
    return 0;
}

void session_close(session *s)
{
    if (s->kv.k) tp_kv_cache_release(&s->kv);
    tp_model_free(s->model);
    cli_tp_end(&s->tp);
    if (s->tok) tp_tokenizer_free(s->tok);
    if (s->tpl) tp_chat_template_free(s->tpl);
    memset(s, 0, sizeof *s);
}

int session_encode(session *s, const char *text, int add_special, int64_t **ids, int64_t *n)
{
    int32_t *raw;
    size_t k;
    if (tp_tokenizer_encode(s->tok, text, strlen(text), add_special, &raw, &k)) return -1;
    *ids = malloc((k ? k : 1) * sizeof **ids);
    if (!*ids) { free(raw); tp_fail(TP_ERR_NOMEM, "out of memory"); return -1; }
    for (size_t i = 0; i < k; i++) (*ids)[i] = raw[i];
    *n = (int64_t)k;
    free(raw);
    return 0;
}

int session_render_chat(session *s, const char *messages_json, char **prompt)
{
    if (!s->tpl) {
        tp_fail(TP_ERR_INVALID, "the model's tokenizer_config.json has no chat_template");
        return -1;
    }
    return tp_chat_template_render(s->tpl, messages_json, 1, NULL, prompt) ? -1 : 0;
}

char *session_messages_json(const char *const *roles, const char *const *contents, int n)
{
    cJSON *a = cJSON_CreateArray();
    for (int i = 0; i < n; i++) {
        cJSON *m = cJSON_CreateObject();
        cJSON_AddStringToObject(m, "role", roles[i]);
        cJSON_AddStringToObject(m, "content", contents[i]);
        cJSON_AddItemToArray(a, m);
    }
    char *text = cJSON_PrintUnformatted(a);
    cJSON_Delete(a);
    return text;
}

int session_ensure_cache(session *s)
{
    if (s->kv.k) return 0;
    int64_t ctx = s->model->cfg.max_position_embeddings;
    if (ctx > 8192) ctx = 8192;   /* memory grows with the context; enough for a session */
    return tp_kv_cache_init(&s->kv, s->model, ctx) ? -1 : 0;
}

void session_print_stats(const tp_generate_stats *st)
{
    double tps = st->new_tokens > 1 && st->decode_s > 0 ? (double)(st->new_tokens - 1) / st->decode_s : 0;
    fprintf(stderr, "\n[%lld prompt tokens (%lld reused), %lld new; time to first token %.3f s; %.2f tokens/s; stop: %s]\n",
            (long long)st->prompt_tokens, (long long)st->reused_tokens, (long long)st->new_tokens,
            st->prefill_s, tps, st->stop_reason ? st->stop_reason : "-");
}
