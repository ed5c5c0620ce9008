"""Per-slot series of a queue's statistics, for the dashboard's sparklines:
the last hour by minute and the last day by hour (from ``QueueStats``' slots)."""

from __future__ import annotations

import time
from typing import Any

from rqsys.observe.stats import ENDED, QueueStats, percentiles

SPANS = {"hour": (60, 60), "day": (3600, 24)}  # name -> (slot width s, slots)


def series(stats: QueueStats, now: float | None = None) -> dict[str, Any]:
    """``{"hour": {...}, "day": {...}}``, each with ``start``, ``step`` and per
    slot ``ended``, ``err``, ``wait_p50`` and ``run_p50`` (None: nothing measured)."""
    now = time.time() if now is None else now
    return {name: _one(stats.minutes if name == "hour" else stats.hours, width, count, now)
            for name, (width, count) in SPANS.items()}


def _one(slots: list[dict[str, Any]], width: int, count: int, now: float) -> dict[str, Any]:
    first = int(now // width * width) - (count - 1) * width
    by_start = {int(slot["start"]): slot for slot in slots}
    chosen = [by_start.get(first + i * width) for i in range(count)]
    return {"start": first, "step": width,
            "ended": [sum(s[k] for k in ENDED) if s else 0 for s in chosen],
            "err": [s["err"] if s else 0 for s in chosen],
            "wait_p50": [percentiles(s["wait"])["p50"] if s else None for s in chosen],
            "run_p50": [percentiles(s["run"])["p50"] if s else None for s in chosen]}
