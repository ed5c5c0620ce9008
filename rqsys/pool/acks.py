"""The ends of a host's pool messages, acked once this host's store has them
on disk: an end is kept with the store's flush count when it was seen, and
acked at the first turn after the store has flushed since; a failed ack is
tried again while ``ack_wait`` lasts.  Once acked, the message's attachments
are dropped from the pool's object store (no host needs them any more).
"""

from __future__ import annotations

import time
from typing import Any

from rqsys.events import EventLog
from rqsys.pool.bridge import Bridge, why
from rqsys.pool.files import PoolFiles
from rqsys.pool.link import Link, NatsMsg

RETRY = 1.0  # seconds before a failed fetch or ack is tried again (NATS away: no busy loop)
SOON = 0.05  # seconds: an ack that waits for the store's next flush is looked at again
Ended = tuple[int, str, NatsMsg]  # flush count at the end (or minus the tries), id, delivery


class Acks:
    """Acks the ends of held messages once they are flushed, and drops their files."""

    def __init__(self, store: Any, link: Link, bridge: Bridge, files: PoolFiles,
                 log: EventLog) -> None:
        self.store, self.link, self.bridge, self.files, self.log = store, link, bridge, files, log
        self.ended: list[Ended] = []
        self.dropping: dict[str, list[str]] = {}  # objects to remove once the end is acked
        self.ack_at = 0.0  # a failed ack is tried again from then

    def add(self, msg_id: str, delivery: NatsMsg, specs: list[dict[str, Any]]) -> None:
        """An end the store has recorded (acked once it is flushed too)."""
        self.ended.append((self.store.dirty.flushes, msg_id, delivery))
        if specs:
            self.dropping[msg_id] = [s["name"] for s in specs]

    def wait(self, now: float) -> float | None:
        """Seconds until an end should be looked at again (None: none waits)."""
        return max(SOON, self.ack_at - now) if self.ended else None

    def turn(self) -> None:
        """Ack the ends the store has flushed to disk since they were recorded."""
        if time.monotonic() < self.ack_at:
            return
        flushes, clean = self.store.dirty.flushes, self.store.dirty.due() is None
        keep = []
        for entry in self.ended:
            if clean or entry[0] < flushes:
                self.bridge.submit(self.link.ack(entry[2]), self._acked(entry))
            else:
                keep.append(entry)
        self.ended = keep

    def _acked(self, entry: Ended) -> Any:
        def then(_result: Any, error: BaseException | None) -> None:
            if error is None:
                names = self.dropping.pop(entry[1], None)
                if names:  # acked: no host needs its attachments any more
                    self.bridge.submit(self.files.drop(entry[1], names))
                return
            # Tried again while ack_wait lasts: until then no other host runs it;
            # after, JetStream has given it out again (a duplicate, or acked unrun here).
            tries = -min(entry[0], 0) + 1  # the first field counts tries, negated, once failed
            text = f"pool: ack not confirmed ({why(error)})"
            if tries * RETRY > self.link.s.ack_wait:
                self.log.event("err", f"{text}; given up: it will be delivered again", entry[1])
                return
            self.log.event("err", f"{text}; trying again in {RETRY:g}s", entry[1])
            self.ended.append((-tries, entry[1], entry[2]))
            self.ack_at = time.monotonic() + RETRY
        return then

    async def final(self) -> None:
        """On the bridge, at stop (the store is flushed): ack every end."""
        for _flushes, msg_id, delivery in self.ended:
            await self.link.ack(delivery)
            if msg_id in self.dropping:
                await self.files.drop(msg_id, self.dropping.pop(msg_id))
