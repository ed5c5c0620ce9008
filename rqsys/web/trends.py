"""A queue's trends page: ``/q/<q>/trends?range=1h|24h|7d`` — what ended per
interval (done, err), and the wait and run times' p50, p95 and p99, charted
with axes (``rqsys.web.charts``) from the queue daemon's statistics."""

from __future__ import annotations

from typing import Any

import falcon

from rqsys.errors import BadRequest
from rqsys.web.charts import bucket_range, chart
from rqsys.web.context import Resource, Web
from rqsys.web.html import e, query, render, table

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
        render(self.web, resp, f"Trends of {name}",
               [(self.web.queue_path(name), name), (here, "trends")],
               _body(self.web, name, shown, slot, stats))


def _body(web: Web, name: str, shown: str, slot: str, stats: dict[str, Any]) -> str:
    span = RANGES[shown][0]
    got = stats["series"][span]
    start, step = got["start"], got["step"]
    window = stats["windows"][WINDOW[shown]]
    charts = (chart("ended", f"Ended per {slot}", start, step,
                    [("done", got["done"]), ("err", got["err"])])
              + chart("wait", "Wait: from entering the que (created, retried or resent) "
                      "to starting", start, step,
                      [(p, got[f"wait_{p}"]) for p in ("p50", "p95", "p99")], latency=True)
              + chart("run", "Run time", start, step,
                      [(p, got[f"run_{p}"]) for p in ("p50", "p95", "p99")], latency=True))
    return (f"<h1>Trends of {e(name)}</h1>" + _ranges(web, name, shown)
            + "<h2>Over the range</h2>" + _window_table(window) + charts)


def _ranges(web: Web, name: str, shown: str) -> str:
    here = web.path("q", name, "trends")
    links = "".join(
        f'<a href="{e(query(here, range=key))}"'
        + (' class="on" aria-current="page"' if key == shown else "") + f">{e(label)}</a>"
        for key, label in (("1h", "1 h"), ("24h", "24 h"), ("7d", "7 d")))
    return f'<nav class="tabs" aria-label="range" id="ranges">{links}</nav>'


def _window_table(window: dict[str, Any]) -> str:
    """Counts and percentiles over the range, each percentile as its bucket's range."""
    counts = [e(f"{window.get(k, 0):,}") for k in ("created", "done", "err", "relayed")]
    marks = [bucket_range(window[what].get(p))
             for what in ("wait", "run") for p in ("p50", "p95", "p99")]
    return table(["Created", "Done", "Err", "Relayed", "Wait p50", "Wait p95", "Wait p99",
                  "Run p50", "Run p95", "Run p99"], [[*counts, *(e(m) for m in marks)]],
                 numeric=range(0, 4))
