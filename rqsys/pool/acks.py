"""The ends of a host's pool messages, recorded in the pool and acked once
this host's store has them on disk: an end is kept with the store's flush
count when it was seen, and sent at the first turn after the store has
flushed since.  Sending an end puts its record in the pool's bucket (and a
batch member's end for the host that made it, ``rqsys.pool.batchends``),
then acks the delivery, in that order: a host that gets the message again finds
the end there (``rqsys.pool.redelivery``); a unique key the message held
is let go between the two.  A failed send is tried again every RETRY until
NATS answers, however long that takes: a stream leader's election can
outlast ``ack_wait``, and an end that gave up would run again elsewhere (or
hold its unique key for ever).  Once acked, the message's attachments are
dropped from the pool's object store (no host needs them any more).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

from rqsys.observe.events import EventLog
from rqsys.pool import batchends, unique
from rqsys.pool.bridge import Bridge, why
from rqsys.pool.files import PoolFiles
from rqsys.pool.link import Link, NatsMsg
from rqsys.store import QueueStore

RETRY = 1.0  # seconds before a failed fetch, lookup or end is tried again (no busy loop)
SOON = 0.05  # seconds: an end that waits for the store's next flush is looked at again
SEND_TIMEOUT = 1.0  # seconds a record or an ack waits for its answer (nats-py's KV: 5)


@dataclass
class End:
    """An ended held message, until the pool has its record and its ack."""

    msg_id: str
    delivery: NatsMsg
    record: dict[str, Any] | None  # its state in the pool's bucket (None: nothing to say)
    flushes: int  # the store's flush count when it ended
    key: tuple[str, float] | None = None  # its unique key, and how long it is held after
    batch: tuple[str, str] | None = None  # a batch member's (batch, end): for its maker
    tries: int = 0  # sends that failed


class Acks:
    """Records and acks the ends of held messages once flushed, and drops their files."""

    def __init__(self, store: QueueStore, link: Link, bridge: Bridge, files: PoolFiles,
                 log: EventLog) -> None:
        self.store, self.link, self.bridge, self.files, self.log = store, link, bridge, files, log
        self.ended: list[End] = []
        self.sending: dict[str, End] = {}  # ends handed to the bridge, not yet answered
        self.dropping: dict[str, list[str]] = {}  # objects to remove once the end is acked
        self.ack_at = 0.0  # a failed send is tried again from then

    def add(self, msg_id: str, delivery: NatsMsg, specs: list[dict[str, Any]],
            record: dict[str, Any] | None, key: tuple[str, float] | None = None,
            batch: tuple[str, str] | None = None) -> None:
        """An end the store has recorded (sent once it is flushed too)."""
        self.ended.append(End(msg_id, delivery, record, self.store.dirty.flushes, key, batch))
        if specs:
            self.dropping[msg_id] = [s["name"] for s in specs]

    def wait(self, now: float) -> float | None:
        """Seconds until an end should be looked at again (None: none waits)."""
        return max(SOON, self.ack_at - now) if self.ended else None

    def turn(self) -> None:
        """Send the ends the store has flushed to disk since they were recorded."""
        if time.monotonic() < self.ack_at:
            return
        flushes, clean = self.store.dirty.flushes, self.store.dirty.due() is None
        keep = []
        for end in self.ended:
            if clean or end.tries or end.flushes < flushes:
                self.sending[end.msg_id] = end
                self.bridge.submit(self._send(end), self._sent(end))
            else:
                keep.append(end)
        self.ended = keep

    async def _send(self, end: End) -> None:
        if end.record is not None:
            await asyncio.wait_for(self.link.record(end.msg_id, end.record), SEND_TIMEOUT)
        if end.batch is not None:
            await asyncio.wait_for(batchends.put_end(self.link.kv, end.msg_id, *end.batch),
                                   SEND_TIMEOUT)
        if end.key is not None:
            await asyncio.wait_for(unique.release(self.link.kv, end.key[0], end.msg_id,
                                                  end.key[1]), SEND_TIMEOUT)
        await self.link.ack(end.delivery, SEND_TIMEOUT)

    def _sent(self, end: End) -> Any:
        def then(_result: Any, error: BaseException | None) -> None:
            self.sending.pop(end.msg_id, None)
            if error is None:
                if end.tries:
                    self.log.event("pool", f"end recorded and acked after {end.tries + 1} "
                                   "tries", end.msg_id)
                names = self.dropping.pop(end.msg_id, None)
                if names:  # acked: no host needs its attachments any more
                    self.bridge.submit(self.files.drop(end.msg_id, names))
                return
            if not end.tries:  # once: an outage would log a line a second per end
                self.log.event("err", f"pool: end not recorded and acked ({why(error)}); "
                               f"tried again every {RETRY:g}s until NATS answers", end.msg_id)
            end.tries += 1
            self.ended.append(end)
            self.ack_at = time.monotonic() + RETRY
        return then

    async def final(self) -> None:
        """On the bridge, at stop (the store is flushed): send every end at once,
        those under way too (a second send is harmless); one that fails is
        named, and the others still go."""
        ends = [*self.ended, *self.sending.values()]
        results = await asyncio.gather(*(self._send(end) for end in ends),
                                       return_exceptions=True)
        for end, error in zip(ends, results, strict=True):
            if isinstance(error, BaseException):
                self.log.event("err", f"pool: end not recorded and acked at stop "
                               f"({why(error)}): it will run again on some host", end.msg_id)
            elif end.msg_id in self.dropping:
                await self.files.drop(end.msg_id, self.dropping.pop(end.msg_id))
