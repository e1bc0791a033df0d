/* tensorpar --help-env: the settings table, one variable a line; and the
 * check of every setting each command makes before it does anything. */
#include "cli.h"
#include "tensorpar/settings.h"

static const char *const scope_titles[] = {
    "settings (environment variables):",
    "set by 'tensorpar launch' for its ranks (not for users):",
    "removed (refused when set):",
};

static void print_scope(tp_setting_scope scope)
{
    printf("%s\n", scope_titles[scope]);
    for (int i = 0; i < TP_SET_COUNT; i++) {
        const tp_setting_info *s = tp_setting_info_of((tp_setting_id)i);
        if (s->scope != scope) continue;
        char range[160];
        tp_setting_range((tp_setting_id)i, range, sizeof range);
        printf("  %-25s %-27s default %-6s %s\n", s->name, range, s->dflt[0] ? s->dflt : "-", s->doc);
    }
}

int cmd_help_env(void)
{
    print_scope(TP_SCOPE_USER);
    printf("\n");
    print_scope(TP_SCOPE_INTERNAL);
    printf("\n");
    print_scope(TP_SCOPE_REMOVED);
    printf("\nA bad value is an error naming the variable; every command checks them all first (exit status 2).\n");
    return 0;
}

int cli_settings_check(void)
{
    if (tp_settings_check() == TP_OK) return 0;
    fprintf(stderr, "tensorpar: error: %s\n", tp_error());
    return CLI_EXIT_USAGE;
}
