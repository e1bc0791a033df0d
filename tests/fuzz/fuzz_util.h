/* Shared helpers of the libFuzzer harnesses: a private scratch folder for
 * harnesses whose entry points take paths, and small input splitters. */
#ifndef TP_FUZZ_UTIL_H
#define TP_FUZZ_UTIL_H

#include <stddef.h>
#include <stdint.h>

/* The process's scratch folder (created on first use under $TMPDIR or /tmp,
 * removed with its files at exit). */
const char *fuzz_scratch_dir(void);
/* Writes data to <scratch>/<name>; returns the full path (static buffer per
 * call site is the caller's business: it is malloc'd, free() it).  Aborts
 * the harness on an I/O error: that is the machine's fault, not a finding. */
char *fuzz_write(const char *name, const uint8_t *data, size_t size);
/* A NUL-terminated malloc'd copy of data. */
char *fuzz_strndup(const uint8_t *data, size_t size);
/* Absolute path of a file in the source tree (TP_SOURCE_DIR is compiled in). */
char *fuzz_source_path(const char *rel);

#endif
