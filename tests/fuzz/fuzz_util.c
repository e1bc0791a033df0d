/* Scratch files for the harnesses.  The library's loaders take folders and
 * file names (as a user's model directory), so path-based harnesses write
 * each input to one fixed file in a private folder and load it from there:
 * that fuzzes exactly the code users run, mmap included. */
#include "fuzz_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <unistd.h>

static char scratch[512];

static void remove_scratch(void)
{
    DIR *d = opendir(scratch);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        char p[1024];
        snprintf(p, sizeof p, "%s/%s", scratch, e->d_name);
        unlink(p);
    }
    closedir(d);
    rmdir(scratch);
}

const char *fuzz_scratch_dir(void)
{
    if (scratch[0]) return scratch;
    const char *tmp = getenv("TMPDIR");
    snprintf(scratch, sizeof scratch, "%s/tp_fuzz_XXXXXX", tmp && tmp[0] ? tmp : "/tmp");
    if (!mkdtemp(scratch)) { perror("mkdtemp"); abort(); }
    atexit(remove_scratch);
    return scratch;
}

char *fuzz_write(const char *name, const uint8_t *data, size_t size)
{
    const char *dir = fuzz_scratch_dir();
    size_t n = strlen(dir) + strlen(name) + 2;
    char *path = malloc(n);
    if (!path) abort();
    snprintf(path, n, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f || (size && fwrite(data, 1, size, f) != size) || fclose(f) != 0) { perror(path); abort(); }
    return path;
}

char *fuzz_strndup(const uint8_t *data, size_t size)
{
    char *s = malloc(size + 1);
    if (!s) abort();
    if (size) memcpy(s, data, size);
    s[size] = '\0';
    return s;
}

char *fuzz_source_path(const char *rel)
{
    size_t n = strlen(TP_SOURCE_DIR) + strlen(rel) + 2;
    char *p = malloc(n);
    if (!p) abort();
    snprintf(p, n, "%s/%s", TP_SOURCE_DIR, rel);
    return p;
}
