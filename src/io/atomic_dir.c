/* Directories that appear whole or not at all: a checkpoint is written
 * into a temporary directory beside its target, every file and the
 * directory are fsynced, and one rename makes it the target.
 *
 * Names beside the target "DIR" (same parent, so renames are atomic):
 *   .DIR.tmp-<pid>   being written; never loadable, removed on failure
 *                    and by the next save to DIR;
 *   .DIR.old-<pid>   the previous DIR while it is replaced without
 *                    RENAME_EXCHANGE (see commit).
 *
 * Crash windows of a commit over an existing DIR:
 *   before the exchange          DIR is the old checkpoint, complete;
 *   renameat2(RENAME_EXCHANGE)   atomic: DIR is the old or the new one;
 *   after it                     DIR is the new one; the old one sits under
 *                                the temporary name until it is removed.
 * Filesystems without RENAME_EXCHANGE (EINVAL/ENOSYS, e.g. NFS): DIR is
 * renamed to .DIR.old-<pid>, the new one renamed in, the old one removed.
 * Between the two renames DIR does not exist; tp_atomic_dir_recover (run
 * by every save and every resume) renames the aside copy back, so the
 * previous checkpoint is what loads. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "tensorpar/io.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#ifndef RENAME_EXCHANGE
#define RENAME_EXCHANGE (1 << 1)
#endif

/* parent and base name of path (trailing slashes ignored). */
static tp_status split_path(const char *path, char *parent, size_t pcap, char *base, size_t bcap)
{
    size_t n = strlen(path), b;
    while (n > 1 && path[n - 1] == '/') n--;
    for (b = n; b > 0 && path[b - 1] != '/'; b--) {}
    size_t pl = b > 1 ? b - 1 : b;   /* "/x" keeps "/", "a/x" keeps "a" */
    if (n == b || n - b >= bcap || pl + 2 > pcap) return tp_fail(TP_ERR_INVALID, "%s: bad directory name", path);
    memcpy(base, path + b, n - b);
    base[n - b] = 0;
    if (!strcmp(base, ".") || !strcmp(base, "..")) return tp_fail(TP_ERR_INVALID, "%s: bad directory name", path);
    if (pl == 0) strcpy(parent, ".");
    else { memcpy(parent, path, pl); parent[pl] = 0; }
    return TP_OK;
}

static tp_status mkdirs(const char *dir)
{
    char buf[4096];
    if (snprintf(buf, sizeof buf, "%s", dir) >= (int)sizeof buf) return tp_fail(TP_ERR_INVALID, "%s: path too long", dir);
    for (char *p = buf + 1;; p++) {
        char c = *p;
        if (c != '/' && c) continue;
        *p = 0;
        if (mkdir(buf, 0777) != 0 && errno != EEXIST) return tp_fail(TP_ERR_IO, "%s: %s", buf, strerror(errno));
        *p = c;
        if (!c) return TP_OK;
    }
}

tp_status tp_fsync_path(const char *path)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return tp_fail(TP_ERR_IO, "%s: %s", path, strerror(errno));
    int rc = fsync(fd), e = errno;
    close(fd);
    /* Some filesystems refuse fsync on a directory: nothing to flush there. */
    if (rc != 0 && e != EINVAL && e != EROFS) return tp_fail(TP_ERR_IO, "%s: fsync: %s", path, strerror(e));
    return TP_OK;
}

void tp_remove_tree(const char *path)
{
    DIR *d = opendir(path);
    if (!d) { unlink(path); return; }
    struct dirent *e;
    char sub[4096];
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        if (snprintf(sub, sizeof sub, "%s/%s", path, e->d_name) >= (int)sizeof sub) continue;
        struct stat st;
        if (lstat(sub, &st) == 0 && S_ISDIR(st.st_mode)) tp_remove_tree(sub);
        else unlink(sub);
    }
    closedir(d);
    rmdir(path);
}

static int is_dir(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

/* Every ".BASE.<kind>-<digits>" entry of parent, calling fn on its path. */
static void each_beside(const char *parent, const char *base, const char *kind, void (*fn)(const char *, void *),
                        void *ctx)
{
    char prefix[1024], full[4096];
    if (snprintf(prefix, sizeof prefix, ".%s.%s-", base, kind) >= (int)sizeof prefix) return;
    size_t pl = strlen(prefix);
    DIR *d = opendir(parent);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (strncmp(e->d_name, prefix, pl) || !e->d_name[pl] || strspn(e->d_name + pl, "0123456789") != strlen(e->d_name + pl))
            continue;
        if (snprintf(full, sizeof full, "%s/%s", parent, e->d_name) < (int)sizeof full) fn(full, ctx);
    }
    closedir(d);
}

static void remove_cb(const char *p, void *ctx) { (void)ctx; tp_remove_tree(p); }

static void restore_cb(const char *p, void *ctx)
{
    const char *target = ctx;
    if (!is_dir(target) && rename(p, target) == 0) return;
    tp_remove_tree(p);
}

