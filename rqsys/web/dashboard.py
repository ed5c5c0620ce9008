"""The dashboard's observing parts: per-queue sparklines of throughput and
latency (last hour by minute, last day by hour) and oldest-queued age."""

from __future__ import annotations

import time
from typing import Any

from rqsys.errors import RQError
from rqsys.web import timeshtml
from rqsys.web.charts import bucket_range
from rqsys.web.context import Web
from rqsys.web.sparkline import sparkline


def stats_of(web: Web, name: str) -> dict[str, Any] | None:
    try:
        return web.call(name, "stats")
    except RQError:
        return None  # the counts cell says why


def stat_cells(stats: dict[str, Any] | None) -> dict[str, Any]:
    """The dashboard row's ``oldest`` and ``sparks`` (None when the daemon did not answer)."""
    if stats is None or "series" not in stats:
        return {"oldest": "", "sparks": None}
    hour, day = stats["series"]["hour"], stats["series"]["day"]
    oldest = stats.get("oldest_queued_s")
    return {"oldest": timeshtml.seconds(oldest) if oldest is not None else "",
            "sparks": [_spark(hour["ended"], "ended per minute, last hour", "count",
                              latest=last_minute(hour, time.time())),
                       _spark(day["ended"], "ended per hour, last 24 hours", "count"),
                       _spark(hour["wait_p50"], "median wait per minute, last hour",
                              "latency", True),
                       _spark(day["run_p50"], "median run time per hour, last 24 hours",
                              "latency", True)]}


def last_minute(hour: dict[str, Any], now: float) -> float:
    """Ended in the 60 s before ``now``: the minute under way, and the part of
    the one before that those 60 s still hold (the minute under way alone
    reads 0 just after it began, however many ended a moment before)."""
    ended, step = hour["ended"], int(hour["step"])
    if not ended:
        return 0.0
    under_way = hour["start"] + (len(ended) - 1) * step
    held = max(0.0, 1.0 - (now - under_way) / step)
    before = ended[-2] if len(ended) > 1 else 0
    return round(ended[-1] + before * held)


def _spark(values: list[Any], what: str, cls: str, latency: bool = False,
           latest: float | None = None) -> dict[str, Any]:
    known = [v for v in values if v is not None]
    say = bucket_range if latency else (lambda v: f"{v:g}")
    last = say(latest) if latest is not None else say(known[-1]) if known else "none"
    peak = say(max(known)) if known else "none"
    return sparkline(values, f"{what}: latest {last}, peak {peak}", cls, last)
