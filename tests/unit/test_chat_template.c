/* Unit tests for the chat-template Jinja interpreter: expressions, filters,
 * tests, methods, whitespace control, loops, scoping, macros and errors.
 * Expected outputs are what Python Jinja (with Transformers' trim_blocks and
 * lstrip_blocks) renders. */
#include "check.h"
#include "tensorpar/text.h"

#include <stdlib.h>
#include <string.h>

static const char *MSGS = "[{\"role\": \"system\", \"content\": \"Be brief.\"},"
                          " {\"role\": \"user\", \"content\": \"  Hi \\u00e9t\\u00e9 \\ud83c\\udf89 \"},"
                          " {\"role\": \"assistant\", \"content\": \"<think>\\nhmm\\n</think>\\n\\nHello\"}]";

/* Renders `src`; returns malloc'd text, or NULL with the error in tp_error(). */
static char *render(const char *src, const char *kwargs)
{
    tp_chat_template *t;
    char *out = NULL;
    if (tp_chat_template_from_string(&t, src, "<s>", "</s>")) return NULL;
    tp_status s = tp_chat_template_render(t, MSGS, 1, kwargs, &out);
    tp_chat_template_free(t);
    return s ? NULL : out;
}

#define EXPECT(src, want) expect(__LINE__, src, NULL, want)
#define EXPECT_KW(src, kw, want) expect(__LINE__, src, kw, want)

static void expect(int line, const char *src, const char *kwargs, const char *want)
{
    char *got = render(src, kwargs);
    CHECK_MSG(got && !strcmp(got, want), "line %d: %s\n  want [%s]\n  got  [%s]%s%s", line, src, want,
              got ? got : "(error)", got ? "" : " ", got ? "" : tp_error());
    free(got);
}

/* Expects failure with `part` somewhere in the message. */
#define EXPECT_ERR(src, part) expect_err(__LINE__, src, part)
static void expect_err(int line, const char *src, const char *part)
{
    char *got = render(src, NULL);
    CHECK_MSG(!got && strstr(tp_error(), part), "line %d: %s\n  want error containing [%s]\n  got [%s] / [%s]",
              line, src, part, got ? got : "(error)", tp_error());
    free(got);
}

static void test_literals_and_operators(void)
{
    EXPECT("{{ 1 + 2 * 3 }}|{{ (1 + 2) * 3 }}|{{ 7 // 2 }}|{{ -7 // 2 }}|{{ 7 % 3 }}|{{ -7 % 3 }}", "7|9|3|-4|1|2");
    EXPECT("{{ 7 / 2 }}|{{ 4 / 2 }}|{{ 2 ** 10 }}|{{ 1.5 + 1 }}|{{ -3 }}|{{ 0.1 + 0.2 }}", "3.5|2.0|1024|2.5|-3|0.30000000000000004");
    EXPECT("{{ 'a' + \"b\" }}|{{ 'n=' ~ 3 ~ none }}|{{ 'ab' * 3 }}|{{ 'x' 'y' }}", "ab|n=3None|ababab|xy");
    EXPECT("{{ true }}|{{ False }}|{{ none }}|{{ [1, 'a', none] }}|{{ {'k': 'v', 'n': 1} }}",
           "True|False|None|[1, 'a', None]|{'k': 'v', 'n': 1}");
    EXPECT("{{ 'it\\'s' }}|{{ \"tab\\there\" }}|{{ '\\u00e9\\n' }}", "it's|tab\there|\xc3\xa9\n");
    EXPECT("{{ 1 < 2 < 3 }}|{{ 3 > 2 > 2 }}|{{ 1 == 1.0 }}|{{ 'a' != 'b' }}|{{ 'b' >= 'a' }}", "True|False|True|True|True");
    EXPECT("{{ 'ell' in 'hello' }}|{{ 2 in [1, 2] }}|{{ 'k' in {'k': 1} }}|{{ 'z' not in 'abc' }}", "True|True|True|True");
    EXPECT("{{ 0 or 'x' }}|{{ 'a' and 'b' }}|{{ not 0 }}|{{ not 1 == 2 }}", "x|b|True|True");
    EXPECT("{{ 'y' if 1 else 'n' }}|{{ 'y' if 0 else 'n' }}|[{{ 'y' if 0 }}]", "y|n|[]");
}

