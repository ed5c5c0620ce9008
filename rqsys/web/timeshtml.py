"""A message's times and timeline as the pages show them (the message page, the
queue page's columns): text, which the templates escape."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from rqsys.observe import timeline

TIME_COLUMNS = ["Created", "Started", "Ended", "Waited", "Ran"]
SHOWN_KEYS = ("t", "ev", "by", "text", "folded", "earlier")  # the others: as its details


def when(at: Any) -> str:
    """A Unix time as UTC to the second ('' when unknown)."""
    if not isinstance(at, int | float):
        return ""
    return time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime(at))


def seconds(value: Any) -> str:
    if not isinstance(value, int | float):
        return ""
    return f"{value:.3f} s" if value < 60 else f"{value / 60:.1f} min"


def time_cells(times: dict[str, Any]) -> dict[str, str]:
    """The five time columns of a message's row (``macros.html``'s ``times``)."""
    return {"created": when(times.get("created_at")), "started": when(times.get("started_at")),
            "ended": when(times.get("ended_at")), "waited": seconds(times.get("wait_s")),
            "ran": seconds(times.get("run_s"))}


def row_times(msg_dir: Path, msg: dict[str, Any]) -> dict[str, str]:
    """A listed message's time columns, from its timeline file."""
    return time_cells(timeline.times(timeline.read_folded(msg_dir),
                                     float(msg.get("due") or 0)))


def events(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The timeline's rows; a fold of status lines with the ones before it kept;
    ``by``: who made it (a create's origin; who retried it: ``alice (10.0.0.5)``)."""
    rows = []
    for item in items:
        row = {"when": when(item.get("t")), "ev": item.get("ev", ""), "by": item.get("by", ""),
               "text": item.get("text", ""), "details": _details(item), "folded": 0}
        folded = item.get("folded")
        if isinstance(folded, int) and folded > 1:
            earlier = item.get("earlier") or []
            row.update(folded=folded, not_kept=max(0, folded - 1 - len(earlier)),
                       earlier=[{"when": when(line.get("t")), "text": line.get("text", "")}
                                for line in earlier])
        rows.append(row)
    return rows


def _details(item: dict[str, Any]) -> str:
    rest = {k: v for k, v in item.items() if k not in SHOWN_KEYS}
    return " ".join(f"{k}={json.dumps(v)}" for k, v in rest.items())
