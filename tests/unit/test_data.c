/* The training data loader (src/train/data*.c): each format, truncation,
 * padding and -100, packing with eos, the chat assistant-only mask, the
 * batch order (shuffle, replicas), and every refusal with its line. */
#include "tensorpar/train.h"

#include "check.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char dir[64];

/* tests/data/tokenizers/NAME, found from this file's own path. */
static void tokenizer_dir(char *out, size_t cap, const char *name)
{
    const char *slash = strrchr(__FILE__, '/');
    int len = slash ? (int)(slash - __FILE__) : 1;
    snprintf(out, cap, "%.*s/../data/tokenizers/%s", len, slash ? __FILE__ : ".", name);
}

static const char *write_file(const char *name, const char *text)
{
    static char path[4][128];
    static int next;
    char *p = path[next++ % 4];
    snprintf(p, 128, "%s/%s", dir, name);
    FILE *f = fopen(p, "wb");
    if (f) { fputs(text, f); fclose(f); }
    return p;
}

static tp_data_options small_opts(int64_t seq_len)
{
    tp_data_options o = { .seq_len = seq_len, .vocab = 10, .n_eos = 1, .eos_ids = { 9 }, .pad_id = 8 };
    return o;
}

static int row_is(const tp_dataset *d, int64_t r, const int64_t *ids, const int64_t *labels)
{
    return !memcmp(d->ids + r * d->seq_len, ids, (size_t)d->seq_len * sizeof *ids) &&
           !memcmp(d->labels + r * d->seq_len, labels, (size_t)d->seq_len * sizeof *labels);
}

static void test_input_ids(void)
{
    tp_data_options o = small_opts(4);
    tp_dataset d;
    const char *p = write_file("ids.jsonl", "{\"input_ids\": [1, 2, 3, 4, 5]}\n\n{\"input_ids\": [5, 6]}\n"
                                             "{\"input_ids\": [7, 0, 1, 2], \"extra\": 1}");
    CHECK_MSG(tp_dataset_load(&d, p, &o) == TP_OK, "%s", tp_error());
    CHECK(d.n_rows == 3 && d.seq_len == 4);
    if (d.n_rows == 3) {
        CHECK(row_is(&d, 0, (int64_t[]){ 1, 2, 3, 4 }, (int64_t[]){ 1, 2, 3, 4 }));
        CHECK(row_is(&d, 1, (int64_t[]){ 5, 6, 8, 8 }, (int64_t[]){ 5, 6, -100, -100 }));
        CHECK(row_is(&d, 2, (int64_t[]){ 7, 0, 1, 2 }, (int64_t[]){ 7, 0, 1, 2 }));
        /* HF counts labels[1:] != -100 */
        CHECK(tp_data_row_label_count(d.labels + 4, 4) == 1);
        CHECK(tp_data_row_label_count(d.labels, 4) == 3);
        /* real tokens: cut at seq_len, the padding not counted */
        CHECK(d.lengths && d.lengths[0] == 4 && d.lengths[1] == 2 && d.lengths[2] == 4);
    }
    tp_dataset_release(&d);
    o.pad_id = -1;   /* no pad token: eos pads */
    CHECK(tp_dataset_load(&d, p, &o) == TP_OK && d.n_rows == 3 && d.ids[6] == 9 && d.labels[6] == -100);
    tp_dataset_release(&d);
}

/* Loading `text` (in file `name`) fails with a message containing `want`. */
static void refused(const char *name, const char *text, const tp_data_options *o, const char *want)
{
    tp_dataset d;
    const char *p = text ? write_file(name, text) : name;
    tp_status s = tp_dataset_load(&d, p, o);
    CHECK_MSG(s != TP_OK && strstr(tp_error(), want), "%s: wanted \"%s\", got \"%s\"", name, want, tp_error());
    char prefix[160];
    snprintf(prefix, sizeof prefix, "%s", p);
    CHECK_MSG(s != TP_OK && !strncmp(tp_error(), prefix, strlen(prefix)), "message names no file: %s", tp_error());
    if (!s) tp_dataset_release(&d);
}

