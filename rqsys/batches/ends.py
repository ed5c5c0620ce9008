"""A queue daemon's part in batches: its members' ends written to their batches.

An EventLog sink: a message carrying ``batch`` that ends here (done, err
after its retries, relayed, or deleted: ``gone``) is noted; at the turn's
end the notes go to the ``batches`` lane, which appends them to each
batch's ``ended.<queue>`` (durably) and, when the batch's ``ended`` files
hold as many lines as it has members, counts them exactly and makes the
callback if it is complete (``rqsys.batches.callback``).  The loop never
waits for it.

An end written to the queue's store but not to its batch (a crash between
the two) is found at the daemon's next start (:meth:`BatchEnds.recover`).

A pool queue's members end on any host: their ends come through the pool's
bucket (``rqsys.pool.batchends``, :meth:`BatchEnds.take`), those that end
here too, so that there is one way in; the sink and the recovery are off.
"""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Callable
from collections.abc import Set as AbstractSet
from typing import TYPE_CHECKING, Any

from rqsys.batches import callback, record
from rqsys.errors import NotFound, RQError
from rqsys.wire.client import QueueClient

if TYPE_CHECKING:
    from rqsys.background import Background
    from rqsys.observe.events import EventLog
    from rqsys.store import Layout, QueueStore

LANE = "batches"
ENDED = ("done", "err", "relayed")


class BatchEnds:
    """Notes this queue's batch members' ends and hands them to the lane."""

    kinds = frozenset({*ENDED, "deleted"})

    def __init__(self, layout: Layout, queue: str, background: Background,
                 log: EventLog, pool: bool = False) -> None:
        self.layout, self.queue, self.background, self.log = layout, queue, background, log
        self.pool = pool  # its members' ends come through the pool (take)
        self._noted: list[tuple[str, str, str]] = []  # (batch, id, end)
        if not pool:
            log.sinks.append(self)
            log.flushing.append(self)  # written once a loop turn

    def __call__(self, kind: str, text: str, msg_id: str, fields: dict[str, Any]) -> None:
        batch = fields.get("RQ_BATCH")
        if not batch or not msg_id:
            return
        if kind == "deleted":
            self._noted.append((batch, msg_id, "gone"))
        elif fields.get("RQ_STATE") == kind:  # an end (not a daemon's err about it)
            self._noted.append((batch, msg_id, kind))

    def flush(self) -> None:
        if self._noted:
            noted, self._noted = self._noted, []
            self.background.submit(lambda: self._write(noted), self._written, LANE)

    def take(self, noted: list[tuple[str, str, str]],
             then: Callable[[BaseException | None], None]) -> None:
        """Ends heard of through the pool: written on the lane, then ``then(error)``."""
        def written(made: Any, error: BaseException | None) -> None:
            self._written(made, error)
            then(error)
        self.background.submit(lambda: self._write(noted), written, LANE)

    def waiting(self) -> bool:
        """Whether a batch here has members in this queue and no callback yet."""
        try:
            entries = list(os.scandir(self.layout.batches))
        except FileNotFoundError:
            return False
        return any(os.path.exists(os.path.join(e.path, f"members.{self.queue}")) and
                   not os.path.exists(os.path.join(e.path, "callback")) for e in entries)

    def _write(self, noted: list[tuple[str, str, str]]) -> list[str]:
        """On the lane: append each batch's ends; the callbacks made."""
        by_batch: dict[str, list[tuple[str, str]]] = defaultdict(list)
        for batch, msg_id, end in noted:
            by_batch[batch].append((msg_id, end))
        made = []
        for batch, ends in by_batch.items():
            path = self.layout.batches / batch
            if not (path / "batch.json").exists():
                continue  # a batch field naming no batch here: not a member
            record.add_ended(path, self.queue, ends)
            made += self._settle(path)
        return made

    def _settle(self, path: Any) -> list[str]:
        if record.read_mark(path, "sealed") is None or \
                record.read_mark(path, "callback") is not None:
            return []
        if record.ended_estimate(path) < int(record.read_spec(path)["total"]):
            return []
        url = callback.settle(path, self._call)
        return [f"batch {path.name} complete: callback {url}"] if url else []

    def _call(self, queue: str, op: str, **args: Any) -> dict[str, Any]:
        with QueueClient(self.layout, queue) as client:
            return client.call(op, **args)

    def _written(self, made: Any, error: BaseException | None) -> None:
        if error is not None:
            self.log.event("err", f"batch ends not written: {error}")
        for line in made or ():
            self.log.event("daemon", line)

    def recover(self, store: QueueStore, queued: AbstractSet[str]) -> None:
        """At start, before the loop: ends the store has and a batch has not
        (a crash between them) are written; a batch then complete gets its
        callback (on the lane).  Not for a pool queue: the pool's bucket keeps its ends."""
        if self.pool:
            return
        try:
            entries = list(os.scandir(self.layout.batches))
        except FileNotFoundError:
            return
        found: list[tuple[str, str, str]] = []
        for entry in entries:
            path = self.layout.batches / entry.name
            if not (path / f"members.{self.queue}").exists() or \
                    record.read_mark(path, "callback") is not None:
                continue
            written = record.ended_here(path, self.queue)
            for msg_id in record.members(path, self.queue):
                if msg_id not in written and msg_id not in queued:
                    end = _end_of(store, msg_id)
                    if end:
                        found.append((entry.name, msg_id, end))
        if found:
            self.log.event("daemon", f"{len(found)} batch member end(s) not written "
                           "before the last stop: written now")
        self.background.submit(lambda: self._write(found) + self._settle_all(),
                               self._written, LANE)

    def _settle_all(self) -> list[str]:
        made = []
        for entry in os.scandir(self.layout.batches):
            if os.path.exists(os.path.join(entry.path, f"members.{self.queue}")):
                made += self._settle(self.layout.batches / entry.name)
        return made


def _end_of(store: QueueStore, msg_id: str) -> str:
    """How a member not queued here ended ('' while in prep or run)."""
    try:
        state = store.find(msg_id)
    except NotFound:
        return "gone"
    except RQError:
        return ""
    return state if state in ENDED else ""
