/* The launcher: runs a program as N ranks (torchrun-style) and watches them.
 *
 * For the shm backend the launcher creates the job's shared segment itself,
 * unlinks its name at once and passes the open descriptor to the ranks
 * (TENSORPAR_SHM_FD): the segment then lives exactly as long as some rank
 * maps it, and nothing can be left behind in /dev/shm, whoever is killed.
 *
 * Signals are read through a signalfd (SIGCHLD for the ranks, SIGTERM,
 * SIGINT, SIGHUP for the launcher), which keeps the launcher free of
 * handlers and global flags.  Ranks get PR_SET_PDEATHSIG so that they die
 * with the launcher even when it is killed with SIGKILL.
 *
 * A rank that stops without exiting (SIGSTOP, a frozen cgroup) sends no
 * SIGCHLD the launcher acts on: for the shm backend the launcher also
 * watches the ranks' heartbeats in the segment (shm_heartbeat.c) and stops
 * the job when one is silent for TENSORPAR_HANG_TIMEOUT (plus a margin that
 * lets the waiting ranks report it first), wherever the others are (even
 * finished). */
#include "comm_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

#define DEFAULT_GRACE_S 2.0
#define WATCH_EVERY_MS 100
/* The ranks waiting for a frozen one notice it after TENSORPAR_HANG_TIMEOUT
 * and say what they waited for; the launcher is the backstop, for a rank
 * frozen where nobody waits for it, and acts a little later. */
#define WATCH_BACKSTOP_S 0.5

/* ---- environment for the ranks ---------------------------------------- */

static const char *const owned_vars[] = {
    "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
    "TENSORPAR_RENDEZVOUS", "TENSORPAR_BACKEND", "TENSORPAR_SHM_FD",
};
#define N_OWNED (sizeof owned_vars / sizeof owned_vars[0])

static int is_owned(const char *kv)
{
    for (size_t i = 0; i < N_OWNED; i++) {
        size_t n = strlen(owned_vars[i]);
        if (!strncmp(kv, owned_vars[i], n) && kv[n] == '=') return 1;
    }
    return 0;
}

/* The rank's environment: ours minus the variables we set, plus them.
 * Built before fork, since the child may only call async-signal-safe
 * functions if the caller has threads. */
typedef struct {
    char **envp;
    char vars[N_OWNED][256];
} rank_env;

static tp_status rank_env_build(rank_env *re, int rank, int n, const char *rendezvous,
                                tp_backend backend, int fd)
{
    size_t count = 0;
    while (environ[count]) count++;
    re->envp = malloc((count + N_OWNED + 1) * sizeof(char *));
    if (!re->envp) return tp_fail(TP_ERR_NOMEM, "out of memory");
    size_t k = 0;
    for (size_t i = 0; i < count; i++)
        if (!is_owned(environ[i])) re->envp[k++] = environ[i];
    snprintf(re->vars[0], 256, "RANK=%d", rank);
    snprintf(re->vars[1], 256, "WORLD_SIZE=%d", n);
    snprintf(re->vars[2], 256, "LOCAL_RANK=%d", rank);
    snprintf(re->vars[3], 256, "LOCAL_WORLD_SIZE=%d", n);
    snprintf(re->vars[4], 256, "TENSORPAR_RENDEZVOUS=%s", rendezvous);
    snprintf(re->vars[5], 256, "TENSORPAR_BACKEND=%s", tp_backend_name(backend));
    snprintf(re->vars[6], 256, "TENSORPAR_SHM_FD=%d", fd);
    for (size_t i = 0; i < N_OWNED; i++)
        if (i != 6 || fd >= 0) re->envp[k++] = re->vars[i];
    re->envp[k] = NULL;
    return TP_OK;
}

/* A job name no other job (of any user, at any time) shares. */
static tp_status make_rendezvous(char *buf, size_t cap)
{
    uint64_t r;
    if (getrandom(&r, sizeof r, 0) != (ssize_t)sizeof r)
        r = tp_comm_hash(&buf, sizeof buf, (uint64_t)getpid() ^ (uint64_t)(tp_now() * 1e9));
    snprintf(buf, cap, "j%d-%016llx", (int)getpid(), (unsigned long long)r);
    return TP_OK;
}

/* ---- children ------------------------------------------------------------ */

typedef struct {
    pid_t pid;
    int alive;
    int ended;          /* reaped in the current look; status is valid */
    int status;
} child;

