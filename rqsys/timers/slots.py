"""Calendar and cron timers without systemd: one message per slot, and catch-up.

A *slot* is one elapse of a timer's expression (:mod:`rqsys.timers.calendar`).  The
table fires each slot once, ``jitter`` seconds or less after it (a delay
derived from the timer and the slot, so every rq-scan picks the same), with
a message carrying ``timer``, ``slot``, ``due`` = the slot and, unless the
file says ``"unique": false``, the unique key ``timer <name> <slot>`` held
for ``UNIQUE_FOR`` after the message ended: a second rq-scan, a restart
between the create and the state file, or a clock step back cannot make a
second message for a slot.  The last slot fired of each timer is kept in
``<root>/timer-slots.json``; at start a ``persistent`` timer whose slots
passed meanwhile fires once, for the latest of them (as systemd's
``Persistent=``); a new timer waits for its first slot.  A timer with
``"overlap": "skip"`` makes no message for a slot while its last message has
not ended (:mod:`rqsys.timers.history`, checked on the send's lane); the
slot counts as fired, a missed one at start alike.

Elapses are computed on the Background lanes (systemd-analyze is another
process, and rq-scan's loop waits on none), like the sends.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from rqsys.background import peer_lane
from rqsys.errors import RQError, Unavailable
from rqsys.observe.events import EventLog
from rqsys.timers import history
from rqsys.timers.calendar import Spec, check, elapses, latest
from rqsys.timers.periodic import RETRY, Runner, Timer, load_last, run_now, save_last

UNIQUE_FOR = 86400.0  # seconds a slot's key stays held after its message ended
LOOKBACKS = (3600.0, 2 * 86400.0, 40 * 86400.0)  # where to look for the latest missed slot
PLAN_LANE = "timer-slots"
SlotSender = Callable[[Timer, float, dict[str, Any]], str]  # (timer, due, extra) -> id


def upcoming(spec: Spec, last: float | None, now: float, persistent: bool) -> float | None:
    """The slot to fire next: the latest one missed since ``last`` (persistent
    timers), else the first after ``now`` (None: it never elapses again)."""
    if last is not None and persistent:
        missed = latest_missed(spec, now, last)
        if missed is not None:
            return missed
    found = elapses(spec, max(now, last or 0.0), 1)
    return found[0] if found else None


def latest_missed(spec: Spec, now: float, since: float) -> float | None:
    """The latest slot in (since, now]; recent windows first, so a timer down
    for months does not page through every slot of a minutely expression."""
    for back in LOOKBACKS:
        start = max(since, now - back)
        found = latest(spec, now, start)
        if found is not None or start == since:
            return found
    return latest(spec, now, since)


def slot_extra(timer: Timer, slot: float) -> dict[str, Any]:
    """The fields a slot's message carries beside the timer's ``msg``."""
    extra: dict[str, Any] = {"timer": timer.name, "slot": slot}
    if timer.unique:
        extra.update(unique_key=f"timer {timer.name} {slot:.0f}", unique_for=UNIQUE_FOR)
    return extra


def delay(timer: Timer, slot: float) -> float:
    """The jitter of a slot: in [0, jitter), the same in every process."""
    if timer.jitter <= 0:
        return 0.0
    digest = hashlib.sha256(f"{timer.name} {slot:.0f}".encode()).digest()
    return timer.jitter * int.from_bytes(digest[:8], "big") / 2 ** 64


class Units(Protocol):
    """Under systemd, who turns timers into units (rqsys.timers.units.SystemdTimers)."""

    def install(self, timer: Timer) -> bool: ...

    def remove(self, name: str) -> None: ...

    def made(self) -> list[str]: ...


class SlotTable:
    """The calendar and cron timers of one rq-scan, and the slot each fires next."""

    def __init__(self, state_path: Path, send: SlotSender, log: EventLog,
                 clock: Callable[[], float], run: Runner = run_now) -> None:
        self.state_path, self.send, self.log, self.clock = state_path, send, log, clock
        self.run = run
        self.root = state_path.parent  # where the timers' records are (rqsys.timers.history)
        self.timers: dict[str, Timer] = {}
        self.last: dict[str, float] = self._load_state()
        self.next: dict[str, float] = {}  # name -> slot it fires next (once planned)
        self.retry_at: dict[str, float] = {}
        self.busy: set[str] = set()  # being planned or sent
        self.units: Units | None = None  # under systemd: timers are units, not fired here

    def _load_state(self) -> dict[str, float]:
        return load_last(self.state_path, self.log, "no catch-up")

    def _save_state(self) -> None:
        save_last(self.state_path, self.last)

    # ------------------------------------------------------------ timers
    def set(self, timer: Timer) -> None:
        """Add or change a timer; its expression is checked and its next slot
        planned off the loop (a bad one is logged and dropped)."""
        verb = "changed" if timer.name in self.timers else "added"
        self.timers[timer.name] = timer
        self.next.pop(timer.name, None)
        assert timer.spec is not None
        self.log.event("daemon", f"timer {timer.name} {verb}: {timer.spec.kind} "
                       f"{timer.spec.expr!r} to {timer.msg['dest']}")
        self._plan(timer)

    def _plan(self, timer: Timer) -> None:
        spec, last, now = timer.spec, self.last.get(timer.name), self.clock()
        assert spec is not None

        def work() -> float | None:
            check(spec)
            return upcoming(spec, last, now, timer.persistent)

        self.busy.add(timer.name)
        self.run(work, lambda slot, error: self._planned(timer, slot, error), PLAN_LANE)

    def _planned(self, timer: Timer, slot: Any, error: BaseException | None) -> None:
        self.busy.discard(timer.name)
        if self.timers.get(timer.name) is not timer:
            return  # changed or removed meanwhile
        if error is not None:
            if not isinstance(error, RQError):
                raise error
            self.log.event("err", f"timer file refused: {timer.source}: {error}")
            self.remove(timer.name, quiet=True)
        elif self.units is not None and self.units.install(timer):
            return  # systemd fires it
        elif slot is None:
            self.log.event("daemon", f"timer {timer.name}: no slot left; it fires no more")
        else:
            self.next[timer.name] = float(slot)

    def remove(self, name: str, quiet: bool = False) -> None:
        """Stop a timer (and its unit) and forget its last slot."""
        self.retry_at.pop(name, None)
        self.next.pop(name, None)
        if self.last.pop(name, None) is not None:
            self._save_state()
        if self.units is not None:
            self.units.remove(name)
        if self.timers.pop(name, None) is not None and not quiet:
            self.log.event("daemon", f"timer {name} removed")

    def forget_missing(self) -> None:
        """Drop saved slots (and units) of timers whose file went away while we were down."""
        gone = set(self.last) - set(self.timers)
        for name in gone:
            del self.last[name]
        if gone:
            self._save_state()
        units = self.units
        if units is None:
            return
        for name in units.made():
            if name not in self.timers:
                units.remove(name)

    # ------------------------------------------------------------ firing
    def _fire_at(self, name: str) -> float:
        slot = self.next[name]
        return self.retry_at.get(name, slot + delay(self.timers[name], slot))

    def _ready(self) -> list[str]:
        return [n for n in sorted(self.next) if n not in self.busy]

    def next_wake(self) -> float | None:
        """Clock time of the next firing, or None."""
        return min((self._fire_at(n) for n in self._ready()), default=None)

    def fire_due(self) -> list[str]:
        """Fire every timer whose slot (plus its jitter) has come; their names."""
        now = self.clock()
        due = [n for n in self._ready() if self._fire_at(n) <= now]
        for name in due:
            self._fire(self.timers[name], self.next[name])
        return due

    def _fire(self, timer: Timer, slot: float) -> None:
        spec = timer.spec
        assert spec is not None
        self.busy.add(timer.name)

        def work() -> tuple[Any, BaseException | None, float | None]:
            held = history.check(self.root, timer.name, slot) \
                if timer.overlap == history.SKIP else None
            try:
                result: tuple[Any, BaseException | None] = (
                    held or self.send(timer, slot, slot_extra(timer, slot)), None)
            except RQError as exc:  # the destination's answer: the next slot still comes
                result = (None, exc)
            return (*result, upcoming(spec, slot, self.clock(), timer.persistent))

        self.run(work, lambda got, error: self._fired(timer, slot, got, error),
                 peer_lane(timer.msg["dest"]))

    def _fired(self, timer: Timer, slot: float, got: Any, error: BaseException | None) -> None:
        self.busy.discard(timer.name)
        if error is not None:
            raise error  # a bug: the destination's errors come back in ``got``
        if self.timers.get(timer.name) is not timer:
            return
        msg_id, failed, upcoming_slot = got
        if isinstance(failed, Unavailable):
            self.retry_at[timer.name] = self.clock() + RETRY
            self.log.event("err", f"timer {timer.name}: {failed}; trying again in {RETRY:.0f}s")
            return
        self._log_slot(timer, slot, msg_id, failed)
        self.retry_at.pop(timer.name, None)
        self.last[timer.name] = slot
        self._save_state()
        if upcoming_slot is None:
            self.next.pop(timer.name, None)
        else:
            self.next[timer.name] = upcoming_slot

    def _log_slot(self, timer: Timer, slot: float, msg_id: Any,
                  failed: BaseException | None) -> None:
        if failed is not None:
            self.log.event("err", f"timer {timer.name}: no message for slot {slot:.0f}: {failed}")
        elif isinstance(msg_id, history.Held):
            self.log.event("daemon", msg_id.text(timer.name, f"slot {slot:.0f}"))
        else:
            self.log.event("created", f"timer {timer.name}: message {msg_id} for slot "
                           f"{slot:.0f} to {timer.msg['dest']}")
