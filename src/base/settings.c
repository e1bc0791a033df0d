/* The settings table: every TENSORPAR_* environment variable declared once
 * (name, type, range, default, scope, doc), Redis static_configs style, and
 * the one place that reads them with getenv.  Parsed once per process under
 * pthread_once; the values and each variable's error live in a static that
 * is written only then (and by tp_settings_reload, for tests). */
#include "tensorpar/settings.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

static const char *const log_names[] = {"debug", "info", "warn", "error", NULL};
static const char *const backend_names[] = {"auto", "self", "shm", "mpi", NULL};
/* TENSORPAR_ISA is parsed by kernels/isa.c (which also knows what the CPU
 * has); the names are here to be listed. */
static const char *const isa_names[] = {"scalar", "avx2", "avx512", "amx", NULL};

#define KB_MAX 1048576.0   /* 1 GiB in KiB: far above any useful buffer */

static const tp_setting_info table[TP_SET_COUNT] = {
    [TP_SET_ISA] = {"TENSORPAR_ISA", TP_SETTING_STRING, TP_SCOPE_USER, 0, 0, 0, isa_names, "",
                    "the kernels' path (default: the best this CPU has; see --isa-list)"},
    [TP_SET_NO_VNNI] = {"TENSORPAR_NO_VNNI", TP_SETTING_BOOL, TP_SCOPE_USER, 0, 0, 0, NULL, "0",
                        "act as a CPU without AVX512_VNNI: q8_0/q4_0 on avx512/amx use the AVX2 kernels (tests)"},
    [TP_SET_BF16_DOT] = {"TENSORPAR_BF16_DOT", TP_SETTING_BOOL, TP_SCOPE_USER, 0, 0, 0, NULL, "0",
                         "bf16 weights: round the activations to bf16 (--matmul bf16 where it is absent; faster, not exact)"},
    [TP_SET_BLAS] = {"TENSORPAR_BLAS", TP_SETTING_BOOL, TP_SCOPE_USER, 0, 0, 0, NULL, "0",
                     "prefill GEMMs through OpenBLAS on the avx2/avx512 paths"},
    [TP_SET_FUSE_NORM] = {"TENSORPAR_FUSE_NORM", TP_SETTING_BOOL, TP_SCOPE_USER, 0, 0, 0, NULL, "1",
                          "fuse the residual add and RMSNorm into the row-wise all-reduce"},
    [TP_SET_LOG] = {"TENSORPAR_LOG", TP_SETTING_ENUM, TP_SCOPE_USER, 0, 0, 0, log_names, "info",
                    "the least severe log message printed to stderr"},
    [TP_SET_PIN] = {"TENSORPAR_PIN", TP_SETTING_BOOL, TP_SCOPE_USER, 0, 0, 0, NULL, "1",
                    "pin each rank's threads to its own cores (0: leave them to the OS)"},
    [TP_SET_BACKEND] = {"TENSORPAR_BACKEND", TP_SETTING_ENUM, TP_SCOPE_USER, 0, 0, 0, backend_names, "auto",
                        "collectives backend (auto: mpi under mpirun, else shm for several ranks, else self)"},
    [TP_SET_COMM_TIMEOUT] = {"TENSORPAR_COMM_TIMEOUT", TP_SETTING_SECONDS, TP_SCOPE_USER, 0, 1e9, 1, NULL, "30",
                             "seconds a collective waits for its peers before it fails"},
    [TP_SET_HANG_TIMEOUT] = {"TENSORPAR_HANG_TIMEOUT", TP_SETTING_SECONDS, TP_SCOPE_USER, 0, 1e9, 0, NULL, "2",
                             "seconds a rank's heartbeat may be silent before it counts as hung (0: no check)"},
    [TP_SET_SHM_SLOT_KB] = {"TENSORPAR_SHM_SLOT_KB", TP_SETTING_INT, TP_SCOPE_USER, 4, KB_MAX, 0, NULL, "256",
                            "shm backend: KiB per collective slot (experiments)"},
    [TP_SET_SHM_ONESHOT_KB] = {"TENSORPAR_SHM_ONESHOT_KB", TP_SETTING_INT, TP_SCOPE_USER, 0, KB_MAX, 0, NULL, "64",
                               "shm backend: largest all-reduce in KiB done in one shot (experiments)"},
    [TP_SET_SHM_CMA] = {"TENSORPAR_SHM_CMA", TP_SETTING_BOOL, TP_SCOPE_USER, 0, 0, 0, NULL, "1",
                        "shm backend: single-copy collectives through process_vm_readv"},
    [TP_SET_SHM_CMA_KB] = {"TENSORPAR_SHM_CMA_KB", TP_SETTING_INT, TP_SCOPE_USER, 0, KB_MAX, 0, NULL, "16",
                           "shm backend: smallest collective in KiB that reads the peers' buffers directly"},
    [TP_SET_RENDEZVOUS] = {"TENSORPAR_RENDEZVOUS", TP_SETTING_STRING, TP_SCOPE_INTERNAL, 0, 0, 0, NULL, "",
                           "the job's name, which tells concurrent jobs' shared memory apart"},
    [TP_SET_SHM_FD] = {"TENSORPAR_SHM_FD", TP_SETTING_INT, TP_SCOPE_INTERNAL, 0, 1e6, 0, NULL, "",
                       "the shared-memory segment the launcher's ranks inherit"},
    [TP_SET_KERNEL] = {"TENSORPAR_KERNEL", TP_SETTING_STRING, TP_SCOPE_REMOVED, 0, 0, 0, NULL, "",
                       "TENSORPAR_ISA=scalar|avx2|avx512|amx replaces it"},
    [TP_SET_AMX] = {"TENSORPAR_AMX", TP_SETTING_STRING, TP_SCOPE_REMOVED, 0, 0, 0, NULL, "",
                    "TENSORPAR_ISA=scalar|avx2|avx512|amx replaces it"},
};

