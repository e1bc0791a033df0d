/* tensorpar/text.h — text in and out of the model.
 *
 * Tokenizer: Hugging Face tokenizer.json with a BPE model, byte-level or not
 * (Llama 3, Qwen2/Qwen3, GPT-2, Mistral-Nemo style files).  Encoding follows
 * the `tokenizers` library step by step and gives the same ids:
 *
 *   1. added tokens that are not `normalized` are cut out of the raw text
 *      (leftmost-longest; `single_word`, `lstrip`, `rstrip` honoured);
 *   2. each remaining segment is normalized (NFC, NFD, NFKC, NFKD, Lowercase,
 *      Replace, Prepend, Strip, Sequence), then `normalized` added tokens are
 *      cut out of it;
 *   3. the pre-tokenizer splits what is left (Split with a regex or a string
 *      and any behaviour/invert, ByteLevel, Digits, Sequence);
 *   4. BPE turns each piece into ids (lowest merge rank first, leftmost on a
 *      tie; `ignore_merges` emits a piece found whole in the vocabulary);
 *   5. with add_special_tokens, the post-processor adds its tokens
 *      (TemplateProcessing, Bert/RobertaProcessing, ByteLevel adds none).  If
 *      the post-processor defines none, DIR/tokenizer_config.json's
 *      add_bos_token / add_eos_token are used instead.
 *
 * Added tokens written in the text are matched whatever add_special_tokens
 * says, as in `tokenizers`.  A loaded tokenizer is immutable: one tokenizer
 * may be used by many threads at once.
 */
#ifndef TENSORPAR_TEXT_H
#define TENSORPAR_TEXT_H

#include "tensorpar/base.h"
#include "tensorpar/models.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- tokenizer -------------------------------------------------------- */

typedef struct tp_tokenizer tp_tokenizer;

/* `path` is a tokenizer.json file or a directory holding one (then
 * DIR/tokenizer_config.json is read too when present).  Errors name the file
 * and the key: missing file, bad JSON, unsupported model ("Unigram",
 * "WordPiece", ...) or component. */
tp_status tp_tokenizer_load(tp_tokenizer **out, const char *path);
/* Same, from the text of a tokenizer.json (and optionally of a
 * tokenizer_config.json, or NULL).  `origin` names the source in messages. */
tp_status tp_tokenizer_load_json(tp_tokenizer **out, const char *json, size_t len,
                                 const char *config_json, const char *origin);
void tp_tokenizer_free(tp_tokenizer *tok);

/* Encodes `len` bytes of UTF-8 text into a malloc'd array of ids (free()).
 * *ids may be NULL when *n is 0.  Invalid UTF-8 is TP_ERR_INVALID. */
tp_status tp_tokenizer_encode(const tp_tokenizer *tok, const char *text, size_t len,
                              int add_special_tokens, int32_t **ids, size_t *n);

/* Decodes ids into a malloc'd NUL-terminated string (free()); *len (may be
 * NULL) receives its length, since a byte-level token may decode to NUL.
 * Bytes that do not form UTF-8 become U+FFFD.  An id outside the
 * vocabulary is TP_ERR_INVALID. */
tp_status tp_tokenizer_decode(const tp_tokenizer *tok, const int32_t *ids, size_t n,
                              int skip_special_tokens, char **text, size_t *len);

/* One more than the largest id (model vocabulary and added tokens). */
size_t tp_tokenizer_vocab_size(const tp_tokenizer *tok);
/* The id of a token's text (added tokens first, then the model's), or -1. */
int32_t tp_tokenizer_token_to_id(const tp_tokenizer *tok, const char *token);
/* The text of a token as stored (byte-level form), or NULL for an unused id.
 * Valid while the tokenizer lives. */
const char *tp_tokenizer_id_to_token(const tp_tokenizer *tok, int32_t id);
/* Whether id is an added token marked special. */
int tp_tokenizer_is_special(const tp_tokenizer *tok, int32_t id);

/* Incremental decoding for generation: feed ids one at a time and get back
 * only text that is complete UTF-8; bytes of a character split across
 * tokens wait for the next id.  One stream per sequence. */
typedef struct tp_detok_stream tp_detok_stream;

tp_status tp_detok_stream_create(tp_detok_stream **out, const tp_tokenizer *tok,
                                 int skip_special_tokens);
/* Decodes `id`; *text is a malloc'd NUL-terminated string (maybe "") of the
 * newly completed text, *len its length. */
tp_status tp_detok_stream_push(tp_detok_stream *s, int32_t id, char **text, size_t *len);
/* Flushes what is left (an unfinished character becomes U+FFFD). */
tp_status tp_detok_stream_finish(tp_detok_stream *s, char **text, size_t *len);
void tp_detok_stream_free(tp_detok_stream *s);

