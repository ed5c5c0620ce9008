/* rq_start: start a queue script with its fds, session and signals set up
 * between clone and exec, so no Python code ever runs in the child.
 *
 * The child shares the parent's memory until execve (clone with CLONE_VM
 * and CLONE_VFORK, as vfork, on a stack of its own in the parent's frame),
 * so it only makes system calls and stores one int.  The child blocks every
 * signal as its first act and resets them to SIG_DFL before it unblocks
 * them, so no Python signal handler runs in it.  (The parent does not block
 * them around the clone, which cost two rt_sigprocmask calls a run: the only
 * signal that can reach the child before its first act is one sent to the
 * daemon's process group, which the daemon gets too, and all it can run there
 * is CPython's C-level handler, which sets the flag the daemon sets anyway
 * and writes a byte to its wake-up socket.)  CLONE_PIDFD hands back the
 * child's pidfd with its pid (no pidfd_open per run). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <sys/types.h>
#include <signal.h>
#include <unistd.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <grp.h>

#define RQ_FD_FLOOR 10
#define RQ_CHILD_STACK (64 * 1024)   /* the child's until execve: a few frames of syscalls */
#ifndef CLONE_PIDFD
#define CLONE_PIDFD 0x00001000
#endif

struct child {
    const char *path, *cwd;
    char *const *argv, *const *envp;
    int out, wfd, rfd;
    pid_t parent;
    long long as_limit;
    volatile int *child_errno;
    const struct user *user;   /* NULL: the script runs as the daemon does */
    int keep;                  /* an fd left open until exec (close-on-exec), or -1 */
    struct slot *slot;         /* where the child says how far it got, or NULL */
};

/* A fork server's page, shared with the daemon (rqspawnd.c): the kernel
 * writes the pid of start ``id``'s child before the child first runs, the
 * child SLOT_EXECING just before execve, or SLOT_FAILED and the errno when
 * it gives up.  Plain stores, each followed by a system call: the daemon
 * reads them to tell the child from what its scripts left behind, and once
 * the server died. */
struct slot {
    volatile unsigned int id;
    volatile int pid, state, err;
};
enum { SLOT_NONE, SLOT_EXECING, SLOT_FAILED };

/* Who a queue's script runs as when it is not the daemon's user (a queue's
 * "user", the daemon being root). */
struct user {
    unsigned int uid, gid;
    int ngroups;
    const unsigned int *groups;
};

/* Move fd above the five fds the child will use, so dup2 cannot clobber it
 * (one already above them, as a daemon's usually are, stays where it is). */
static int lift(int fd)
{
    return fd < 0 || fd > 4 ? fd : fcntl(fd, F_DUPFD, RQ_FD_FLOOR);
}

/* The signals whose disposition the child resets to SIG_DFL (bit sig-1):
 * every one unless told which are not at their default (rq_reset_signals):
 * a sigaction each is most of the child's system calls before exec, and
 * the daemon waits for its exec (CLONE_VFORK). */
static volatile unsigned long long reset_mask = ~0ULL;

void rq_reset_signals(unsigned long long mask)
{
    reset_mask = mask;
}

static void close_range_of(int first, unsigned int last)
{
#ifdef SYS_close_range
    if (syscall(SYS_close_range, first, last, 0) == 0)
        return;
#endif
    long max = sysconf(_SC_OPEN_MAX);
    for (long fd = first; fd < max && fd <= (long)last; fd++)
        close((int)fd);
}

/* Every fd from ``first`` up closed but ``keep`` (-1: none). */
static void close_from(int first, int keep)
{
    if (keep < first) {
        close_range_of(first, ~0U);
        return;
    }
    if (keep > first) close_range_of(first, (unsigned int)keep - 1);
    close_range_of(keep + 1, ~0U);
}

static void mark(struct slot *slot, int state, int err)
{
    if (!slot) return;
    slot->err = err;
    slot->state = state;
}

static void reset_signals(void)
{
    struct sigaction dfl = {0};
    dfl.sa_handler = SIG_DFL;
    unsigned long long mask = reset_mask;
    for (int sig = 1; sig < _NSIG; sig++)
        if (sig > 64 || (mask >> (sig - 1)) & 1)
            sigaction(sig, &dfl, NULL);
}

/* The child's stdout and stderr: ``out``, or (out < 0) stdio.log in its cwd. */
static int open_output(int out)
{
    if (out >= 0)
        return lift(out);
    return lift(open("stdio.log", O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644));
}

