/* Minimal test harness for tests/unit: CHECK records a failure and goes on,
 * check_summary() prints "N passed, M failed" and gives the exit status. */
#ifndef TP_TEST_CHECK_H
#define TP_TEST_CHECK_H

#include <stdio.h>

static int check_passed, check_failed;

#define CHECK(cond) do { \
    if (cond) check_passed++; \
    else { check_failed++; fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); } \
} while (0)

#define CHECK_MSG(cond, ...) do { \
    if (cond) check_passed++; \
    else { check_failed++; fprintf(stderr, "%s:%d: CHECK failed: %s: ", __FILE__, __LINE__, #cond); \
           fprintf(stderr, __VA_ARGS__); fputc('\n', stderr); } \
} while (0)

static inline int check_summary(void)
{
    printf("%d passed, %d failed\n", check_passed, check_failed);
    return check_failed ? 1 : 0;
}

#endif
