"""The spawn helper and the fork server as the queue's runner calls them.

A start goes to the fork server (``rqsys.run.forkserver``: the loop does
not wait for the exec; the Child's pid comes with ``then(0)``, or
``then(errno)`` says why it did not start) when the server takes it, and
is made in process otherwise (started on return; ``then`` is not called).
The server is used as ``RQ_FORK_SERVER`` says (``rqsys.tunables``): for
every start (``on``), for none (``off``), or (``auto``, the default) for a
start made while messages wait for a worker, as ``busy`` tells, where the
loop's exec waits hold the queue back; otherwise the start is made in
process, the shortest way to a script's first act.  Another value is said
and taken as off.  The server is started at the first start it takes, so
a queue that never needs it costs no process.  Starts sent to the server
run once each, as those made in process do, but one sent in a turn may
exec after one made in process in the next: the order of first acts is
not the que's order exactly.

Each start's time in the in-process helper (a failed one's too) is added to
the loop's spawn seconds (``rqsys.daemon.loopclock``), and so is the time
spent sending a request to the server.  A start holds the script's ends of
its pipes until its run ends (closed then with the run's other fds,
``rqsys.run.children``); the output fd it gives the script is closed
with the turn's fds (``rqsys.fdclose.FdBatch``) once the script has its
copy, so the output's reader sees end of file when the script is done.
"""

from __future__ import annotations

import os
import selectors
import time
from collections.abc import Callable

from rqsys import tunables
from rqsys.daemon.loopclock import LoopClock
from rqsys.fdclose import FdBatch
from rqsys.observe.events import EventLog
from rqsys.run.forkserver import ForkServer, Then
from rqsys.run.identity import Identity
from rqsys.run.spawn import Child, QueueEnviron, spawn


class Starts:
    """Starting scripts: timed, and their leftover fds closed with the turn's."""

    def __init__(self, clock: LoopClock, closing: FdBatch, identity: Identity,
                 selector: selectors.BaseSelector, log: EventLog,
                 busy: Callable[[], bool]) -> None:
        """``busy``: whether messages wait for a worker now (``auto``'s test)."""
        self.clock, self.identity, self.busy = clock, identity, busy
        self._pid = os.getpid()  # the helper checks its child's parent against it
        self._closing = closing
        self.server: ForkServer | None = None
        self._always = tunables.FORK_SERVER_MODE == "on"
        if tunables.FORK_SERVER_MODE != "off":
            self.server = ForkServer(selector, self.leave, lambda text: log.warn(text))
        elif tunables.FORK_SERVER_SETTING != "off":
            log.warn(f"RQ_FORK_SERVER={tunables.FORK_SERVER_SETTING!r} is neither on, off"
                     " nor auto: scripts start in process")
        self._server_tried = False

    def spawn(self, words: list[str], program: str, environ: QueueEnviron, run: dict[str, str],
              job: str, out: int | None, as_limit: int, then: Then) -> Child:
        """Start the script; the Child holds the script's ends of its pipes.  Its
        ``pid`` is 0 while the fork server starts it (``then`` says how it went).
        ``out`` is closed by this call, or once the script has its copy."""
        began, sent = time.perf_counter(), None
        try:
            if (sent := self._send(words, program, environ, run, job, out, as_limit, then)):
                return sent
            return self._in_process(words, program, environ, run, job, out, as_limit)
        finally:
            if out is not None and sent is None:
                self.leave(out)  # the child has its copy (or none will run)
            self.clock.spawn_s += time.perf_counter() - began

    def _send(self, words: list[str], program: str, environ: QueueEnviron,
              run: dict[str, str], job: str, out: int | None, as_limit: int,
              then: Then) -> Child | None:
        server = self.server
        if server is None or not (self._always or self.busy()):
            return None
        if not server.running and not self._server_tried:
            self._server_tried = True  # once: a server that died is started again by itself
            server.start()
        user = self.identity.switch
        ids = None if user is None else (user.uid, user.gid, list(user.groups) or [user.gid])
        env, envc = environ.blob(run)
        return server.begin(program, words, env, envc, job, out, as_limit, ids, then,
                            lambda: self._in_process(words, program, environ, run, job, out,
                                                     as_limit))

    def _in_process(self, words: list[str], program: str, environ: QueueEnviron,
                    run: dict[str, str], job: str, out: int | None, as_limit: int) -> Child:
        return spawn(words, program, environ.array(run), job, out, self._pid, as_limit,
                     hold=True, user=self.identity.switch)

    def children(self, unknown: list[int]) -> set[int]:
        """Of the daemon's ``unknown`` children, the fork server's (none without one)."""
        return set() if self.server is None else self.server.children(unknown)

    def close(self) -> None:
        """The daemon stops: its fork server, if any, exits."""
        if self.server is not None:
            self.server.close()

    def leave(self, *fds: int) -> None:
        """Fds to close with the turn's (a start's output: the child has its copy)."""
        self._closing.add(fds)
