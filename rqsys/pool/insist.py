"""Writes to the pool's bucket that must happen, whenever NATS answers.

A single key let go once its message is stored here is such a write: given
up, the key would stay held by a message no longer queued in the pool, and
every later ``single`` create would be answered with that message for ever.
A write that fails is logged once and tried again every RETRY until NATS
answers.  Only writes whose order does not matter belong here (letting a
key go checks whose it is); a message's own records do not (an old one
landing late would hide a newer state), and its end goes with its ack
(``rqsys.pool.acks``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from rqsys.observe.events import EventLog
from rqsys.pool.acks import RETRY, SEND_TIMEOUT
from rqsys.pool.bridge import Bridge, why


@dataclass
class Write:
    make: Callable[[], Coroutine[Any, Any, Any]]  # a new coroutine for each try
    what: str  # for the log: "single key not let go"
    msg_id: str
    at: float = 0.0  # tried again from then
    failed: bool = False


class Insist:
    """Runs bucket writes on the bridge, each tried again until it succeeds."""

    def __init__(self, bridge: Bridge, log: EventLog) -> None:
        self.bridge, self.log = bridge, log
        self.waiting: list[Write] = []

    def submit(self, make: Callable[[], Coroutine[Any, Any, Any]], what: str,
               msg_id: str) -> None:
        self._try(Write(make, what, msg_id))

    def turn(self, now: float) -> None:
        due = [w for w in self.waiting if w.at <= now]
        self.waiting = [w for w in self.waiting if w.at > now]
        for write in due:
            self._try(write)

    def wait(self, now: float) -> float | None:
        """Seconds until a failed write is tried again (None: none waits)."""
        return max(0.0, min(w.at for w in self.waiting) - now) if self.waiting else None

    def _try(self, write: Write) -> None:
        def then(_result: Any, error: BaseException | None) -> None:
            if error is None:
                return
            if not write.failed:  # once: an outage would log a line a second
                self.log.event("err", f"pool: {write.what} ({why(error)}): tried again "
                               f"every {RETRY:g}s until NATS answers", write.msg_id)
            write.failed, write.at = True, time.monotonic() + RETRY
            self.waiting.append(write)
        self.bridge.submit(write.make(), then)

    async def final(self) -> None:
        """On the bridge, at stop: every write still waiting, tried once more."""
        writes, self.waiting = self.waiting, []
        results = await asyncio.gather(*(asyncio.wait_for(w.make(), SEND_TIMEOUT)
                                         for w in writes), return_exceptions=True)
        for write, error in zip(writes, results, strict=True):
            if isinstance(error, BaseException):
                self.log.event("err", f"pool: {write.what} at stop ({why(error)})",
                               write.msg_id)