typedef struct {
    tp_setting_value v[TP_SET_COUNT];
    char err[TP_SET_COUNT][256];   /* "" when the variable's value is good */
    int set[TP_SET_COUNT];
} settings_state;

static settings_state g_state;   /* written under pthread_once (and reload), read after */
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

const tp_setting_info *tp_setting_info_of(tp_setting_id id)
{
    return (unsigned)id < TP_SET_COUNT ? &table[id] : NULL;
}

static void join_names(const char *const *names, char *buf, size_t cap)
{
    size_t used = 0;
    buf[0] = '\0';
    for (int i = 0; names[i] && used < cap; i++) {
        int n = snprintf(buf + used, cap - used, "%s%s", i ? "|" : "", names[i]);
        if (n < 0) break;
        used += (size_t)n;
    }
}

void tp_setting_range(tp_setting_id id, char *buf, size_t cap)
{
    const tp_setting_info *s = tp_setting_info_of(id);
    if (!cap) return;
    if (!s) { buf[0] = '\0'; return; }
    switch (s->type) {
    case TP_SETTING_BOOL: snprintf(buf, cap, "bool (0|1)"); break;
    case TP_SETTING_INT: snprintf(buf, cap, "int in [%.0f, %.0f]", s->lo, s->hi); break;
    case TP_SETTING_SECONDS:
        snprintf(buf, cap, "seconds in %c%.10g, %.10g]", s->lo_open ? '(' : '[', s->lo, s->hi);
        break;
    case TP_SETTING_ENUM: join_names(s->names, buf, cap); break;
    case TP_SETTING_STRING:
        if (s->names) join_names(s->names, buf, cap);   /* checked by its user, listed here */
        else snprintf(buf, cap, "%s", s->scope == TP_SCOPE_REMOVED ? "removed" : "string");
        break;
    }
}

static tp_status refuse(const tp_setting_info *s, tp_setting_id id, const char *text)
{
    char range[160];
    tp_setting_range(id, range, sizeof range);
    return tp_fail(TP_ERR_INVALID, "%s='%s' is not valid (allowed: %s)", s->name, text, range);
}

/* Only 0 and 1: a "yes" or "off" meant by one user and mistyped by another
 * is refused rather than guessed. */
static int parse_bool(const char *t, int *out)
{
    if (strcmp(t, "0") && strcmp(t, "1")) return 0;
    *out = t[0] == '1';
    return 1;
}

