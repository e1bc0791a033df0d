/* tensorpar/settings.h — every TENSORPAR_* environment variable, declared once.
 *
 * The table in src/base/settings.c gives each knob its name, type, range,
 * default, scope and a one-line doc.  The environment is parsed once per
 * process (pthread_once); a bad value is always an error that names the
 * variable, the value and what is allowed.  Getters never fail: a bad or
 * unset variable reads as its default, and tp_setting_check() (one knob) or
 * tp_settings_check() (all) returns the error.  The library reads the table
 * only in one function per options struct (tp_model_options_from_env,
 * tp_kernel_options_from_env, tp_comm_options_from_env), which return that
 * error, and for the process-wide knobs: TENSORPAR_ISA (kernels/isa.c),
 * TENSORPAR_NO_VNNI (kernels/cpu.c) and TENSORPAR_LOG (base/log.c).  `tensorpar --help-env` prints the table.
 */
#ifndef TENSORPAR_SETTINGS_H
#define TENSORPAR_SETTINGS_H

#include "tensorpar/base.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    TP_SETTING_BOOL,     /* 0 or 1                                             */
    TP_SETTING_INT,      /* a decimal integer in [lo, hi]                      */
    TP_SETTING_SECONDS,  /* a decimal number of seconds in [lo, hi] (or (lo, hi]) */
    TP_SETTING_ENUM,     /* one of a list of names; read as the name's index   */
    TP_SETTING_STRING    /* any text; its user checks it                       */
} tp_setting_type;

typedef enum {
    TP_SCOPE_USER,       /* a knob for users                                   */
    TP_SCOPE_INTERNAL,   /* set by tensorpar's own launcher for its ranks      */
    TP_SCOPE_REMOVED     /* no longer read; refused when set                   */
} tp_setting_scope;

typedef enum {
    TP_SET_ISA,
    TP_SET_NO_VNNI,
    TP_SET_BF16_DOT,
    TP_SET_BLAS,
    TP_SET_FUSE_NORM,
    TP_SET_LOG,
    TP_SET_PIN,
    TP_SET_BACKEND,
    TP_SET_COMM_TIMEOUT,
    TP_SET_HANG_TIMEOUT,
    TP_SET_SHM_SLOT_KB,
    TP_SET_SHM_ONESHOT_KB,
    TP_SET_SHM_CMA,
    TP_SET_SHM_CMA_KB,
    TP_SET_RENDEZVOUS,
    TP_SET_SHM_FD,
    TP_SET_KERNEL,
    TP_SET_AMX,
    TP_SET_COUNT
} tp_setting_id;

typedef struct {
    const char *name;             /* "TENSORPAR_..."                              */
    tp_setting_type type;
    tp_setting_scope scope;
    double lo, hi;                /* INT and SECONDS: the allowed range            */
    int lo_open;                  /* SECONDS: lo itself is not allowed             */
    const char *const *names;     /* ENUM: the names, NULL-terminated              */
    const char *dflt;             /* the default, as text ("" for none)            */
    const char *doc;              /* one line                                      */
} tp_setting_info;

/* A parsed value; which member holds it follows the type. */
typedef struct {
    int b;                        /* BOOL                                          */
    long i;                       /* INT                                           */
    double s;                     /* SECONDS                                       */
    int e;                        /* ENUM: index into names                        */
    const char *str;              /* STRING: the text (NULL when unset)            */
} tp_setting_value;

/* The table row of `id`; NULL when id is out of range. */
const tp_setting_info *tp_setting_info_of(tp_setting_id id);
/* The type and range as text, e.g. "seconds > 0", "int in [4, 1048576]",
 * "debug|info|warn|error". */
void tp_setting_range(tp_setting_id id, char *buf, size_t cap);
/* Parses `text` as the value of `id` (NULL or "": the default).  A bad
 * text: TP_ERR_INVALID, the message naming the variable, the value and
 * what is allowed. */
tp_status tp_setting_parse(tp_setting_id id, const char *text, tp_setting_value *out);

/* The process's values, from the environment as it was at the first call. */
int tp_setting_bool(tp_setting_id id);
long tp_setting_int(tp_setting_id id);
double tp_setting_seconds(tp_setting_id id);
int tp_setting_enum(tp_setting_id id);
const char *tp_setting_string(tp_setting_id id);   /* NULL when unset */
/* 1 when the variable is set (non-empty). */
int tp_setting_is_set(tp_setting_id id);
/* TP_OK, or the error for this variable's bad value (or, for a removed
 * knob, for its being set). */
tp_status tp_setting_check(tp_setting_id id);
/* The first error of any variable, in table order. */
tp_status tp_settings_check(void);
/* Re-reads the environment.  For tests that change it with setenv; not
 * safe while other threads read settings. */
void tp_settings_reload(void);

#ifdef __cplusplus
}
#endif

#endif
