"""Slow work a queue daemon hands to a thread, so that its loop never waits.

Checking an attachment means reading it whole (its MD5) and perhaps copying
it: seconds for a gigabyte, during which the loop would answer nobody.  The
loop submits such a job with a callback; one worker thread (started at the
first job) runs the jobs in turn; when one ends, the thread wakes the loop
through a pipe in its selector, and the loop runs the callback itself, so
every change to the daemon's state still happens on the loop.
"""

from __future__ import annotations

import collections
import os
import queue
import threading
from collections.abc import Callable
from typing import Any

Then = Callable[[Any, "BaseException | None"], None]  # then(result, error), on the loop


class Background:
    """One worker thread for slow jobs, and a pipe that says one has ended."""

    def __init__(self) -> None:
        self._todo: queue.SimpleQueue[tuple[Callable[[], Any], Then] | None] = queue.SimpleQueue()
        self._ended: collections.deque[tuple[Then, Any, BaseException | None]] = (
            collections.deque())
        self._unfinished = 0  # submitted, not yet called back (loop side only)
        self._thread: threading.Thread | None = None
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)

    def fileno(self) -> int:
        """Readable when a job has ended (register it with the loop's selector)."""
        return self._wake_r

    def busy(self) -> bool:
        """Whether a job has not been called back yet."""
        return self._unfinished > 0

    def submit(self, work: Callable[[], Any], then: Then) -> None:
        """Run ``work()`` on the thread; ``then(result, error)`` runs on the loop after."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._work, name="rq-background", daemon=True)
            self._thread.start()
        self._unfinished += 1
        self._todo.put((work, then))

    def run_finished(self) -> None:
        """On the loop: call back the jobs that have ended, in order."""
        try:
            while os.read(self._wake_r, 4096):
                pass
        except BlockingIOError:
            pass
        while self._ended:
            then, result, error = self._ended.popleft()
            self._unfinished -= 1
            then(result, error)

    def close(self) -> None:
        """Let the thread end after the jobs it has; the daemon exits right
        after, which ends it sooner (their clients get no answer: nothing of
        theirs was stored).  The pipe stays open until the process ends: the
        thread may still write to it."""
        self._todo.put(None)

    def _work(self) -> None:
        while (job := self._todo.get()) is not None:
            work, then = job
            try:
                self._ended.append((then, work(), None))
            except Exception as exc:  # handed to the loop's callback
                self._ended.append((then, None, exc))
            try:
                os.write(self._wake_w, b"\0")
            except BlockingIOError:
                pass  # the pipe is full of wake-ups already
