/* text/sampler: greedy, each processor, determinism from the seed. */
#include "check.h"
#include "tensorpar/text.h"

#include <math.h>
#include <string.h>

static tp_sampler make(tp_sampling s, int64_t vocab)
{
    tp_sampler sp;
    if (tp_sampler_init(&sp, &s, vocab) != TP_OK) memset(&sp, 0, sizeof sp);
    return sp;
}

static void test_greedy_and_penalty(void)
{
    tp_sampling s;
    tp_sampling_defaults(&s);
    tp_sampler sp = make(s, 4);
    float x[4] = {0.1f, 2.0f, 1.9f, -1.0f};
    CHECK(tp_sampler_next(&sp, x) == 1);
    tp_sampler_release(&sp);
    s.repetition_penalty = 2.0;
    sp = make(s, 4);
    int64_t seen = 1;
    tp_sampler_observe(&sp, &seen, 1);
    float y[4] = {0.1f, 2.0f, 1.9f, -1.0f};
    CHECK(tp_sampler_next(&sp, y) == 2);          /* 2.0 / 2 = 1.0 < 1.9 */
    CHECK(y[1] == 1.0f);
    int64_t neg = 3;
    tp_sampler_observe(&sp, &neg, 1);
    float z[4] = {0.1f, 2.0f, 1.9f, -1.0f};
    tp_sampler_next(&sp, z);
    CHECK(z[3] == -2.0f);                          /* negative logits are multiplied */
    tp_sampler_release(&sp);
}

static void histogram(tp_sampling s, const float *logits, int64_t vocab, int draws, int *counts)
{
    tp_sampler sp = make(s, vocab);
    float x[16];
    memset(counts, 0, (size_t)vocab * sizeof *counts);
    for (int i = 0; i < draws; i++) {
        memcpy(x, logits, (size_t)vocab * sizeof *x);
        counts[tp_sampler_next(&sp, x)]++;
    }
    tp_sampler_release(&sp);
}

static void test_filters(void)
{
    /* probabilities 0.5, 0.25, 0.125, 0.125 */
    float l[4] = {logf(0.5f), logf(0.25f), logf(0.125f), logf(0.125f)};
    int c[4];
    tp_sampling s;
    tp_sampling_defaults(&s);
    s.do_sample = 1;
    s.seed = 7;
    histogram(s, l, 4, 20000, c);
    CHECK(fabs(c[0] / 20000.0 - 0.5) < 0.02 && fabs(c[1] / 20000.0 - 0.25) < 0.02);
    s.top_k = 1;
    histogram(s, l, 4, 1000, c);
    CHECK(c[0] == 1000);
    s.top_k = 3;                                   /* keeps the tie at the 3rd value */
    histogram(s, l, 4, 4000, c);
    CHECK(c[2] > 0 && c[3] > 0);
    s.top_k = 0;
    s.top_p = 0.7;                                 /* 0.5 + 0.25 reaches 0.7 */
    histogram(s, l, 4, 4000, c);
    CHECK(c[2] == 0 && c[3] == 0 && c[1] > 0);
    s.top_p = 1.0;
    s.min_p = 0.4;                                 /* threshold 0.2: keeps 0.5, 0.25 */
    histogram(s, l, 4, 4000, c);
    CHECK(c[2] == 0 && c[3] == 0 && c[1] > 0);
    s.min_p = 0;
    s.temperature = 0.05;                          /* nearly greedy */
    histogram(s, l, 4, 2000, c);
    CHECK(c[0] > 1990);
}

static void test_seed(void)
{
    float l[8] = {0, 0.1f, 0.2f, 0.3f, 0.4f, 0.5f, 0.6f, 0.7f};
    tp_sampling s;
    tp_sampling_defaults(&s);
    s.do_sample = 1;
    s.seed = 123;
    int a[8], b[8];
    histogram(s, l, 8, 500, a);
    histogram(s, l, 8, 500, b);
    CHECK(!memcmp(a, b, sizeof a));
    s.top_p = 0;
    tp_sampler sp;
    CHECK(tp_sampler_init(&sp, &s, 8) == TP_ERR_INVALID);
}

int main(void)
{
    test_greedy_and_penalty();
    test_filters();
    test_seed();
    return check_summary();
}
