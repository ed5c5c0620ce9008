"""A queue's trends page: ``/q/<q>/trends?range=1h|24h|7d`` — what ended per
interval (done, err), and the wait and run times' p50, p95 and p99, charted
with axes (``rqsys.web.charts``) from the queue daemon's statistics."""

from __future__ import annotations

from typing import Any

import falcon

from rqsys.errors import BadRequest
from rqsys.web.charts import bucket_range, chart
from rqsys.web.context import Resource
from rqsys.web.html import query, render

RANGES = {"1h": ("hour", "minute"), "24h": ("day", "hour"), "7d": ("week", "hour")}
WINDOW = {"1h": "hour", "24h": "day", "7d": "week"}  # the stats' window of the same length


class Trends(Resource):
    """``GET /q/<q>/trends`` (HTML)."""

    def on_get(self, req: falcon.Request, resp: falcon.Response, name: str) -> None:
        self.web.existing(name)
        shown = req.get_param("range") or "24h"
        if shown not in RANGES:
            raise BadRequest(f"range must be one of {', '.join(RANGES)}, not {shown[:20]!r}")
        span, slot = RANGES[shown]
        stats = self.web.call(name, "stats", span=span)
        here = self.web.path("q", name, "trends")
        render(self.web, resp, "trends.html", f"Trends of {name}",
               [(self.web.queue_path(name), name), (here, "trends")], queue=name,
               ranges=_ranges(here, shown), window=_window(stats["windows"][WINDOW[shown]]),
               charts=_charts(stats["series"][span], slot))


def _charts(got: dict[str, Any], slot: str) -> list[dict[str, Any]]:
    start, step = got["start"], got["step"]
    return [chart("ended", f"Ended per {slot}", start, step,
                  [("done", got["done"]), ("err", got["err"])]),
            chart("wait", "Wait: from entering the que (created, retried or resent) to "
                  "starting", start, step,
                  [(p, got[f"wait_{p}"]) for p in ("p50", "p95", "p99")], latency=True),
            chart("run", "Run time", start, step,
                  [(p, got[f"run_{p}"]) for p in ("p50", "p95", "p99")], latency=True)]


def _ranges(here: str, shown: str) -> list[dict[str, Any]]:
    return [{"href": query(here, range=key), "label": label, "on": key == shown}
            for key, label in (("1h", "1 h"), ("24h", "24 h"), ("7d", "7 d"))]


def _window(window: dict[str, Any]) -> list[tuple[str, str, bool]]:
    """Counts and percentiles over the range (head, value, numeric), each
    percentile as its bucket's range."""
    counts = [(head, f"{window.get(key, 0):,}", True) for head, key in (
        ("Created", "created"), ("Done", "done"), ("Err", "err"), ("Relayed", "relayed"))]
    marks = [(f"{what.title()} {p}", bucket_range(window[what].get(p)), False)
             for what in ("wait", "run") for p in ("p50", "p95", "p99")]
    return counts + marks
