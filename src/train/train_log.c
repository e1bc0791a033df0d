/* The training log: train_log.jsonl (one JSON object per optimizer step,
 * flushed as soon as it is written, so the file is the record of every
 * finished step even when the run dies), the terminal progress line, and
 * the loss chart drawn at the end with gnuplot from the losses kept here.
 *
 * The chart is the only part that runs a program; gnuplot is a dependency
 * (gnuplot-nox) but a run must not fail for want of a picture, so a missing
 * gnuplot is a warning.  The gnuplot script is src/train/loss_chart.gp,
 * embedded at build time (CMakeLists.txt, tp_embed_text). */
#include "tensorpar/train.h"

#include "loss_chart_gp.h"   /* generated from src/train/loss_chart.gp */
#include "tensorpar/io.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define LOG_NAME "train_log.jsonl"
#define CHART_NAME "loss.png"

typedef struct {
    int64_t n, cap;
    int64_t *step;
    double *value;
} series;

struct tp_train_log {
    int writer, tty;
    char *dir;
    FILE *f;
    int64_t total, last_step, first_step;
    double t_first;              /* when the first step was logged */
    series loss, eval;
    int line_drawn;
};

static tp_status series_add(series *s, int64_t step, double v)
{
    if (s->n == s->cap) {
        int64_t cap = s->cap ? 2 * s->cap : 64;
        int64_t *st = realloc(s->step, (size_t)cap * sizeof *st);
        if (st) s->step = st;
        double *va = st ? realloc(s->value, (size_t)cap * sizeof *va) : NULL;
        if (!va) return tp_fail(TP_ERR_NOMEM, "training log: out of memory");
        s->value = va, s->cap = cap;
    }
    s->step[s->n] = step, s->value[s->n++] = v;
    return TP_OK;
}

/* mkdir -p: every missing folder of the path. */
static tp_status make_dirs(const char *dir)
{
    char *p = strdup(dir);
    if (!p) return tp_fail(TP_ERR_NOMEM, "training log: out of memory");
    tp_status st = TP_OK;
    for (char *c = p + 1;; c++) {
        int end = *c == '\0';
        if (*c != '/' && !end) continue;
        *c = '\0';
        if (mkdir(p, 0777) != 0 && errno != EEXIST)
            st = tp_fail(TP_ERR_IO, "training log: cannot create the folder %s: %s", p, strerror(errno));
        if (end || st) break;
        *c = '/';
    }
    free(p);
    return st;
}

static char *join(const char *dir, const char *name)
{
    size_t n = strlen(dir) + strlen(name) + 2;
    char *p = malloc(n);
    if (p) snprintf(p, n, "%s/%s", dir, name);
    return p;
}

tp_status tp_train_log_open(const char *out_dir, int64_t total_steps, int writer, tp_train_log **out)
{
    *out = NULL;
    tp_train_log *l = calloc(1, sizeof *l);
    if (!l) return tp_fail(TP_ERR_NOMEM, "training log: out of memory");
    l->writer = writer != 0;
    l->total = total_steps > 0 ? total_steps : 0;
    *out = l;
    if (!l->writer) return TP_OK;
    tp_status st = make_dirs(out_dir);
    char *path = NULL;
    if (!st && (!(l->dir = strdup(out_dir)) || !(path = join(out_dir, LOG_NAME))))
        st = tp_fail(TP_ERR_NOMEM, "training log: out of memory");
    if (!st && !(l->f = fopen(path, "w")))
        st = tp_fail(TP_ERR_IO, "training log: cannot write %s: %s", path, strerror(errno));
    free(path);
    if (st) {
        tp_train_log_close(l);
        *out = NULL;
        return st;
    }
    l->tty = isatty(2);
    return TP_OK;
}

/* A JSON number, or null for NaN and infinities (JSON has neither). */
static void json_number(FILE *f, const char *key, double v)
{
    if (isfinite(v)) fprintf(f, ", \"%s\": %.17g", key, v);
    else fprintf(f, ", \"%s\": null", key);
}

static void hms(char *buf, size_t cap, double s)
{
    long long t = (long long)(s + 0.5);
    snprintf(buf, cap, "%lld:%02lld:%02lld", t / 3600, t / 60 % 60, t % 60);
}

void tp_train_progress_format(char *buf, size_t cap, const tp_train_log_entry *e, int64_t total, double eta_s)
{
    char steps[48], eta[32];
    if (total > 0) snprintf(steps, sizeof steps, "%lld/%lld", (long long)e->step, (long long)total);
    else snprintf(steps, sizeof steps, "%lld", (long long)e->step);
    if (eta_s >= 0 && isfinite(eta_s)) hms(eta, sizeof eta, eta_s);
    else snprintf(eta, sizeof eta, "?");
    int n = snprintf(buf, cap, "step %s  loss %.4f  lr %.2e  grad-norm %.3f  tok/s %.0f  ETA %s", steps, e->loss,
                     e->lr, e->grad_norm, e->tokens_per_s, eta);
    if (e->has_eval && n >= 0 && (size_t)n < cap) snprintf(buf + n, cap - (size_t)n, "  eval %.4f", e->eval_loss);
}

