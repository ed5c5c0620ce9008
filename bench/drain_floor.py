"""The floor of a drain in Python: the least a Python queue daemon must do a message.

``bench_drain`` prints it beside rqsys and task-spooler.  Each message is a
directory with a file in it, moved ``queue/ -> run/ -> done/`` by rename, as
rqsys moves it; its script is started with ``os.posix_spawn`` (glibc's
vfork: the caller waits for the exec, as rqsys's in-process start does),
its fd 3 a pipe read once the script has ended, its end seen on a pidfd in
epoll and reaped with ``waitpid``.  Nothing else: no timeline, stats, log,
search index, limits, retries, riders, leftovers or client socket.  So it
measures what any daemon written in Python pays for the moves and
the start alone, with the interpreter's own cost of the loop, on the same
file system and script as the rest of the bench.

:func:`drain_with_calls` is that floor again with the other system calls
rqsys's run path makes a message (its strace table): the script in a new
session with fd 4 on a second pipe, its fd 3 in the epoll too, its
timeline (``<msg>/timeline`` opened at the start, a line written then and
three at the end), a stats journal line and a log line for each event
(written once a turn), its process group signalled and ``wait4``'s rusage
at its end, and the daemon's ``/proc`` children read once (the leftovers
check); on ext4 without a journal, the state directories updated
synchronously (``chattr +D``) and a directory that grew in a rename
fsynced, as rqsys orders its renames there (``rqsys.store.dirsync``).
With as little Python as those calls need, it is the floor of a Python
daemon that keeps rqsys's features.
"""

from __future__ import annotations

import os
import select
import signal
import time
from pathlib import Path

from rqsys.fdclose import close_fds
from rqsys.store import dirsync

BATCH = 64  # epoll events taken a wait
APPEND = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC
PIPE = os.O_CLOEXEC | os.O_NONBLOCK


def prepare(root: Path, n: int) -> list[str]:
    """n message directories in ``root/queue`` (each with a ``msg`` file); their names."""
    for state in ("queue", "run", "done"):
        (root / state).mkdir(parents=True)
    names = [f"m{i:06d}" for i in range(n)]
    for name in names:
        (root / "queue" / name).mkdir()
        (root / "queue" / name / "msg").write_text("{}\n")
    return names


def drain(root: Path, names: list[str], script: Path, slots: int) -> None:
    """Run every message's script, ``slots`` at a time, moving each through the states."""
    que, run, done = (str(root / state) for state in ("queue", "run", "done"))
    epoll = select.epoll()
    running: dict[int, tuple[str, int, int]] = {}  # pidfd -> (name, pid, status pipe)
    todo = list(reversed(names))
    argv, env = [str(script)], dict(os.environ)
    while todo or running:
        while todo and len(running) < slots:
            name = todo.pop()
            os.rename(f"{que}/{name}", f"{run}/{name}")
            status_r, status_w = os.pipe2(PIPE)
            pid = os.posix_spawn(argv[0], argv, env,
                                 file_actions=[(os.POSIX_SPAWN_DUP2, status_w, 3)])
            os.close(status_w)
            pidfd = os.pidfd_open(pid)
            epoll.register(pidfd, select.EPOLLIN)
            running[pidfd] = (name, pid, status_r)
        for pidfd, _events in epoll.poll(-1, BATCH):
            name, pid, status_r = running.pop(pidfd)
            _read_status(status_r)
            os.waitpid(pid, 0)
            epoll.unregister(pidfd)
            os.close(pidfd)
            os.close(status_r)
            os.rename(f"{run}/{name}", f"{done}/{name}")
    epoll.close()


def _read_status(fd: int) -> bytes:
    try:
        return os.read(fd, 4096)
    except BlockingIOError:
        return b""


class _Calls:
    """The files and lines of :func:`drain_with_calls`: its stats journal, its
    log, the daemon's ``/proc`` children, and a turn's lines for the first two."""

    def __init__(self, root: Path) -> None:
        self.stats = os.open(root / "stats.log", APPEND, 0o644)
        self.log = os.open(root / "daemon.log", APPEND, 0o644)
        self.children = os.open(f"/proc/self/task/{os.getpid()}/children",
                                os.O_RDONLY | os.O_CLOEXEC)
        self.stat_lines: list[str] = []
        self.log_lines: list[str] = []
        self.ended: list[int] = []  # the ended runs' fds, closed as rqsys's FdBatch does
        self.watched: set[int] = set()  # the running scripts' status pipes in the epoll
        self.ordered = dirsync.unjournalled_ext4(root)
        self.sizes: dict[str, int] = {}  # ordered: a state directory's size after a rename
        for state in ("queue", "run", "done") if self.ordered else ():
            dirsync.set_dirsync(root / state)

    def rename(self, old: str, new: str) -> None:
        """A move, ordered as rqsys orders it on ext4 without a journal."""
        parent = os.path.dirname(new)
        if self.ordered and parent not in self.sizes:
            self.sizes[parent] = os.stat(parent).st_size
        os.rename(old, new)
        if self.ordered:
            size = os.stat(parent).st_size
            if size != self.sizes[parent]:
                fd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY)
                os.fsync(fd)
                os.close(fd)
                self.sizes[parent] = size

    def status_lines(self, fd: int, epoll: select.epoll) -> None:
        """A script's fd 3 lines, read as they come (rqsys reads them so); at
        its end of file the pipe is watched no more."""
        try:
            if os.read(fd, 4096):
                return
        except BlockingIOError:
            return
        epoll.unregister(fd)
        self.watched.discard(fd)

    def turn_ended(self) -> None:
        for fd, lines in ((self.stats, self.stat_lines), (self.log, self.log_lines)):
            if lines:
                os.write(fd, "".join(lines).encode())
                lines.clear()
        fds, self.ended = self.ended, []
        close_fds(fds)  # each run of consecutive numbers in one close_range(2)

    def close(self) -> None:
        for fd in (self.stats, self.log, self.children):
            os.close(fd)