static void test_variables_and_access(void)
{
    EXPECT("{{ messages[0]['role'] }} {{ messages[0].content }} {{ messages[-1].role }} {{ messages|length }}",
           "system Be brief. assistant 3");
    EXPECT("{{ bos_token }}{{ eos_token }}{{ add_generation_prompt }}{{ date_string }}", "<s></s>True26 Jul 2024");
    EXPECT("[{{ nothing }}][{{ messages[0].missing }}][{{ messages[9] }}]", "[][][]");
    EXPECT("{{ 'yes' if nothing is defined else 'no' }}{{ 'u' if nothing is undefined }}", "nou");
    EXPECT_KW("{{ enable_thinking }}|{{ tools[0].name }}|{{ date_string }}",
              "{\"enable_thinking\": false, \"tools\": [{\"name\": \"f\"}], \"date_string\": \"1 Jan 2025\"}",
              "False|f|1 Jan 2025");
    EXPECT("{{ [1, 2, 3, 4][1:3] }}|{{ [1, 2, 3][::-1] }}|{{ [1, 2, 3][-2:] }}|{{ 'h\xc3\xa9llo'[1:3] }}|{{ 'abc'[::-1] }}",
           "[2, 3]|[3, 2, 1]|[2, 3]|\xc3\xa9l|cba");
    EXPECT("{% for m in messages[::-1] %}{{ m.role[0] }}{% endfor %}", "aus");
    EXPECT("{{ messages.0.role }}|{{ 'abc'[1] }}|{{ 'abc'[-1] }}", "system|b|c");
}

static void test_filters(void)
{
    EXPECT("[{{ messages[1].content | trim }}]|{{ '  x ' | trim | length }}", "[Hi \xc3\xa9t\xc3\xa9 \xf0\x9f\x8e\x89]|1");
    EXPECT("{{ messages[1].content | length }}|{{ [1, 2] | length }}|{{ {'a': 1} | count }}", "11|2|1");
    EXPECT("{{ 'Hello World' | upper }}|{{ 'ÉCOLE' | lower }}|{{ 'hello world' | title }}|{{ 'hELLO' | capitalize }}",
           "HELLO WORLD|école|Hello World|Hello");
    EXPECT("{{ {'a': [1, 2.5, none, true], 'b': 'x\"\xc3\xa9\\n'} | tojson }}",
           "{\"a\": [1, 2.5, null, true], \"b\": \"x\\\"\xc3\xa9\\n\"}");
    EXPECT("{{ {'b': 1, 'a': [1, {}]} | tojson(indent=2) }}", "{\n  \"b\": 1,\n  \"a\": [\n    1,\n    {}\n  ]\n}");
    EXPECT("{{ ['a', 'b'] | join(', ') }}|{{ messages | map(attribute='role') | join }}|{{ [1, 2] | first }}{{ [1, 2] | last }}",
           "a, b|systemuserassistant|12");
    EXPECT("{{ nothing | default('d') }}|{{ '' | default('d', true) }}|{{ 'v' | d('x') }}", "d|d|v");
    EXPECT("{{ messages | selectattr('role', 'equalto', 'user') | map(attribute='content') | map('trim') | list }}",
           "['Hi \xc3\xa9t\xc3\xa9 \xf0\x9f\x8e\x89']");
    EXPECT("{{ messages | rejectattr('role', 'in', ['user', 'system']) | length }}", "1");
    EXPECT("{% for k, v in {'a': 1, 'b': 2} | items %}{{ k }}={{ v }};{% endfor %}", "a=1;b=2;");
    EXPECT("{{ 'a-b-c' | replace('-', '+') }}|{{ '42' | int + 1 }}|{{ 3 | string + 'x' }}|{{ [3, 1] | reverse | list }}",
           "a+b+c|43|3x|[1, 3]");
    EXPECT("{{ 'a\\nb' | indent(2) }}|{{ 'a\\nb' | indent(2, true) }}", "a\n  b|  a\n  b");
    EXPECT_ERR("{{ 'x' | frobnicate }}", "unknown filter 'frobnicate'");
}

static void test_tests_and_methods(void)
{
    EXPECT("{{ 'a' is string }}{{ 1 is string }}{{ 1 is number }}{{ none is none }}{{ 1 is not none }}",
           "TrueFalseTrueTrueTrue");
    EXPECT("{{ false is false }}{{ 0 is false }}{{ true is true }}{{ 4 is divisibleby 2 }}{{ 3 is odd }}{{ {} is mapping }}",
           "TrueFalseTrueTrueTrueTrue");
    EXPECT("{{ 'hello'.startswith('he') }}{{ 'hello'.endswith(('x', 'lo')) }}{{ 'hello'.startswith('lo') }}",
           "TrueTrueFalse");
    EXPECT("{{ 'a,b,,c'.split(',') }}|{{ ' a  b '.split() }}|{{ 'a,b,c'.split(',', 1) }}|{{ 'x</think>y'.split('</think>')[-1] }}",
           "['a', 'b', '', 'c']|['a', 'b']|['a', 'b,c']|y");
    EXPECT("[{{ '\\n\\nx\\n'.strip('\\n') }}][{{ '  x  '.lstrip() }}][{{ '  x  '.rstrip() }}][{{ 'xxaxx'.strip('x') }}]",
           "[x][x  ][  x][a]");
    EXPECT("{{ 'Hi'.upper() }}{{ 'Hi'.lower() }}{{ 'a_b'.replace('_', ' ') }}{{ 'abcb'.find('b') }}{{ 'abcb'.count('b') }}",
           "HIhia b12");
    EXPECT("{{ {'a': 1}.get('a') }}{{ {'a': 1}.get('b', 'd') }}{{ {'a': 1}.get('b') }}{% for k, v in {'x': 1}.items() %}{{ k }}{{ v }}{% endfor %}",
           "1dNonex1");
    EXPECT_ERR("{{ 1 is frob }}", "unknown test 'frob'");
}

