"""Slow work a queue daemon hands to threads, so that its loop never waits.

Checking an attachment means reading it whole (its MD5): seconds for a
gigabyte.  Making a commit or a resend durable means an fsync.  Asking
another queue daemon to take a copy may take as long as that daemon hangs.
The loop submits such a job with a callback, in a *lane*; each lane has one
thread (started at its first job) that runs the lane's jobs in turn, so jobs
of one lane keep their order and a job that hangs holds up its own lane only:
a hung peer daemon (its own lane, ``peer:<queue>``) never delays the hashing
of an attachment (``files``) or the fsync a commit waits for (``sync``).
When a job ends, its thread wakes the loop through a pipe in its selector,
and the loop runs the callback itself, so every change to the daemon's state
still happens on the loop.
"""

from __future__ import annotations

import collections
import os
import queue
import threading
from collections.abc import Callable
from typing import Any

Then = Callable[[Any, "BaseException | None"], None]  # then(result, error), on the loop
Job = tuple[Callable[[], Any], Then]

FILES = "files"  # copying, syncing and hashing attachments
SYNC = "sync"  # the fsyncs an answer waits for (commit, delete, admin state, resend)
AUDIT = "audit"  # the audit trail's fdatasyncs and rotation (rqsys.daemon.audit)
PRUNE = "prune"  # the cleaner's removals: long, so they hold up no other answer


def peer_lane(queue_name: str) -> str:
    """The lane of calls to another queue daemon (one hung daemon holds up only its own)."""
    return f"peer:{queue_name}"


class Background:
    """Threads for slow jobs, one per lane, and a pipe that says a job has ended."""

    def __init__(self) -> None:
        self._lanes: dict[str, queue.SimpleQueue[Job | None]] = {}
        self._ended: collections.deque[tuple[str, Then, Any, BaseException | None]] = (
            collections.deque())
        self._unfinished: collections.Counter[str] = collections.Counter()  # loop side only
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)

    def fileno(self) -> int:
        """Readable when a job has ended (register it with the loop's selector)."""
        return self._wake_r

    def busy(self, *lanes: str) -> bool:
        """Whether a job (of one of ``lanes``, or of any) has not been called back yet."""
        return any(self._unfinished[lane] for lane in lanes or self._unfinished)

    def submit(self, work: Callable[[], Any], then: Then, lane: str = FILES) -> None:
        """Run ``work()`` on ``lane``'s thread; ``then(result, error)`` runs on the loop after."""
        todo = self._lanes.get(lane)
        if todo is None:
            todo = self._lanes[lane] = queue.SimpleQueue()
            threading.Thread(target=self._work, args=(lane, todo), name=f"rq-{lane}",
                             daemon=True).start()
        self._unfinished[lane] += 1
        todo.put((work, then))

    def run_finished(self) -> None:
        """On the loop: call back the jobs that have ended, in the order they ended."""
        try:
            while os.read(self._wake_r, 4096):
                pass
        except BlockingIOError:
            pass
        while self._ended:
            lane, then, result, error = self._ended.popleft()
            self._unfinished[lane] -= 1
            then(result, error)

    def close(self) -> None:
        """Let the threads end after the jobs they have; the daemon exits right
        after, which ends them sooner (their clients get no answer: nothing of
        theirs was stored).  The pipe stays open until the process ends: a
        thread may still write to it."""
        for todo in self._lanes.values():
            todo.put(None)

    def _work(self, lane: str, todo: queue.SimpleQueue[Job | None]) -> None:
        while (job := todo.get()) is not None:
            work, then = job
            try:
                self._ended.append((lane, then, work(), None))
            except Exception as exc:  # handed to the loop's callback
                self._ended.append((lane, then, None, exc))
            try:
                os.write(self._wake_w, b"\0")
            except BlockingIOError:
                pass  # the pipe is full of wake-ups already