static void test_refusals(void)
{
    tp_data_options o = small_opts(4);
    char missing[128];
    snprintf(missing, sizeof missing, "%s/missing.jsonl", dir);
    refused(missing, NULL, &o, "No such file");
    refused("empty.jsonl", "", &o, "empty.jsonl: empty file");
    refused("blank.jsonl", "\n  \n", &o, "blank.jsonl: empty file");
    refused("bad1.jsonl", "{\"input_ids\": [1]}\n{\"input_ids\": [1,\n", &o, "bad1.jsonl:2: not JSON");
    refused("bad2.jsonl", "{\"input_ids\": [1]} x\n", &o, "bad2.jsonl:1: not JSON");
    refused("bad3.jsonl", "{\"input_ids\": [1]}\n\n[1, 2]\n", &o, "bad3.jsonl:3: not a JSON object");
    refused("bad4.jsonl", "{\"ids\": [1]}\n", &o, "bad4.jsonl:1: none of the keys");
    refused("bad5.jsonl", "{\"input_ids\": [1]}\n{\"input_ids\": [1, 2.5]}\n", &o,
            "bad5.jsonl:2: input_ids[1] = 2.5 is not an integer");
    refused("bad6.jsonl", "{\"input_ids\": [\"3\"]}\n", &o, "bad6.jsonl:1: input_ids[0] = \"3\" is not an integer");
    refused("bad7.jsonl", "{\"input_ids\": [1]}\n{\"input_ids\": [1]}\n{\"input_ids\": [0, 10]}\n", &o,
            "bad7.jsonl:3: input_ids token 1 = 10 is outside the vocabulary [0, 10)");
    refused("bad8.jsonl", "{\"input_ids\": [-1]}\n", &o, "bad8.jsonl:1: input_ids token 0 = -1 is outside");
    refused("bad9.jsonl", "{\"input_ids\": []}\n", &o, "bad9.jsonl:1: input_ids is empty");
    refused("bad10.jsonl", "{\"input_ids\": [1]}\n{\"text\": \"a\"}\n", &o, "bad10.jsonl:2: \"text\" in a file of \"input_ids\" lines");
    refused("bad11.jsonl", "{\"text\": \"a\"}\n", &o, "bad11.jsonl:1: \"text\" needs the model's tokenizer");
    refused("bad12.jsonl", "{\"messages\": []}\n", &o, "bad12.jsonl:1: messages is not a non-empty array");
    refused("bad.csv", "1,2\n", &o, "bad.csv: unknown data format");
}

static void test_text_packing(const tp_tokenizer *tok)
{
    /* Qwen3's eos (<|im_end|>) separates the documents. */
    tp_data_options o = { .seq_len = 3, .vocab = 151669, .n_eos = 1, .eos_ids = { 151645 }, .pad_id = -1, .tok = tok };
    tp_dataset d;
    const char *p = write_file("text.jsonl", "{\"text\": \"Hello world\"}\n{\"text\": \"Hello\"}\n{\"text\": \" world\"}\n");
    CHECK_MSG(tp_dataset_load(&d, p, &o) == TP_OK, "%s", tp_error());
    /* Hello=9707, " world"=1879: 9707 1879 E | 9707 E 1879 | E (dropped) */
    int64_t want[6] = { 9707, 1879, 151645, 9707, 151645, 1879 };
    CHECK(d.n_rows == 2);
    if (d.n_rows == 2) {
        CHECK(!memcmp(d.ids, want, sizeof want));
        CHECK(!memcmp(d.labels, want, sizeof want));   /* every packed token counts */
        CHECK(d.lengths && d.lengths[0] == 3 && d.lengths[1] == 3);   /* packed rows are full */
    }
    tp_dataset_release(&d);

    /* .txt: the whole file one document. */
    p = write_file("plain.txt", "Hello world\nHello");
    CHECK_MSG(tp_dataset_load(&d, p, &o) == TP_OK && d.n_rows == 1, "%s", tp_error());
    /* Hello world \n(198) | Hello E (dropped) */
    CHECK(d.n_rows == 1 && d.ids[0] == 9707 && d.ids[1] == 1879 && d.ids[2] == 198 && d.labels[2] == 198);
    tp_dataset_release(&d);

    /* Not enough tokens for one row: how many there are and are needed. */
    o.seq_len = 8;
    refused("short.jsonl", "{\"text\": \"Hello world\"}\n{\"text\": \"Hello\"}\n", &o,
            "short.jsonl: 5 tokens after tokenization (eos separators included), fewer than one sequence of seq_len = 8");
    refused("short.txt", "Hello", &o, "short.txt: 2 tokens after tokenization");
    /* The tokenizer's ids must fit the model's vocabulary too. */
    o.vocab = 5000;
    o.eos_ids[0] = 0;
    refused("bigid.jsonl", "{\"text\": \"Hello\"}\n", &o, "bigid.jsonl:1: tokenized token 0 = 9707 is outside");
}

