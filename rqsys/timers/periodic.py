"""Timers: periodic messages from JSON files in ``timers/`` (RQ's timer scandir).

A timer file ``<name>.json`` (one '.', symlinks allowed) holds
``{"period": N, "msg": {"dest": ..., "param1": ...}}``.  A new timer fires at
once, then every ``period`` seconds; a message may be queued up to
``EARLY`` seconds before its time with ``due`` set to the scheduled time.
With ``"overlap": "skip"`` a period whose timer's last message has not
ended makes no message (:mod:`rqsys.timers.history` records the skip).
The scheduled time of each timer's last firing is kept in
``<root>/timer-state.json`` so a restart neither skips nor doubles a period.
A destination that is PAUSE or DOWN gets no message for that period.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rqsys import config, store
from rqsys.background import peer_lane
from rqsys.errors import ConfigError, QueueDown, RQError, Unavailable
from rqsys.observe.events import EventLog
from rqsys.store import Layout
from rqsys.timers import history
from rqsys.timers.calendar import Spec
from rqsys.wire import client

EARLY = 60.0  # seconds a message may be queued before its scheduled time
RETRY = 5.0  # seconds before trying again when the destination daemon is unreachable
TIMER_FILE_RE = re.compile(r"^([^.]+)\.json$")
SCHEDULE_KINDS = ("period", "calendar", "cron")
SLOT_FIELDS = ("timezone", "persistent", "jitter", "unique")  # calendar and cron only


@dataclass(frozen=True)
class Timer:
    """One timer file's content: a ``period``, or a calendar or cron ``spec``
    (then ``period`` is 0; see :mod:`rqsys.timers.slots`)."""

    name: str
    period: int
    msg: dict[str, str]
    spec: Spec | None = None
    persistent: bool = True
    jitter: float = 0.0
    unique: bool = True
    overlap: str = history.QUEUE  # or SKIP: no message while the last one has not ended
    source: str = field(default="", compare=False)  # the file, for log lines


def timer_name(filename: str) -> str | None:
    """The timer name of a file name like ``hourly.json``, else None."""
    found = TIMER_FILE_RE.match(filename)
    return found.group(1) if found else None


def first_file(dirs: list[Path], filename: str) -> Path | None:
    """``filename`` in the first of ``dirs`` that has it (a link counts), if any."""
    return next((d / filename for d in dirs if os.path.lexists(d / filename)), None)


def load_timer(path: Path) -> Timer:
    """Read and validate a timer file; ConfigError says why it is refused."""
    name = timer_name(path.name)
    if name is None:
        raise ConfigError(f"{path}: a timer file is named NAME.json with a single '.'")
    if not path.is_file():
        raise ConfigError(f"{path}: {'broken link' if path.is_symlink() else 'not a file'}")
    data = config.load_checked("timer", path)
    kinds = [k for k in SCHEDULE_KINDS if k in data]
    if len(kinds) != 1:
        given = " and ".join(kinds) or "none"
        raise ConfigError(f"{path}: {'/'.join(SCHEDULE_KINDS)}: give exactly one (given: {given})")
    overlap = str(data.get("overlap", history.QUEUE))  # the schema's enum checked it
    if kinds[0] == "period":
        extra = sorted(set(data) & set(SLOT_FIELDS))
        if extra:
            raise ConfigError(f"{path}: {extra[0]}: goes with calendar or cron, not period")
        return Timer(name, int(data["period"]), dict(data["msg"]), overlap=overlap,
                     source=str(path))
    spec = Spec(kinds[0], str(data[kinds[0]]), str(data.get("timezone", "")))
    return Timer(name, 0, dict(data["msg"]), spec, bool(data.get("persistent", True)),
                 float(data.get("jitter", 0)), bool(data.get("unique", True)), overlap,
                 str(path))


Sender = Callable[[Timer, float], str]
Then = Callable[[Any, "BaseException | None"], None]  # then(result, error)
Runner = Callable[[Callable[[], Any], Then, str], None]  # run(work, then, lane)


def run_now(work: Callable[[], Any], then: Then, lane: str = "") -> None:
    """The plain runner: ``work`` runs at once, on the caller's thread."""
    try:
        result = work()
    except Exception as exc:  # handed to ``then``, as Background hands it
        then(None, exc)
    else:
        then(result, None)


