"""Signals for the event loops: a handler only records the signal.

The signal also wakes the loop's selector through a socketpair given to
``signal.set_wakeup_fd``; the loop acts on the recorded signals in its own
phase (supervisor's ``SignalReceiver`` shape).
"""

from __future__ import annotations

import signal
import socket
from typing import Any

STOP_SIGNALS = frozenset({signal.SIGTERM, signal.SIGINT})


class SignalFlags:
    """Records TERM, INT and HUP; register it in a selector with ``drain``."""

    def __init__(self, signals: tuple[int, ...] = (signal.SIGTERM, signal.SIGINT,
                                                    signal.SIGHUP)) -> None:
        self.pending: set[int] = set()
        self._r, self._w = socket.socketpair()
        for sock in (self._r, self._w):
            sock.setblocking(False)
        signal.set_wakeup_fd(self._w.fileno(), warn_on_full_buffer=False)
        for sig in signals:
            signal.signal(sig, self._record)

    def _record(self, signum: int, _frame: Any) -> None:
        self.pending.add(signum)  # only a flag: the loop acts on it

    def fileno(self) -> int:
        return self._r.fileno()

    def drain(self, *_event: Any) -> None:
        """Empty the wake-up socket (the selector callback)."""
        try:
            while self._r.recv(512):
                pass
        except BlockingIOError:
            pass

    def take(self) -> set[int]:
        """The signals recorded since the last call."""
        taken, self.pending = self.pending, set()
        return taken