typedef struct {
    const char *name;            /* message prefix                     */
    const char *what;            /* "rank" or "mpirun"                 */
    child *kids;
    int n, running;
    int stopping, killed;
    double kill_at, grace;
    int exit_code;
    sigset_t old_mask;
    tp_shm_watch *watch;         /* the ranks' heartbeats, or NULL     */
    double hang_s;               /* 0: no heartbeat check              */
} job;

static void start_child(job *j, int i, const char *path, char *const argv[], char **envp, pid_t parent)
{
    pid_t pid = fork();
    if (pid != 0) {
        j->kids[i].pid = pid;
        j->kids[i].alive = pid > 0;
        return;
    }
    /* Child: die with the launcher, even if it is SIGKILLed. */
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);
    sigprocmask(SIG_SETMASK, &j->old_mask, NULL);
    execvpe(path, argv, envp);
    const char *msg = strerror(errno);
    (void)!write(2, j->name, strlen(j->name));
    (void)!write(2, ": cannot run ", 13);
    (void)!write(2, path, strlen(path));
    (void)!write(2, ": ", 2);
    (void)!write(2, msg, strlen(msg));
    (void)!write(2, "\n", 1);
    _exit(127);
}

static void signal_all(job *j, int sig)
{
    for (int i = 0; i < j->n; i++)
        if (j->kids[i].alive) kill(j->kids[i].pid, sig);
}

static void begin_stop(job *j)
{
    if (j->stopping) return;
    j->stopping = 1;
    j->kill_at = tp_now() + j->grace;
    signal_all(j, SIGTERM);
    /* A stopped rank would keep its SIGTERM pending until the SIGKILL. */
    signal_all(j, SIGCONT);
}

static void describe_failure(job *j, int i, int status)
{
    char who[64], cause[128];
    int is_rank = !strcmp(j->what, "rank");
    if (is_rank) snprintf(who, sizeof who, "rank %d (pid %d)", i, (int)j->kids[i].pid);
    else snprintf(who, sizeof who, "%s (pid %d)", j->what, (int)j->kids[i].pid);
    if (WIFSIGNALED(status))
        snprintf(cause, sizeof cause, "was killed by signal %d (%s)", WTERMSIG(status), strsignal(WTERMSIG(status)));
    else
        snprintf(cause, sizeof cause, "exited with status %d", WEXITSTATUS(status));
    fprintf(stderr, "%s: %s %s%s\n", j->name, who, cause,
            is_rank && j->running > 0 && !j->stopping ? "; stopping the other ranks" : "");
}

/* Whether a child's end is news: a failure before we stopped the job, or a
 * signal we did not send (the cause, even if the job is stopping already
 * because a rank that noticed it exited first). */
static int is_news(const job *j, int status)
{
    if (WIFEXITED(status)) return WEXITSTATUS(status) != 0 && !j->stopping;
    int sig = WTERMSIG(status);
    return !(j->stopping && sig == SIGTERM) && !(j->killed && sig == SIGKILL);
}

static void reap(job *j)
{
    /* Ranks that notice a peer's death exit soon after it: when several
     * ended since the last look, the ones killed by a signal are told first,
     * as they are the cause. */
    for (int i = 0; i < j->n; i++) {
        child *c = &j->kids[i];
        c->ended = 0;
        if (!c->alive || waitpid(c->pid, &c->status, WNOHANG) != c->pid) continue;
        c->alive = 0;
        c->ended = 1;
        j->running--;
    }
    for (int pass = 0; pass < 2; pass++)
        for (int i = 0; i < j->n; i++) {
            child *c = &j->kids[i];
            if (!c->ended || WIFSIGNALED(c->status) != (pass == 0) || !is_news(j, c->status)) continue;
            if (!j->stopping)
                j->exit_code = WIFEXITED(c->status) ? WEXITSTATUS(c->status) : 128 + WTERMSIG(c->status);
            describe_failure(j, i, c->status);
            begin_stop(j);
        }
}

