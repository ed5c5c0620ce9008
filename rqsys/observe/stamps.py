"""The time now to the millisecond, with the text a JSON line gives it, made
once a millisecond.

Every event of a message's run stamps its timeline line and its stats line
with the time: ``repr(round(time.time(), 3))`` went through CPython's
correctly rounded decimal conversion twice for each (a tenth of the queue
daemon's instructions per drained message).  A busy loop tells several
events a millisecond, so the rounded time and its text are kept for the
millisecond they were made in.
"""

from __future__ import annotations

import time

_last: tuple[int, float, str] = (-1, 0.0, "")  # ms since the epoch, as seconds, their repr
# (one tuple, replaced whole: a thread reads a matching time and text)


def now() -> tuple[float, str]:
    """The time to the nearest ms, as ``round(time.time(), 3)``, and its ``repr``."""
    global _last
    count = (time.time_ns() + 500_000) // 1_000_000
    last = _last
    if count != last[0]:
        seconds = count / 1000  # the nearest double to the decimal, as round() gives
        last = _last = (count, seconds, repr(seconds))
    return last[1], last[2]


def text(value: float) -> str:
    """``repr(value)``, kept when ``value`` is the last :func:`now`."""
    last = _last
    return last[2] if value == last[1] and last[0] >= 0 else repr(value)
