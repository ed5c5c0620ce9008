"""Calendar and cron expressions: elapses checked against ``systemd-analyze calendar``
(run here directly), across DST changes in Europe/Berlin and month ends."""

from __future__ import annotations

import re
import subprocess
from datetime import UTC, datetime

import pytest

from rqsys.errors import ConfigError
from rqsys.timers.calendar import Spec, check, elapses, latest, on_calendar


def utc(text: str) -> float:
    return datetime.strptime(text, "%Y-%m-%d %H:%M").replace(tzinfo=UTC).timestamp()


def analyze(expr: str, base: float, count: int) -> list[float]:
    """systemd's own elapses of ``expr``, parsed independently of rqsys."""
    out = subprocess.run(["systemd-analyze", "calendar", f"--iterations={count}",
                          f"--base-time=@{base:.0f}", expr], capture_output=True, text=True,
                         env={"TZ": "UTC", "LC_ALL": "C", "PATH": "/usr/bin:/bin"},
                         check=True, timeout=30).stdout
    found = re.findall(r"(?:Next elapse|Iter\. #\d+): \w{3} (\S+ \S+) UTC", out)
    return [datetime.strptime(t, "%Y-%m-%d %H:%M:%S").replace(tzinfo=UTC).timestamp()
            for t in found]


def merged(exprs: list[str], base: float, count: int) -> list[float]:
    """Elapses of several OnCalendar= lines together, as one systemd timer has them."""
    return sorted({t for e in exprs for t in analyze(e, base, count)})[:count]


# (cron, timezone, base): spring forward 2026-03-29 and fall back 2026-10-25 in Berlin,
# month ends (a leap February), cron's day-of-month OR day-of-week rule
CRON_TABLE = [
    ("*/15 * * * *", "Europe/Berlin", "2026-03-29 00:20"),
    ("0 4 * * *", "Europe/Berlin", "2026-10-23 00:00"),
    ("30 1 * * 1-5", "Europe/Berlin", "2026-10-23 00:00"),
    ("0 12 * * *", "Europe/Berlin", "2026-03-27 00:00"),
    ("0 0 L * *", "UTC", "2028-01-15 00:00"),
    ("0 0 31 * *", "UTC", "2026-01-15 00:00"),
    ("5 4 1,15 * sun", "America/New_York", "2026-10-20 00:00"),
    ("0 9 * jan-mar mon-fri", "UTC", "2026-12-30 00:00"),
]


@pytest.mark.parametrize(("cron", "zone", "base"), CRON_TABLE)
def test_cron_elapses_match_systemd_for_its_oncalendar_lines(cron, zone, base):
    spec = Spec("cron", cron, zone)
    ours = elapses(spec, utc(base), 8)
    assert ours == merged(on_calendar(spec), utc(base), 8)
    assert len(set(ours)) == 8 and ours == sorted(ours)


# (calendar, timezone, base, the elapses expected, UTC)
CALENDAR_TABLE = [
    ("*-*-* 02:30:00", "Europe/Berlin", "2026-03-28 00:00",  # no 02:30 on the 29th
     ["2026-03-28 01:30", "2026-03-30 00:30", "2026-03-31 00:30"]),
    ("*-*-* 02:30:00", "Europe/Berlin", "2026-10-24 00:00",  # 02:30 twice on the 25th: once
     ["2026-10-24 00:30", "2026-10-25 00:30", "2026-10-26 01:30"]),
    ("*-02~01 12:00", "UTC", "2027-06-01 00:00",  # the last day of February
     ["2028-02-29 12:00", "2029-02-28 12:00", "2030-02-28 12:00"]),
    ("Mon..Fri *-*-* 02:00:00 Europe/Berlin", "", "2026-11-20 12:00",
     ["2026-11-23 01:00", "2026-11-24 01:00", "2026-11-25 01:00"]),
    ("*:0/20", "UTC", "2026-05-31 23:30",
     ["2026-05-31 23:40", "2026-06-01 00:00", "2026-06-01 00:20"]),
]


@pytest.mark.parametrize(("expr", "zone", "base", "expected"), CALENDAR_TABLE)
def test_calendar_elapses_are_systemds(expr, zone, base, expected):
    spec = Spec("calendar", expr, zone)
    ours = elapses(spec, utc(base), 3)
    assert ours == [utc(t) for t in expected] == analyze(on_calendar(spec)[0], utc(base), 3)


def test_the_timezone_field_is_the_zone_of_the_expression():
    plain = elapses(Spec("calendar", "*-*-* 09:00:00", "Asia/Tokyo"), utc("2026-06-01 00:00"), 1)
    assert plain == [utc("2026-06-02 00:00")]  # 09:00 in Tokyo is 00:00 UTC
    cron = elapses(Spec("cron", "0 9 * * *", "Asia/Tokyo"), utc("2026-06-01 00:00"), 1)
    assert cron == plain


def test_cron_and_systemd_differ_only_where_documented_at_dst_changes():
    # 02:30 does not exist in Berlin on 2026-03-29: cron runs it at 03:00, systemd skips it
    spec = Spec("cron", "30 2 * * *", "Europe/Berlin")
    base = utc("2026-03-28 12:00")
    assert elapses(spec, base, 2) == [utc("2026-03-29 01:00"), utc("2026-03-30 00:30")]
    assert merged(on_calendar(spec), base, 2) == [utc("2026-03-30 00:30"),
                                                  utc("2026-03-31 00:30")]
    # 02:00-03:00 comes twice on 2026-10-25: cron runs its slots twice, systemd once
    spec = Spec("cron", "*/30 * * * *", "Europe/Berlin")
    base = utc("2026-10-24 23:50")
    assert elapses(spec, base, 4) == [utc(t) for t in (
        "2026-10-25 00:00", "2026-10-25 00:30", "2026-10-25 01:00", "2026-10-25 01:30")]
    assert merged(on_calendar(spec), base, 3) == [utc(t) for t in (
        "2026-10-25 00:00", "2026-10-25 00:30", "2026-10-25 02:00")]


def test_latest_finds_the_last_missed_slot():
    spec = Spec("cron", "*/15 * * * *", "UTC")
    assert latest(spec, utc("2026-01-01 10:50"), utc("2026-01-01 10:00")) == \
        utc("2026-01-01 10:45")
    assert latest(spec, utc("2026-01-01 10:10"), utc("2026-01-01 10:00")) is None


@pytest.mark.parametrize(("spec", "why"), [
    (Spec("calendar", "Mon..Fry 02:00"), "calendar: 'Mon..Fry 02:00': Failed to parse"),
    (Spec("calendar", "2001-01-01"), "never elapses"),
    (Spec("calendar", "hourly UTC", "Europe/Berlin"), "calendar"),
    (Spec("cron", "61 * * * *"), "cron: '61 * * * *'"),
    (Spec("cron", "* * * *"), "not 5 fields"),
    (Spec("cron", "* * * * * *"), "not 5 fields"),
    (Spec("cron", "0 0 * * *", "Mars/Olympus"), "timezone: unknown time zone 'Mars/Olympus'"),
])
def test_bad_expressions_say_which_field_and_why(spec, why):
    with pytest.raises(ConfigError, match=re.escape(why)):
        check(spec)