/* A rank whose heartbeat is silent is frozen: the job cannot go on. */
static void check_heartbeats(job *j)
{
    if (!j->watch || j->hang_s <= 0 || j->stopping) return;
    double now = tp_now();
    for (int i = 0; i < j->n; i++) {
        if (!j->kids[i].alive) continue;
        double silent = tp_shm_watch_silent(j->watch, i, (int)j->kids[i].pid, now);
        if (silent <= j->hang_s + WATCH_BACKSTOP_S) continue;
        fprintf(stderr, "%s: rank %d (pid %d) stopped responding (no heartbeat for %.1f s; "
                "TENSORPAR_HANG_TIMEOUT sets the limit); stopping the ranks\n", j->name, i,
                (int)j->kids[i].pid, silent);
        j->exit_code = 1;
        begin_stop(j);
        return;
    }
}

static void on_signal(job *j, int sig)
{
    if (sig == SIGCHLD) { reap(j); return; }
    if (j->stopping) {
        /* Asked twice: no more grace. */
        signal_all(j, SIGKILL);
        j->killed = 1;
        return;
    }
    fprintf(stderr, "%s: received %s; stopping the %s\n", j->name, strsignal(sig),
            strcmp(j->what, "rank") ? "job" : "ranks");
    j->exit_code = 128 + sig;
    /* mpirun forwards SIGTERM to its ranks itself. */
    begin_stop(j);
}

/* Waits for every child, stopping the rest on the first failure. */
static void watch(job *j, int sfd)
{
    while (j->running > 0) {
        int timeout_ms = j->watch && j->hang_s > 0 && !j->stopping ? WATCH_EVERY_MS : -1;
        if (j->stopping && !j->killed) {
            double left = j->kill_at - tp_now();
            timeout_ms = left > 0 ? (int)(left * 1000) + 1 : 0;
        }
        struct pollfd pfd = {.fd = sfd, .events = POLLIN};
        int r = poll(&pfd, 1, timeout_ms);
        if (r > 0) {
            struct signalfd_siginfo si;
            while (read(sfd, &si, sizeof si) == (ssize_t)sizeof si) on_signal(j, (int)si.ssi_signo);
        }
        /* A SIGCHLD can be merged with another: reap on every wake-up. */
        reap(j);
        check_heartbeats(j);
        if (j->stopping && !j->killed && tp_now() >= j->kill_at) {
            signal_all(j, SIGKILL);
            j->killed = 1;
        }
    }
}

/* Forks all children (argv per child: the same), then watches them. */
static tp_status run_job(job *j, const char *path, char *const argv[], rank_env *envs, int *exit_code)
{
    sigset_t mask;
    sigemptyset(&mask);
    sigaddset(&mask, SIGCHLD);
    sigaddset(&mask, SIGTERM);
    sigaddset(&mask, SIGINT);
    sigaddset(&mask, SIGHUP);
    if (sigprocmask(SIG_BLOCK, &mask, &j->old_mask) != 0)
        return tp_fail(TP_ERR_INTERNAL, "sigprocmask: %s", strerror(errno));
    int sfd = signalfd(-1, &mask, SFD_NONBLOCK | SFD_CLOEXEC);
    if (sfd < 0) {
        sigprocmask(SIG_SETMASK, &j->old_mask, NULL);
        return tp_fail(TP_ERR_INTERNAL, "signalfd: %s", strerror(errno));
    }
    pid_t parent = getpid();
    j->running = 0;
    for (int i = 0; i < j->n; i++) {
        start_child(j, i, path, argv, envs[i].envp, parent);
        if (!j->kids[i].alive) {
            fprintf(stderr, "%s: fork failed: %s\n", j->name, strerror(errno));
            j->exit_code = 1;
            begin_stop(j);
            break;
        }
        tp_shm_watch_announce(j->watch, i, j->kids[i].pid);
        j->running++;
    }
    watch(j, sfd);
    close(sfd);
    sigprocmask(SIG_SETMASK, &j->old_mask, NULL);
    *exit_code = j->exit_code;
    return TP_OK;
}

/* ---- the two ways of launching ------------------------------------------ */

/* The ranks learn the segment's descriptor from TENSORPAR_SHM_FD, where 0
 * means none (tp_comm_options.shm_fd): a launcher started with stdin
 * closed moves it above the standard streams. */
static tp_status keep_above_stdio(int *fd)
{
    if (*fd > 2) return TP_OK;
    int moved = fcntl(*fd, F_DUPFD_CLOEXEC, 3);
    if (moved < 0) return tp_fail(TP_ERR_IO, "moving the shared memory's descriptor: %s", strerror(errno));
    close(*fd);
    *fd = moved;
    return TP_OK;
}

