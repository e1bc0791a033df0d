/* The settings table: each type's parsing, bad values refused with the
 * variable named, the defaults, and the process's values from the
 * environment (parsed once, re-read by tp_settings_reload). */
#include "check.h"
#include "tensorpar/settings.h"

#include <stdlib.h>
#include <string.h>

static int contains(const char *s, const char *part) { return strstr(s, part) != NULL; }

/* A bad text: refused, the message naming the variable and the value. */
static void refused(tp_setting_id id, const char *text)
{
    tp_setting_value v;
    const char *name = tp_setting_info_of(id)->name;
    CHECK_MSG(tp_setting_parse(id, text, &v) == TP_ERR_INVALID, "%s=%s accepted", name, text);
    CHECK_MSG(contains(tp_error(), name) && contains(tp_error(), text), "%s", tp_error());
}

static void test_bool(void)
{
    tp_setting_value v;
    CHECK(tp_setting_parse(TP_SET_FUSE_NORM, NULL, &v) == TP_OK && v.b == 1);
    CHECK(tp_setting_parse(TP_SET_FUSE_NORM, "", &v) == TP_OK && v.b == 1);
    CHECK(tp_setting_parse(TP_SET_FUSE_NORM, "0", &v) == TP_OK && v.b == 0);
    CHECK(tp_setting_parse(TP_SET_BLAS, NULL, &v) == TP_OK && v.b == 0);
    CHECK(tp_setting_parse(TP_SET_BLAS, "1", &v) == TP_OK && v.b == 1);
    refused(TP_SET_FUSE_NORM, "yes");
    CHECK(contains(tp_error(), "0|1"));
    refused(TP_SET_PIN, "2");
}

static void test_int(void)
{
    tp_setting_value v;
    CHECK(tp_setting_parse(TP_SET_SHM_SLOT_KB, NULL, &v) == TP_OK && v.i == 256);
    CHECK(tp_setting_parse(TP_SET_SHM_SLOT_KB, "4", &v) == TP_OK && v.i == 4);
    CHECK(tp_setting_parse(TP_SET_SHM_CMA_KB, "0", &v) == TP_OK && v.i == 0);
    refused(TP_SET_SHM_SLOT_KB, "3");          /* below the range */
    CHECK(contains(tp_error(), "[4, 1048576]"));
    refused(TP_SET_SHM_SLOT_KB, "1048577");    /* above it */
    refused(TP_SET_SHM_ONESHOT_KB, "64k");
    refused(TP_SET_SHM_FD, "-1");
}

static void test_seconds(void)
{
    tp_setting_value v;
    CHECK(tp_setting_parse(TP_SET_HANG_TIMEOUT, NULL, &v) == TP_OK && v.s == 2.0);
    CHECK(tp_setting_parse(TP_SET_HANG_TIMEOUT, "0", &v) == TP_OK && v.s == 0.0);
    CHECK(tp_setting_parse(TP_SET_HANG_TIMEOUT, "0.25", &v) == TP_OK && v.s == 0.25);
    CHECK(tp_setting_parse(TP_SET_COMM_TIMEOUT, NULL, &v) == TP_OK && v.s == 30.0);
    refused(TP_SET_COMM_TIMEOUT, "0");          /* the range is open at 0 */
    CHECK(contains(tp_error(), "(0, "));
    refused(TP_SET_HANG_TIMEOUT, "abc");
    refused(TP_SET_HANG_TIMEOUT, "-1");
    refused(TP_SET_HANG_TIMEOUT, "2s");
    refused(TP_SET_HANG_TIMEOUT, "nan");
    refused(TP_SET_COMM_TIMEOUT, "inf");
}

