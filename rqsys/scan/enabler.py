"""Putting queues into and out of service: the supervisor, systemd, or nobody.

rq-scan installs a queue's directory, then asks an enabler to serve it.
Which one is chosen once at start: under the embedded supervisor
(``RQ_SUPERVISOR_PID`` set) a SIGHUP makes it rescan ``queue/``; under
systemd, ``systemctl enable --now rq@<q>.socket`` (and ``disable --now`` on
removal); with neither, queues are only installed and the log says so.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Protocol

from rqsys import config, systemd
from rqsys.errors import RQError
from rqsys.install import units
from rqsys.observe.events import EventLog
from rqsys.run import credentials, resources, unituser
from rqsys.store import Layout
from rqsys.wire.client import QueueClient

RELOAD_TIMEOUT = 10.0  # seconds a queue daemon has to answer "reload"
UNIT_DIR = Path("/etc/systemd/system")  # where rq-scan writes queues' drop-ins


class Enabler(Protocol):
    """What rq-scan asks of whoever serves queues; no call waits for another process.

    A call that starts a helper process returns its pidfd (readable once it
    has exited; the caller closes it) and the caller then calls :meth:`reap`.
    """

    def enable(self, names: list[str]) -> int | None:
        """Serve the newly installed queues ``names``."""

    def reload(self, name: str) -> int | None:
        """Make queue ``name``'s daemon re-read its config."""

    def disable(self, name: str) -> int | None:
        """Stop serving ``name`` (disabled marker already written)."""

    def stopped(self, name: str) -> bool:
        """True once no daemon of ``name`` can be running any more."""

    def reap(self) -> None:
        """Collect the helper processes that have exited, logging failures."""


class SupervisorEnabler:
    """Embedded mode: SIGHUP the supervisor, which syncs its daemons with queue/."""

    def __init__(self, layout: Layout, pid: int, log: EventLog) -> None:
        self.layout, self.pid, self.log = layout, pid, log

    def _hup(self) -> None:
        try:
            os.kill(self.pid, signal.SIGHUP)
        except ProcessLookupError:
            self.log.event("err", f"supervisor {self.pid} is gone; cannot start or stop queues")

    def enable(self, names: list[str]) -> int | None:
        self._hup()
        return None

    def reload(self, name: str) -> int | None:
        reload_in_background(self.layout, name, self.log)
        return None

    def disable(self, name: str) -> int | None:
        self._hup()  # the supervisor TERMs the daemon, then removes its socket file
        return None

    def stopped(self, name: str) -> bool:
        return not self.layout.socket_path(name).exists()

    def reap(self) -> None:
        pass  # no helper processes


@dataclass
class Helper:
    """A systemctl run: the process and the file its stderr goes to."""

    argv: list[str]
    proc: subprocess.Popen[bytes]
    errors: IO[bytes]

    def finish(self, log: EventLog) -> None:
        """Log why it failed, if it did; the process has exited."""
        self.errors.seek(0)
        why = self.errors.read().decode(errors="replace").strip()
        self.errors.close()
        if self.proc.returncode != 0:
            log.event("err", f"{' '.join(self.argv)} failed ({self.proc.returncode}): {why}")


