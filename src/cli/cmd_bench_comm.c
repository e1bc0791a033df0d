/* tensorpar bench comm (placeholder, being written). */
#include "cli.h"

int cmd_bench_comm(int argc, char **argv)
{
    (void)argc; (void)argv;
    fprintf(stderr, "tensorpar bench comm: not yet\n");
    return 1;
}
