"""The fork server: scripts started by a process of its own, so the loop never waits for an exec.

The in-process helper (:func:`rqsys.run.spawn.spawn`) starts a script with
vfork: the daemon is suspended until the script has exec'd, 250-450 us a
start on a busy 2-core host, one start after the other.  Here the daemon
makes the run's pipes, sends ``_native/rqspawnd`` a request (argv,
environment, cwd, memory limit, user; the script's pipe ends and output as
SCM_RIGHTS) and goes on.  The server starts the script with the same C code
as the helper, but as the *daemon's* child (CLONE_PARENT: the daemon reaps
it and reads its rusage; its parent-death signal follows the daemon), and
answers on a pipe with the child's pid (the daemon opens its pidfd: its own
unreaped child's pid is no one else's): an event, ``then(0)``, or why it did
not start, ``then(errno)`` (the daemon reaps the child).  The answers are
12 bytes each, so one read takes all that came.

A start the server cannot take (larger than REQUEST_MAX, the socket full,
no server) is made in process, as before (:meth:`ForkServer.begin` returns
None).

If the server dies, the socket reads end of file once every process that
held the server's end is gone: the server and a child it was starting,
which holds it until its exec closes it.  The starts in flight are then
settled by the page the server's children write in (``struct slot`` in
spawn.c).  The server starts one at a time, in the order sent, so only the
oldest unanswered start can have a child: it exec'd if the page names it
EXECING (the run goes on as an answered one would), and it did not if the
page names it FAILED (reaped) or another start.  Every other start in flight
never reached the server.  Those that did not exec are started again in
process (``again``): no message is started twice, and none is lost.  A new
server is started at once.
"""

from __future__ import annotations

import array
import errno
import mmap
import os
import selectors
import socket
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from rqsys.errors import SpawnError
from rqsys.fdclose import close_fds
from rqsys.run.spawn import Child, ExecFailed

REQUEST = struct.Struct("=IIiiqIIiIII")  # struct rq_req in rqspawnd.c
ANSWER = struct.Struct("=Iii")  # struct rq_rep: id, pid, errno
SLOT = struct.Struct("=Iiii")  # struct slot in spawn.c: id, pid, state, errno
MAGIC = 0x31535152  # "RQS1"
REQUEST_MAX = 192 * 1024  # rqspawnd.c's buffer; larger starts are made in process
ANSWERS_READ = ANSWER.size * 341  # whole answers only
EXECING = 1
PROGRAM = Path(__file__).resolve().parent.parent / "_native" / "rqspawnd"
PIPE_FLAGS = os.O_CLOEXEC | os.O_NONBLOCK

Then = Callable[[int], None]  # 0: started (the Child has its pid and pidfd); else errno
Again = Callable[[], Child]  # the start made in process (raises SpawnError)


@dataclass
class Pending:
    """A start sent to the server and not answered yet."""

    id: int
    child: Child  # its pipes; pid and pidfd once started
    out: int | None  # the script's output, ours to close once the start is settled
    then: Then
    again: Again


