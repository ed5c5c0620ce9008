"""Calendar and cron timers under systemd: the ``rq-timer@<name>.timer`` units
rq-scan writes, and the slot message their service sends (``rqsys timer NAME``).

rq-scan renders a checked timer file into ``/etc/systemd/system/
rq-timer@<name>.timer`` (``OnCalendar=`` lines from :func:`on_calendar`,
``Persistent=``, ``RandomizedDelaySec=``), enables and (re)starts it, and
stops, disables and removes it when the file goes: ``systemctl list-timers``
shows every schedule with its next and last run, and systemd's catch-up
applies.  The oneshot ``rq-timer@.service`` (``units/``) runs ``rqsys timer
NAME``, which sends the message of the latest slot through the queue
socket with the slot's unique key, so a re-delivered trigger or a second
start makes no second message (and, for ``"overlap": "skip"``, none while
the timer's last message has not ended: :mod:`rqsys.timers.history`).
Period timers stay in rq-scan's own loop.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from pathlib import Path

from rqsys import config
from rqsys.errors import ConfigError
from rqsys.observe.events import EventLog
from rqsys.scan import scandir
from rqsys.store import Layout
from rqsys.timers import history, listing
from rqsys.timers.calendar import on_calendar
from rqsys.timers.periodic import Timer, deliver, first_file, load_timer
from rqsys.timers.slots import latest_missed, slot_extra

UNIT_DIR = Path("/etc/systemd/system")
UNIT_NAME_RE = re.compile(r"^[A-Za-z0-9_-]{1,200}$")  # used as is in a unit name
MARK = "# Made by rq-scan from"  # a timer unit of ours (the others are left alone)
LOOKBACK = 400 * 86400.0  # how far back `rqsys timer` looks for the slot it sends
Steps = Callable[[list[list[str]], bool], None]  # run commands in a helper (all, or each)


def unit_name(name: str) -> str:
    return f"rq-timer@{name}.timer"


def unit_text(timer: Timer) -> str:
    """The ``rq-timer@<name>.timer`` file of a calendar or cron timer."""
    assert timer.spec is not None
    lines = [f"{MARK} {timer.source}; rewritten or removed with it.",
             "[Unit]", f"Description=rqsys timer {timer.name}",
             "Documentation=man:rqsys.json(5)", "PartOf=rq.target", "", "[Timer]",
             *(f"OnCalendar={c}" for c in on_calendar(timer.spec)),
             f"Persistent={'true' if timer.persistent else 'false'}",
             "AccuracySec=1s"]
    if timer.jitter:
        lines.append(f"RandomizedDelaySec={timer.jitter:g}")
    return "\n".join([*lines, "", "[Install]", "WantedBy=timers.target rq.target", ""])


class SystemdTimers:
    """rq-scan's timer units: written here, (re)started and removed by helpers."""

    def __init__(self, log: EventLog, steps: Steps, systemctl: str = "systemctl",
                 unit_dir: Path = UNIT_DIR) -> None:
        self.log, self.steps, self.systemctl, self.unit_dir = log, steps, systemctl, unit_dir

    def path(self, name: str) -> Path:
        return self.unit_dir / unit_name(name)

    def install(self, timer: Timer) -> bool:
        """Write the unit; enable and start it (restart it when it changed).
        False when it cannot be a unit here: rq-scan then fires it itself."""
        if not UNIT_NAME_RE.match(timer.name):
            self.log.event("err", f"timer {timer.name}: not a unit name (letters, digits, _ "
                           "and -): rq-scan fires it itself")
            return False
        path, text, unit = self.path(timer.name), unit_text(timer), unit_name(timer.name)
        if _read(path) == text:
            self.steps([[self.systemctl, "enable", "--now", unit]], True)
            return True
        tmp = path.with_name(f".{path.name}.tmp")
        try:
            tmp.write_text(text)
            tmp.replace(path)  # systemd never reads half a file (unit config, not message data)
        except OSError as exc:  # e.g. NixOS: /etc/systemd/system is read-only
            self.log.event("err", f"timer {timer.name}: cannot write {path} "
                           f"({exc.strerror or exc}): rq-scan fires it itself")
            return False
        self.log.event("daemon", f"timer {timer.name}: {unit} written; (re)starting it")
        self.steps([[self.systemctl, "daemon-reload"], [self.systemctl, "enable", unit],
                    [self.systemctl, "restart", unit]], True)
        return True

    def remove(self, name: str) -> None:
        """Stop and disable a timer's unit, then remove its file (if it is ours)."""
        path = self.path(name)
        if not _read(path).startswith(MARK):
            return
        self.log.event("daemon", f"timer {name}: removing {unit_name(name)}")
        self.steps([[self.systemctl, "disable", "--now", unit_name(name)],
                    ["rm", "-f", str(path)], [self.systemctl, "daemon-reload"]], False)

    def made(self) -> list[str]:
        """Names of the timers whose units rq-scan made (to remove stale ones at start)."""
        return sorted(p.name[len("rq-timer@"):-len(".timer")]
                      for p in self.unit_dir.glob("rq-timer@*.timer")
                      if _read(p).startswith(MARK))


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:  # missing, or no directory to read it from
        return ""


def send_slot(layout: Layout, name: str, now: float | None = None) -> str:
    """``rqsys timer NAME`` (rq-timer@NAME.service): send the latest slot's
    message; its id, or the one of the message that already has that slot, or
    (``"overlap": "skip"``, the slot skipped) the one of the last message,
    which has not ended."""
    dirs = [layout.timers, layout.scandir / scandir.TIMERS_SUBDIR]
    path = first_file(dirs, f"{name}.json")
    if path is None:
        raise ConfigError(f"no timer file {name}.json in {' or '.join(map(str, dirs))}")
    timer = load_timer(path)
    if timer.spec is None:
        raise ConfigError(f"{path}: a period timer is fired by rq-scan, not rq-timer@")
    now = time.time() if now is None else now
    slot = latest_missed(timer.spec, now + 1.0, now - LOOKBACK)  # +1: a trigger a tick early
    if slot is None:
        raise ConfigError(f"{path}: no slot of {timer.spec.kind} {timer.spec.expr!r} "
                          "has elapsed")
    if timer.overlap == history.SKIP:
        held = history.check(layout.root, timer.name, slot)
        if held is not None:  # recorded as skipped (the timer's last message is kept)
            return held.msg_id
    sysconfig = config.load_system_config(layout)
    msg_id = deliver(layout, sysconfig, timer, slot, slot_extra(timer, slot))
    listing.record(layout, timer, slot, msg_id)
    return msg_id
