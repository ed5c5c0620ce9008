"""Watching the running scripts: their status pipes and pidfds, on an epoll of their own.

The loop's selector holds one fd for all of them (this epoll); each turn that
it is ready, every script that wrote or ended is handled in one batch.  A
script's two fds are added when it starts and never removed: closing them at
its end (with the turn's other fds, before the loop waits again) takes them
out of the epoll (nothing else holds them: they are close-on-exec and every
child closes them before exec), which saves two ``epoll_ctl`` calls per run.
The one exception is a status pipe at end of file while its run goes on (a
relay handed to the worker, which holds the write end alone, closed it):
that one is removed, or it would be ready for ever.  A started script's
pipe never reads end of file: the daemon holds its write end too.

At an end the script's process group is signalled *before* the script is
reaped: the zombie keeps the group alive, so the signal reaches whatever the
script left behind (and cannot reach a later group that took its number).
What left the group (setsid, a daemon's double fork) is found by the run's
marks once the script is reaped, and ended (``rqsys.run.leftovers``).
"""

from __future__ import annotations

import select
import selectors
import signal
from collections.abc import Callable
from typing import Any

from rqsys.daemon.context import QueueContext
from rqsys.errors import ProtocolError
from rqsys.fdclose import FdBatch
from rqsys.observe.events import EventLog
from rqsys.run.leftovers import After, Leftovers, Starting
from rqsys.run.protocol import Command
from rqsys.run.verdict import Worker

Lines = list[Command | ProtocolError]
OnLines = Callable[[Worker, Lines], None]
OnExit = Callable[[Worker, int], None]


class Children:
    """The scripts' fds in one epoll; calls back their status lines and exits."""

    def __init__(self, selector: selectors.BaseSelector, on_lines: OnLines,
                 on_exit: OnExit, closing: FdBatch, ctx: QueueContext | None = None,
                 log: EventLog | None = None, after: After | None = None,
                 starting: Starting | None = None) -> None:
        """``ctx``, ``log`` and ``after`` (the runner's ``Deadlines.after``):
        what the run's leftovers are ended with; without them they are not.
        ``starting``: the fork server's children, not leftovers."""
        self._epoll = select.epoll(flags=select.EPOLL_CLOEXEC)
        selector.register(self._epoll.fileno(), selectors.EVENT_READ, self._ready)
        self._on_lines, self._on_exit = on_lines, on_exit
        self._closing = closing  # the ended ones' fds, closed with the turn's: neighbours
        self._status: dict[int, Worker] = {}  # status pipe fd -> its script
        self._pidfds: dict[int, Worker] = {}
        self.leftovers = None if ctx is None or log is None or after is None else \
            Leftovers(ctx, selector, log, after, self._running, starting)

    def watch(self, worker: Worker) -> None:
        child = worker.child
        self._epoll.register(child.status_r, select.EPOLLIN)
        self._epoll.register(child.pidfd, select.EPOLLIN)
        self._status[child.status_r] = self._pidfds[child.pidfd] = worker

    def _ready(self, _key: Any, _mask: int) -> None:
        ended: dict[str, Worker] = {}
        talked: list[Worker] = []
        for fd, _events in self._epoll.poll(0):
            if fd in self._pidfds:
                worker = self._pidfds[fd]
                ended[worker.msg_id] = worker
            elif fd in self._status:
                talked.append(self._status[fd])
        for worker in talked:
            if worker.msg_id not in ended:  # an ended one's lines are read at its reaping
                self._read(worker)
        for worker in ended.values():
            self._reap(worker)

    def _read(self, worker: Worker) -> None:
        lines, eof = worker.read_lines()
        if eof:  # fd 3 closed before the script ended: stop watching it
            fd = worker.child.status_r
            if self._status.pop(fd, None) is not None:
                self._epoll.unregister(fd)
        self._on_lines(worker, lines)

    def _reap(self, worker: Worker) -> None:
        child = worker.child
        child.signal_group(signal.SIGTERM)  # background children left behind
        pid, wait_status, worker.rusage = child.wait()
        if pid == 0:
            return  # not ended after all (cannot happen for a ready pidfd)
        worker.wait_status = wait_status
        if child.status_r in self._status:
            self._on_lines(worker, worker.read_lines()[0])  # before fd 4 is closed
        del self._pidfds[child.pidfd]
        self._status.pop(child.status_r, None)
        self._closing.add(child.release())  # out of the epoll when closed, before the next wait
        if self.leftovers is not None:
            self.leftovers.run_ended(child.pid, worker.msg_id)
        self._on_exit(worker, wait_status)

    def _running(self) -> list[tuple[int, str]]:
        """The running scripts' pids and messages (a hand-over's pid is 0)."""
        return [(worker.child.pid, worker.msg_id) for worker in self._pidfds.values()]
