"""Per-slot series of a queue's statistics, for the dashboard's sparklines and the
trends page: the last hour by minute, the last day and week by hour (from
``QueueStats``' slots)."""

from __future__ import annotations

import time
from typing import Any

from rqsys.observe.stats import ENDED, QueueStats, percentiles

SPANS = {"hour": (60, 60), "day": (3600, 24), "week": (3600, 24 * 7)}  # (slot s, slots)
SPARKS = ("hour", "day")  # the dashboard's: the median only


def series(stats: QueueStats, now: float | None = None, span: str | None = None
           ) -> dict[str, Any]:
    """``{"hour": {...}, "day": {...}}``, each with ``start``, ``step`` and per
    slot ``ended``, ``err``, ``wait_p50`` and ``run_p50`` (None: nothing
    measured); with ``span`` (hour, day or week) that one alone, with ``done``
    and the p95 and p99 too."""
    now = time.time() if now is None else now
    names = (span,) if span else SPARKS
    return {name: _one(stats.minutes if SPANS[name][0] == 60 else stats.hours, *SPANS[name],
                       now, full=span is not None) for name in names}


def _one(slots: list[dict[str, Any]], width: int, count: int, now: float,
         full: bool) -> dict[str, Any]:
    first = int(now // width * width) - (count - 1) * width
    by_start = {int(slot["start"]): slot for slot in slots}
    chosen = [by_start.get(first + i * width) for i in range(count)]
    out: dict[str, Any] = {
        "start": first, "step": width,
        "ended": [sum(s[k] for k in ENDED) if s else 0 for s in chosen],
        "err": [s["err"] if s else 0 for s in chosen]}
    marks = ("p50", "p95", "p99") if full else ("p50",)
    for what in ("wait", "run"):
        found = [percentiles(s[what]) if s else None for s in chosen]
        for mark in marks:
            out[f"{what}_{mark}"] = [p[mark] if p else None for p in found]
    if full:
        out["done"] = [s["done"] if s else 0 for s in chosen]
    return out