/* ---- sampling ---------------------------------------------------------- */

/* Transformers' generation settings that choose a token.  do_sample = 0 or
 * temperature = 0 is greedy.  Defaults: tp_sampling_defaults(). */
typedef struct {
    int do_sample;
    double temperature;          /* 1.0 */
    int64_t top_k;               /* 50; 0 = off */
    double top_p;                /* 1.0 = off */
    double min_p;                /* 0 = off */
    double repetition_penalty;   /* 1.0 = off */
    uint64_t seed;
} tp_sampling;

typedef struct { int64_t id; float logit; double prob; } tp_scored;

typedef struct {
    tp_sampling cfg;
    int64_t vocab;
    tp_rng rng;
    tp_scored *work;             /* [vocab] scratch */
    unsigned char *seen;         /* [vocab] ids already in the sequence */
} tp_sampler;

void tp_sampling_defaults(tp_sampling *s);
tp_status tp_sampling_validate(const tp_sampling *s);
tp_status tp_sampler_init(tp_sampler *sp, const tp_sampling *s, int64_t vocab);
void tp_sampler_release(tp_sampler *sp);
/* Records ids of the sequence (prompt and generated) for the repetition penalty. */
void tp_sampler_observe(tp_sampler *sp, const int64_t *ids, int64_t n);
/* Applies the processors to `logits` (modified in place) and picks an id. */
int64_t tp_sampler_next(tp_sampler *sp, float *logits);

/* ---- generation --------------------------------------------------------- */

/* Receives each piece of newly completed text (stop strings held back). */
typedef void (*tp_text_callback)(void *ctx, const char *text, size_t len);
/* Lets the caller replace the sampled id in place (under TP: every rank
 * takes TP rank 0's id, broadcast; tp-semantics.md §10.7). */
typedef tp_status (*tp_choose_callback)(void *ctx, int64_t *id);

typedef struct {
    tp_sampling sampling;
    int64_t max_new_tokens;
    int64_t eos_ids[TP_MAX_EOS];
    int n_eos;
    const char *const *stop;      /* stop strings */
    int n_stop;
    const tp_tokenizer *tok;      /* NULL: no text, no stop strings */
    tp_text_callback on_text;
    void *ctx;                    /* for on_text */
    tp_choose_callback choose;
    void *choose_ctx;
} tp_generate_options;

typedef struct {
    int64_t prompt_tokens, reused_tokens, new_tokens;
    double prefill_s, decode_s;   /* time to first token; decoding time */
    const char *stop_reason;      /* "eos", "stop string", "length", "context full" */
} tp_generate_stats;

/* Generates up to max_new_tokens ids into out (eos included when hit).  The
 * cache may hold an earlier turn: its longest prefix shared with the prompt
 * is reused.  The prompt must fit the cache; generation stops early, with
 * stop_reason "context full", when the sequence fills the cache's capacity. */
tp_status tp_generate(tp_model *m, tp_kv_cache *kv, const int64_t *prompt, int64_t n_prompt,
                      const tp_generate_options *o, int64_t *out, int64_t *n_out, tp_generate_stats *st);

/* ---- chat templates ---- */

/* tokenizer_config.json's `chat_template` (Jinja), rendered the way
 * Transformers' apply_chat_template does (trim_blocks, lstrip_blocks, no
 * autoescape) by an interpreter for the Jinja subset chat templates use.
 * Variables: messages, add_generation_prompt, bos_token, eos_token (strings,
 * or "" when absent), date_string ("26 Jul 2024" unless given), plus extra
 * keyword arguments (enable_thinking, tools, ...).  Undefined names behave
 * like Jinja's default Undefined.  Errors (syntax errors with line and
 * column, unknown filters, raise_exception's message) go through tp_fail. */
typedef struct tp_chat_template tp_chat_template;

/* `path` is a tokenizer directory or its tokenizer_config.json.  The
 * template is parsed now, so syntax errors surface here. */
tp_status tp_chat_template_load(tp_chat_template **out, const char *path);
/* Parses template text directly (bos/eos tokens may be NULL). */
tp_status tp_chat_template_from_string(tp_chat_template **out, const char *source,
                                       const char *bos_token, const char *eos_token);
/* messages_json: a JSON array of {"role", "content", ...} objects.
 * extra_kwargs_json: a JSON object of further variables, or NULL.
 * *out_text is malloc'd, NUL-terminated; free() it. */
tp_status tp_chat_template_render(const tp_chat_template *tpl, const char *messages_json,
                                  int add_generation_prompt, const char *extra_kwargs_json,
                                  char **out_text);
void tp_chat_template_free(tp_chat_template *tpl);

#ifdef __cplusplus
}
#endif
#endif
