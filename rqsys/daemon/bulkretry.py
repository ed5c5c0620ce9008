"""A bulk retry (err → que of many messages), its disk work off the loop.

The loop marks a batch of ``BATCH`` ids busy (``Retries.take_batch``);
the ``retry`` background lane renames them into que/, clears their status
and fsyncs err/ and que/ once (``rqsys.store.retrybatch``); back on the loop
the moved join the schedule (``Retries.batch_landed``), each ``retried``
event naming who asked (``by``) on its timeline line, written with the rest
of the loop turn's lines.  ``IN_FLIGHT``
batches are on the lane at a time, so the lane always has the next one
while the loop queues the last; between two callbacks the loop serves
every other client.  Answered once the last batch is durable.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rqsys.background import Background
from rqsys.daemon.transitions import Transitions
from rqsys.store import retrybatch

BATCH = 250  # ids a lane job moves: its callback's loop time is a few ms
IN_FLIGHT = 2
LANE = "retry"
Finish = Callable[[int, int, "BaseException | None"], None]  # (retried, passed over, error)


class BulkRetry:
    """One bulk retry of a list of ids, answered through ``finish``."""

    def __init__(self, transitions: Transitions, background: Background, ids: list[str],
                 finish: Finish, by: str = "") -> None:
        self.retries, self.background, self.ids, self.finish = (transitions.retries, background,
                                                                ids, finish)
        self.by = by  # who asked (``Request.actor``), on each retried message's timeline
        self.next = 0  # the first id not yet submitted
        self.pending = 0  # batches on the lane
        self.retried = self.passed = 0
        self.error: BaseException | None = None

    def start(self) -> None:
        for _ in range(IN_FLIGHT):
            self._submit()
        self._maybe_end()

    def _submit(self) -> None:
        if self.next >= len(self.ids) or self.error is not None:
            return
        batch = self.ids[self.next:self.next + BATCH]
        self.next += BATCH
        chosen = self.retries.take_batch(batch)
        self.passed += len(batch) - len(chosen)
        self.pending += 1
        store = self.retries.store
        self.background.submit(lambda: retrybatch.retry_batch(store, chosen),
                               lambda moved, error: self._landed(chosen, moved, error), LANE)

    def _landed(self, chosen: list[str], moved: Any, error: BaseException | None) -> None:
        """On the loop: a batch is durable (or failed: its messages stay in err,
        except those it had moved, which join the que as the others)."""
        self.pending -= 1
        if isinstance(error, retrybatch.BatchFailed):
            moved = error.moved
        moved = moved or []
        self.retries.batch_landed(chosen, moved, self.by)
        self.retried += len(moved)
        self.passed += len(chosen) - len(moved)
        if error is not None and self.error is None:
            self.error = error
        self._submit()
        self._maybe_end()

    def _maybe_end(self) -> None:
        if self.pending == 0 and (self.next >= len(self.ids) or self.error is not None):
            self.finish(self.retried, self.passed, self.error)
