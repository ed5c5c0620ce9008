"""When a calendar or cron timer elapses: systemd's own parser and a cron library.

No calendar arithmetic is done here.  A ``calendar`` expression (systemd's
syntax, ``man systemd.time``) is handed to ``systemd-analyze calendar
--base-time=@T --iterations=N``, which computes elapses exactly as systemd's
timers will; a ``cron`` expression (5 fields) goes to croniter, which keeps
cron's own rules (a day-of-month and a day-of-week both given: either
matches).  Both are computed in the timer's ``timezone`` (an IANA name; the
host's when not given).  For systemd, a cron expression is also written as
``OnCalendar=`` lines from croniter's expansion of its fields: the same
slots, except at a DST change, where cron runs a skipped local time at the
jump and a repeated hour twice, and systemd skips the one and runs the
other once.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from rqsys.errors import ConfigError

ANALYZE = "systemd-analyze"
ANALYZE_TIMEOUT = 10.0  # seconds: it answers in milliseconds
BATCH = 256  # elapses asked of systemd-analyze at once
ELAPSE_FORMAT = "%a %Y-%m-%d %H:%M:%S UTC"
DAY_NAMES = ("Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat")


@dataclass(frozen=True)
class Spec:
    """A timer's schedule: ``kind`` is ``calendar`` or ``cron``."""

    kind: str
    expr: str
    timezone: str = ""  # "" = the host's


def host_zone() -> str:
    """The host's IANA zone name (/etc/localtime's link; UTC without one)."""
    try:
        target = os.readlink("/etc/localtime")
    except OSError:
        return "UTC"
    _, found, name = target.partition("zoneinfo/")
    return name if found and name else "UTC"


def zone_of(spec: Spec) -> ZoneInfo:
    name = spec.timezone or host_zone()
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise ConfigError(f"timezone: unknown time zone {name!r}") from exc


def check(spec: Spec) -> None:
    """ConfigError naming the field and why, unless ``spec`` can elapse."""
    zone_of(spec)
    if not elapses(spec, _now(), 1):
        raise ConfigError(f"{spec.kind}: {spec.expr!r} never elapses")


def elapses(spec: Spec, after: float, count: int) -> list[float]:
    """The next ``count`` elapses strictly after ``after`` (epoch seconds)."""
    if spec.kind == "cron":
        return _cron_elapses(spec, after, count)
    return _calendar_elapses(spec, after, count)


def latest(spec: Spec, now: float, since: float) -> float | None:
    """The last elapse in (``since``, ``now``], or None when there is none."""
    found = None
    while True:
        batch = [t for t in elapses(spec, since, BATCH) if t <= now]
        if not batch:
            return found
        found = since = batch[-1]
        if len(batch) < BATCH:
            return found


def on_calendar(spec: Spec) -> list[str]:
    """The ``OnCalendar=`` values that elapse as ``spec`` does (see the module)."""
    zone = f" {spec.timezone}" if spec.timezone else ""
    if spec.kind == "calendar":
        return [spec.expr + zone]
    minute, hour, dom, month, dow = _cron(spec).expanded
    clock = f"{_list(hour)}:{_list(minute)}:00{zone}"
    date = f"*-{_list(month)}~01" if dom == ["l"] else f"*-{_list(month)}-{_list(dom)}"
    days = ",".join(DAY_NAMES[d % 7] for d in sorted({d % 7 for d in dow})) \
        if dow != ["*"] else ""
    if days and dom != ["*"]:  # cron: either day field matches
        return [f"{date} {clock}", f"{days} *-{_list(month)}-* {clock}"]
    return [f"{days} {date} {clock}".lstrip()]


def _list(values: list[int | str]) -> str:
    return "*" if values == ["*"] else ",".join(str(v) for v in values)


def _now() -> float:
    return datetime.now(UTC).timestamp()


# ---------------------------------------------------------------- cron
def _cron(spec: Spec) -> Any:  # croniter has no type hints
    from croniter import croniter  # type: ignore[import-untyped]

    if len(spec.expr.split()) != 5:
        raise ConfigError(f"cron: {spec.expr!r} is not 5 fields (minute hour day month weekday)")
    try:
        return croniter(spec.expr, datetime.now(zone_of(spec)))
    except (ValueError, KeyError) as exc:
        raise ConfigError(f"cron: {spec.expr!r}: {exc}") from exc


def _cron_elapses(spec: Spec, after: float, count: int) -> list[float]:
    it = _cron(spec)
    it.set_current(datetime.fromtimestamp(after, zone_of(spec)))
    return [float(it.get_next(float)) for _ in range(count)]


# ---------------------------------------------------------------- calendar
def _calendar_elapses(spec: Spec, after: float, count: int) -> list[float]:
    """systemd-analyze's elapses: with a timezone, the expression as the unit's
    ``OnCalendar=`` has it; without, in the host's zone, as PID 1 reads it."""
    expr = f"{spec.expr} {spec.timezone}" if spec.timezone else spec.expr
    argv = [ANALYZE, "calendar", f"--iterations={count}", f"--base-time=@{after:.6f}", expr]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=ANALYZE_TIMEOUT,
                              env=_ANALYZE_ENV, stdin=subprocess.DEVNULL)
    except FileNotFoundError as exc:
        raise ConfigError(f"calendar: {ANALYZE} is not installed (it parses calendar "
                          "expressions)") from exc
    if done.returncode != 0:
        why = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
        raise ConfigError(f"calendar: {spec.expr!r}: {why}")
    return _parse_elapses(done.stdout)


_ANALYZE_ENV = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C",
                "SYSTEMD_PAGER": "", "SYSTEMD_COLORS": "0"}


def _parse_elapses(text: str) -> list[float]:
    """Each elapse's UTC time: its own line when the zone is UTC, else the
    ``(in UTC):`` line after it; ``never`` has none."""
    found: list[str] = []
    for line in text.splitlines():
        key, _, value = line.strip().partition(": ")
        if key == "Next elapse" or key.startswith("Iter. #"):
            found.append(value.strip())
        elif key == "(in UTC)" and found:
            found[-1] = value.strip()
    return [datetime.strptime(v, ELAPSE_FORMAT).replace(tzinfo=UTC).timestamp()
            for v in found if v.endswith(" UTC")]
