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

_LAST: list = [-1, 0.0, ""]  # [ms since the epoch, as seconds, their repr]


def now() -> tuple[float, str]:
    """The time to the nearest ms, as ``round(time.time(), 3)``, and its ``repr``."""
    count = (time.time_ns() + 500_000) // 1_000_000
    if count != _LAST[0]:
        seconds = count / 1000  # the nearest double to the decimal, as round() gives
        _LAST[:] = [count, seconds, repr(seconds)]
    return _LAST[1], _LAST[2]


def text(value: float) -> str:
    """``repr(value)``, kept when ``value`` is the last :func:`now`."""
    return _LAST[2] if value == _LAST[1] and _LAST[0] >= 0 else repr(value)
