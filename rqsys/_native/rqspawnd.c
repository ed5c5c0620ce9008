/* rqspawnd: a queue daemon's fork server, so the daemon's loop never waits
 * for a script's exec.
 *
 * The daemon starts it once (``rqspawnd SOCKET_FD PAGE_FD ANSWER_FD
 * DAEMON_PID``: a SOCK_SEQPACKET unix socket, a memfd page for ``struct
 * slot``, a pipe for the answers) and sends it one message per start: a
 * header, the run's user ids, then NUL-terminated strings (the program's
 * path, argv, the cwd, envp), with the script's ends of its two pipes and,
 * when the daemon opened it, its output as SCM_RIGHTS.  The server starts the child exactly as the
 * in-process helper does (spawn.c, included below: the same set-up between
 * clone and exec) but with CLONE_PARENT: the script is the *daemon's* child,
 * so the daemon reaps it, reads its rusage, and the script's
 * PR_SET_PDEATHSIG follows the daemon, not this server.  The server waits
 * for the exec (CLONE_VFORK), then writes ``{id, pid, errno}`` on the answer
 * pipe: 12 bytes, atomic, so the daemon reads all that came in one read (and
 * opens the pidfd of its own child itself).  A failed child (errno set) has
 * exited; the daemon reaps it.
 *
 * It serves one start at a time, in the order sent: a start whose answer
 * never came (the server died) can only be the oldest unanswered one, and
 * it ran if and only if the shared page names it SLOT_EXECING.
 *
 * It resets its own signal dispositions at start-up, so its children have
 * none to reset; it exits when the daemon's end of the socket closes, and
 * dies with the daemon (PR_SET_PDEATHSIG). */
#include "spawn.c"

#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>

#define RQ_REQ_MAGIC 0x31535152u   /* "RQS1" */
#define RQ_REQ_MAX (192 * 1024)    /* the daemon starts larger requests itself */
#define RQ_MAX_FDS 3

struct rq_req {
    uint32_t magic, id;
    int32_t parent, nfds;      /* nfds: 2 (status write end, reply read end) or 3 (+ output) */
    int64_t as_limit;          /* RLIMIT_AS for the child, or -1 */
    uint32_t uid, gid;
    int32_t ngroups;           /* -1: no change of user; else that many uint32 groups follow */
    uint32_t argc, envc, pad;
};

struct rq_rep {
    uint32_t id;
    int32_t pid, err;
};

static char buf[RQ_REQ_MAX] __attribute__((aligned(16)));
static char *ptrs[RQ_REQ_MAX / 2 + 4];

/* The next NUL-terminated string at *at (below end), or NULL. */
static char *next_string(char **at, char *end)
{
    char *s = *at, *nul = s < end ? memchr(s, '\0', (size_t)(end - s)) : NULL;
    if (!nul) return NULL;
    *at = nul + 1;
    return s;
}

/* Fill ``c`` from the request in buf (n bytes) and its fds; EINVAL when malformed. */
static int parse(size_t n, const int *fds, int nfds, struct child *c, struct user *u)
{
    const struct rq_req *h = (const struct rq_req *)buf;
    if (n < sizeof *h || h->magic != RQ_REQ_MAGIC || h->nfds != nfds
        || (nfds != 2 && nfds != 3))
        return EINVAL;
    size_t groups = h->ngroups < 0 ? 0 : (size_t)h->ngroups;
    size_t strings = (size_t)h->argc + h->envc;
    if (groups > NGROUPS_MAX || strings + 4 > sizeof ptrs / sizeof ptrs[0]
        || sizeof *h + groups * 4 > n)
        return EINVAL;
    char *at = buf + sizeof *h + groups * 4, *end = buf + n;
    c->path = next_string(&at, end);
    for (size_t i = 0; i < h->argc; i++)
        if (!(ptrs[i] = next_string(&at, end))) return EINVAL;
    c->cwd = next_string(&at, end);
    for (size_t i = h->argc; i < strings; i++)
        if (!(ptrs[i + 1] = next_string(&at, end))) return EINVAL;
    if (!c->path || !c->cwd || h->argc == 0) return EINVAL;
    ptrs[h->argc] = ptrs[strings + 1] = NULL;
    c->argv = ptrs;
    c->envp = ptrs + h->argc + 1;
    c->wfd = fds[0];
    c->rfd = fds[1];
    c->out = nfds == 3 ? fds[2] : -1;
    c->parent = h->parent;
    c->as_limit = h->as_limit;
    if (h->ngroups >= 0) {
        *u = (struct user){h->uid, h->gid, h->ngroups,
                           (const unsigned int *)(buf + sizeof *h)};
        c->user = u;
    }
    return 0;
}

