"""Batch members in a pool queue: their ends carried to the host that made them.

A pool queue's message runs on any host; its batch lives on the host that
made it (``rqsys.batches``).  The host where a member ends puts
``bend.<n>.<msg_id>`` in the pool's bucket (``n``: the number of the host
that made the id, ``rqsys.pool.ids``), after the end's record and before
its ack (``rqsys.pool.acks``); a host that finds a redelivery ended puts it
again.  The maker's daemon watches ``bend.<its n>.>``: each end goes to its
batch (``rqsys.batches.ends``, on the batches lane, fsynced), then its key is
deleted.  A crash anywhere leaves the key: the watch, begun anew at the next
start (or every RESTART seconds), delivers every key still there, and an
end written twice is counted once.  The watch begins at start when a batch
here has members in this queue and no callback yet, and at the first
create of a member: a pool queue without batches watches nothing.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import TYPE_CHECKING, Any

import nats.errors
from nats.js.kv import KV_DEL, KV_PURGE

from rqsys.pool.bridge import Bridge, why
from rqsys.pool.ids import host_of

if TYPE_CHECKING:
    from rqsys.batches.ends import BatchEnds
    from rqsys.observe.events import EventLog
    from rqsys.pool.link import Link

PREFIX = "bend"
WAIT = 1.0  # seconds a watch waits for a first end before it answers empty
GATHER = 0.01  # seconds it waits for each further end of a handful
MOST = 1000  # ends handed over at once
RESTART = 60.0  # seconds: the watch is begun anew (what it may have missed, it gets)
RETRY = 1.0  # seconds before a failed watch is begun again

End = tuple[str, str, str]  # (batch, msg_id, done | err | relayed | gone)


def end_of(msg: Any, state: str) -> tuple[str, str] | None:
    """(batch, end) of a message that ended in ``state`` ('': deleted), or None."""
    batch = msg.get("batch") if isinstance(msg, dict) else None
    if not isinstance(batch, str) or not batch:
        return None
    return batch, state or "gone"


def msg_in(data: bytes) -> dict[str, Any] | None:
    """A delivery's message, when it may be a batch member (read only then)."""
    return dict(json.loads(data)) if b'"batch"' in data else None


def key(msg_id: str) -> str:
    return f"{PREFIX}.{host_of(msg_id)}.{msg_id}"


async def put_end(kv: Any, msg_id: str, batch: str, end: str) -> None:
    """On the bridge: a member's end, for the host that made it."""
    await kv.put(key(msg_id), json.dumps({"batch": batch, "end": end}).encode())


class PoolBatchEnds:
    """Watches the bucket for the ends of members made here; hands them to the batches."""

    def __init__(self, link: Link, bridge: Bridge, ends: BatchEnds, log: EventLog) -> None:
        self.link, self.bridge, self.ends, self.log = link, bridge, ends, log
        self.number = 0  # this host's number in the pool, once joined
        self.watching = False
        self.watcher: Any = None
        self.begun = 0.0
        self.failing = ""  # the last watch's error, logged once

    def start(self, number: int) -> None:
        """Once joined: watch now if a batch here waits for this queue's members."""
        self.number = number
        if self.ends.waiting():
            self.watch()

    def watch(self) -> None:
        if not self.watching and self.number:
            self.watching = True
            self.bridge.submit(self._next(), self._got)

    async def _next(self) -> tuple[list[tuple[str, End]], str]:
        """On the bridge: the next ends (with their keys), and an error's text."""
        try:
            if self.watcher is not None and time.monotonic() - self.begun > RESTART:
                await self._stop()
            if self.watcher is None:
                self.watcher = await self.link.kv.watch(f"{PREFIX}.{self.number}.>",
                                                        ignore_deletes=True)
                self.begun = time.monotonic()
            return await self._gather(), ""
        except Exception as exc:  # noqa: BLE001 - NATS away: begun again after RETRY
            await self._stop()
            await asyncio.sleep(RETRY)
            return [], why(exc)

    async def _gather(self) -> list[tuple[str, End]]:
        got: list[tuple[str, End]] = []
        wait = WAIT
        while len(got) < MOST:
            try:
                entry = await self.watcher.updates(timeout=wait)
            except nats.errors.TimeoutError:
                break
            wait = GATHER
            if entry is None or entry.operation in (KV_DEL, KV_PURGE):
                continue  # the end of what was there at the start; a key let go
            try:
                value = json.loads(entry.value)
                msg_id = entry.key.split(".", 2)[2]
                got.append((entry.key, (str(value["batch"]), msg_id, str(value["end"]))))
            except (ValueError, KeyError, IndexError, TypeError):
                self.log.event("err", f"pool: batch end {entry.key} not understood: left")
        return got

    async def _stop(self) -> None:
        watcher, self.watcher = self.watcher, None
        if watcher is not None:
            try:
                await watcher.stop()
            except Exception:  # noqa: BLE001,S110 - a watch whose connection went
                pass

    def _got(self, got: Any, error: BaseException | None) -> None:
        """On the loop: the ends to their batches, and the watch goes on."""
        ends, failed = got if error is None else ([], why(error))
        if failed and failed != self.failing:
            self.log.event("err", f"pool: batch ends not watched ({failed}): "
                           f"tried again every {RETRY:g}s")
        self.failing = failed
        if ends:
            keys = [k for k, _end in ends]
            self.ends.take([end for _k, end in ends], lambda e: self._written(keys, e))
        self.bridge.submit(self._next(), self._got)

    def _written(self, keys: list[str], error: BaseException | None) -> None:
        if error is None:  # in the batch: the keys go (one kept comes again: counted once)
            self.bridge.submit(self._forget(keys))

    async def _forget(self, keys: list[str]) -> None:
        for at in range(0, len(keys), 100):
            await asyncio.gather(*(self.link.kv.delete(k) for k in keys[at:at + 100]),
                                 return_exceptions=True)