static tp_status launch_shm(const tp_launch_options *o, const char *path, char *const argv[], int *exit_code)
{
    int n = o->nprocs, fd = -1;
    char rendezvous[64];
    make_rendezvous(rendezvous, sizeof rendezvous);
    double hang_s = tp_comm_hang_of(o->comm);
    tp_shm_settings shm_cfg;
    tp_status st = tp_shm_settings_of(o->comm ? &o->comm->shm : NULL, &shm_cfg);
    if (st) return st;
    tp_shm_watch *watch = NULL;
    if (n > 1) {
        st = tp_shm_segment_create(rendezvous, n, &shm_cfg, &fd);
        if (st) return tp_fail_context(st, "creating the job's shared memory");
        char name[256];
        tp_shm_segment_name(name, sizeof name, rendezvous);
        shm_unlink(name);                      /* nothing to leave behind */
        st = keep_above_stdio(&fd);
        if (st) { close(fd); return st; }
        fcntl(fd, F_SETFD, 0);                 /* let the ranks inherit it */
        st = tp_shm_watch_open(fd, n, &watch);
    }
    rank_env *envs = calloc((size_t)n, sizeof *envs);
    child *kids = calloc((size_t)n, sizeof *kids);
    if (!envs || !kids) st = tp_fail(TP_ERR_NOMEM, "out of memory");
    for (int r = 0; r < n && st == TP_OK; r++)
        st = rank_env_build(&envs[r], r, n, rendezvous, n > 1 ? TP_BACKEND_SHM : TP_BACKEND_SELF, fd);
    if (st == TP_OK) {
        job j = {.name = o->name, .what = "rank", .kids = kids, .n = n,
                 .grace = o->kill_grace_s > 0 ? o->kill_grace_s : DEFAULT_GRACE_S,
                 .watch = watch, .hang_s = hang_s};
        st = run_job(&j, path, argv, envs, exit_code);
    }
    tp_shm_watch_close(watch);
    for (int r = 0; envs && r < n; r++) free(envs[r].envp);
    free(envs);
    free(kids);
    if (fd >= 0) close(fd);
    return st;
}

/* Count of TENSORPAR_* variables of this environment that mpirun must
 * pass on (with -x): ranks on other hosts, started through ssh, see only
 * what mpirun forwards.  Those the launcher owns are set by it. */
static size_t forwarded_settings(const char **names, char *buf, size_t cap)
{
    size_t n = 0, used = 0;
    for (int i = 0; environ[i]; i++) {
        const char *kv = environ[i], *eq = strchr(kv, '=');
        if (strncmp(kv, "TENSORPAR_", 10) || !eq || is_owned(kv)) continue;
        size_t len = (size_t)(eq - kv);
        if (names) {
            if (used + len + 1 > cap) break;
            memcpy(buf + used, kv, len);
            buf[used + len] = '\0';
            names[n] = buf + used;
            used += len + 1;
        }
        n++;
    }
    return n;
}

/* mpirun's command line: N ranks (on the hosts of o->hostfile, else here,
 * oversubscribed if need be), the mpi backend, the TENSORPAR_* settings,
 * then the program.  NULL when out of memory. */
static char **mpirun_argv(const tp_launch_options *o, const char *path, char *const argv[], char *nbuf,
                          char **names_buf)
{
    int argc = 0;
    while (argv[argc]) argc++;
    size_t nset = forwarded_settings(NULL, NULL, 0), k = 0, cap = 0;
    for (int i = 0; environ[i]; i++) cap += strlen(environ[i]) + 1;
    const char **names = calloc(nset + 1, sizeof *names);
    *names_buf = malloc(cap + 1);
    char **m = calloc(12 + 2 * nset + (size_t)argc, sizeof *m);
    if (!names || !*names_buf || !m) {
        free(names); free(*names_buf); free(m);
        *names_buf = NULL;
        return NULL;
    }
    nset = forwarded_settings(names, *names_buf, cap + 1);
    m[k++] = "mpirun";
    m[k++] = "-n";
    m[k++] = nbuf;
    if (o->hostfile) { m[k++] = "--hostfile"; m[k++] = (char *)o->hostfile; }
    else m[k++] = "--oversubscribe";   /* one host: as many ranks as asked */
    /* OpenMPI binds each rank to one core by default; a rank then runs one
     * thread.  tensorpar divides a host's cores among its ranks and pins
     * the threads itself (TENSORPAR_PIN). */
    m[k++] = "--bind-to";
    m[k++] = "none";
    m[k++] = "-x";
    m[k++] = "TENSORPAR_BACKEND=mpi";
    if (geteuid() == 0) m[k++] = "--allow-run-as-root";
    for (size_t i = 0; i < nset; i++) { m[k++] = "-x"; m[k++] = (char *)names[i]; }
    free(names);
    m[k++] = (char *)path;
    for (int i = 1; i < argc; i++) m[k++] = argv[i];
    return m;
}

