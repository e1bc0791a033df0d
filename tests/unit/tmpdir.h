/* Temporary folders for tests/unit: the tests write made models, logs and
 * charts into a mkdtemp folder and remove the whole tree at the end. */
#ifndef TP_TEST_TMPDIR_H
#define TP_TEST_TMPDIR_H

#include <dirent.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

/* Removes dir and everything below it (a best effort: errors are ignored,
 * as a leftover in /tmp fails no test). */
static inline void remove_tree(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    char p[4096];
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        /* a path too long to name is left behind */
        if ((size_t)snprintf(p, sizeof p, "%s/%.255s", dir, e->d_name) >= sizeof p) continue;
        if (unlink(p) != 0) remove_tree(p);
    }
    closedir(d);
    rmdir(dir);
}

#endif