tp_status tp_atomic_dir_recover(const char *target)
{
    char parent[4096], base[1024];
    tp_status s = split_path(target, parent, sizeof parent, base, sizeof base);
    if (s) return s;
    each_beside(parent, base, "old", restore_cb, (void *)target);
    each_beside(parent, base, "tmp", remove_cb, NULL);
    return TP_OK;
}

/* ".X.old-<pid>" of parent: X put back when missing; ".X.tmp-<pid>"
 * removed. */
tp_status tp_atomic_dir_recover_all(const char *parent)
{
    DIR *d = opendir(parent);
    if (!d) return errno == ENOENT ? TP_OK : tp_fail(TP_ERR_IO, "%s: %s", parent, strerror(errno));
    struct dirent *e;
    char full[4096], target[4096];
    while ((e = readdir(d))) {
        const char *n = e->d_name, *dot = strrchr(n, '.');
        if (n[0] != '.' || !dot || dot == n) continue;
        int old = !strncmp(dot, ".old-", 5), tmp = !strncmp(dot, ".tmp-", 5);
        if ((!old && !tmp) || !dot[5] || strspn(dot + 5, "0123456789") != strlen(dot + 5)) continue;
        if (snprintf(full, sizeof full, "%s/%s", parent, n) >= (int)sizeof full) continue;
        int len = (int)(dot - n) - 1;
        if (snprintf(target, sizeof target, "%s/%.*s", parent, len, n + 1) >= (int)sizeof target) continue;
        if (old) restore_cb(full, target);
        else tp_remove_tree(full);
    }
    closedir(d);
    return TP_OK;
}

tp_status tp_atomic_dir_begin(const char *target, char *tmp, size_t cap)
{
    char parent[4096], base[1024];
    tp_status s = split_path(target, parent, sizeof parent, base, sizeof base);
    if (!s) s = mkdirs(parent);
    if (!s) s = tp_atomic_dir_recover(target);
    if (s) return tp_fail_context(s, "saving to %s", target);
    if (snprintf(tmp, cap, "%s/.%s.tmp-%ld", parent, base, (long)getpid()) >= (int)cap)
        return tp_fail(TP_ERR_INVALID, "%s: path too long", target);
    if (mkdir(tmp, 0777) != 0) return tp_fail(TP_ERR_IO, "%s: %s", tmp, strerror(errno));
    return TP_OK;
}

tp_status tp_atomic_dir_commit(const char *tmp, const char *target)
{
    char parent[4096], base[1024], aside[4096];
    tp_status s = split_path(target, parent, sizeof parent, base, sizeof base);
    if (!s) s = tp_fsync_path(tmp);
    if (s) return s;
    if (!is_dir(target)) {
        if (rename(tmp, target) != 0) return tp_fail(TP_ERR_IO, "%s -> %s: %s", tmp, target, strerror(errno));
        return tp_fsync_path(parent);
    }
    if (renameat2(AT_FDCWD, tmp, AT_FDCWD, target, RENAME_EXCHANGE) == 0) {
        s = tp_fsync_path(parent);
        tp_remove_tree(tmp);   /* now the previous checkpoint */
        return s;
    }
    if (errno != EINVAL && errno != ENOSYS && errno != EOPNOTSUPP)
        return tp_fail(TP_ERR_IO, "%s <-> %s: %s", tmp, target, strerror(errno));
    if (snprintf(aside, sizeof aside, "%s/.%s.old-%ld", parent, base, (long)getpid()) >= (int)sizeof aside)
        return tp_fail(TP_ERR_INVALID, "%s: path too long", target);
    if (rename(target, aside) != 0) return tp_fail(TP_ERR_IO, "%s -> %s: %s", target, aside, strerror(errno));
    if (rename(tmp, target) != 0) {
        int e = errno;
        rename(aside, target);
        return tp_fail(TP_ERR_IO, "%s -> %s: %s", tmp, target, strerror(e));
    }
    s = tp_fsync_path(parent);
    tp_remove_tree(aside);
    return s;
}

void tp_atomic_dir_abort(const char *tmp)
{
    if (tmp && tmp[0]) tp_remove_tree(tmp);
}

tp_status tp_write_file_synced(const char *path, const void *data, size_t len)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
    if (fd < 0) return tp_fail(TP_ERR_IO, "%s: %s", path, strerror(errno));
    const char *p = data;
    size_t done = 0;
    int e = 0;
    while (done < len) {
        ssize_t w = write(fd, p + done, len - done);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) { e = w < 0 ? errno : EIO; break; }
        done += (size_t)w;
    }
    if (!e && fsync(fd) != 0) e = errno;
    if (close(fd) != 0 && !e) e = errno;
    return e ? tp_fail(TP_ERR_IO, "%s: write failed: %s", path, strerror(e)) : TP_OK;
}
