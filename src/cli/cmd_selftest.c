/* tensorpar selftest <what>: hidden workers that the tests launch as ranks. */
#include "cli.h"

#include <string.h>

typedef struct {
    const char *name;
    int (*run)(int argc, char **argv);
} selftest;

static const selftest selftests[] = {
    {"comm", cmd_selftest_comm},
};

int cmd_selftest(int argc, char **argv)
{
    size_t n = sizeof selftests / sizeof selftests[0];
    if (argc >= 2)
        for (size_t i = 0; i < n; i++)
            if (!strcmp(argv[1], selftests[i].name)) return selftests[i].run(argc - 1, argv + 1);
    fprintf(stderr, "usage: tensorpar selftest <what> [options]\n\nwhat:");
    for (size_t i = 0; i < n; i++) fprintf(stderr, " %s", selftests[i].name);
    fprintf(stderr, "\n");
    return 2;
}