/* The pipes are made non-blocking for the daemon's ends; the script's ends
 * are other open files, so clearing the flag on them leaves ours as they are.
 * O_NONBLOCK is the only status flag pipe2 gave them (F_SETFL leaves the
 * access mode alone), so no F_GETFL first: one call fewer in the vfork. */
static int blocking(int fd)
{
    return fcntl(fd, F_SETFL, 0);
}

/* cwd is the run's job/ directory, made here when a spare did not bring it. */
static int enter(const char *cwd)
{
    if (chdir(cwd) == 0) return 0;
    if (errno != ENOENT || mkdir(cwd, 0777) < 0) return -1;
    return chdir(cwd);
}

/* memory_max without systemd: RLIMIT_AS, set before exec so it holds from
 * the script's first instruction (as_limit < 0: none). */
static int limit_memory(long long as_limit)
{
    if (as_limit < 0) return 0;
    struct rlimit now;
    if (getrlimit(RLIMIT_AS, &now) == 0 && now.rlim_max != RLIM_INFINITY
        && (rlim_t)as_limit > now.rlim_max)
        as_limit = (long long)now.rlim_max;   /* never above the hard limit: EPERM */
    struct rlimit lim = {(rlim_t)as_limit, (rlim_t)as_limit};
    return setrlimit(RLIMIT_AS, &lim);
}

/* Out of the daemon's process group while signals are still blocked, then
 * drop what was sent to that group meanwhile (setting SIG_IGN discards a
 * pending signal): a TERM or INT meant for the daemon's group (^C or a stop
 * of `rqsys serve`) must not kill a script it was just starting. */
static int leave_group(void)
{
    if (setsid() < 0) return -1;
    sigset_t pending;
    if (sigpending(&pending) < 0) return -1;
    struct sigaction ign = {0}, dfl = {0};
    ign.sa_handler = SIG_IGN;
    dfl.sa_handler = SIG_DFL;
    for (int sig = 1; sig < _NSIG; sig++)
        if (sigismember(&pending, sig) == 1) {
            sigaction(sig, &ign, NULL);
            sigaction(sig, &dfl, NULL);
        }
    return 0;
}

/* Become the queue's user: its job/ directory handed to it first (the
 * daemon made it), then groups, group and user, by raw system calls: glibc's
 * setuid() would have every thread of the daemon, whose memory this child
 * shares until exec, change its ids too. */
static int become(const struct user *u)
{
    if (!u) return 0;
    if (chown(".", u->uid, u->gid) < 0) return -1;
    if (syscall(SYS_setgroups, u->ngroups, u->groups) < 0) return -1;
    if (syscall(SYS_setresgid, u->gid, u->gid, u->gid) < 0) return -1;
    return syscall(SYS_setresuid, u->uid, u->uid, u->uid) < 0 ? -1 : 0;
}

/* The parent-death signal is set after the ids change: a change of
 * credentials clears it. */
static int child_setup(const struct child *c)
{
    if (limit_memory(c->as_limit) < 0) return -1;
    if (enter(c->cwd) < 0) return -1;
    int d = lift(open("/dev/null", O_RDONLY | O_CLOEXEC));
    int o = open_output(c->out), w = lift(c->wfd), r = lift(c->rfd);
    if (d < 0 || o < 0 || w < 0 || r < 0) return -1;
    if (blocking(w) < 0 || blocking(r) < 0) return -1;
    if (dup2(d, 0) < 0 || dup2(o, 1) < 0 || dup2(o, 2) < 0) return -1;
    if (dup2(w, 3) < 0 || dup2(r, 4) < 0) return -1;
    close_from(5, c->keep);
    if (become(c->user) < 0) return -1;
    if (prctl(PR_SET_PDEATHSIG, SIGTERM) < 0) return -1;
    return getppid() == c->parent ? 0 : -1;   /* parent died before prctl */
}

static int child_main(void *arg)
{
    struct child *c = arg;
    sigset_t all;
    sigfillset(&all);
    sigprocmask(SIG_SETMASK, &all, NULL);
    reset_signals();
    if (leave_group() == 0) {
        sigset_t none;
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
        if (child_setup(c) == 0) {
            mark(c->slot, SLOT_EXECING, 0);
            execve(c->path, c->argv, c->envp);
        }
    }
    int err = errno ? errno : EINVAL;
    *c->child_errno = err;
    mark(c->slot, SLOT_FAILED, err);
    _exit(127);
}

