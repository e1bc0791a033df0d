/* Where a rank learns who it is: the job layout from explicit options or the
 * environment the launcher gave it (torchrun-style variables, mpirun's, or
 * none), and the options resolved: the backend, the timeouts and the
 * rendezvous name that tells concurrent jobs apart (tp-semantics §5.3). */
#include "comm_internal.h"
#include "shm.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

uint64_t tp_comm_hash(const void *data, size_t n, uint64_t seed)
{
    const unsigned char *p = data;
    uint64_t h = 1469598103934665603ull ^ seed;
    for (size_t i = 0; i < n; i++) {
        h ^= p[i];
        h *= 1099511628211ull;
    }
    return h;
}

/* Parses environment variable `name` as an integer >= lo; *present = 0 if
 * unset.  The message names the variable and its value. */
static tp_status env_int(const char *name, long lo, long *out, int *present)
{
    const char *s = getenv(name);
    *present = s != NULL && *s;
    if (!*present) return TP_OK;
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo)
        return tp_fail(TP_ERR_INVALID, "environment variable %s='%s' is not a valid %s", name, s,
                       lo > 0 ? "positive integer" : "non-negative integer");
    *out = v;
    return TP_OK;
}

/* RANK/WORLD_SIZE (torchrun-style), else OMPI_COMM_WORLD_* (mpirun), else 1. */
static tp_status read_layout(tp_comm_env *e, int *under_mpirun)
{
    long rank = 0, world = 1, lrank = -1, lsize = -1;
    int has_world, has_rank, has_lr, has_ls;
    tp_status st;
    if ((st = env_int("WORLD_SIZE", 1, &world, &has_world)) ||
        (st = env_int("RANK", 0, &rank, &has_rank)) ||
        (st = env_int("LOCAL_RANK", 0, &lrank, &has_lr)) ||
        (st = env_int("LOCAL_WORLD_SIZE", 1, &lsize, &has_ls)))
        return st;
    *under_mpirun = getenv("OMPI_COMM_WORLD_RANK") != NULL || getenv("PMIX_RANK") != NULL;
    if (!has_world && !has_rank && *under_mpirun) {
        if ((st = env_int("OMPI_COMM_WORLD_SIZE", 1, &world, &has_world)) ||
            (st = env_int("OMPI_COMM_WORLD_RANK", 0, &rank, &has_rank)) ||
            (st = env_int("OMPI_COMM_WORLD_LOCAL_RANK", 0, &lrank, &has_lr)) ||
            (st = env_int("OMPI_COMM_WORLD_LOCAL_SIZE", 1, &lsize, &has_ls)))
            return st;
    }
    if (has_world && world > 1 && !has_rank)
        return tp_fail(TP_ERR_INVALID, "WORLD_SIZE is %ld but RANK is not set", world);
    if (rank >= world)
        return tp_fail(TP_ERR_INVALID, "RANK=%ld must be smaller than WORLD_SIZE=%ld", rank, world);
    e->rank = (int)rank;
    e->world_size = (int)world;
    e->local_rank = has_lr ? (int)lrank : (int)rank;
    e->local_size = has_ls ? (int)lsize : (int)world;
    if (e->local_rank >= e->local_size)
        return tp_fail(TP_ERR_INVALID, "LOCAL_RANK=%d must be smaller than LOCAL_WORLD_SIZE=%d",
                       e->local_rank, e->local_size);
    return TP_OK;
}

tp_status tp_comm_job_layout(int *rank, int *world_size, int *local_rank, int *local_size)
{
    tp_comm_env e;
    int under_mpirun;
    memset(&e, 0, sizeof e);
    tp_status st = read_layout(&e, &under_mpirun);
    if (st) return st;
    if (rank) *rank = e.rank;
    if (world_size) *world_size = e.world_size;
    if (local_rank) *local_rank = e.local_rank;
    if (local_size) *local_size = e.local_size;
    return TP_OK;
}

static tp_status choose_backend(tp_comm_env *e, tp_backend b, int under_mpirun)
{
    if (b == TP_BACKEND_AUTO)
        b = under_mpirun ? TP_BACKEND_MPI : e->world_size > 1 ? TP_BACKEND_SHM : TP_BACKEND_SELF;
    if (b == TP_BACKEND_SHM && e->world_size == 1) b = TP_BACKEND_SELF;
    /* The shm backend's segment lives in this host's /dev/shm: ranks on
     * other hosts would wait for it until the timeout.  Say so at once. */
    if (b == TP_BACKEND_SHM && e->local_size < e->world_size)
        return tp_fail(TP_ERR_INVALID, "the shm backend needs every rank on one host, but this host runs %d of the "
                       "%d ranks (%s); start a job of several hosts with mpirun and the mpi backend",
                       e->local_size, e->world_size,
                       under_mpirun ? "OMPI_COMM_WORLD_LOCAL_SIZE" : "LOCAL_WORLD_SIZE");
    if (b == TP_BACKEND_SELF && e->world_size > 1)
        return tp_fail(TP_ERR_INVALID, "the self backend runs one rank, but WORLD_SIZE is %d",
                       e->world_size);
    if (!tp_backend_available(b))
        return tp_fail(TP_ERR_UNSUPPORTED, "this build of tensorpar has no %s backend",
                       tp_backend_name(b));
    e->backend = b;
    return TP_OK;
}

/* Keeps names usable in /dev/shm: anything odd becomes '_'. */
static void sanitize(char *s)
{
    for (; *s; s++)
        if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || (*s >= '0' && *s <= '9') ||
              *s == '-' || *s == '.'))
            *s = '_';
}

static void read_rendezvous(tp_comm_env *e, const tp_comm_options *o)
{
    const char *r = o->rendezvous;
    const char *addr = getenv("MASTER_ADDR"), *port = getenv("MASTER_PORT");
    e->rendezvous[0] = '\0';
    if (r && *r)
        snprintf(e->rendezvous, sizeof e->rendezvous, "%s", r);
    else if (addr && *addr && port && *port)
        /* torchrun without our launcher: MASTER_ADDR:MASTER_PORT names the
         * job; the segment name adds the uid. */
        snprintf(e->rendezvous, sizeof e->rendezvous, "m-%.80s-%.20s", addr, port);
    sanitize(e->rendezvous);
}

tp_status tp_comm_env_read(tp_comm_env *e, const tp_comm_options *given)
{
    memset(e, 0, sizeof *e);
    e->shm_fd = -1;
    tp_comm_options from_env;
    const tp_comm_options *o = given;
    tp_status st;
    if (!o && (st = tp_comm_options_from_env(&from_env))) return st;
    if (!o) o = &from_env;
    int under_mpirun = 0;
    if (o->world_size > 0 && o->rank >= 0) {
        if (o->rank >= o->world_size)
            return tp_fail(TP_ERR_INVALID, "rank %d must be smaller than world size %d", o->rank, o->world_size);
        e->rank = o->rank;
        e->world_size = o->world_size;
        e->local_rank = o->rank;
        e->local_size = o->world_size;
    } else if ((st = read_layout(e, &under_mpirun))) {
        return st;
    }
    if ((st = choose_backend(e, o->backend, under_mpirun)) || (st = tp_shm_settings_of(&o->shm, &e->shm)))
        return st;
    e->timeout_s = tp_comm_timeout_of(o);
    e->hang_s = tp_comm_hang_of(o);
    read_rendezvous(e, o);
    if (o->shm_fd > 0) e->shm_fd = o->shm_fd;
    return TP_OK;
}
