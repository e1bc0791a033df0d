/* The training log (src/train/train_log.c): the JSON lines read back after
 * each step (flushed, before the log is closed), the progress line's text,
 * the chart drawn by gnuplot (a PNG, nothing left beside it), the warning
 * without gnuplot, and a non-writer rank writing nothing. */
#include "check.h"
#include "tmpdir.h"
#include "tensorpar/train.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char *slurp(const char *path, long *size)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = malloc((size_t)n + 1);
    if (s && fread(s, 1, (size_t)n, f) != (size_t)n) n = 0;
    if (s) s[n] = '\0';
    fclose(f);
    if (size) *size = n;
    return s;
}

static int exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0;
}

static int entries(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d) return -1;
    int n = 0;
    for (struct dirent *e; (e = readdir(d));) n += strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
    closedir(d);
    return n;
}

static double num(const cJSON *o, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsNumber(v) ? v->valuedouble : NAN;
}

/* Reads the log back: each line one object with the step's fields. */
static void check_lines(const char *path, int expect_lines)
{
    char *text = slurp(path, NULL);
    CHECK(text != NULL);
    if (!text) return;
    int line = 0;
    for (char *s = strtok(text, "\n"); s; s = strtok(NULL, "\n"), line++) {
        cJSON *o = cJSON_Parse(s);
        CHECK_MSG(o != NULL, "line %d not JSON: %s", line + 1, s);
        if (!o) continue;
        int step = line + 1;
        CHECK(num(o, "step") == step);
        CHECK(fabs(num(o, "loss") - (3.0 - 0.25 * step)) < 1e-9);
        CHECK(fabs(num(o, "lr") - 1e-4 * step) < 1e-15);
        CHECK(fabs(num(o, "tokens_per_s") - 512.5) < 1e-9);
        if (step == 2) CHECK(cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(o, "grad_norm")));
        else CHECK(fabs(num(o, "grad_norm") - 0.5 * step) < 1e-9);
        const cJSON *ev = cJSON_GetObjectItemCaseSensitive(o, "eval_loss");
        if (step % 2) CHECK(ev == NULL);
        else CHECK(cJSON_IsNumber(ev) && fabs(ev->valuedouble - (3.5 - 0.25 * step)) < 1e-9);
        cJSON_Delete(o);
    }
    CHECK_MSG(line == expect_lines, "%d lines, expected %d", line, expect_lines);
    free(text);
}

static int png_ok(const char *path)
{
    long n = 0;
    char *s = slurp(path, &n);
    int ok = s && n > 100 && !memcmp(s, "\x89PNG\r\n\x1a\n", 8);
    free(s);
    return ok;
}

static int have_gnuplot(void)
{
    return access("/usr/bin/gnuplot", X_OK) == 0 || access("/usr/local/bin/gnuplot", X_OK) == 0;
}

static tp_train_log_entry entry(int step)
{
    tp_train_log_entry e = {step, 3.0 - 0.25 * step, 1e-4 * step, step == 2 ? NAN : 0.5 * step, 512.5,
                            step % 2 == 0, 3.5 - 0.25 * step};
    return e;
}

static void test_log_and_chart(const char *root)
{
    char out[512], log[600], png[600], other[600];
    snprintf(out, sizeof out, "%s/run/a", root);   /* two folders to create */
    snprintf(log, sizeof log, "%s/train_log.jsonl", out);
    snprintf(png, sizeof png, "%s/loss.png", out);
    tp_train_log *l;
    CHECK(tp_train_log_open(out, 6, 1, &l) == TP_OK);
    if (!l) return;
    for (int s = 1; s <= 6; s++) {
        tp_train_log_entry e = entry(s);
        CHECK(tp_train_log_step(l, &e) == TP_OK);
        if (s == 3) check_lines(log, 3);   /* flushed at every step */
    }
    tp_train_log_entry again = entry(6);
    CHECK(tp_train_log_step(l, &again) == TP_ERR_INVALID && strstr(tp_error(), "step 6 after step 6"));
    int drawn = -1;
    CHECK(tp_train_log_chart(l, NULL, &drawn) == TP_OK);
    if (have_gnuplot()) {
        CHECK(drawn == 1);
        CHECK(png_ok(png));
        CHECK_MSG(entries(out) == 2, "%d files in %s: temporaries left", entries(out), out);
        /* Another path, and again over an existing file. */
        snprintf(other, sizeof other, "%s/chart.png", root);
        CHECK(tp_train_log_chart(l, other, &drawn) == TP_OK && drawn == 1 && png_ok(other));
        CHECK(tp_train_log_chart(l, other, &drawn) == TP_OK && drawn == 1 && png_ok(other));
    } else {
        fprintf(stderr, "gnuplot not installed: the chart is not checked\n");
    }
    /* Without gnuplot: a warning, no failure, nothing written. */
    char *path = getenv("PATH") ? strdup(getenv("PATH")) : NULL;
    setenv("PATH", "/nonexistent", 1);
    snprintf(other, sizeof other, "%s/none.png", root);
    CHECK(tp_train_log_chart(l, other, &drawn) == TP_OK && drawn == 0 && !exists(other));
    if (path) setenv("PATH", path, 1), free(path);
    tp_train_log_close(l);
    check_lines(log, 6);
}

static void test_not_writer(const char *root)
{
    char out[512];
    snprintf(out, sizeof out, "%s/rank1", root);
    tp_train_log *l;
    CHECK(tp_train_log_open(out, 0, 0, &l) == TP_OK);
    tp_train_log_entry e = entry(1);
    int drawn = -1;
    CHECK(tp_train_log_step(l, &e) == TP_OK);
    CHECK(tp_train_log_chart(l, NULL, &drawn) == TP_OK && drawn == 0);
    tp_train_log_close(l);
    CHECK(!exists(out));
}

static void test_open_fails(const char *root)
{
    char out[512];
    snprintf(out, sizeof out, "%s/file", root);
    FILE *f = fopen(out, "w");
    if (f) fclose(f);
    snprintf(out, sizeof out, "%s/file/sub", root);   /* under a file */
    tp_train_log *l = (tp_train_log *)1;
    CHECK(tp_train_log_open(out, 0, 1, &l) == TP_ERR_IO && l == NULL && strstr(tp_error(), "file/sub"));
}

static void test_progress_text(void)
{
    char buf[256];
    tp_train_log_entry e = {3, 2.5, 1e-4, 1.25, 812.4, 0, 0};
    tp_train_progress_format(buf, sizeof buf, &e, 10, 65.2);
    CHECK_MSG(!strcmp(buf, "step 3/10  loss 2.5000  lr 1.00e-04  grad-norm 1.250  tok/s 812  ETA 0:01:05"), "%s", buf);
    e.has_eval = 1, e.eval_loss = 2.75;
    tp_train_progress_format(buf, sizeof buf, &e, 0, -1);
    CHECK_MSG(!strcmp(buf, "step 3  loss 2.5000  lr 1.00e-04  grad-norm 1.250  tok/s 812  ETA ?  eval 2.7500"), "%s",
              buf);
    tp_train_progress_format(buf, 12, &e, 10, 3725);   /* truncated, terminated */
    CHECK(strlen(buf) == 11);
}

int main(void)
{
    char root[] = "/tmp/tp-train-log-XXXXXX";
    if (!mkdtemp(root)) return 1;
    test_log_and_chart(root);
    test_not_writer(root);
    test_open_fails(root);
    test_progress_text();
    remove_tree(root);
    return check_summary();
}