/* The ETA from the pace since the first logged step (that one's own time,
 * spent before it was logged, is not known here). */
static double eta(const tp_train_log *l, int64_t step)
{
    if (!l->total || step <= l->first_step) return -1;
    double per = (tp_now() - l->t_first) / (double)(step - l->first_step);
    return per * (double)(l->total > step ? l->total - step : 0);
}

static void draw_line(tp_train_log *l, const tp_train_log_entry *e)
{
    char line[256];
    tp_train_progress_format(line, sizeof line, e, l->total, eta(l, e->step));
    /* \033[K clears what a longer previous line left. */
    fprintf(stderr, "\r%s\033[K", line);
    fflush(stderr);
    l->line_drawn = 1;
}

tp_status tp_train_log_step(tp_train_log *l, const tp_train_log_entry *e)
{
    if (!l->writer) return TP_OK;
    if (e->step < 1 || e->step <= l->last_step)
        return tp_fail(TP_ERR_INVALID, "training log: step %lld after step %lld (steps count from 1 and increase)",
                       (long long)e->step, (long long)l->last_step);
    if (!l->last_step) l->first_step = e->step, l->t_first = tp_now();
    l->last_step = e->step;
    fprintf(l->f, "{\"step\": %lld", (long long)e->step);
    json_number(l->f, "loss", e->loss);
    json_number(l->f, "lr", e->lr);
    json_number(l->f, "grad_norm", e->grad_norm);
    json_number(l->f, "tokens_per_s", e->tokens_per_s);
    if (e->has_eval) json_number(l->f, "eval_loss", e->eval_loss);
    fputs("}\n", l->f);
    if (fflush(l->f) != 0 || ferror(l->f))
        return tp_fail(TP_ERR_IO, "training log: cannot write %s/%s: %s", l->dir, LOG_NAME, strerror(errno));
    tp_status st = series_add(&l->loss, e->step, e->loss);
    if (!st && e->has_eval) st = series_add(&l->eval, e->step, e->eval_loss);
    if (l->tty) draw_line(l, e);
    return st;
}

/* ---- the chart ---------------------------------------------------------- */

static int write_series(const char *path, const series *s)
{
    FILE *f = fopen(path, "w");
    if (!f) return -1;
    for (int64_t i = 0; i < s->n; i++)
        if (isfinite(s->value[i])) fprintf(f, "%lld %.17g\n", (long long)s->step[i], s->value[i]);
    return fclose(f) ? -1 : 0;
}

/* The temporary files of one drawing, in a folder beside the PNG, so the
 * final rename stays on one file system. */
typedef struct {
    char dir[4096], data[4200], eval[4200], script[4200], png[4200], err[4200];
} chart_files;

static int write_script(const chart_files *c, const char *term, const tp_train_log *l)
{
    FILE *g = fopen(c->script, "w");
    if (!g) return -1;
    fprintf(g, "term = '%s'\nout = ", term);
    tp_gnuplot_quote(g, c->png);
    fputs("\ndata = ", g);
    tp_gnuplot_quote(g, c->data);
    fputs("\neval_data = ", g);
    tp_gnuplot_quote(g, c->eval);
    fprintf(g, "\nhas_eval = %d\nsteps = %lld\n%s", l->eval.n > 0, (long long)l->last_step, loss_chart_gp);
    return fclose(g) ? -1 : 0;
}

/* gnuplot's first line of complaint, for the error message. */
static void first_line(const char *path, char *buf, size_t cap)
{
    buf[0] = '\0';
    FILE *f = fopen(path, "r");
    if (!f) return;
    while (fgets(buf, (int)cap, f) && strspn(buf, " \t\n^") == strlen(buf)) {}
    fclose(f);
    buf[strcspn(buf, "\n")] = '\0';
}

static tp_status draw(const tp_train_log *l, const char *png, chart_files *c)
{
    /* pngcairo draws better; the plain png terminal is the fallback. */
    for (int attempt = 0; attempt < 2; attempt++) {
        if (write_script(c, attempt == 0 ? "pngcairo" : "png", l))
            return tp_fail(TP_ERR_IO, "loss chart: cannot write %s: %s", c->script, strerror(errno));
        if (tp_gnuplot_run(c->script, c->err) == 0) {
            if (rename(c->png, png) != 0)
                return tp_fail(TP_ERR_IO, "loss chart: cannot write %s: %s", png, strerror(errno));
            return TP_OK;
        }
    }
    char why[512];
    first_line(c->err, why, sizeof why);
    return tp_fail(TP_ERR_IO, "loss chart: gnuplot could not draw %s%s%s", png, why[0] ? ": " : "", why);
}

