"""Kept connections to queue daemons, so keep-alive HTTP clients don't reconnect.

A connection idle for longer than ``IDLE_CLOSE`` seconds is closed, because an
open connection keeps a queue daemon from exiting when idle (socket activation).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from rqsys.errors import NotSent, ProtocolError, RQError, Unavailable
from rqsys.store import Layout
from rqsys.wire.client import QueueClient

IDLE_CLOSE = 2.0
READ_ONLY_OPS = frozenset({"get", "state", "status", "list", "counts", "config", "ping"})


class Connections:
    """Free lists of QueueClients per queue, shared by the server's threads."""

    def __init__(self, layout: Layout, clock: Callable[[], float] = time.monotonic) -> None:
        self.layout = layout
        self._clock = clock
        self._free: dict[str, list[tuple[QueueClient, float]]] = {}
        self._lock = threading.Lock()
        self._next_sweep = 0.0  # the clock's time for the next sweep() of every queue

    def call(self, queue: str, op: str, fds: list[int] | tuple[int, ...] = (),
             **args: Any) -> dict[str, Any]:
        """One request on a pooled connection; on a stale one (its daemon
        restarted), a request that was not sent is sent again on a new one, and
        one that was, only if it reads (a write may have been done)."""
        client, reused = self._acquire(queue)
        try:
            reply = client.call(op, fds=fds, **args)
        except Unavailable as exc:
            client.close()
            if not (reused and (isinstance(exc, NotSent) or op in READ_ONLY_OPS)):
                raise
            with QueueClient(self.layout, queue) as fresh:
                return fresh.call(op, fds=fds, **args)
        except (ProtocolError, OSError):
            client.close()
            raise
        except RQError:
            self._release(client)  # a refusal: the connection itself is fine
            raise
        self._release(client)
        return reply

    def _acquire(self, queue: str) -> tuple[QueueClient, bool]:
        """A free connection used within IDLE_CLOSE, else a new one.  Every
        queue's idle ones are swept a few times per IDLE_CLOSE, not per call."""
        now = self._clock()
        if now >= self._next_sweep:
            self._next_sweep = now + IDLE_CLOSE / 4
            self.sweep()
        found, stale = None, []
        with self._lock:
            free = self._free.get(queue)
            while free and found is None:
                client, used = free.pop()
                if used >= now - IDLE_CLOSE:
                    found = client
                else:
                    stale.append(client)
        for client in stale:
            client.close()
        return (found, True) if found else (QueueClient(self.layout, queue), False)

    def _release(self, client: QueueClient) -> None:
        with self._lock:
            self._free.setdefault(client.queue, []).append((client, self._clock()))

    def sweep(self) -> None:
        """Close the connections nobody used for IDLE_CLOSE seconds."""
        limit = self._clock() - IDLE_CLOSE
        stale: list[QueueClient] = []
        with self._lock:
            for queue, free in self._free.items():
                stale += [c for c, used in free if used < limit]
                self._free[queue] = [(c, used) for c, used in free if used >= limit]
        for client in stale:
            client.close()

    def start_sweeper(self) -> threading.Thread:
        """A daemon thread that sweeps once a second (for a long-running server)."""
        def loop() -> None:
            while True:
                time.sleep(1.0)
                self.sweep()

        thread = threading.Thread(target=loop, name="rq-pool-sweeper", daemon=True)
        thread.start()
        return thread