class ForkServer:
    """The daemon's end of one ``rqspawnd``: starts sent, answers taken as events."""

    def __init__(self, selector: selectors.BaseSelector, closing: Callable[[int], None],
                 warn: Callable[[str], None]) -> None:
        """``closing``: closes an fd with the turn's; ``warn``: says what went wrong."""
        self._selector, self._closing, self._warn = selector, closing, warn
        self._parent = os.getpid()
        self._sock: socket.socket | None = None
        self._answers = -1  # the answer pipe's read end (-1: at end of file, or none)
        self._page: mmap.mmap | None = None
        self._server_pid = 0
        self._next = 0
        self._pending: dict[int, Pending] = {}
        self._words: dict[tuple[str, ...], bytes] = {}  # argv -> its C strings, made once
        self.restarts = 0

    @property
    def running(self) -> bool:
        return self._sock is not None

    @property
    def pid(self) -> int:
        """The server's pid (0 before it started)."""
        return self._server_pid

    def start(self) -> bool:
        """Start the server (False, said, when it cannot be: starts stay in process)."""
        if not os.access(PROGRAM, os.X_OK):
            self._warn(f"no fork server ({PROGRAM} missing): scripts start in process")
            return False
        made: list[int] = []  # the server's ends, closed here once it has them
        answers = -1
        try:
            ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            made.append(theirs.detach())
            try:
                made.append(page := os.memfd_create("rqspawnd", os.MFD_CLOEXEC))
                answers, write_end = os.pipe2(os.O_CLOEXEC)
                made.append(write_end)
                os.ftruncate(page, mmap.PAGESIZE)
                self._page = mmap.mmap(page, mmap.PAGESIZE)
                self._server_pid = os.posix_spawn(  # dup2 onto itself: kept open by exec
                    str(PROGRAM), [str(PROGRAM), *map(str, made), str(self._parent)], {},
                    file_actions=[(os.POSIX_SPAWN_DUP2, fd, fd) for fd in made])
            except OSError:
                ours.close()
                close_fds([answers] if answers >= 0 else [])
                raise
        except OSError as exc:  # out of fds, or a system call filter refuses one
            self._warn(f"cannot start the fork server: {exc}; scripts start in process")
            return False
        finally:
            close_fds(made)
        ours.setblocking(False)
        os.set_blocking(answers, False)
        self._selector.register(ours, selectors.EVENT_READ, self._gone)
        self._selector.register(answers, selectors.EVENT_READ, self._ready)
        self._sock, self._answers = ours, answers
        return True

    def close(self) -> None:
        """The daemon stops: the server reads end of file and exits (starts in
        flight are not settled: the daemon stops with its scripts)."""
        if self._sock is not None:
            self._selector.unregister(self._sock)
            self._sock.close()
            self._sock = None
        if self._answers >= 0:
            self._selector.unregister(self._answers)
            os.close(self._answers)
            self._answers = -1

    def begin(self, program: str, argv: list[str], env: bytes, envc: int, cwd: str,
              out: int | None, as_limit: int, user: tuple[int, int, list[int]] | None,
              then: Then, again: Again) -> Child | None:
        """Send a start; its Child (pid 0 until ``then(0)``), or None: not taken
        (make it in process).  ``env``: NUL-terminated ``K=V`` strings, ``envc``
        of them; ``out`` is kept until the start is settled, then closed."""
        if self._sock is None:
            return None
        uid, gid, groups = user if user is not None else (0, 0, [])
        self._next = start = (self._next + 1) & 0xFFFFFFFF
        head = REQUEST.pack(MAGIC, start, self._parent, 2 if out is None else 3, as_limit,
                            uid, gid, -1 if user is None else len(groups), len(argv), envc, 0)
        parts = [head, struct.pack(f"={len(groups)}I", *groups), self._strings(program, argv),
                 os.fsencode(cwd) + b"\0", env]
        if sum(map(len, parts)) > REQUEST_MAX or not (pipes := _pipes()):
            return None  # too large, or out of fds: the helper's start says so
        status_r, status_w, reply_r, reply_w = pipes
        fds = [status_w, reply_r] if out is None else [status_w, reply_r, out]
        try:
            self._sock.sendmsg(parts, [(socket.SOL_SOCKET, socket.SCM_RIGHTS,
                                        array.array("i", fds))])
        except OSError:  # full (or the server is gone: its end of file settles the rest)
            close_fds(pipes)
            return None
        child = Child(0, -1, status_r, reply_w, (status_w, reply_r))
        self._pending[start] = Pending(start, child, out, then, again)
        return child

    def _strings(self, program: str, argv: list[str]) -> bytes:
        """The program's path and argv as C strings (the request has the cwd
        between them and the environment)."""
        key = (program, *argv)
        made = self._words.get(key)
        if made is None:
            if len(self._words) >= 64:
                self._words.clear()
            made = self._words[key] = b"\0".join(map(os.fsencode, key)) + b"\0"
        return made

    def children(self, unknown: list[int]) -> set[int]:
        """Which of the daemon's ``unknown`` children are the server's business,
        not what runs left behind: the server and the child it starts now (read
        in the page first: the kernel writes its pid there before it runs).
        When others are left, the answers written so far are taken: a script
        that started (and maybe ended) before its answer was read is then
        running, and one answered after the page was read is no longer the
        one it names."""
        if self._sock is None or self._page is None:
            return set()
        mine = {self._server_pid, SLOT.unpack_from(self._page, 0)[1]}
        if self._pending and not mine.issuperset(unknown):
            self._ready(None, 0)
        return mine

    # ------------------------------------------------------------ answers
    def _ready(self, _key: object, _mask: int) -> bool:
        """Take the answers that came (one read: they are whole, 12 bytes each);
        False when none came (or the pipe is closed)."""
        if self._answers < 0:
            return False
        try:
            data = os.read(self._answers, ANSWERS_READ)
        except BlockingIOError:
            return False
        if not data:  # the server is gone: its socket's end of file settles the rest
            self._selector.unregister(self._answers)
            os.close(self._answers)
            self._answers = -1
            return False
        for start, pid, err in ANSWER.iter_unpack(data):
            if (pending := self._pending.pop(start, None)) is not None:
                self._settle(pending, pid, err)
        return True

    def _settle(self, pending: Pending, pid: int, err: int) -> None:
        self._closing_out(pending)
        if err == 0 and pid > 0:
            pending.child.pid = pid
            try:
                pending.child.pidfd = os.pidfd_open(pid)  # ours, unreaped: no one else's pid
            except ProcessLookupError:  # ended, and reaped by another before this answer
                self._lost(pending.child)
            pending.then(0)
            return
        if pid > 0:
            self._reap(pid)
        pending.then(err or errno.EIO)

    def _lost(self, child: Child) -> None:
        """A script that ran and was reaped by another before its start was
        answered (seen once in 380,000 runs, by the leftovers' sweep, which
        now asks again first: ``Leftovers._started``; kept so that no such
        reaping can end the daemon): watched through an fd that reads as
        ended at once, its wait status lost, its lines its end."""
        child.pidfd, child.status_lost = os.eventfd(1, os.EFD_CLOEXEC), True
        self._warn(f"pid {child.pid} ended and was reaped before its start was answered: "
                   "its exit status is lost; its status lines decide its end")

    def _reap(self, pid: int) -> None:
        """Reap a child that did not exec once it is gone (it is exiting)."""
        try:
            pidfd = os.pidfd_open(pid)
        except OSError:
            return  # reaped already

        def reaped(_key: object, _mask: int) -> None:
            self._selector.unregister(pidfd)
            try:  # through its pidfd: its pid may be another child's by now
                os.waitid(os.P_PIDFD, pidfd, os.WEXITED | os.WNOHANG)
            except ChildProcessError:
                pass  # the leftovers' sweep reaped it first
            os.close(pidfd)
        self._selector.register(pidfd, selectors.EVENT_READ, reaped)

    # ------------------------------------------------------------ the server lost
    def _gone(self, _key: object, _mask: int) -> None:
        """The socket is readable: the server never writes on it, so it reads end
        of file: the server died, and no child of it can still exec.  Settle
        the starts in flight, reap it, start another."""
        assert self._sock is not None and self._page is not None
        while self._answers >= 0 and self._ready(None, 0):
            pass  # every answer it wrote, then its end of file
        self._selector.unregister(self._sock)
        self._sock.close()
        self._sock = None
        start, pid, state, _err = SLOT.unpack_from(self._page, 0)
        self._page.close()
        self._page = None
        dead = self._server_pid
        self._reap(dead)
        pending, self._pending = list(self._pending.values()), {}
        self.restarts += 1
        again = "a new server started" if self.start() else "starts now made in process"
        self._warn(f"the fork server (pid {dead}) died with {len(pending)} start(s) in "
                   f"flight: those settled, {again}")
        for each in pending:
            if each.id == start and state == EXECING:
                self._settle(each, pid, 0)
                continue
            if each.id == start and pid > 0:  # it failed, or was killed, before its exec
                self._reap(pid)
            self._start_again(each)

    def _start_again(self, pending: Pending) -> None:
        """A start that never exec'd, made in process now (its pipes made anew)."""
        close_fds(pending.child.release())
        try:
            child = pending.again()
        except SpawnError as exc:
            self._closing_out(pending)
            pending.then(exc.errno if isinstance(exc, ExecFailed) else errno.EIO)
            return
        self._closing_out(pending)
        target = pending.child
        target.pid, target.pidfd, target.status_r, target.reply_w = (
            child.pid, child.pidfd, child.status_r, child.reply_w)
        target.held, target.closed = child.held, set()
        pending.then(0)

    def _closing_out(self, pending: Pending) -> None:
        if pending.out is not None:
            self._closing(pending.out)
            pending.out = None


def _pipes() -> tuple[int, int, int, int] | None:
    """The status pipe and the reply pipe, non-blocking (None: out of fds)."""
    try:
        status_r, status_w = os.pipe2(PIPE_FLAGS)
    except OSError:
        return None
    try:
        return (status_r, status_w, *os.pipe2(PIPE_FLAGS))
    except OSError:
        close_fds((status_r, status_w))
        return None