static tp_status parse_text(tp_setting_id id, const tp_setting_info *s, const char *t, tp_setting_value *out)
{
    char *end;
    switch (s->type) {
    case TP_SETTING_BOOL:
        return parse_bool(t, &out->b) ? TP_OK : refuse(s, id, t);
    case TP_SETTING_INT: {
        errno = 0;
        long v = strtol(t, &end, 10);
        if (errno || end == t || *end || v < s->lo || v > s->hi) return refuse(s, id, t);
        out->i = v;
        return TP_OK;
    }
    case TP_SETTING_SECONDS: {
        double v = strtod(t, &end);
        if (end == t || *end || !isfinite(v) || v < s->lo || v > s->hi || (s->lo_open && v == s->lo))
            return refuse(s, id, t);
        out->s = v;
        return TP_OK;
    }
    case TP_SETTING_ENUM:
        for (int i = 0; s->names[i]; i++)
            if (!strcmp(t, s->names[i])) { out->e = i; return TP_OK; }
        return refuse(s, id, t);
    case TP_SETTING_STRING:
        if (s->scope == TP_SCOPE_REMOVED)
            return tp_fail(TP_ERR_INVALID, "%s is no longer read (it is '%s'); %s (unset %s)", s->name, t, s->doc, s->name);
        out->str = t;
        return TP_OK;
    }
    return tp_fail(TP_ERR_INTERNAL, "%s: unknown setting type", s->name);
}

tp_status tp_setting_parse(tp_setting_id id, const char *text, tp_setting_value *out)
{
    const tp_setting_info *s = tp_setting_info_of(id);
    if (!s) return tp_fail(TP_ERR_INVALID, "no setting number %d", (int)id);
    memset(out, 0, sizeof *out);
    const char *d = s->dflt;
    /* The default is parsed like any text; "" (built in elsewhere) leaves zeros. */
    if (d[0] && parse_text(id, s, d, out) != TP_OK) return TP_ERR_INTERNAL;
    if (!text || !*text) return TP_OK;
    return parse_text(id, s, text, out);
}

static void read_all(void)
{
    for (int i = 0; i < TP_SET_COUNT; i++) {
        const char *text = getenv(table[i].name);
        g_state.set[i] = text && *text;
        g_state.err[i][0] = '\0';
        if (tp_setting_parse((tp_setting_id)i, text, &g_state.v[i]) != TP_OK) {
            snprintf(g_state.err[i], sizeof g_state.err[i], "%s", tp_error());
            tp_clear_error();
            tp_setting_parse((tp_setting_id)i, NULL, &g_state.v[i]);   /* the default */
        }
    }
}

static const settings_state *state(void)
{
    pthread_once(&g_once, read_all);
    return &g_state;
}

void tp_settings_reload(void)
{
    (void)state();
    read_all();
}

static const tp_setting_value *value(tp_setting_id id)
{
    static const tp_setting_value none;
    return (unsigned)id < TP_SET_COUNT ? &state()->v[id] : &none;
}

int tp_setting_bool(tp_setting_id id) { return value(id)->b; }
long tp_setting_int(tp_setting_id id) { return value(id)->i; }
double tp_setting_seconds(tp_setting_id id) { return value(id)->s; }
int tp_setting_enum(tp_setting_id id) { return value(id)->e; }
const char *tp_setting_string(tp_setting_id id) { return value(id)->str; }
int tp_setting_is_set(tp_setting_id id) { return (unsigned)id < TP_SET_COUNT && state()->set[id]; }

tp_status tp_setting_check(tp_setting_id id)
{
    if ((unsigned)id >= TP_SET_COUNT) return tp_fail(TP_ERR_INVALID, "no setting number %d", (int)id);
    const settings_state *st = state();
    return st->err[id][0] ? tp_fail(TP_ERR_INVALID, "%s", st->err[id]) : TP_OK;
}

tp_status tp_settings_check(void)
{
    for (int i = 0; i < TP_SET_COUNT; i++) {
        tp_status s = tp_setting_check((tp_setting_id)i);
        if (s) return s;
    }
    return TP_OK;
}
