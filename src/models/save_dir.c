/* A checkpoint directory saved by all ranks at once, atomically: the
 * writer rank creates the temporary directory beside the target and tells
 * every rank its path; the ranks write into it; they agree on the outcome;
 * the writer renames it over the target, or removes it on failure (the
 * target untouched).  tp_atomic_dir_* (io/atomic_dir.c) states the crash
 * windows.
 *
 * into_existing (the final model in a training run's output directory,
 * beside its log and checkpoints): the directory cannot be replaced whole,
 * so the previous model's files are removed and the new ones renamed in
 * one by one, the index (or the single file) and config.json last.  A
 * crash in that window can leave an incomplete final model; the training
 * checkpoints beside it are whole directories and stay intact. */
#include "tensorpar/module.h"
#include "tensorpar/comm.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

tp_status tp_save_dir_begin(tp_group *g, int writer, const char *target, char *tmp, size_t cap)
{
    int me = g ? tp_group_rank(g) : 0;
    char path[4096] = {0};
    tp_status s = me == writer ? tp_atomic_dir_begin(target, path, sizeof path) : TP_OK;
    s = tp_comm_agree(g, s);
    if (!s && g && tp_group_size(g) > 1) s = tp_comm_broadcast(g, path, sizeof path, TP_U8, writer);
    if (s) return s;
    path[sizeof path - 1] = 0;
    if (snprintf(tmp, cap, "%s", path) >= (int)cap) return tp_fail(TP_ERR_INVALID, "%s: path too long", path);
    return TP_OK;
}

static int is_model_file(const char *n)
{
    size_t l = strlen(n);
    if (!strcmp(n, "model.safetensors") || !strcmp(n, "model.safetensors.index.json")) return 1;
    return !strncmp(n, "model-", 6) && l > 12 && !strcmp(n + l - 12, ".safetensors") && strstr(n, "-of-");
}

/* Files of tmp whose move comes last: what makes the directory load. */
static int moved_last(const char *n)
{
    return !strcmp(n, "model.safetensors") || !strcmp(n, "model.safetensors.index.json") || !strcmp(n, "config.json");
}

static tp_status move_pass(const char *tmp, const char *target, int last)
{
    DIR *d = opendir(tmp);
    if (!d) return tp_fail(TP_ERR_IO, "%s: %s", tmp, strerror(errno));
    struct dirent *e;
    char from[4096], to[4096];
    tp_status s = TP_OK;
    while (!s && (e = readdir(d))) {
        if (e->d_name[0] == '.' || moved_last(e->d_name) != last) continue;
        snprintf(from, sizeof from, "%s/%s", tmp, e->d_name);
        snprintf(to, sizeof to, "%s/%s", target, e->d_name);
        if (rename(from, to) != 0) s = tp_fail(TP_ERR_IO, "%s -> %s: %s", from, to, strerror(errno));
    }
    closedir(d);
    return s;
}

static tp_status merge_into(const char *tmp, const char *target)
{
    tp_status s = tp_fsync_path(tmp);
    DIR *d = s ? NULL : opendir(target);
    if (!s && !d) {
        if (errno != ENOENT) return tp_fail(TP_ERR_IO, "%s: %s", target, strerror(errno));
        if (rename(tmp, target) != 0) return tp_fail(TP_ERR_IO, "%s -> %s: %s", tmp, target, strerror(errno));
        return TP_OK;
    }
    if (s) return s;
    struct dirent *e;
    char path[4096];
    while ((e = readdir(d)))
        if (is_model_file(e->d_name)) {
            snprintf(path, sizeof path, "%s/%s", target, e->d_name);
            unlink(path);
        }
    closedir(d);
    if (!(s = move_pass(tmp, target, 0))) s = move_pass(tmp, target, 1);
    if (!s) s = tp_fsync_path(target);
    tp_remove_tree(tmp);
    return s;
}

tp_status tp_save_dir_end(tp_group *g, int writer, const char *tmp, const char *target, int into_existing,
                          tp_status s)
{
    int me = g ? tp_group_rank(g) : 0;
    s = tp_comm_agree(g, s);
    if (me == writer) {
        if (!s) s = into_existing ? merge_into(tmp, target) : tp_atomic_dir_commit(tmp, target);
        if (s) tp_atomic_dir_abort(tmp);
    }
    s = tp_comm_agree(g, s);
    return s ? tp_fail_context(s, "saving %s", target) : TP_OK;
}