static tp_status chart_at(const tp_train_log *l, const char *png)
{
    chart_files c;
    if ((size_t)snprintf(c.dir, sizeof c.dir, "%s.tmp-XXXXXX", png) >= sizeof c.dir)
        return tp_fail(TP_ERR_INVALID, "loss chart: the path %s is too long", png);
    if (!mkdtemp(c.dir))
        return tp_fail(TP_ERR_IO, "loss chart: cannot create a folder beside %s: %s", png, strerror(errno));
    snprintf(c.data, sizeof c.data, "%s/loss.dat", c.dir);
    snprintf(c.eval, sizeof c.eval, "%s/eval.dat", c.dir);
    snprintf(c.script, sizeof c.script, "%s/chart.gp", c.dir);
    snprintf(c.png, sizeof c.png, "%s/chart.png", c.dir);
    snprintf(c.err, sizeof c.err, "%s/gnuplot.log", c.dir);
    tp_status st = TP_OK;
    if (write_series(c.data, &l->loss) || write_series(c.eval, &l->eval))
        st = tp_fail(TP_ERR_IO, "loss chart: cannot write in %s: %s", c.dir, strerror(errno));
    if (!st) st = draw(l, png, &c);
    const char *tmp[] = {c.data, c.eval, c.script, c.png, c.err};
    for (int i = 0; i < 5; i++) remove(tmp[i]);
    rmdir(c.dir);
    return st;
}

tp_status tp_train_log_chart(tp_train_log *l, const char *png, int *drawn)
{
    if (drawn) *drawn = 0;
    if (!l->writer) return TP_OK;
    char *def = NULL;
    if (!png && !(png = def = join(l->dir, CHART_NAME))) return tp_fail(TP_ERR_NOMEM, "loss chart: out of memory");
    tp_status st = TP_OK;
    if (!l->loss.n) {
        tp_log(TP_LOG_WARN, "no step logged: no loss chart drawn at %s", png);
    } else if (!tp_gnuplot_available()) {
        tp_log(TP_LOG_WARN, "gnuplot not found on PATH: the loss chart %s was not drawn "
               "(install gnuplot-nox; the losses are in %s/%s)", png, l->dir, LOG_NAME);
    } else if (!(st = chart_at(l, png)) && drawn) {
        *drawn = 1;
    }
    free(def);
    return st;
}

void tp_train_log_close(tp_train_log *l)
{
    if (!l) return;
    if (l->line_drawn) fputc('\n', stderr);
    if (l->f) fclose(l->f);
    free(l->dir);
    free(l->loss.step), free(l->loss.value), free(l->eval.step), free(l->eval.value);
    free(l);
}

/* ---- a resumed run ------------------------------------------------------ */

tp_status tp_train_log_carry(tp_train_log *l, const char *path, int64_t upto)
{
    if (!l->writer) return TP_OK;
    char *text = NULL;
    size_t len = 0;
    tp_status st = tp_read_file(path, &text, &len);
    int64_t last = l->last_step;
    for (size_t at = 0; !st && at < len;) {
        size_t end = at;
        while (end < len && text[end] != '\n') end++;
        cJSON *o = cJSON_ParseWithLength(text + at, end - at);
        const cJSON *step = cJSON_GetObjectItemCaseSensitive(o, "step");
        const cJSON *loss = cJSON_GetObjectItemCaseSensitive(o, "loss");
        const cJSON *ev = cJSON_GetObjectItemCaseSensitive(o, "eval_loss");
        int64_t k = cJSON_IsNumber(step) ? (int64_t)step->valuedouble : 0;
        if (k > last && k <= upto) {
            fwrite(text + at, 1, end - at, l->f);
            fputc('\n', l->f);
            st = series_add(&l->loss, k, cJSON_IsNumber(loss) ? loss->valuedouble : NAN);
            if (!st && ev) st = series_add(&l->eval, k, cJSON_IsNumber(ev) ? ev->valuedouble : NAN);
            last = k;
        }
        cJSON_Delete(o);
        at = end + 1;
    }
    free(text);
    if (!st && (fflush(l->f) != 0 || ferror(l->f)))
        st = tp_fail(TP_ERR_IO, "training log: cannot write %s/%s: %s", l->dir, LOG_NAME, strerror(errno));
    /* The pace (ETA) is measured from here. */
    l->last_step = l->first_step = last;
    l->t_first = tp_now();
    return st;
}