def drain_with_calls(root: Path, names: list[str], script: Path, slots: int) -> None:
    """:func:`drain`, with the other system calls of rqsys's run path (the module's docstring)."""
    que, run, done = (str(root / state) for state in ("queue", "run", "done"))
    epoll, calls = select.epoll(), _Calls(root)
    running: dict[int, tuple[str, int, int, int, int, float]] = {}  # pidfd -> its run
    todo, argv, env = list(reversed(names)), [str(script)], dict(os.environ)
    while todo or running:
        while todo and len(running) < slots:
            name = todo.pop()
            calls.rename(f"{que}/{name}", f"{run}/{name}")
            pidfd, run_fds = _start(argv, env, epoll)
            calls.watched.add(run_fds[1])
            timeline, at = os.open(f"{run}/{name}/timeline", APPEND, 0o644), time.time()
            os.write(timeline, f'{{"t":{at:.3f},"ev":"started","run":1}}\n'.encode())
            running[pidfd] = (name, *run_fds, timeline, at)
            calls.stat_lines.append(f'{{"k":"wait","t":{at:.3f},"v":0.001}}\n')
            calls.log_lines.append(f"q: {name}: started: pid {run_fds[0]}\n")
        for fd, _events in epoll.poll(-1, BATCH):
            if fd in running:
                _end(running.pop(fd), fd, f"{run}/", f"{done}/", calls)
            elif fd in calls.watched:  # a status pipe: its lines read as they come
                calls.status_lines(fd, epoll)
        calls.turn_ended()
    calls.close()
    epoll.close()


def _start(argv: list[str], env: dict[str, str], epoll: select.epoll
           ) -> tuple[int, tuple[int, int, int]]:
    """The script started in its own session, fd 3 and fd 4 on pipes; its
    pidfd and (pid, our end of fd 3, our end of fd 4)."""
    status_r, status_w = os.pipe2(PIPE)
    reply_r, reply_w = os.pipe2(PIPE)
    pid = os.posix_spawn(argv[0], argv, env, setsid=True,
                         file_actions=[(os.POSIX_SPAWN_DUP2, status_w, 3),
                                       (os.POSIX_SPAWN_DUP2, reply_r, 4)])
    os.close(status_w)
    os.close(reply_r)
    pidfd = os.pidfd_open(pid)
    epoll.register(pidfd, select.EPOLLIN)
    epoll.register(status_r, select.EPOLLIN)
    return pidfd, (pid, status_r, reply_w)


def _end(ran: tuple[str, int, int, int, int, float], pidfd: int, run: str, done: str,
         calls: _Calls) -> None:
    """The ended script's group signalled, it reaped, its lines read, the
    leftovers check's read, ``run/ -> done/``, its lines; its fds left to close."""
    name, pid, status_r, reply_w, timeline, began = ran
    calls.watched.discard(status_r)  # out of the epoll when closed
    os.killpg(pid, signal.SIGTERM)
    _pid, _status, usage = os.wait4(pid, 0)
    _read_status(status_r)
    os.pread(calls.children, 4096, 0)
    calls.rename(run + name, done + name)
    at = time.time()
    os.write(timeline, (f'{{"t":{at:.3f},"ev":"status","text":"done"}}\n'
                        f'{{"t":{at:.3f},"ev":"exit","exit_status":0,"run_s":{at - began:.3f},'
                        f'"utime_s":{usage.ru_utime:.3f},"maxrss_kb":{usage.ru_maxrss}}}\n'
                        f'{{"t":{at:.3f},"ev":"done"}}\n').encode())
    calls.stat_lines.append(f'{{"k":"run","t":{at:.3f},"v":{at - began:.3f}}}\n'
                            f'{{"k":"done","t":{at:.3f}}}\n')
    calls.log_lines.append(f"q: {name}: done: done\n")
    calls.ended += (pidfd, status_r, reply_w, timeline)
