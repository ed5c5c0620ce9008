"""Slow work a queue daemon hands to a thread, so that its loop never waits.

Checking an attachment means reading it whole (its MD5) and perhaps copying
it: seconds for a gigabyte, during which the loop would answer nobody.  The
loop submits such a job with a callback; one worker thread runs the jobs in
turn; when one ends, the thread wakes the loop through a pipe in its
selector, and the loop runs the callback itself, so every change to the
daemon's state still happens on the loop.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

Done = Callable[["Future[Any]"], None]


class Background:
    """One worker thread for slow jobs, and a pipe that says one has ended."""

    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rq-background")
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._jobs: list[tuple[Future[Any], Done]] = []

    def fileno(self) -> int:
        """Readable when a job has ended (register it with the loop's selector)."""
        return self._wake_r

    def submit(self, work: Callable[[], Any], then: Done) -> None:
        """Run ``work`` on the thread; ``then(future)`` runs on the loop after."""
        future = self._pool.submit(work)
        self._jobs.append((future, then))
        future.add_done_callback(self._wake)

    def busy(self) -> bool:
        """Whether a job has not been called back yet."""
        return bool(self._jobs)

    def _wake(self, _future: Future[Any]) -> None:
        try:
            os.write(self._wake_w, b"\0")
        except BlockingIOError:
            pass  # the pipe is full of wake-ups already

    def run_finished(self) -> None:
        """On the loop: run the callbacks of the jobs that have ended, in order."""
        try:
            while os.read(self._wake_r, 4096):
                pass
        except BlockingIOError:
            pass
        finished: list[tuple[Future[Any], Done]] = []
        pending: list[tuple[Future[Any], Done]] = []
        for job in self._jobs:  # one look at each: a job may end meanwhile
            (finished if job[0].done() else pending).append(job)
        self._jobs = pending
        for future, then in finished:
            then(future)

    def close(self) -> None:
        """Drop the jobs not started; the one running ends with the process."""
        self._pool.shutdown(wait=False, cancel_futures=True)
        os.close(self._wake_r)
        os.close(self._wake_w)
