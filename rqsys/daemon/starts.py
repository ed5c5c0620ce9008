"""The spawn helper as the queue's runner calls it.

Each start's time in the helper (a failed one's too) is added to the
loop's spawn seconds (``rqsys.daemon.loopclock``).  The fds a start leaves
to close (the script's ends of its pipes, its output's) are held and
closed together after a batch of starts: started one after the other,
their numbers run in pairs, so one ``close_range`` a pair; at most
CLOSE_BATCH are held, so a full turn of starts does not run out of fds.
"""

from __future__ import annotations

import os
import time

from rqsys.daemon.loopclock import LoopClock
from rqsys.fdclose import close_fds
from rqsys.spawn import Child, spawn

CLOSE_BATCH = 48


class Starts:
    """Starting scripts: timed, and their leftover fds closed in batches."""

    def __init__(self, clock: LoopClock) -> None:
        self.clock = clock
        self._pid = os.getpid()  # the helper checks its child's parent against it
        self._closing: list[int] = []

    def spawn(self, words: list[str], program: str, env: object, job: str,
              out: int | None, as_limit: int) -> Child:
        """:func:`rqsys.spawn.spawn`, timed; the script's ends of its pipes
        are held to be closed with the batch."""
        began = time.perf_counter()
        try:
            return spawn(words, program, env, job, out, self._pid, as_limit, self._closing)
        finally:
            self.clock.spawn_s += time.perf_counter() - began

    def leave(self, fd: int) -> None:
        """An fd to close with the batch (a start's output: the child has its copy)."""
        self._closing.append(fd)
        if len(self._closing) >= CLOSE_BATCH:
            self.close()

    def close(self) -> None:
        """Close what the starts so far have left."""
        fds, self._closing = self._closing, []
        close_fds(fds)
