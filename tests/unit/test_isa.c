/* TENSORPAR_ISA: the names, the choice among the paths a CPU has (any CPU,
 * through tp_isa_choose's has[]), the messages of a refusal, the knobs it
 * replaced, and that the process's own choice keeps its kernels to it. */
#include "check.h"
#include "tensorpar/settings.h"
#include "tensorpar/kernels.h"
#include "kernels/kern_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static int contains(const char *s, const char *part) { return strstr(s, part) != NULL; }

static void test_names(void)
{
    static const char *const names[TP_ISA_COUNT] = {"scalar", "avx2", "avx512", "amx"};
    for (int i = 0; i < TP_ISA_COUNT; i++) {
        tp_isa got = TP_ISA_COUNT;
        CHECK_MSG(tp_isa_parse(names[i], &got) == TP_OK && got == (tp_isa)i, "parse %s", names[i]);
        CHECK(!strcmp(tp_isa_name((tp_isa)i), names[i]));
    }
    tp_isa got = TP_ISA_AVX2;
    const char *bad[] = {"", "AVX2", "avx", "avx512bf16", "auto", " scalar", NULL};
    for (int i = 0; i < 7; i++) {
        CHECK_MSG(tp_isa_parse(bad[i], &got) == TP_ERR_INVALID, "'%s' accepted", bad[i] ? bad[i] : "NULL");
        CHECK(got == TP_ISA_AVX2);   /* untouched on failure */
    }
    CHECK(!strcmp(tp_isa_name(TP_ISA_COUNT), "?"));
}

/* The default is the best path has[] holds; gaps do not happen on real
 * CPUs, but the rule is still "the highest". */
static void test_default_choice(void)
{
    const struct { int has[TP_ISA_COUNT]; tp_isa want; } cases[] = {
        {{1, 0, 0, 0}, TP_ISA_SCALAR}, {{1, 1, 0, 0}, TP_ISA_AVX2},
        {{1, 1, 1, 0}, TP_ISA_AVX512}, {{1, 1, 1, 1}, TP_ISA_AMX},
    };
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        tp_isa got = TP_ISA_COUNT;
        CHECK(tp_isa_choose(NULL, cases[c].has, &got) == TP_OK && got == cases[c].want);
        got = TP_ISA_COUNT;
        CHECK(tp_isa_choose("", cases[c].has, &got) == TP_OK && got == cases[c].want);
    }
}

static void test_explicit_choice(void)
{
    const int avx2_cpu[TP_ISA_COUNT] = {1, 1, 0, 0}, amx_cpu[TP_ISA_COUNT] = {1, 1, 1, 1};
    tp_isa got = TP_ISA_COUNT;
    CHECK(tp_isa_choose("scalar", avx2_cpu, &got) == TP_OK && got == TP_ISA_SCALAR);
    CHECK(tp_isa_choose("avx2", avx2_cpu, &got) == TP_OK && got == TP_ISA_AVX2);
    CHECK(tp_isa_choose("avx512", amx_cpu, &got) == TP_OK && got == TP_ISA_AVX512);
    CHECK(tp_isa_choose("amx", amx_cpu, &got) == TP_OK && got == TP_ISA_AMX);

    /* A path the CPU lacks: the value, the valid names, what the CPU has. */
    got = TP_ISA_COUNT;
    CHECK(tp_isa_choose("avx512", avx2_cpu, &got) == TP_ERR_INVALID && got == TP_ISA_COUNT);
    printf("refusal: %s\n", tp_error());
    CHECK(contains(tp_error(), "TENSORPAR_ISA=avx512"));
    CHECK(contains(tp_error(), "does not support"));
    CHECK(contains(tp_error(), "scalar, avx2, avx512, amx"));
    CHECK(contains(tp_error(), "this CPU supports: scalar, avx2)"));
    CHECK(tp_isa_choose("amx", avx2_cpu, &got) == TP_ERR_INVALID && contains(tp_error(), "TENSORPAR_ISA=amx"));

    /* An unknown name, on a CPU with everything. */
    CHECK(tp_isa_choose("avx-512", amx_cpu, &got) == TP_ERR_INVALID);
    printf("refusal: %s\n", tp_error());
    CHECK(contains(tp_error(), "TENSORPAR_ISA=avx-512: unknown path"));
    CHECK(contains(tp_error(), "this CPU supports: scalar, avx2, avx512, amx)"));
    CHECK(got == TP_ISA_COUNT);

    char buf[64];
    const int scalar_cpu[TP_ISA_COUNT] = {1, 0, 0, 0};
    tp_isa_list(buf, sizeof buf, scalar_cpu);
    CHECK(!strcmp(buf, "scalar"));
    tp_isa_list(buf, 8, amx_cpu);   /* cut short, still a string */
    CHECK(strlen(buf) < 8);
}