static tp_status launch_mpi(const tp_launch_options *o, const char *path, char *const argv[], int *exit_code)
{
    char nbuf[16], *names = NULL;
    snprintf(nbuf, sizeof nbuf, "%d", o->nprocs);
    char **margv = mpirun_argv(o, path, argv, nbuf, &names);
    child kid = {0};
    rank_env env = {0};
    if (!margv) return tp_fail(TP_ERR_NOMEM, "out of memory");
    /* mpirun's own environment: no torchrun-style layout of an outer job. */
    tp_status st = rank_env_build(&env, 0, 1, "", TP_BACKEND_MPI, -1);
    if (st == TP_OK) {
        int k = 0;
        for (int i = 0; env.envp[i]; i++)
            if (!is_owned(env.envp[i]) || !strncmp(env.envp[i], "TENSORPAR_BACKEND=", 18)) env.envp[k++] = env.envp[i];
        env.envp[k] = NULL;
        job j = {.name = o->name, .what = "mpirun", .kids = &kid, .n = 1,
                 .grace = o->kill_grace_s > 0 ? o->kill_grace_s : DEFAULT_GRACE_S};
        st = run_job(&j, "mpirun", margv, &env, exit_code);
    }
    free(env.envp);
    free(margv);
    free(names);
    return st;
}

static tp_status launch_path(const tp_launch_options *o, const char *path, char *const argv[], int *exit_code)
{
    *exit_code = 1;
    if (!o || o->nprocs < 1) return tp_fail(TP_ERR_INVALID, "the number of ranks must be at least 1");
    if (!argv || !argv[0]) return tp_fail(TP_ERR_INVALID, "no program to launch");
    tp_launch_options opts = *o;
    if (!opts.name) opts.name = "tensorpar launch";
    if (opts.hostfile && opts.backend != TP_BACKEND_MPI)
        return tp_fail(TP_ERR_INVALID, "a hostfile needs the mpi backend: mpirun starts the ranks on other hosts");
    if (opts.backend == TP_BACKEND_MPI) {
        if (!tp_backend_available(TP_BACKEND_MPI))
            return tp_fail(TP_ERR_UNSUPPORTED, "this build of tensorpar has no mpi backend");
        return launch_mpi(&opts, path, argv, exit_code);
    }
    return launch_shm(&opts, path, argv, exit_code);
}

tp_status tp_launch(const tp_launch_options *opts, char *const argv[], int *exit_code)
{
    return launch_path(opts, argv ? argv[0] : NULL, argv, exit_code);
}

tp_status tp_launch_self_ex(const tp_launch_options *opts, char *const argv[], int *exit_code)
{
    *exit_code = 1;
    if (!opts) return tp_fail(TP_ERR_INVALID, "no launch options");
    char exe[PATH_MAX];
    ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (len <= 0) return tp_fail(TP_ERR_IO, "cannot find this program's path: %s", strerror(errno));
    exe[len] = '\0';
    tp_launch_options o = *opts;
    if (!o.name) o.name = "tensorpar";
    if (!argv || !argv[0]) return tp_fail(TP_ERR_INVALID, "no arguments to launch with");
    return launch_path(&o, exe, argv, exit_code);
}

tp_status tp_launch_self(int nprocs, tp_backend backend, char *const argv[], int *exit_code)
{
    tp_launch_options o = {.nprocs = nprocs, .backend = backend, .name = "tensorpar"};
    return tp_launch_self_ex(&o, argv, exit_code);
}

int tp_launch_in_job(void)
{
    /* WORLD_SIZE > 1 alone also counts: joining then fails with an error
     * naming RANK (§5.3, C8) instead of silently running a single process. */
    const char *ws = getenv("WORLD_SIZE");
    return (ws && *ws && (getenv("RANK") || strcmp(ws, "1"))) || getenv("OMPI_COMM_WORLD_RANK") != NULL;
}