static void test_whitespace_control(void)
{
    /* trim_blocks: the newline after a block tag goes; lstrip_blocks: the
     * indentation before it goes; expressions keep both. */
    EXPECT("{% if true %}\n  a\n{% endif %}\nb", "  a\nb");
    EXPECT("x\n    {% if true %}y{% endif %}\n", "x\ny");
    EXPECT("  {{ 'e' }}\n{{ 'f' }}\n", "  e\nf");
    EXPECT("a   {%- if true -%}   b   {%- endif %}  c", "ab  c");
    EXPECT("a \n {{- 'b' -}} \n c", "abc");
    EXPECT("a\n  {%+ if true %}b{% endif %}", "a\n  b");
    EXPECT("a {# comment #}b\n{# line\ncomment #}\nc", "a b\nc");
    EXPECT("a  {#- trimmed -#}  b", "ab");
    EXPECT("{% for i in [1, 2] %}\n    {{- i }}\n{% endfor %}", "1\n2\n");
    EXPECT("trailing\n", "trailing");
}

static void test_loops_and_scope(void)
{
    EXPECT("{% for m in messages %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}"
           "{{ loop.first }}{{ loop.last }}{{ loop.length }};{% endfor %}",
           "1032TrueFalse3;2121FalseFalse3;3210FalseTrue3;");
    EXPECT("{% for x in [] %}a{% else %}empty{% endfor %}|{% for x in nothing %}a{% else %}none{% endfor %}", "empty|none");
    EXPECT("{% for x in [1, 2, 3, 4] if x is even %}{{ x }}{{ loop.length }}{% endfor %}", "2242");
    EXPECT("{% for x in [1, 2, 3, 4] %}{% if x == 2 %}{% continue %}{% endif %}{% if x == 4 %}{% break %}{% endif %}{{ x }}{% endfor %}",
           "13");
    EXPECT("{% for x in [1, 2] %}{{ loop.previtem | default('-') }}{{ loop.nextitem | default('-') }}{% endfor %}", "-21-");
    EXPECT("{% for c in 'h\xc3\xa9' %}[{{ c }}]{% endfor %}{% for k in {'a': 1, 'b': 2} %}{{ k }}{% endfor %}", "[h][\xc3\xa9]ab");
    EXPECT("{% for a, b in [[1, 2], [3, 4]] %}{{ a + b }}{% endfor %}", "37");
    /* set inside a loop does not leak; namespace attributes do. */
    EXPECT("{% set x = 1 %}{% for i in [1, 2] %}{% set x = i %}{% endfor %}{{ x }}", "1");
    EXPECT("{% set ns = namespace(n=0, last='') %}{% for m in messages %}{% set ns.n = ns.n + 1 %}"
           "{% set ns.last = m.role %}{% endfor %}{{ ns.n }} {{ ns.last }}", "3 assistant");
    EXPECT("{% set a, b = 1, 2 %}{{ a }}{{ b }}{% set c %}block {{ a }}{% endset %}[{{ c }}]", "12[block 1]");
    EXPECT("{% for i in range(3) %}{{ i }}{% endfor %}{{ range(1, 7, 2) | list }}", "012[1, 3, 5]");
    EXPECT("{% for m in messages %}{% for c in [1] %}{{ loop.index }}{% endfor %}{{ loop.index }}{% endfor %}", "111213");
}