/* The parent is suspended until the child execs or exits (CLONE_VFORK), so
 * the child's stack can be an array in this frame.  With a slot (a fork
 * server's start) the kernel writes the child's pid there before the child
 * first runs (CLONE_PARENT_SETTID; the clone() wrapper takes one of it and
 * CLONE_PIDFD, which shares its argument). */
static pid_t start_child(struct child *c, int *pidfd, int flags)
{
    char stack[RQ_CHILD_STACK] __attribute__((aligned(16)));
    flags |= CLONE_VM | CLONE_VFORK | SIGCHLD;
    if (c->slot)
        return clone(child_main, stack + sizeof stack, flags | CLONE_PARENT_SETTID, c,
                     (pid_t *)&c->slot->pid);
    return clone(child_main, stack + sizeof stack, flags | (pidfd ? CLONE_PIDFD : 0), c, pidfd);
}

static void close_pair(int p[2])
{
    close(p[0]);
    close(p[1]);
}

/* Start a script: its pipes, the child, and a pidfd, in one call.
 * ``parent`` is the caller's pid (known to it; saves a getpid per run);
 * ``out`` < 0 makes the child open stdio.log in ``cwd`` itself.
 * On success returns the pid, with fds = {status read end (fd 3's other
 * end), reply write end (fd 4's other end), pidfd, and the script's own
 * ends of the two pipes}, all O_CLOEXEC and the first two non-blocking; on
 * failure -errno (exec failures included).  The script's ends are the
 * caller's to close: the child has them once this returns, and the daemon
 * holds them until the run ends, then closes them with the run's other fds
 * (made one after the other, they are neighbours: one close_range). */
static int start_limited(const char *path, char *const argv[], char *const envp[],
                         const char *cwd, int out, int parent, int fds[5],
                         long long as_limit, const struct user *user)
{
    int st[2], rp[2];
    if (pipe2(st, O_CLOEXEC | O_NONBLOCK) < 0) return -errno;
    if (pipe2(rp, O_CLOEXEC | O_NONBLOCK) < 0) {
        int saved = errno;
        close_pair(st);
        return -saved;
    }
    volatile int child_errno = 0;
    int pidfd = -1;
    struct child c = {path, cwd, argv, envp, out, st[1], rp[0], parent, as_limit,
                      &child_errno, user, -1, NULL};
    pid_t pid = start_child(&c, &pidfd, 0);
    int saved = errno;
    if (pid < 0 || child_errno) {
        close_pair(st);
        close_pair(rp);
        if (pid < 0) return -saved;
        waitpid(pid, NULL, 0);              /* the child has exited with 127 */
        close(pidfd);
        return -child_errno;
    }
    fds[0] = st[0];
    fds[1] = rp[1];
    fds[2] = pidfd;
    fds[3] = st[1];
    fds[4] = rp[0];
    return pid;
}

int rq_start(const char *path, char *const argv[], char *const envp[],
             const char *cwd, int out, int parent, int fds[5])
{
    return start_limited(path, argv, envp, cwd, out, parent, fds, -1, NULL);
}

/* rq_start with RLIMIT_AS = as_limit bytes in the child (a run's memory_max
 * where no systemd scope holds it); a limit that cannot be set fails the
 * start with its errno. */
int rq_start_as(const char *path, char *const argv[], char *const envp[],
                const char *cwd, int out, int parent, int fds[5], long long as_limit)
{
    return start_limited(path, argv, envp, cwd, out, parent, fds, as_limit, NULL);
}

/* rq_start_as whose script runs as user ``uid`` (group ``gid``, supplementary
 * ``groups``): the caller is root.  A change of ids that fails fails the
 * start with its errno: the script never runs as the daemon's user. */
int rq_start_user(const char *path, char *const argv[], char *const envp[],
                  const char *cwd, int out, int parent, int fds[5], long long as_limit,
                  unsigned int uid, unsigned int gid, int ngroups,
                  const unsigned int *groups)
{
    struct user u = {uid, gid, ngroups, groups};
    return start_limited(path, argv, envp, cwd, out, parent, fds, as_limit, &u);
}

/* For the supervisor's own children (forked from Python): die with it. */
int rq_set_pdeathsig(int sig)
{
    return prctl(PR_SET_PDEATHSIG, sig);
}