static ssize_t receive(int sock, int *fds, int *nfds)
{
    union { char space[CMSG_SPACE(sizeof(int) * RQ_MAX_FDS)]; struct cmsghdr align; } ctl;
    struct iovec iov = {buf, sizeof buf};
    struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1,
                       .msg_control = ctl.space, .msg_controllen = sizeof ctl.space};
    ssize_t n = recvmsg(sock, &m, MSG_CMSG_CLOEXEC);
    *nfds = 0;
    for (struct cmsghdr *cm = n >= 0 ? CMSG_FIRSTHDR(&m) : NULL; cm; cm = CMSG_NXTHDR(&m, cm))
        if (cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_RIGHTS) {
            int got = (int)((cm->cmsg_len - CMSG_LEN(0)) / sizeof(int));
            memcpy(fds + *nfds, CMSG_DATA(cm), sizeof(int) * (size_t)got);
            *nfds += got;
        }
    if (n >= 0 && (m.msg_flags & (MSG_TRUNC | MSG_CTRUNC))) {
        for (int i = 0; i < *nfds; i++) close(fds[i]);
        *nfds = -1;   /* a request cut short: answered EINVAL */
    }
    return n;
}

static int answer(int fd, uint32_t id, pid_t pid, int err)
{
    struct rq_rep rep = {id, pid, err};
    ssize_t sent;
    do sent = write(fd, &rep, sizeof rep); while (sent < 0 && errno == EINTR);
    return sent == (ssize_t)sizeof rep ? 0 : -1;
}

/* One request: start its child, answer, close what it brought.  The child
 * keeps the socket open until its exec (or exit): the daemon reads end of
 * file only once no child of the server can still exec. */
static int serve_one(int sock, int out, struct slot *slot, size_t n, int *fds, int nfds)
{
    struct child c = {0};
    struct user u;
    volatile int child_errno = 0;
    int err = nfds < 0 ? EINVAL : parse(n, fds, nfds, &c, &u);
    uint32_t id = n >= sizeof(struct rq_req) ? ((const struct rq_req *)buf)->id : 0;
    pid_t pid = 0;
    if (!err) {
        slot->pid = 0;
        slot->state = SLOT_NONE;
        slot->id = id;
        c.child_errno = &child_errno;
        c.keep = sock;
        c.slot = slot;
        pid = start_child(&c, NULL, CLONE_PARENT);
        err = pid < 0 ? errno : child_errno;
        if (pid < 0) pid = 0;
    }
    int failed = answer(out, id, pid, err);
    for (int i = 0; i < nfds; i++) close(fds[i]);
    return failed;
}

/* Every disposition back to the default, signals unblocked: the children
 * reset none.  SIGPIPE too: an answer pipe with no reader means the daemon
 * is gone, and the server goes with it. */
static void plain_signals(void)
{
    struct sigaction dfl = {0};
    dfl.sa_handler = SIG_DFL;
    for (int sig = 1; sig < _NSIG; sig++)
        sigaction(sig, &dfl, NULL);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    rq_reset_signals(0);
}

int main(int argc, char **argv)
{
    if (argc != 5) {
        fprintf(stderr, "usage: rqspawnd SOCKET_FD PAGE_FD ANSWER_FD DAEMON_PID\n");
        return 2;
    }
    int sock = atoi(argv[1]), page = atoi(argv[2]), out = atoi(argv[3]);
    pid_t daemon = (pid_t)atoi(argv[4]);
    if (prctl(PR_SET_PDEATHSIG, SIGKILL) < 0 || getppid() != daemon) return 1;
    struct slot *slot = mmap(NULL, sizeof *slot, PROT_READ | PROT_WRITE, MAP_SHARED, page, 0);
    if (slot == MAP_FAILED) {
        perror("rqspawnd: mmap");
        return 1;
    }
    close(page);
    fcntl(sock, F_SETFD, FD_CLOEXEC);
    fcntl(out, F_SETFD, FD_CLOEXEC);
    plain_signals();
    for (;;) {
        int fds[RQ_MAX_FDS], nfds;
        ssize_t n = receive(sock, fds, &nfds);
        if (n == 0) return 0;   /* the daemon closed its end */
        if (n < 0) {
            if (errno == EINTR) continue;
            perror("rqspawnd: recvmsg");
            return 1;
        }
        if (serve_one(sock, out, slot, (size_t)n, fds, nfds) < 0) {
            perror("rqspawnd: write");
            return 1;
        }
    }
}
