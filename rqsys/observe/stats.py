"""A queue's statistics: totals, histograms and time windows, O(1) per event.

:class:`QueueStats` is an ``EventLog`` sink in the daemon.  Each counted
event adds one to a few integers: the all-time totals (created, and ended
by state, resends), the all-time wait and run histograms, and the current
minute's and hour's slots (counts and histograms), from which the last
hour, day and week are summed when asked (``window``).  Nothing walks a
directory.  Histograms have fixed log buckets: bucket ``i`` holds values up
to ``BOUNDS[i]`` seconds (1 ms doubling up to about 36 hours, then +Inf).

Wait time is from when the message last entered the que (its creation, its
id being its creation time; or a retry or resend since: ``REQUEUED``) or its
due time, if later, to the start that followed; run time is each run's.
Persistence (``rqsys.observe.statsfile``) keeps the totals across restarts.
"""

from __future__ import annotations

import bisect
import calendar
import time
from typing import Any

BOUNDS = [0.001 * 2 ** i for i in range(28)]  # 1 ms .. 37 h; one more bucket: +Inf
ENDED = ("done", "err", "relayed")
REQUEUED = ("retried", "retry", "resend")  # back in the que: its next wait starts here
COUNTED = ("created", *ENDED, "resend", "retry")  # what a slot counts
MINUTES, HOURS = 60, 24 * 7  # the slots kept: the last hour by minute, the week by hour
WINDOWS = {"hour": 3600, "day": 86400, "week": 7 * 86400}
DAYS_KEPT = 90  # per-day counts


def bucket(seconds: float) -> int:
    """The histogram bucket of a duration."""
    return bisect.bisect_left(BOUNDS, seconds)


def id_time(msg_id: str) -> float:
    """A message's creation time, from its id (``YYYYmmdd.HHMM.SS.mmm.n``, UTC)."""
    second = _SECONDS.get(msg_id[:17])  # a drain's messages were made in few seconds
    if second is not None and msg_id[17:20].isdigit():
        return second + int(msg_id[17:20]) / 1000
    found = _id_time(msg_id)
    if found:
        if len(_SECONDS) >= 4096:  # about 68 minutes of seconds: start again
            _SECONDS.clear()
        _SECONDS[msg_id[:17]] = float(int(found))
    return found


_SECONDS: dict[str, float] = {}  # "YYYYmmdd.HHMM.SS." -> its Unix time (made by _id_time)


def _id_time(msg_id: str) -> float:
    try:  # by hand: strptime took 30 us, a tenth of the daemon's time per message
        if msg_id[8] != "." or msg_id[13] != "." or msg_id[16] != ".":
            return 0.0
        fields = (msg_id[0:4], msg_id[4:6], msg_id[6:8], msg_id[9:11], msg_id[11:13],
                  msg_id[14:16])
        year, month, day, hour, minute, sec = map(int, fields)
        if not (1 <= month <= 12 and 1 <= day <= 31 and hour < 24 and minute < 60
                and sec < 62):
            return 0.0
        return calendar.timegm((year, month, day, hour, minute, sec, 0, 0, 0)) + int(
            msg_id[17:20]) / 1000
    except (ValueError, IndexError):
        return 0.0


_DAY: list[Any] = [-1, ""]  # (UTC day number, "YYYY-mm-dd"): one strftime a day