static void test_if_and_macros(void)
{
    EXPECT("{% if 0 %}a{% elif nothing %}b{% elif 'x' %}c{% else %}d{% endif %}", "c");
    EXPECT("{% if messages[0].role == 'system' and not (messages | length < 2) %}sys{% endif %}", "sys");
    EXPECT("{% macro greet(name, punct='!') %}Hi {{ name }}{{ punct }}{% endmacro %}"
           "{{ greet('A') }} {{ greet('B', '?') }} {{ greet(punct='.', name='C') }}", "Hi A! Hi B? Hi C.");
    EXPECT("{%- macro r(n) -%}{% if n > 0 %}{{ n }}{{ r(n - 1) }}{% endif %}{%- endmacro -%}{{ r(3) }}", "321");
    EXPECT_KW("{%- if enable_thinking is defined and enable_thinking is false %}off{% endif %}",
              "{\"enable_thinking\": false}", "off");
    EXPECT("{%- if enable_thinking is defined and enable_thinking is false %}off{% endif %}", "");
    EXPECT("{% generation %}kept{% endgeneration %}", "kept");
}

static void test_errors(void)
{
    EXPECT_ERR("{{ raise_exception('Conversation roles must alternate') }}", "Conversation roles must alternate");
    EXPECT_ERR("line1\n{% if x %}\n  {{ 1 + }}\n{% endif %}", "line 3, column 10");
    EXPECT_ERR("{% if x %}never closed", "missing '{% endif %}'");
    EXPECT_ERR("{% for x in y %}a{% endif %}", "line 1");
    EXPECT_ERR("{{ 'unterminated }}", "unterminated string");
    EXPECT_ERR("{% frobnicate %}", "unknown or unsupported statement 'frobnicate'");
    EXPECT_ERR("{{ nothing.attr }}", "'nothing' is undefined");
    EXPECT_ERR("{{ nothing + 1 }}", "'nothing' is undefined");
    EXPECT_ERR("{{ 1 + 'a' }}", "unsupported operand");
    EXPECT_ERR("{{ 1 // 0 }}", "division by zero");
    EXPECT_ERR("{% set x.y = 1 %}", "namespace");
    EXPECT_ERR("{{ x ! }}", "unexpected character");

    tp_chat_template *t;
    CHECK(tp_chat_template_from_string(&t, "{{ messages }}", NULL, NULL) == TP_OK);
    char *out = NULL;
    CHECK(tp_chat_template_render(t, "{\"not\": \"a list\"}", 0, NULL, &out) == TP_ERR_INVALID);
    CHECK(tp_chat_template_render(t, "[oops", 0, NULL, &out) == TP_ERR_INVALID);
    CHECK(tp_chat_template_render(t, "[]", 0, "[1]", &out) == TP_ERR_INVALID);
    CHECK(tp_chat_template_render(t, "[]", 0, NULL, &out) == TP_OK && out && !strcmp(out, "[]"));
    free(out);
    tp_chat_template_free(t);
    CHECK(tp_chat_template_load(&t, "/nonexistent/tokenizer_config.json") == TP_ERR_IO);
}

/* Templates the fuzzer (tests/fuzz/fuzz_chat_template) found too slow:
 * repeating an empty sequence spun once per repetition, and 'x' * 32 ** 5
 * built a 33 MB string a byte at a time. */
static void test_fuzz_regressions(void)
{
    EXPECT("[{{ '' * 1000000000000000000 }}]{{ [] * 1000000000000000000 }}{{ ('' * 5) | length }}", "[][]0");
    EXPECT_ERR("{{ 'x' * 32 ** 5 }}", "string repetition too large");
    EXPECT("{{ ('=' * 80) | length }}|{{ ('ab' * (2 * 1024 * 1024)) | length }}", "80|4194304");
    /* A long number with an exponent overflowed the lexer's buffer by one. */
    EXPECT("{{ 1" "000000000000000000000000000000000000000000000000000000000000" "e5 > 1e64 }}", "True");
    char *r = render("{{ 1" "0000000000000000000000000000000000000000000000000000000000000" "e5 }}", NULL);
    free(r);   /* lexes as a number and a name; ASan checks the buffer */
    /* Nested loops over long strings ran for minutes: a render has a budget
     * of loop iterations, far above what chat templates use. */
    EXPECT_ERR("{% set s = 'x' * 1000 %}{% for a in s %}{% for b in s %}{% for c in s %}{% endfor %}{% endfor %}{% endfor %}",
               "template loops ran more than 200000 iterations");
    EXPECT("{% set ns = namespace(n=0) %}{% for a in range(300) %}{% for b in range(300) %}{% set ns.n = ns.n + 1 %}"
           "{% endfor %}{% endfor %}{{ ns.n }}", "90000");
}

int main(void)
{
    test_literals_and_operators();
    test_variables_and_access();
    test_filters();
    test_tests_and_methods();
    test_whitespace_control();
    test_loops_and_scope();
    test_if_and_macros();
    test_errors();
    test_fuzz_regressions();
    return check_summary();
}
