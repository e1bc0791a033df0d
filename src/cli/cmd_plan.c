/* tensorpar plan: resolve a TP plan against a model directory's config.json
 * (no weights are read) and print what every rank would hold and exchange. */
#include "cli.h"
#include "tensorpar/parallel.h"

#include <stdlib.h>

int cmd_plan(int argc, char **argv)
{
    cli_option o[] = {
        {"--model", "DIR", "model directory (only config.json is read; required)", 0, {0}},
        {"--tp", "N", "tensor parallel size (default 1)", 0, {0}},
        {"--tp-plan", "auto|FILE.json", "the built-in plan (default) or a JSON object of rules", 0, {0}},
        {"--ep", NULL, "expert parallelism: auto is the model type's expert-parallel plan", 0, {0}},
        {"--json", NULL, "print one JSON document instead of text", 0, {0}},
    };
    int n = (int)(sizeof o / sizeof o[0]);
    int rc = cli_parse(argc, argv, o, n, "tensorpar plan --model DIR --tp N [--tp-plan auto|FILE.json] [--ep] [--json]",
                       "Resolves the tensor parallel plan for the model's config and prints each parameter's\n"
                       "rule, style, placement and local shape, the bytes per rank, the collectives per\n"
                       "token and the plan warnings.  Invalid plans exit 1 with the error.", NULL, NULL);
    if (rc) return rc == 1 ? 0 : CLI_EXIT_USAGE;
    const char *dir = cli_value(o, n, "--model");
    if (!dir) {
        tp_fail(TP_ERR_INVALID, "--model is required (see --help)");
        return cli_usage_error("plan");
    }
    if (cli_check_dir("plan", "--model", dir)) return CLI_EXIT_USAGE;
    long long tp = 1;
    if (cli_int(o, n, "--tp", &tp)) return cli_usage_error("plan");
    if (tp < 1 || tp > 65536) {
        fprintf(stderr, "tensorpar plan: error: Parallelism sizes must be >= 1, got %lld.\n", tp);
        return CLI_EXIT_USAGE;
    }
    tp_model_config cfg;
    tp_plan plan;
    tp_plan_resolution *res;
    if (tp_config_load(&cfg, dir) || tp_plan_load_mode(cli_value(o, n, "--tp-plan"), &cfg, cli_flag(o, n, "--ep") && tp > 1, &plan))
        return cli_report("plan");
    tp_status s = tp_plan_resolve(&cfg, &plan, (int)tp, NULL, &res);
    if (!s && (s = tp_plan_check_flow(res))) tp_plan_resolution_free(res);
    tp_plan_free(&plan);
    if (s) return cli_report("plan");
    /* One process plays rank 0 of the group: it prints the warnings. */
    tp_plan_log_pattern_warnings(res, 0);
    tp_plan_log_coverage(res, 0);
    if (cli_flag(o, n, "--json")) {
        char *j = tp_plan_report_json(res);
        if (!j) s = tp_fail(TP_ERR_NOMEM, "out of memory");
        else printf("%s\n", j);
        free(j);
    } else {
        s = tp_plan_report_text(res, stdout);
    }
    tp_plan_resolution_free(res);
    return s ? cli_report("plan") : 0;
}