class SystemdEnabler:
    """Under systemd: the rq@<q>.socket / rq@<q>.service template units.

    ``systemctl`` waits for the jobs it starts, so it runs as a child the
    loop does not wait for; its stderr goes to a file (a pipe nobody reads
    could fill), read when it has exited.
    """

    def __init__(self, log: EventLog, systemctl: str = "systemctl",
                 layout: Layout | None = None, unit_dir: Path = UNIT_DIR) -> None:
        self.log, self.systemctl = log, systemctl
        self.layout, self.unit_dir = layout, unit_dir
        self.running: list[Helper] = []
        self.stopping: dict[str, Helper] = {}

    def _limits_changed(self, names: list[str], removed: bool = False) -> bool:
        """Bring each queue's limits, credentials and user drop-ins in line with
        its config; True when one changed (systemd must then reload its units first)."""
        changed, layout = False, self.layout
        if layout is None:
            return False
        for name in names:
            try:
                cfg = {} if removed else config.load_queue_config(layout, name)
                changed |= resources.sync_drop_in(self.unit_dir, name, cfg.get("limits"),
                                                      resources.limits_runs(cfg))
                changed |= self._write(name, credentials.DROP_IN_NAME, credentials.drop_in(cfg))
                changed |= self._write(name, unituser.DROP_IN_NAME, unituser.drop_in(
                    name, cfg, layout.queue_dir(name), units.rqsys_executable()))
                for why in credentials.unreadable(cfg):
                    self.log.event("err", f"queue {name}: {why}")
            except (RQError, OSError) as exc:
                self.log.event("err", f"queue {name}: drop-ins not written: {exc}")
        return changed

    def _write(self, name: str, drop_in: str, text: str) -> bool:
        return resources.write_drop_in(resources.drop_in_path(self.unit_dir, name, drop_in),
                                       text)

    def _start(self, *args: str, reload_first: bool = False) -> Helper | None:
        argv = [self.systemctl, *args]
        if reload_first:  # one helper: the units are read again before the job
            argv = ["sh", "-c", '"$0" daemon-reload && exec "$0" "$@"', *argv]
        return self._spawn(argv)

    def run_steps(self, steps: list[list[str]], all_of: bool = True) -> int | None:
        """One helper running the commands ``steps`` in turn: each only after the
        last succeeded (``all_of``), or each whatever the last did."""
        script = (" && " if all_of else "; ").join(shlex.join(step) for step in steps)
        helper = self._spawn(["sh", "-c", script])
        if helper is None:
            return None
        self.running.append(helper)
        return os.pidfd_open(helper.proc.pid)

    def _spawn(self, argv: list[str]) -> Helper | None:
        errors = tempfile.TemporaryFile()  # noqa: SIM115 (closed by Helper.finish)
        try:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL,
                                    stdout=subprocess.DEVNULL, stderr=errors)
        except OSError as exc:
            errors.close()
            self.log.event("err", f"{' '.join(argv)}: {exc}")
            return None
        return Helper(argv, proc, errors)

    def _run(self, *args: str, reload_first: bool = False) -> int | None:
        helper = self._start(*args, reload_first=reload_first)
        if helper is None:
            return None
        self.running.append(helper)
        return os.pidfd_open(helper.proc.pid)

    def enable(self, names: list[str]) -> int | None:
        if not names:
            return None
        return self._run("enable", "--now", *(f"rq@{n}.socket" for n in names),
                         reload_first=self._limits_changed(names))

    def reload(self, name: str) -> int | None:
        was = self._read_at_start(name)
        changed = self._limits_changed([name])
        # Delegate= and credentials are applied when a unit starts: a daemon that
        # gains or loses message_limits, or whose credentials change, is
        # restarted (its running scripts requeued)
        verb = ("try-restart" if self._read_at_start(name) != was
                else "try-reload-or-restart")
        return self._run(verb, f"rq@{name}.service", reload_first=changed)

    def _read_at_start(self, name: str) -> tuple[bool, str, str]:
        """What of queue ``name``'s drop-ins systemd applies only when it starts the unit."""
        return (resources.delegates(self.unit_dir, name),
                resources.drop_in_text(self.unit_dir, name, credentials.DROP_IN_NAME),
                resources.drop_in_text(self.unit_dir, name, unituser.DROP_IN_NAME))

    def disable(self, name: str) -> int | None:
        self._limits_changed([name], removed=True)  # read again at the next daemon-reload
        helper = self._start("disable", "--now", f"rq@{name}.socket", f"rq@{name}.service")
        if helper is None:
            return None  # no systemctl to run: nothing of systemd's can be serving it
        self.stopping[name] = helper
        return os.pidfd_open(helper.proc.pid)

    def stopped(self, name: str) -> bool:
        helper = self.stopping.get(name)
        if helper is None or helper.proc.poll() is None:
            return helper is None
        del self.stopping[name]
        helper.finish(self.log)
        return True

    def reap(self) -> None:
        for helper in [h for h in self.running if h.proc.poll() is not None]:
            self.running.remove(helper)
            helper.finish(self.log)


class NullEnabler:
    """Neither supervisor nor systemd: queues are installed, nothing is started."""

    def __init__(self, layout: Layout, log: EventLog) -> None:
        self.layout, self.log = layout, log

    def enable(self, names: list[str]) -> int | None:
        for name in names:
            self.log.event("daemon", f"queue {name} installed; no supervisor or systemd "
                           "to start its daemon")
        return None

    def reload(self, name: str) -> int | None:
        reload_in_background(self.layout, name, self.log)
        return None

    def disable(self, name: str) -> int | None:
        if self.layout.socket_path(name).exists():
            self.log.event("err", f"queue {name}: a daemon started by hand may still be "
                           "running; stop it by hand")
        return None

    def stopped(self, name: str) -> bool:
        return True

    def reap(self) -> None:
        pass  # no helper processes


def reload_in_background(layout: Layout, name: str, log: EventLog) -> threading.Thread:
    """Ask queue ``name``'s daemon to reload, on a thread: a slow daemon holds no loop."""
    thread = threading.Thread(target=_reload_over_socket, args=(layout, name, log),
                              name=f"reload {name}", daemon=True)
    thread.start()
    return thread


def _reload_over_socket(layout: Layout, name: str, log: EventLog) -> None:
    try:
        with QueueClient(layout, name, timeout=RELOAD_TIMEOUT) as client:
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
        return SystemdEnabler(log, layout=layout)
    return NullEnabler(layout, log)