static void test_enum_and_string(void)
{
    tp_setting_value v;
    CHECK(tp_setting_parse(TP_SET_LOG, NULL, &v) == TP_OK && v.e == TP_LOG_INFO);
    CHECK(tp_setting_parse(TP_SET_LOG, "debug", &v) == TP_OK && v.e == TP_LOG_DEBUG);
    CHECK(tp_setting_parse(TP_SET_LOG, "error", &v) == TP_OK && v.e == TP_LOG_ERROR);
    refused(TP_SET_LOG, "verbose");
    CHECK(contains(tp_error(), "debug|info|warn|error"));
    CHECK(tp_setting_parse(TP_SET_BACKEND, "shm", &v) == TP_OK &&
          !strcmp(tp_setting_info_of(TP_SET_BACKEND)->names[v.e], "shm"));
    refused(TP_SET_BACKEND, "nccl");
    CHECK(tp_setting_parse(TP_SET_RENDEZVOUS, "job-1", &v) == TP_OK && !strcmp(v.str, "job-1"));
    CHECK(tp_setting_parse(TP_SET_RENDEZVOUS, NULL, &v) == TP_OK && v.str == NULL);
    /* A removed knob is refused whatever its value, pointing at its
     * replacement. */
    refused(TP_SET_KERNEL, "avx2");
    refused(TP_SET_AMX, "0");
    CHECK(contains(tp_error(), "TENSORPAR_ISA"));
}

/* Every row is complete and every name unique. */
static void test_table(void)
{
    for (int i = 0; i < TP_SET_COUNT; i++) {
        const tp_setting_info *s = tp_setting_info_of((tp_setting_id)i);
        CHECK(s && !strncmp(s->name, "TENSORPAR_", 10) && s->doc && s->doc[0] && s->dflt);
        CHECK(s->type != TP_SETTING_ENUM || s->names);
        for (int j = 0; j < i; j++) CHECK(strcmp(s->name, tp_setting_info_of((tp_setting_id)j)->name) != 0);
        tp_setting_value v;
        CHECK_MSG(tp_setting_parse((tp_setting_id)i, NULL, &v) == TP_OK, "%s: default refused", s->name);
    }
    CHECK(tp_setting_info_of(TP_SET_COUNT) == NULL);
}

/* The process's values: read at the first use, re-read only on reload. */
static void test_environment(void)
{
    for (int i = 0; i < TP_SET_COUNT; i++) unsetenv(tp_setting_info_of((tp_setting_id)i)->name);
    tp_settings_reload();
    CHECK(tp_settings_check() == TP_OK);
    CHECK(tp_setting_seconds(TP_SET_HANG_TIMEOUT) == 2.0 && !tp_setting_is_set(TP_SET_HANG_TIMEOUT));
    setenv("TENSORPAR_HANG_TIMEOUT", "0.5", 1);
    CHECK(tp_setting_seconds(TP_SET_HANG_TIMEOUT) == 2.0);   /* parsed once */
    tp_settings_reload();
    CHECK(tp_setting_seconds(TP_SET_HANG_TIMEOUT) == 0.5 && tp_setting_is_set(TP_SET_HANG_TIMEOUT));
    setenv("TENSORPAR_HANG_TIMEOUT", "abc", 1);
    setenv("TENSORPAR_SHM_SLOT_KB", "8", 1);
    tp_settings_reload();
    /* A bad value reads as the default; its check and the whole check fail. */
    CHECK(tp_setting_seconds(TP_SET_HANG_TIMEOUT) == 2.0);
    CHECK(tp_setting_check(TP_SET_HANG_TIMEOUT) == TP_ERR_INVALID && contains(tp_error(), "TENSORPAR_HANG_TIMEOUT='abc'"));
    CHECK(tp_setting_check(TP_SET_SHM_SLOT_KB) == TP_OK && tp_setting_int(TP_SET_SHM_SLOT_KB) == 8);
    CHECK(tp_settings_check() == TP_ERR_INVALID && contains(tp_error(), "TENSORPAR_HANG_TIMEOUT"));
    unsetenv("TENSORPAR_HANG_TIMEOUT");
    unsetenv("TENSORPAR_SHM_SLOT_KB");
    tp_settings_reload();
    CHECK(tp_settings_check() == TP_OK);
}

int main(void)
{
    test_bool();
    test_int();
    test_seconds();
    test_enum_and_string();
    test_table();
    test_environment();
    return check_summary();
}
