"""Putting queues into and out of service: the supervisor, systemd, or nobody.

rq-scan installs a queue's directory, then asks an enabler to serve it.
Which one is chosen once at start: under the embedded supervisor
(``RQ_SUPERVISOR_PID`` set) a SIGHUP makes it rescan ``queue/``; under
systemd, ``systemctl enable --now rq@<q>.socket`` (and ``disable --now`` on
removal); with neither, queues are only installed and the log says so.
"""

from __future__ import annotations

import os
import signal
import subprocess
from typing import Protocol

from rqsys import systemd
from rqsys.client import QueueClient
from rqsys.errors import RQError
from rqsys.events import EventLog
from rqsys.store import Layout

SYSTEMCTL_TIMEOUT = 60.0


class Enabler(Protocol):
    def enable(self, names: list[str]) -> None:
        """Serve the newly installed queues ``names``."""

    def reload(self, name: str) -> None:
        """Make queue ``name``'s daemon re-read its config."""

    def disable(self, name: str) -> int | None:
        """Stop serving ``name`` (disabled marker already written); a pidfd to wait on."""

    def stopped(self, name: str) -> bool:
        """True once no daemon of ``name`` can be running any more."""


class SupervisorEnabler:
    """Embedded mode: SIGHUP the supervisor, which syncs its daemons with queue/."""

    def __init__(self, layout: Layout, pid: int, log: EventLog) -> None:
        self.layout, self.pid, self.log = layout, pid, log

    def _hup(self) -> None:
        try:
            os.kill(self.pid, signal.SIGHUP)
        except ProcessLookupError:
            self.log.event("err", f"supervisor {self.pid} is gone; cannot start or stop queues")

    def enable(self, names: list[str]) -> None:
        self._hup()

    def reload(self, name: str) -> None:
        _reload_over_socket(self.layout, name, self.log)

    def disable(self, name: str) -> int | None:
        self._hup()  # the supervisor TERMs the daemon, then removes its socket file
        return None

    def stopped(self, name: str) -> bool:
        return not self.layout.socket_path(name).exists()


class SystemdEnabler:
    """Under systemd: the rq@<q>.socket / rq@<q>.service template units."""

    def __init__(self, log: EventLog, systemctl: str = "systemctl") -> None:
        self.log, self.systemctl = log, systemctl
        self.stopping: dict[str, subprocess.Popen[bytes]] = {}

    def _run(self, *args: str) -> None:
        argv = [self.systemctl, *args]
        try:
            done = subprocess.run(argv, capture_output=True, timeout=SYSTEMCTL_TIMEOUT)
        except (OSError, subprocess.TimeoutExpired) as exc:
            self.log.event("err", f"{' '.join(argv)}: {exc}")
            return
        if done.returncode != 0:
            why = done.stderr.decode(errors="replace").strip()
            self.log.event("err", f"{' '.join(argv)} failed ({done.returncode}): {why}")

    def enable(self, names: list[str]) -> None:
        if names:
            self._run("enable", "--now", *(f"rq@{n}.socket" for n in names))

    def reload(self, name: str) -> None:
        self._run("try-reload-or-restart", f"rq@{name}.service")

    def disable(self, name: str) -> int | None:
        argv = [self.systemctl, "disable", "--now", f"rq@{name}.socket", f"rq@{name}.service"]
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.stopping[name] = proc
        return os.pidfd_open(proc.pid)

    def stopped(self, name: str) -> bool:
        proc = self.stopping.get(name)
        if proc is None or proc.poll() is None:
            return proc is None
        del self.stopping[name]
        if proc.returncode != 0:
            self.log.event("err", f"systemctl disable --now rq@{name} exited {proc.returncode}")
        return True


class NullEnabler:
    """Neither supervisor nor systemd: queues are installed, nothing is started."""

    def __init__(self, layout: Layout, log: EventLog) -> None:
        self.layout, self.log = layout, log

    def enable(self, names: list[str]) -> None:
        for name in names:
            self.log.event("daemon", f"queue {name} installed; no supervisor or systemd "
                           "to start its daemon")

    def reload(self, name: str) -> None:
        _reload_over_socket(self.layout, name, self.log)

    def disable(self, name: str) -> int | None:
        if self.layout.socket_path(name).exists():
            self.log.event("err", f"queue {name}: a daemon started by hand may still be "
                           "running; stop it by hand")
        return None

    def stopped(self, name: str) -> bool:
        return True


def _reload_over_socket(layout: Layout, name: str, log: EventLog) -> None:
    try:
        with QueueClient(layout, name, timeout=10.0) as client:
            client.call("reload")
    except RQError as exc:
        log.event("daemon", f"queue {name}: not reloaded ({exc}); it reads its config at start")


def systemd_booted() -> bool:
    """sd_booted(3): is systemd the init system here?"""
    return systemd.booted()


def choose(layout: Layout, log: EventLog, environ: dict[str, str] | None = None) -> Enabler:
    """The enabler for how this rq-scan was started."""
    env = os.environ if environ is None else environ
    if env.get("RQ_SUPERVISOR_PID", "").isdigit():
        return SupervisorEnabler(layout, int(env["RQ_SUPERVISOR_PID"]), log)
    if env.get("INVOCATION_ID") or systemd_booted():
        return SystemdEnabler(log)
    return NullEnabler(layout, log)
