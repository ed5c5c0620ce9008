/* rqrelay: the relay queue's script, handing its message to the long-lived relay worker.
 *
 * Usage (as the relay queue's exec_prefix): rqrelay PYTHON relay.py
 *
 * When $RQ_RELAY_SOCKET names the worker's socket and it answers, this
 * process passes its fds 1 to 4 (output, RQ_WRITE, RQ_READ) and its
 * environment to the worker, which relays the message, writes the status
 * lines on our fd 3 itself, and finally sends "exit N\n": we exit N.  So a
 * relay costs the daemon one small exec instead of a Python start-up, and
 * RQ's process model stays: the worker sees our end of the connection close
 * when we are killed, and stops that message.
 *
 * Without a worker (no variable, no socket, a refused connection) or when
 * the worker goes away before answering, we exec PYTHON relay.py instead:
 * the same relay in a process of its own, which resumes from job/relay_id.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

extern char **environ;

static int fallback(char **argv)
{
    if (argv[1] == NULL) {
        fprintf(stderr, "rqrelay: usage: rqrelay PYTHON relay.py\n");
        return 127;
    }
    execv(argv[1], argv + 1);
    fprintf(stderr, "rqrelay: cannot run %s: %s\n", argv[1], strerror(errno));
    return 127;
}

static int connect_worker(void)
{
    const char *path = getenv("RQ_RELAY_SOCKET");
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    if (path == NULL || *path == '\0' || strlen(path) >= sizeof(addr.sun_path))
        return -1;
    strcpy(addr.sun_path, path);
    int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (s < 0)
        return -1;
    if (connect(s, (struct sockaddr *)&addr, sizeof(addr)) < 0) {
        close(s);
        return -1;
    }
    return s;
}

/* The environment as NUL-terminated strings, one after the other. */
static char *environ_block(size_t *size)
{
    size_t total = 0;
    for (char **e = environ; *e; e++)
        total += strlen(*e) + 1;
    char *block = malloc(total ? total : 1), *at = block;
    if (block == NULL)
        return NULL;
    for (char **e = environ; *e; e++) {
        size_t n = strlen(*e) + 1;
        memcpy(at, *e, n);
        at += n;
    }
    *size = total;
    return block;
}

/* Header "RQRELAY1 <size>\n" with fds 1-4 attached, then the environment. */
static int send_request(int s)
{
    size_t size = 0;
    char *block = environ_block(&size);
    if (block == NULL)
        return -1;
    char head[64];
    int hlen = snprintf(head, sizeof(head), "RQRELAY1 %zu\n", size);
    int fds[4] = {1, 2, 3, 4};
    char control[CMSG_SPACE(sizeof(fds))];
    memset(control, 0, sizeof(control));
    struct iovec iov = {.iov_base = head, .iov_len = (size_t)hlen};
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = control,
                         .msg_controllen = sizeof(control)};
    struct cmsghdr *cmsg = CMSG_FIRSTHDR(&msg);
    cmsg->cmsg_level = SOL_SOCKET;
    cmsg->cmsg_type = SCM_RIGHTS;
    cmsg->cmsg_len = CMSG_LEN(sizeof(fds));
    memcpy(CMSG_DATA(cmsg), fds, sizeof(fds));
    int rc = sendmsg(s, &msg, MSG_NOSIGNAL) == hlen ? 0 : -1;
    for (size_t done = 0; rc == 0 && done < size;) {
        ssize_t n = send(s, block + done, size - done, MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            rc = -1;
        else
            done += (size_t)n;
    }
    free(block);
    return rc;
}

/* The exit code in "exit N\n", or -1 when the worker went away without one. */
static int read_exit(int s)
{
    char line[32];
    size_t len = 0;
    while (len < sizeof(line) - 1) {
        ssize_t n = read(s, line + len, sizeof(line) - 1 - len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return -1;
        len += (size_t)n;
        line[len] = '\0';
        if (strchr(line, '\n') != NULL)
            break;
    }
    int code;
    if (sscanf(line, "exit %d", &code) != 1 || code < 0 || code > 255)
        return -1;
    return code;
}

int main(int argc, char **argv)
{
    (void)argc;
    int s = connect_worker();
    if (s < 0)
        return fallback(argv);
    if (send_request(s) < 0) {
        close(s);
        return fallback(argv);
    }
    int code = read_exit(s);
    close(s);
    return code < 0 ? fallback(argv) : code;
}
