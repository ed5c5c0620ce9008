"""The spawn helper as the queue's runner calls it.

Each start's time in the helper (a failed one's too) is added to the
loop's spawn seconds (``rqsys.daemon.loopclock``).  A start holds the
script's ends of its pipes until its run ends (closed then with the run's
other fds, ``rqsys.daemon.children``); the output fd it gives the script
is left to the turn's batch (``rqsys.fdclose.FdBatch``), closed before
the loop waits again, so the output's reader sees end of file when the
script is done.
"""

from __future__ import annotations

import os
import time

from rqsys.daemon.loopclock import LoopClock
from rqsys.fdclose import FdBatch
from rqsys.run.identity import Identity
from rqsys.run.spawn import Child, spawn


class Starts:
    """Starting scripts: timed, and their leftover fds closed with the turn's."""

    def __init__(self, clock: LoopClock, closing: FdBatch, identity: Identity) -> None:
        self.clock, self.identity = clock, identity
        self._pid = os.getpid()  # the helper checks its child's parent against it
        self._closing = closing

    def spawn(self, words: list[str], program: str, env: object, job: str,
              out: int | None, as_limit: int) -> Child:
        """:func:`rqsys.run.spawn.spawn`, timed; the Child holds the script's
        ends of its pipes."""
        began = time.perf_counter()
        try:
            return spawn(words, program, env, job, out, self._pid, as_limit, hold=True,
                         user=self.identity.switch)
        finally:
            self.clock.spawn_s += time.perf_counter() - began

    def leave(self, fd: int) -> None:
        """An fd to close with the turn's (a start's output: the child has its copy)."""
        self._closing.add((fd,))
