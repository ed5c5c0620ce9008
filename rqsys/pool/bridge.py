"""An asyncio event loop on its own thread, and the way back to the daemon's loop.

nats-py is asyncio; the queue daemon's loop is a selector loop that must
never wait.  The daemon hands a coroutine to :meth:`Bridge.submit` with a
callback; the coroutine runs on the bridge's thread, and when it ends the
thread wakes the daemon through a pipe in its selector, where
:meth:`run_finished` calls the callback, so every change to the daemon's
state still happens on its own loop.  Coroutines run concurrently (unlike
``rqsys.background``'s lanes): a slow publish never holds up an ack.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import os
import threading
from collections.abc import Callable, Coroutine
from typing import Any

Then = Callable[[Any, "BaseException | None"], None]


class Bridge:
    """A thread running an asyncio loop; results come back through a pipe."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._ended: collections.deque[tuple[Then, concurrent.futures.Future[Any]]] = (
            collections.deque())
        self._unfinished = 0  # daemon side only
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._thread = threading.Thread(target=self._run, name="rq-pool", daemon=True)
        self._thread.start()

    def fileno(self) -> int:
        """Readable when a coroutine has ended (register it with the daemon's selector)."""
        return self._wake_r

    @property
    def busy(self) -> int:
        """Coroutines not yet called back."""
        return self._unfinished

    def submit(self, coro: Coroutine[Any, Any, Any], then: Then | None = None) -> None:
        """Run ``coro`` on the bridge; ``then(result, error)`` later on the daemon's loop."""
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        self._unfinished += 1
        future.add_done_callback(lambda f: self._finished(then or _ignore, f))

    def call(self, coro: Coroutine[Any, Any, Any], timeout: float) -> Any:
        """Run ``coro`` and wait for it (start-up and stop only: never in a turn)."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def run_finished(self) -> None:
        """On the daemon's loop: call back the coroutines that have ended."""
        try:
            while os.read(self._wake_r, 4096):
                pass
        except BlockingIOError:
            pass
        while self._ended:
            then, future = self._ended.popleft()
            self._unfinished -= 1
            error = (concurrent.futures.CancelledError() if future.cancelled()
                     else future.exception())
            then(None if error else future.result(), error)

    def close(self) -> None:
        """Stop the asyncio loop (its thread ends; the pipe stays until exit)."""
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(5)

    def _finished(self, then: Then, future: concurrent.futures.Future[Any]) -> None:
        self._ended.append((then, future))
        try:
            os.write(self._wake_w, b"\0")
        except BlockingIOError:
            pass  # the pipe is full of wake-ups already

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()


def why(error: BaseException | None) -> str:
    """An error's text, or its type's name when it has none (asyncio's timeouts)."""
    return (str(error) or type(error).__name__) if error is not None else ""


def _ignore(_result: Any, _error: BaseException | None) -> None:
    """A coroutine whose end nobody waits for (its errors are logged by itself)."""
