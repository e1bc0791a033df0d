/* Running gnuplot for the charts (benchmarks, loss curves): finding it,
 * quoting strings into a script, running a script with its complaints kept.
 * gnuplot is a dependency (gnuplot-nox), but a chart is never worth a
 * failed run, so callers treat its absence as a warning. */
#include "tensorpar/base.h"

#include <errno.h>
#include <fcntl.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

int tp_gnuplot_available(void)
{
    const char *path = getenv("PATH");
    if (!path) return 0;
    char dir[4096];
    while (*path) {
        size_t n = strcspn(path, ":");
        if (n > 0 && n < sizeof dir - 16) {
            memcpy(dir, path, n);
            snprintf(dir + n, sizeof dir - n, "/gnuplot");
            if (access(dir, X_OK) == 0) return 1;
        }
        path += n + (path[n] == ':');
    }
    return 0;
}

void tp_gnuplot_quote(FILE *f, const char *s)
{
    fputc('\'', f);
    for (; *s; s++) {
        if (*s == '\'') fputc('\'', f);   /* gnuplot doubles a quote inside '...' */
        fputc(*s, f);
    }
    fputc('\'', f);
}

/* posix_spawnp rather than system(): no shell between us and a path that
 * may hold quotes or spaces. */
int tp_gnuplot_run(const char *script, const char *output_path)
{
    posix_spawn_file_actions_t fa;
    if (posix_spawn_file_actions_init(&fa)) return -1;
    posix_spawn_file_actions_addopen(&fa, 1, output_path ? output_path : "/dev/null", O_WRONLY | O_CREAT | O_TRUNC,
                                     0644);
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
    char *argv[] = {"gnuplot", (char *)script, NULL};
    extern char **environ;
    pid_t pid;
    int rc = posix_spawnp(&pid, "gnuplot", &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    if (rc) return -1;
    int status;
    while (waitpid(pid, &status, 0) < 0)
        if (errno != EINTR) return -1;
    return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : -1;
}
