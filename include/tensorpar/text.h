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

/* ---- chat templates ---- */

#ifdef __cplusplus
}
#endif
#endif
