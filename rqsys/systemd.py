"""systemd integration: inherited sockets, sd_notify, watchdog (over systemd-python).

Everything degrades to a no-op without systemd (embedded mode on a laptop).
systemd-python does the socket hand-over, READY=1 and ``booted()``; the two
hand-written pieces left are each explained where they are: the loop's
notifications (:meth:`Notifier.send`) and the watchdog interval.
"""

from __future__ import annotations

import os
import socket
import time

import systemd.daemon

from rqsys.errors import ConfigError

_LISTEN_VARS = ("LISTEN_FDS", "LISTEN_PID", "LISTEN_FDNAMES")
# RQ_SUPERVISOR_PID is for the supervisor's own children (rq-scan signals it), which
# it sets after scrubbing; a queue script has no business with it.
_CHILD_SCRUB = ("NOTIFY_SOCKET", *_LISTEN_VARS, "WATCHDOG_USEC", "WATCHDOG_PID",
                "RQ_SUPERVISOR_PID")


def listen_sockets() -> dict[str, socket.socket]:
    """Sockets handed over by systemd (or our supervisor), keyed by fd name.

    libsystemd honours LISTEN_PID (fds meant for another process are not
    ours) and makes the fds close-on-exec.  The LISTEN_* variables are
    removed so that children do not inherit them: libsystemd unsets them in
    the C environment, and os.environ, a copy taken at start, loses them too.
    """
    try:
        named = _listen_fds_with_names()
    except OSError:
        named = {}  # a LISTEN_FDS that is not a number: nothing was handed to us
    for var in _LISTEN_VARS:
        os.environ.pop(var, None)
    return {name: socket.socket(fileno=fd) for fd, name in named.items()}


def _listen_fds_with_names() -> dict[int, str]:
    """{fd: name}; an fd without a usable name is called ``fd<i>``."""
    try:
        named = systemd.daemon.listen_fds_with_names(unset_environment=False)
    except OSError:  # LISTEN_FDNAMES does not have one name per fd
        named = dict.fromkeys(systemd.daemon.listen_fds(unset_environment=False), "")
    start = systemd.daemon.LISTEN_FDS_START
    return {fd: name if name not in ("", "unknown") else f"fd{fd - start}"
            for fd, name in named.items()}


def booted() -> bool:
    """sd_booted(3): is systemd the init system here?"""
    return bool(systemd.daemon.booted())


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
    """sd_notify(3) to this process's unit over NOTIFY_SOCKET; silent when there is none."""

    def __init__(self) -> None:
        self.address = os.environ.get("NOTIFY_SOCKET", "")
        if self.address.startswith("@"):
            self.address = "\0" + self.address[1:]  # the abstract namespace
        self.watchdog_interval = _watchdog_interval()
        self._last_watchdog = 0.0
        self._last_status = ""

    def send(self, *assignments: str) -> None:
        """Send from the event loop: never blocks, drops what does not fit.

        Hand-written because systemd.daemon.notify (sd_notify(3)) blocks
        while the reader's queue is full (net.unix.max_dgram_qlen datagrams,
        10 by default): a reader that fell behind would stall every client
        of the loop, and no STATUS or WATCHDOG line is worth that.
        """
        if not self.address:
            return
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
                sock.sendto("\n".join(assignments).encode(), socket.MSG_DONTWAIT, self.address)
        except OSError:
            pass  # out of fds, or systemd gone, not listening or behind: nothing to tell

    def ready(self, status: str = "") -> None:
        """READY=1, once, before the loop serves: systemd is waiting to read it."""
        if not self.address:
            return
        try:
            systemd.daemon.notify("\n".join(["READY=1", *([f"STATUS={status}"] if status
                                                         else [])]))
        except OSError:
            pass  # systemd gone or not listening: nothing to tell

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


def _watchdog_interval() -> float:
    """Half of WATCHDOG_USEC when it is meant for this process, in seconds (0: none).

    Hand-written: systemd-python has no sd_watchdog_enabled(3).
    """
    try:
        usec = int(os.environ.get("WATCHDOG_USEC", "0"))
        pid = int(os.environ.get("WATCHDOG_PID", str(os.getpid())))
    except ValueError:
        return 0.0
    return usec / 2e6 if usec > 0 and pid == os.getpid() else 0.0
