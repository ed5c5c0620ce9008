"""systemd integration: inherited sockets, sd_notify, watchdog, journald.

Everything degrades to a no-op without systemd (embedded mode on a laptop).
"""

from __future__ import annotations

import os
import socket
import time
from typing import Any

from rqsys.errors import ConfigError

LISTEN_FDS_START = 3
_CHILD_SCRUB = ("NOTIFY_SOCKET", "LISTEN_FDS", "LISTEN_PID", "LISTEN_FDNAMES",
                "WATCHDOG_USEC", "WATCHDOG_PID")


def listen_sockets() -> dict[str, socket.socket]:
    """Sockets handed over by systemd (or our supervisor), keyed by fd name.

    Honours LISTEN_PID, and removes the LISTEN_* variables so that children
    do not inherit them.
    """
    try:
        if int(os.environ.get("LISTEN_PID", "0")) != os.getpid():
            return {}
        count = int(os.environ.get("LISTEN_FDS", "0"))
    except ValueError:
        return {}
    names = os.environ.get("LISTEN_FDNAMES", "").split(":")
    for var in ("LISTEN_FDS", "LISTEN_PID", "LISTEN_FDNAMES"):
        os.environ.pop(var, None)
    found = {}
    for i in range(count):
        fd = LISTEN_FDS_START + i
        name = names[i] if i < len(names) and names[i] else f"fd{i}"
        os.set_inheritable(fd, False)
        found[name] = socket.socket(fileno=fd)
    return found


def default_idle_timeout(environ: dict[str, str] | None = None) -> float:
    """RQ_IDLE_TIMEOUT: a unit's idle time for queues that set none (0 = never)."""
    text = (os.environ if environ is None else environ).get("RQ_IDLE_TIMEOUT", "0") or "0"
    try:
        seconds = float(text)
    except ValueError:
        seconds = -1.0
    if not 0 <= seconds < float("inf"):
        raise ConfigError(f"RQ_IDLE_TIMEOUT={text[:40]!r}: not a number of seconds >= 0")
    return seconds


def child_environ(base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment for a child process, without our systemd hand-over."""
    env = dict(os.environ if base is None else base)
    for var in _CHILD_SCRUB:
        env.pop(var, None)
    return env


class Notifier:
    """sd_notify(3) over NOTIFY_SOCKET; silent when there is none."""

    def __init__(self, environ: dict[str, str] | None = None) -> None:
        env = os.environ if environ is None else environ
        self.address = env.get("NOTIFY_SOCKET", "")
        if self.address.startswith("@"):
            self.address = "\0" + self.address[1:]
        self.watchdog_interval = _watchdog_interval(env)
        self._last_watchdog = 0.0
        self._last_status = ""

    def send(self, *assignments: str) -> None:
        if not self.address:
            return
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            try:
                # never block the event loop on a reader that fell behind
                sock.sendto("\n".join(assignments).encode(), socket.MSG_DONTWAIT, self.address)
            except OSError:
                pass  # systemd gone or not listening: nothing to tell

    def ready(self, status: str = "") -> None:
        self.send("READY=1", *([f"STATUS={status}"] if status else []))

    def status(self, text: str) -> None:
        if text != self._last_status:
            self._last_status = text
            self.send(f"STATUS={text}")

    def reloading(self) -> None:
        usec = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
        self.send("RELOADING=1", f"MONOTONIC_USEC={usec}")

    def stopping(self) -> None:
        self.send("STOPPING=1")

    def watchdog_due(self, now: float) -> float | None:
        """Seconds until the next WATCHDOG=1 is due (None: no watchdog)."""
        if not self.watchdog_interval:
            return None
        return max(0.0, self._last_watchdog + self.watchdog_interval - now)

    def kick_watchdog(self, now: float) -> None:
        due = self.watchdog_due(now)
        if due is not None and due <= 0:
            self._last_watchdog = now
            self.send("WATCHDOG=1")


def _watchdog_interval(env: Any) -> float:
    try:
        usec = int(env.get("WATCHDOG_USEC", "0"))
        pid = int(env.get("WATCHDOG_PID", str(os.getpid())))
    except ValueError:
        return 0.0
    return usec / 2e6 if usec > 0 and pid == os.getpid() else 0.0
