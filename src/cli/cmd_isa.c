/* tensorpar --isa-list, and the TENSORPAR_ISA check every command makes
 * before it does anything. */
#include "cli.h"
#include "tensorpar/kernels.h"

int cmd_isa_list(void)
{
    /* One path per line, the chosen one marked, so scripts can loop over
     * the paths (scripts/test.sh does). */
    int refused = tp_isa_check() != TP_OK;
    for (int i = 0; i < TP_ISA_COUNT; i++)
        if (tp_isa_cpu_has((tp_isa)i))
            printf("%s%s\n", tp_isa_name((tp_isa)i), !refused && tp_isa_selected() == (tp_isa)i ? " (chosen)" : "");
    fflush(stdout);
    return cli_isa_check();
}

int cli_isa_check(void)
{
    if (tp_isa_check() == TP_OK) return 0;
    fprintf(stderr, "tensorpar: error: %s\n", tp_error());
    return 2;
}