class TimerTable:
    """The in-memory timers and when each fires next; the clock is injectable.

    A firing's send runs through ``run`` (rq-scan passes its Background's
    submit, so a destination daemon that hangs holds no loop); until its
    outcome is back, that timer is *in flight* and does not fire again.
    """

    def __init__(self, state_path: Path, send: Sender, log: EventLog,
                 clock: Callable[[], float], run: Runner = run_now) -> None:
        self.state_path, self.send, self.log, self.clock = state_path, send, log, clock
        self.run = run
        self.timers: dict[str, Timer] = {}
        self.last: dict[str, float] = self._load_state()
        self.retry_at: dict[str, float] = {}
        self.in_flight: set[str] = set()

    def _load_state(self) -> dict[str, float]:
        return load_last(self.state_path, self.log, "timers start afresh")

    def _save_state(self) -> None:
        save_last(self.state_path, self.last)

    def set(self, timer: Timer) -> None:
        """Add a timer, or override one (its last firing is kept)."""
        verb = "changed" if timer.name in self.timers else "added"
        self.timers[timer.name] = timer
        self.log.event("daemon", f"timer {timer.name} {verb}: every {timer.period}s "
                       f"to {timer.msg['dest']}")

    def remove(self, name: str) -> None:
        """Stop a timer and forget its last firing (a new one fires at once)."""
        self.retry_at.pop(name, None)
        if self.last.pop(name, None) is not None:
            self._save_state()
        if self.timers.pop(name, None) is not None:
            self.log.event("daemon", f"timer {name} removed")

    def forget_missing(self) -> None:
        """Drop saved firings of timers whose file went away while we were down."""
        gone = set(self.last) - set(self.timers)
        for name in gone:
            del self.last[name]
        if gone:
            self._save_state()

    def scheduled(self, name: str, now: float) -> float:
        """When timer ``name`` is due next (``now``, for a timer that never fired)."""
        if name not in self.last:
            return now
        return self.last[name] + self.timers[name].period

    def _fire_at(self, name: str, now: float) -> float:
        early = min(EARLY, self.timers[name].period / 2)  # never a whole period ahead
        return self.retry_at.get(name, self.scheduled(name, now) - early)

    def _waiting(self) -> list[str]:
        """The timers that may fire: all but those in flight."""
        return [n for n in sorted(self.timers) if n not in self.in_flight]

    def next_wake(self) -> float | None:
        """Clock time of the next firing, or None without timers (or all in flight)."""
        now = self.clock()
        return min((self._fire_at(n, now) for n in self._waiting()), default=None)

    def fire_due(self) -> list[str]:
        """Fire every timer whose time has come; returns their names."""
        now = self.clock()
        due = [n for n in self._waiting() if self._fire_at(n, now) <= now]
        for name in due:
            self._fire(self.timers[name], now)
        return due

    def _fire(self, timer: Timer, now: float) -> None:
        when = self.scheduled(timer.name, now)
        self.in_flight.add(timer.name)
        self.run(lambda: self._send_unless_held(timer, when, now),
                 lambda msg_id, error: self._fired(timer, now, when, msg_id, error),
                 peer_lane(timer.msg["dest"]))

    def _send_unless_held(self, timer: Timer, when: float, now: float) -> Any:
        """On the send's lane: the message's id, or a skip timer's Held."""
        if timer.overlap == history.SKIP:
            held = history.check(self.state_path.parent, timer.name, when)
            if held is not None:
                return held
        return self.send(timer, when if when > now else 0.0)

    def _fired(self, timer: Timer, now: float, when: float, msg_id: Any,
               error: BaseException | None) -> None:
        """The outcome of one firing, back on the caller's thread."""
        self.in_flight.discard(timer.name)
        if error is not None and not isinstance(error, RQError):
            raise error  # a bug, not the destination's answer
        if timer.name not in self.timers:
            return  # removed meanwhile, and its last firing with it
        if isinstance(error, Unavailable):
            self.retry_at[timer.name] = now + RETRY
            self.log.event("err", f"timer {timer.name}: {error}; trying again in {RETRY:.0f}s")
            return
        if error is not None:
            self.log.event("err", f"timer {timer.name}: no message this period: {error}")
        elif isinstance(msg_id, history.Held):
            self.log.event("daemon", msg_id.text(timer.name, "period"))
        else:
            self.log.event("created", f"timer {timer.name}: message {msg_id} "
                           f"to {timer.msg['dest']}")
        self.retry_at.pop(timer.name, None)
        late = now - when >= timer.period  # down for a whole period: fire once, not a burst
        self.last[timer.name] = now if late else when
        self._save_state()


def deliver(layout: Layout, sysconfig: dict[str, Any], timer: Timer, due: float,
            extra: dict[str, Any] | None = None) -> str:
    """Queue ``timer``'s message (through the relay for another host), with the
    ``extra`` fields; its id (a duplicate's: the one holding its unique key).

    QueueDown when the destination is PAUSE or DOWN, NotFound without it.
    """
    msg: dict[str, Any] = dict(timer.msg, **(extra or {}))
    if due:
        msg["due"] = due
    queue = client.queue_for_dest(msg["dest"], bool(msg.get("force_remote")))
    with client.QueueClient(layout, queue, timeout=10.0) as conn:
        admin = conn.call("counts")["admin"]
        if admin != "UP":
            raise QueueDown(f"destination queue {queue} is {admin}")
        return str(conn.call("create", msg=msg, refuse_paused=True,
                             by=f"timer {timer.name}")["msg_id"])


def load_last(path: Path, log: EventLog, otherwise: str) -> dict[str, float]:
    """Each timer's last firing (name -> time) from ``path``; none if it is
    missing, or unreadable (logged, saying what follows: ``otherwise``)."""
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        log.event("err", f"{path}: unreadable ({exc}); {otherwise}")
        return {}
    return {str(k): float(v) for k, v in data.items() if isinstance(v, (int, float))}


def save_last(path: Path, last: dict[str, float]) -> None:
    """Write each timer's last firing, durably."""
    store.write_file_durably(path, json.dumps(last, indent=1, sort_keys=True).encode())