/* The environment: TENSORPAR_ISA, and the knobs it replaced refused by
 * name.  tp_isa_choose_env reads the environment on every call (the
 * process's own choice is made once, elsewhere), so it can be driven here.
 * The variables are put back as ctest set them. */
static void test_env(void)
{
    const int cpu[TP_ISA_COUNT] = {1, 1, 0, 0};
    const char *vars[3] = {"TENSORPAR_ISA", "TENSORPAR_KERNEL", "TENSORPAR_AMX"};
    char *saved[3];
    for (int i = 0; i < 3; i++) {
        saved[i] = getenv(vars[i]) ? strdup(getenv(vars[i])) : NULL;
        unsetenv(vars[i]); tp_settings_reload();
    }
    tp_isa got;
    setenv("TENSORPAR_ISA", "scalar", 1); tp_settings_reload();
    CHECK(tp_isa_choose_env(cpu, &got) == TP_OK && got == TP_ISA_SCALAR);
    unsetenv("TENSORPAR_ISA"); tp_settings_reload();
    CHECK(tp_isa_choose_env(cpu, &got) == TP_OK && got == TP_ISA_AVX2);
    setenv("TENSORPAR_ISA", "sse2", 1); tp_settings_reload();
    CHECK(tp_isa_choose_env(cpu, &got) == TP_ERR_INVALID && contains(tp_error(), "TENSORPAR_ISA=sse2"));
    unsetenv("TENSORPAR_ISA"); tp_settings_reload();
    const char *removed[] = {"TENSORPAR_KERNEL", "TENSORPAR_AMX"};
    for (int i = 0; i < 2; i++) {
        setenv(removed[i], "0", 1); tp_settings_reload();
        CHECK(tp_isa_choose_env(cpu, &got) == TP_ERR_INVALID);
        CHECK_MSG(contains(tp_error(), removed[i]) && contains(tp_error(), "TENSORPAR_ISA"), "%s", tp_error());
        unsetenv(removed[i]); tp_settings_reload();
    }
    for (int i = 0; i < 3; i++) {
        if (saved[i]) setenv(vars[i], saved[i], 1);
        free(saved[i]);
    }
    tp_settings_reload();
}

/* The process's choice (made from the real CPU and the environment ctest
 * gave, e.g. TENSORPAR_ISA=scalar in CI's per-path runs): the kernels stay
 * at or below it, and asking tp_matmul_ex for more is an error, not a
 * fallback. */
static void test_refused_process(void)
{
    CHECK(tp_isa_check() == TP_ERR_INVALID);
    printf("this process was refused: %s\n", tp_error());
    CHECK(tp_isa_selected() == TP_ISA_SCALAR && tp_kernel_path_default() == TP_KERNEL_SCALAR);
    CHECK(!tp_kernel_has_amx() && !tp_kernel_has_bf16_dot());
    float x[1] = {1}, y[1] = {-1};
    int64_t shape[2] = {1, 1};
    tp_tensor W = {0};
    CHECK(tp_tensor_init(&W, TP_F32, 2, shape) == TP_OK);
    tp_matmul_opts o;
    tp_matmul_opts_default(&o);
    CHECK(tp_matmul_ex(y, x, 1, &W, NULL, NULL, &o) == TP_ERR_INVALID && contains(tp_error(), "TENSORPAR_"));
    CHECK(y[0] == -1);
    tp_tensor_release(&W);
}

