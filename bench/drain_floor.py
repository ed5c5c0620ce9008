"""The floor of a drain in Python: the least a Python queue daemon must do a message.

``bench_drain`` prints it beside rqsys and task-spooler.  Each message is a
directory with a file in it, moved ``queue/ -> run/ -> done/`` by rename, as
rqsys moves it; its script is started with ``os.posix_spawn`` (glibc's
vfork: the caller waits for the exec, as rqsys's in-process start does),
its fd 3 a pipe read once the script has ended, its end seen on a pidfd in
epoll and reaped with ``waitpid``.  Nothing else: no timeline, stats, log,
search index, limits, retries, riders, leftovers or client socket.  So it
measures what any daemon written in Python pays for the durable moves and
the start alone, with the interpreter's own cost of the loop, on the same
file system and script as the rest of the bench.
"""

from __future__ import annotations

import os
import select
from pathlib import Path

BATCH = 64  # epoll events taken a wait


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
            status_r, status_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
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
