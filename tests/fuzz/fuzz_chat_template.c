/* libFuzzer harness: the Jinja chat-template engine.  Each input is a
 * template (seeds: the Qwen3 and Llama 3 templates and small ones using each
 * construct), parsed and, when it parses, rendered for a fixed conversation
 * with a system prompt, tools, a tool call and its result. */
#include "fuzz_util.h"
#include "tensorpar/text.h"

#include <stdlib.h>
#include <string.h>

static const char MESSAGES[] =
    "[{\"role\": \"system\", \"content\": \"Be brief.\"},"
    " {\"role\": \"user\", \"content\": \"What is the weather in Paris? \\u00e9\\ud83c\\udf89\"},"
    " {\"role\": \"assistant\", \"content\": \"<think>\\nhmm\\n</think>\\n\\n\","
    "  \"tool_calls\": [{\"type\": \"function\", \"function\": {\"name\": \"get_weather\","
    "   \"arguments\": {\"city\": \"Paris\", \"days\": 2}}}]},"
    " {\"role\": \"tool\", \"content\": \"{\\\"temp\\\": 21}\"},"
    " {\"role\": \"assistant\", \"content\": \"21 degrees.\"},"
    " {\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": \"Thanks\"}]}]";

static const char KWARGS[] =
    "{\"enable_thinking\": false, \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"get_weather\","
    " \"description\": \"Weather\", \"parameters\": {\"type\": \"object\", \"properties\":"
    " {\"city\": {\"type\": \"string\"}}, \"required\": [\"city\"]}}}]}";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *src = fuzz_strndup(data, size);
    tp_chat_template *t = NULL;
    if (tp_chat_template_from_string(&t, src, "<|begin_of_text|>", "<|im_end|>") == TP_OK) {
        char *out = NULL;
        if (tp_chat_template_render(t, MESSAGES, (int)(size & 1), size & 2 ? KWARGS : NULL, &out) == TP_OK)
            free(out);
        tp_chat_template_free(t);
    }
    free(src);
    return 0;
}
