/* A progress bar on stderr for long work (loading, training).  Drawn only on a
 * terminal, at most ten times a second, so logs stay clean when redirected. */
#include "tensorpar/base.h"

#include <unistd.h>

static void draw(tp_progress *p)
{
    const int width = 30;
    double frac = p->total ? (double)p->done / (double)p->total : 1.0;
    if (frac > 1) frac = 1;
    int fill = (int)(frac * width);
    fprintf(stderr, "\r%s [", p->label);
    for (int i = 0; i < width; i++) fputc(i < fill ? '#' : '.', stderr);
    fprintf(stderr, "] %3d%%", (int)(frac * 100));
    fflush(stderr);
}

void tp_progress_begin(tp_progress *p, const char *label, uint64_t total)
{
    p->label = label;
    p->total = total;
    p->done = 0;
    p->enabled = isatty(2);
    p->last_draw = 0;
    if (p->enabled) draw(p);
}

void tp_progress_advance(tp_progress *p, uint64_t n)
{
    p->done += n;
    if (!p->enabled) return;
    double t = tp_now();
    if (t - p->last_draw < 0.1 && p->done < p->total) return;
    p->last_draw = t;
    draw(p);
}

void tp_progress_end(tp_progress *p)
{
    if (!p->enabled) return;
    p->done = p->total;
    draw(p);
    fputc('\n', stderr);
}