/* The counted tokens of row 0, decoded span by span, joined with '|'. */
static void counted_text(const tp_dataset *d, const tp_tokenizer *tok, char *out, size_t cap)
{
    size_t used = 0;
    out[0] = '\0';
    for (int64_t t = 0; t < d->seq_len;) {
        if (d->labels[t] == -100) { t++; continue; }
        int64_t a = t;
        while (t < d->seq_len && d->labels[t] != -100) t++;
        int32_t ids[512];
        for (int64_t i = a; i < t && i - a < 512; i++) ids[i - a] = (int32_t)d->labels[i];
        char *txt = NULL;
        if (tp_tokenizer_decode(tok, ids, (size_t)(t - a), 0, &txt, NULL) == TP_OK) {
            used += (size_t)snprintf(out + used, cap - used, "%s%s", used ? "|" : "", txt);
            if (used >= cap) used = cap - 1;
        }
        free(txt);
    }
}

static const char *const conv =
    "{\"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"}, {\"role\": \"user\", \"content\": \"Hi\"}, "
    "{\"role\": \"assistant\", \"content\": \"Hello there.\"}, {\"role\": \"user\", \"content\": \"2+2?\"}, "
    "{\"role\": \"assistant\", \"content\": \"4\"}]}\n";

static void test_chat_qwen3(const tp_tokenizer *tok, const char *tdir)
{
    tp_chat_template *tpl = NULL;
    CHECK_MSG(tp_chat_template_load(&tpl, tdir) == TP_OK, "%s", tp_error());
    int64_t eos = 0, pad = 0;
    CHECK(tp_data_special_ids(tdir, tok, &eos, &pad) == TP_OK && eos == 151645 && pad == 151643);
    tp_data_options o = { .seq_len = 64, .vocab = 151669, .n_eos = 2, .eos_ids = { eos, 151643 }, .pad_id = pad,
                          .tok = tok, .chat = tpl };
    tp_dataset d;
    const char *p = write_file("chat.jsonl", conv);
    CHECK_MSG(tp_dataset_load(&d, p, &o) == TP_OK, "%s", tp_error());
    if (d.n_rows == 1) {
        /* The earlier turn renders without a think block, the last with an
         * empty one (Qwen3's template); the "\n" after <|im_end|> is not
         * generated, so not counted. */
        char got[1024];
        counted_text(&d, tok, got, sizeof got);
        CHECK_MSG(!strcmp(got, "Hello there.<|im_end|>|<think>\n\n</think>\n\n4<|im_end|>"), "counted: [%s]", got);
        /* All tokens decode to the rendered conversation, then padding. */
        int64_t n = 0;
        while (n < 64 && d.ids[n] != pad) n++;
        int32_t ids[64];
        for (int64_t i = 0; i < n; i++) ids[i] = (int32_t)d.ids[i];
        char *txt = NULL, *want = NULL;
        tp_tokenizer_decode(tok, ids, (size_t)n, 0, &txt, NULL);
        const char *msgs = strchr(conv, '[');
        char *arr = strndup(msgs, strlen(msgs) - 2);
        tp_chat_template_render(tpl, arr, 0, NULL, &want);
        CHECK_MSG(txt && want && !strcmp(txt, want), "[%s] vs [%s]", txt, want);
        CHECK(n < 64 && d.labels[n] == -100 && d.labels[63] == -100);
        free(txt); free(want); free(arr);
    }
    CHECK(d.n_rows == 1);
    tp_dataset_release(&d);
    /* Truncation keeps the first seq_len tokens with their labels. */
    o.seq_len = 8;
    CHECK(tp_dataset_load(&d, p, &o) == TP_OK && d.n_rows == 1 && d.labels[7] == -100);
    tp_dataset_release(&d);
    o.seq_len = 64;
    refused("noasst.jsonl", "{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}]}\n", &o,
            "noasst.jsonl:1: no assistant message");
    refused("norole.jsonl", "{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}, 3]}\n", &o,
            "norole.jsonl:1: message 1 is not an object");
    o.chat = NULL;
    refused("notpl.jsonl", conv, &o, "notpl.jsonl:1: \"messages\" needs the model's chat template");
    tp_chat_template_free(tpl);
}

static void test_chat_llama3(const char *tdir)
{
    tp_tokenizer *tok = NULL;
    tp_chat_template *tpl = NULL;
    CHECK_MSG(tp_tokenizer_load(&tok, tdir) == TP_OK && tp_chat_template_load(&tpl, tdir) == TP_OK, "%s", tp_error());
    if (!tok || !tpl) { tp_tokenizer_free(tok); tp_chat_template_free(tpl); return; }
    /* Llama 3's template always appends the generation prompt, so no turn
     * renders as a prefix: the end-of-turn id (<|eot_id|>) ends each part. */
    int64_t eot = tp_tokenizer_token_to_id(tok, "<|eot_id|>");
    tp_data_options o = { .seq_len = 64, .vocab = 128256, .n_eos = 2, .eos_ids = { 128001, eot }, .pad_id = -1,
                          .tok = tok, .chat = tpl };
    tp_dataset d;
    const char *p = write_file("chat3.jsonl", conv);
    CHECK_MSG(tp_dataset_load(&d, p, &o) == TP_OK && d.n_rows == 1, "%s", tp_error());
    if (d.n_rows == 1) {
        char got[1024];
        counted_text(&d, tok, got, sizeof got);
        CHECK_MSG(!strcmp(got, "Hello there.<|eot_id|>|4<|eot_id|>"), "counted: [%s]", got);
        CHECK(d.ids[0] == 128000);   /* bos written by the template, once */
    }
    tp_dataset_release(&d);
    /* Without the end-of-turn id, where the first turn ends is unknown. */
    o.n_eos = 1;
    refused("chat3b.jsonl", conv, &o, "chat3b.jsonl:1: message 2 (assistant): no end-of-turn token");
    tp_chat_template_free(tpl);
    tp_tokenizer_free(tok);
}

/* 11 rows, row i = [i, 1]. */
static void make_rows(tp_dataset *d)
{
    char text[1024];
    size_t used = 0;
    for (int i = 0; i < 11; i++) used += (size_t)snprintf(text + used, sizeof text - used, "{\"input_ids\": [%d, 1]}\n", i);
    tp_data_options o = small_opts(2);
    o.vocab = 100;
    CHECK(tp_dataset_load(d, write_file("rows.jsonl", text), &o) == TP_OK && d->n_rows == 11);
}

static void test_order(const tp_dataset *d)
{
    tp_data_loader l;
    tp_data_step st;
    int64_t rows[8], n = 0, ids[16], labels[16];
    CHECK(tp_data_loader_init(&l, d, 2, 2, 0, 0, 0, 1) == TP_OK);
    CHECK(l.micro_per_epoch == 5 && l.steps_per_epoch == 3);
    /* file order: step 0 = rows 0-3, step 2 = one micro-batch (rows 8, 9; 10 dropped) */
    CHECK(tp_data_loader_step(&l, 0, &st) == TP_OK && st.n_micro == 2 && st.epoch == 0 && st.label_tokens == 4);
    CHECK(tp_data_loader_micro(&l, 0, 1, rows, &n, ids, labels) == TP_OK && n == 2 && rows[0] == 2 && rows[1] == 3);
    CHECK(ids[0] == 2 && ids[1] == 1 && ids[2] == 3 && labels[3] == 1);
    CHECK(tp_data_loader_step(&l, 2, &st) == TP_OK && st.n_micro == 1 && st.label_tokens == 2);
    CHECK(tp_data_loader_micro(&l, 2, 0, rows, &n, NULL, NULL) == TP_OK && rows[0] == 8 && rows[1] == 9);
    CHECK(tp_data_loader_micro(&l, 2, 1, rows, &n, NULL, NULL) != TP_OK && strstr(tp_error(), "micro-batch 1"));
    CHECK(tp_data_loader_step(&l, 3, &st) == TP_OK && st.epoch == 1);
    CHECK(tp_data_loader_micro(&l, 3, 0, rows, &n, NULL, NULL) == TP_OK && rows[0] == 0 && rows[1] == 1);
    tp_data_loader_release(&l);
    CHECK(tp_data_loader_init(&l, d, 2, 1, 0, 0, 0, 3) != TP_OK && strstr(tp_error(), "batch size 2 is smaller"));
    CHECK(tp_data_loader_init(&l, d, 12, 1, 0, 0, 0, 1) != TP_OK &&
          strstr(tp_error(), "holds 11 sequences of 2 tokens, fewer than one micro-batch of batch size 12"));
}

/* Rows of step `step` seen by replica r of R, appended to out. */
static int64_t step_rows(const tp_dataset *d, uint64_t seed, int R, int64_t step, int64_t *out)
{
    int64_t total = 0;
    for (int r = 0; r < R; r++) {
        tp_data_loader l;
        tp_data_step st;
        if (tp_data_loader_init(&l, d, 4, 2, 1, seed, r, R) || tp_data_loader_step(&l, step, &st)) return -1;
        (void)0;
        for (int m = 0; m < st.n_micro; m++) {
            int64_t rows[4], n = 0;
            if (tp_data_loader_micro(&l, step, m, rows, &n, NULL, NULL)) return -1;
            for (int64_t i = 0; i < n; i++) out[m * 4 + (r * 4 / R) + i] = rows[i];
            total += n;
        }
        tp_data_loader_release(&l);
    }
    return total;
}

static void test_shuffle(const tp_dataset *d)
{
    /* batch 4, accum 2: 2 micro-batches per epoch, one step per epoch. */
    int64_t a[8], b[8], c[8], e1[8];
    CHECK(step_rows(d, 7, 1, 0, a) == 8 && step_rows(d, 7, 1, 0, b) == 8);
    CHECK(!memcmp(a, b, sizeof a));                   /* same seed, same order */
    CHECK(step_rows(d, 8, 1, 0, c) == 8 && memcmp(a, c, sizeof a));   /* another seed, another */
    CHECK(step_rows(d, 7, 1, 1, e1) == 8 && memcmp(a, e1, sizeof a)); /* epochs differ */
    int seen[11] = { 0 }, distinct = 1, sorted = 1;
    for (int i = 0; i < 8; i++) {
        if (a[i] < 0 || a[i] > 10 || seen[a[i]]++) distinct = 0;
        sorted = sorted && a[i] == i;
    }
    CHECK(distinct);
    CHECK(!sorted);
    for (int R = 2; R <= 4; R++) {                    /* the union over replicas = the one-replica batch */
        int64_t r[8];
        memset(r, -1, sizeof r);
        CHECK_MSG(step_rows(d, 7, R, 0, r) == 8 && !memcmp(a, r, sizeof a), "R = %d", R);
    }
    /* the step's label count does not depend on the replica either */
    tp_data_loader l1, l3;
    tp_data_step s1, s3;
    CHECK(tp_data_loader_init(&l1, d, 4, 2, 1, 7, 0, 1) == TP_OK && tp_data_loader_init(&l3, d, 4, 2, 1, 7, 2, 3) == TP_OK);
    CHECK(tp_data_loader_step(&l1, 0, &s1) == TP_OK && tp_data_loader_step(&l3, 0, &s3) == TP_OK);
    CHECK(s1.label_tokens == 8 && s3.label_tokens == 8 && s1.n_micro == 2);
    tp_data_loader_release(&l1);
    tp_data_loader_release(&l3);
}

int main(void)
{
    snprintf(dir, sizeof dir, "/tmp/tp-data-XXXXXX");
    if (!mkdtemp(dir)) return 1;
    test_input_ids();
    test_refusals();
    char qdir[512], ldir[512];
    tokenizer_dir(qdir, sizeof qdir, "qwen3");
    tokenizer_dir(ldir, sizeof ldir, "llama3");
    tp_tokenizer *tok = NULL;
    CHECK_MSG(tp_tokenizer_load(&tok, qdir) == TP_OK, "%s", tp_error());
    if (tok) {
        test_text_packing(tok);
        test_chat_qwen3(tok, qdir);
        tp_tokenizer_free(tok);
    }
    test_chat_llama3(ldir);
    tp_dataset d;
    make_rows(&d);
    if (d.n_rows == 11) {
        test_order(&d);
        test_shuffle(&d);
    }
    tp_dataset_release(&d);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
    return check_summary();
}