static void test_process_choice(void)
{
    int has[TP_ISA_COUNT];
    for (int i = 0; i < TP_ISA_COUNT; i++) has[i] = tp_isa_cpu_has((tp_isa)i);
    tp_isa expect;
    if (tp_isa_choose_env(has, &expect) != TP_OK) { test_refused_process(); return; }
    CHECK(tp_isa_check() == TP_OK);
    tp_isa isa = tp_isa_selected();
    CHECK(isa == expect);
    const char *env = getenv("TENSORPAR_ISA");
    if (env && *env) CHECK_MSG(!strcmp(env, tp_isa_name(isa)), "TENSORPAR_ISA=%s but %s chosen", env, tp_isa_name(isa));
    CHECK(tp_isa_cpu_has(TP_ISA_SCALAR) && tp_isa_cpu_has(isa));
    for (int i = isa + 1; i < TP_ISA_COUNT && !(env && *env); i++) CHECK(!tp_isa_cpu_has((tp_isa)i));
    tp_kernel_path want = isa == TP_ISA_SCALAR ? TP_KERNEL_SCALAR : isa == TP_ISA_AVX2 ? TP_KERNEL_AVX2 : TP_KERNEL_AVX512;
    CHECK(tp_kernel_path_default() == want);
    CHECK(tp_kernel_resolve(TP_KERNEL_AVX512) == want);
    CHECK(tp_kernel_has_amx() == (isa == TP_ISA_AMX));
    if (isa < TP_ISA_AVX512) CHECK(!tp_kernel_has_bf16_dot() && !tp_kernel_has_vnni());
    /* TENSORPAR_NO_VNNI=1 (scripts/test.sh's run of the q8_0/q4_0 tests)
     * hides AVX512_VNNI, so the AVX2 fallback of an AVX-512 CPU without it
     * runs here. */
    if (tp_setting_bool(TP_SET_NO_VNNI)) CHECK(!tp_kernel_has_vnni());
    printf("AVX512_VNNI kernels: %s\n", tp_kernel_has_vnni() ? "yes" : "no");
    printf("this CPU: ");
    for (int i = 0; i < TP_ISA_COUNT; i++)
        if (tp_isa_cpu_has((tp_isa)i)) printf("%s ", tp_isa_name((tp_isa)i));
    printf("; chosen: %s\n", tp_isa_name(isa));

    float x[2] = {1, 2}, y[1] = {0};
    int64_t shape[2] = {1, 2};
    tp_tensor W = {0};
    CHECK(tp_tensor_init(&W, TP_F32, 2, shape) == TP_OK);
    ((float *)W.data)[0] = 3;
    ((float *)W.data)[1] = 4;
    for (tp_kernel_path p = TP_KERNEL_SCALAR; p <= TP_KERNEL_AVX512; p++) {
        tp_matmul_opts o;
        tp_matmul_opts_default(&o);
        o.path = p;
        y[0] = 0;
        tp_status st = tp_matmul_ex(y, x, 1, &W, NULL, NULL, &o);
        if (p <= want) {
            CHECK_MSG(st == TP_OK && y[0] == 11.0f, "%s: %s", tp_kernel_path_name(p), tp_error());
        } else {
            CHECK_MSG(st == TP_ERR_UNSUPPORTED && contains(tp_error(), tp_kernel_path_name(p)), "%s allowed under %s",
                      tp_kernel_path_name(p), tp_isa_name(isa));
            CHECK(y[0] == 0);
        }
    }
    tp_tensor_release(&W);
}

int main(void)
{
    test_names();
    test_default_choice();
    test_explicit_choice();
    test_env();
    test_process_choice();
    return check_summary();
}
