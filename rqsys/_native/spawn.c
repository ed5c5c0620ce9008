/* rq_spawn: start a queue script with its fds, session and signals set up
 * between vfork and exec, so no Python code ever runs in the child.
 *
 * The child shares the parent's memory until execve (vfork), so it only
 * makes system calls and stores one int; every signal is blocked across the
 * vfork and reset to SIG_DFL in the child before it is unblocked, so no
 * Python signal handler can run in the child. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>

#define RQ_FD_FLOOR 10

/* Move fd above the five fds the child will use, so dup2 cannot clobber it. */
static int lift(int fd)
{
    return fd < 0 ? fd : fcntl(fd, F_DUPFD, RQ_FD_FLOOR);
}

static void close_from(int first)
{
#ifdef SYS_close_range
    if (syscall(SYS_close_range, first, ~0U, 0) == 0)
        return;
#endif
    long max = sysconf(_SC_OPEN_MAX);
    for (int fd = first; fd < max; fd++)
        close(fd);
}

static void reset_signals(void)
{
    struct sigaction dfl = {0};
    dfl.sa_handler = SIG_DFL;
    for (int sig = 1; sig < _NSIG; sig++)
        sigaction(sig, &dfl, NULL);
}

static int child_setup(const char *cwd, int devnull, int out, int wfd, int rfd,
                       pid_t parent)
{
    if (setsid() < 0) return -1;
    if (prctl(PR_SET_PDEATHSIG, SIGTERM) < 0) return -1;
    if (getppid() != parent) return -1;   /* parent died before prctl */
    int d = lift(devnull), o = lift(out), w = lift(wfd), r = lift(rfd);
    if (d < 0 || o < 0 || w < 0 || r < 0) return -1;
    if (dup2(d, 0) < 0 || dup2(o, 1) < 0 || dup2(o, 2) < 0) return -1;
    if (dup2(w, 3) < 0 || dup2(r, 4) < 0) return -1;
    close_from(5);
    if (chdir(cwd) < 0) return -1;
    return 0;
}

/* Returns the child's pid, or -errno when the child could not exec. */
int rq_spawn(const char *path, char *const argv[], char *const envp[],
             const char *cwd, int devnull, int out, int wfd, int rfd)
{
    volatile int child_errno = 0;
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    pid_t parent = getpid();
    pid_t pid = vfork();
    if (pid == 0) {
        reset_signals();
        sigset_t none;
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
        if (child_setup(cwd, devnull, out, wfd, rfd, parent) == 0)
            execve(path, argv, envp);
        child_errno = errno ? errno : EINVAL;
        _exit(127);
    }
    int saved = errno;
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (pid < 0) return -saved;
    if (child_errno) {                      /* the child has exited with 127 */
        waitpid(pid, NULL, 0);
        return -child_errno;
    }
    return pid;
}

/* For the supervisor's own children (forked from Python): die with it. */
int rq_set_pdeathsig(int sig)
{
    return prctl(PR_SET_PDEATHSIG, sig);
}