def day_name(at: float) -> str:
    """The UTC date of a Unix time, as the ``days`` keys are."""
    number = int(at // 86400)
    if _DAY[0] != number:
        _DAY[:] = [number, time.strftime("%Y-%m-%d", time.gmtime(at))]
    return str(_DAY[1])


def new_slot(start: int) -> dict[str, Any]:
    return {"start": start, **dict.fromkeys(COUNTED, 0),
            "wait": [0] * (len(BOUNDS) + 1), "run": [0] * (len(BOUNDS) + 1)}


class QueueStats:
    """One queue's numbers, updated by its daemon's events."""

    kinds = frozenset({*COUNTED, "started", "exit"})  # the events ``observed`` counts

    def __init__(self, clock: Any = time.time) -> None:
        self.clock = clock
        self.totals: dict[str, int] = dict.fromkeys(COUNTED, 0)
        self.hist: dict[str, list[int]] = {"wait": [0] * (len(BOUNDS) + 1),
                                           "run": [0] * (len(BOUNDS) + 1)}
        self.sums: dict[str, float] = {"wait": 0.0, "run": 0.0}
        self.minutes: list[dict[str, Any]] = []  # newest last, at most MINUTES
        self.hours: list[dict[str, Any]] = []  # newest last, at most HOURS
        self.days: dict[str, dict[str, int]] = {}  # "YYYY-mm-dd" (UTC) -> counts
        self.starts = 0  # daemon starts (a restart counter)
        self.seq = 0  # counted events so far (the journal's line numbers)

    # ------------------------------------------------------------ the sink
    def __call__(self, kind: str, text: str, msg_id: str, fields: dict[str, Any]) -> None:
        event = observed(kind, msg_id, fields, self.clock())
        if event is not None:
            self.apply(event)

    def apply(self, event: dict[str, Any]) -> None:
        """Count one event (``observed``'s shape); O(1)."""
        self.seq += 1
        kind, at = event["k"], event["t"]
        if kind == "start":
            self.starts += 1
            return
        minute, hour = self._slot(self.minutes, 60, MINUTES, at), self._slot(
            self.hours, 3600, HOURS, at)
        if kind in ("wait", "run"):
            self._measure(kind, float(event["v"]), minute, hour)
            return
        self.totals[kind] += 1
        minute[kind] += 1
        hour[kind] += 1
        name = day_name(at)
        day = self.days.get(name)
        if day is None:  # a new day (no new dict made per event to find the old one)
            day = self.days[name] = dict.fromkeys(COUNTED, 0)
            if len(self.days) > DAYS_KEPT:
                del self.days[min(self.days)]
        day[kind] += 1

    def _measure(self, what: str, seconds: float, *slots: dict[str, Any]) -> None:
        i = bucket(seconds)
        self.hist[what][i] += 1
        self.sums[what] += seconds
        for slot in slots:
            slot[what][i] += 1

    @staticmethod
    def _slot(slots: list[dict[str, Any]], width: int, keep: int, at: float) -> dict[str, Any]:
        """The slot holding time ``at`` (a new one when time has moved on)."""
        if slots and at < slots[-1]["start"] + width:  # starts are multiples of width
            return slots[-1]  # also a late event: counted in the newest slot
        start = int(at // width * width)
        slots.append(new_slot(start))
        if len(slots) > keep:
            del slots[0]
        return slots[-1]

    # ------------------------------------------------------------ reading
    def window(self, seconds: int) -> dict[str, Any]:
        """Counts, throughput and wait/run percentiles over the last ``seconds``."""
        now = self.clock()
        slots = self.minutes if seconds <= 3600 else self.hours
        width = 60 if seconds <= 3600 else 3600
        chosen = [s for s in slots if s["start"] + width > now - seconds]
        counts = {k: sum(s[k] for s in chosen) for k in COUNTED}
        out: dict[str, Any] = dict(counts)
        out["throughput_per_s"] = sum(counts[k] for k in ENDED) / seconds
        for what in ("wait", "run"):
            merged = [sum(col) for col in zip(*(s[what] for s in chosen), strict=True)]
            out[what] = percentiles(merged or [0] * (len(BOUNDS) + 1))
        return out

    def report(self) -> dict[str, Any]:
        """Everything, for the ``stats`` op: totals, histograms, windows, days."""
        return {"totals": dict(self.totals), "starts": self.starts,
                "hist": {k: list(v) for k, v in self.hist.items()}, "sums": dict(self.sums),
                "bounds": BOUNDS, "windows": {name: self.window(secs)
                                              for name, secs in WINDOWS.items()},
                "days": dict(sorted(self.days.items()))}

    # ------------------------------------------------------------ persistence
    def state(self) -> dict[str, Any]:
        return {"totals": self.totals, "hist": self.hist, "sums": self.sums,
                "minutes": self.minutes, "hours": self.hours, "days": self.days,
                "starts": self.starts, "seq": self.seq}

    def restore(self, saved: dict[str, Any]) -> None:
        """Take a saved ``state()`` back (keys it lacks keep their defaults)."""
        for key in ("minutes", "hours", "days", "starts", "seq", "sums"):
            if key in saved:
                setattr(self, key, saved[key])
        self.totals.update(saved.get("totals", {}))
        self.hist.update(saved.get("hist", {}))


def observed(kind: str, msg_id: str, fields: dict[str, Any], now: float,
             at: float | None = None, enqueued: float | None = None) -> dict[str, Any] | None:
    """What an event adds to the stats, as one small record (a journal line);
    ``at``: ``now`` to the ms when the caller has it (``rqsys.observe.stamps``);
    ``enqueued``: when a started message was last put back in the que (None: a
    first run waited from its creation, a later one is not a wait counted)."""
    if kind in COUNTED:
        return {"k": kind, "t": round(now, 3) if at is None else at}
    if kind == "started" and (enqueued is not None or fields.get("RQ_RUN") == 1):
        entered = id_time(msg_id) if enqueued is None else enqueued
        since = max(entered, float(fields.get("RQ_DUE") or 0))
        return {"k": "wait", "t": round(now, 3) if at is None else at,
                "v": round(max(0.0, now - since), 4)}
    if kind == "exit" and "RQ_RUN_S" in fields:
        return {"k": "run", "t": round(now, 3) if at is None else at, "v": fields["RQ_RUN_S"]}
    return None


def percentiles(hist: list[int]) -> dict[str, float | None]:
    """p50, p95 and p99 of a histogram: each the upper bound of the bucket it
    falls in (None when empty; the last bucket has no bound: its lower one)."""
    total = sum(hist)
    out: dict[str, float | None] = {"count": total}
    for name, q in (("p50", 0.50), ("p95", 0.95), ("p99", 0.99)):
        out[name] = None if not total else _quantile(hist, q * total)
    return out


def _quantile(hist: list[int], rank: float) -> float:
    seen = 0
    for i, n in enumerate(hist):
        seen += n
        if seen >= rank and n:
            return BOUNDS[i] if i < len(BOUNDS) else BOUNDS[-1]
    return BOUNDS[-1]
