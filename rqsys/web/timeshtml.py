"""HTML for a message's times and timeline (the message page, the queue page's columns)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from rqsys.observe import timeline
from rqsys.web.html import e, table

TIME_COLUMNS = ["Created", "Started", "Ended", "Waited", "Ran"]
SHOWN_KEYS = ("t", "ev", "text", "folded", "earlier")  # the others: shown as its details


def when(at: Any) -> str:
    """A Unix time as UTC to the second ('' when unknown)."""
    if not isinstance(at, int | float):
        return ""
    return time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime(at))


def seconds(value: Any) -> str:
    if not isinstance(value, int | float):
        return ""
    return f"{value:.3f} s" if value < 60 else f"{value / 60:.1f} min"


def time_cells(times: dict[str, Any]) -> list[str]:
    """The five time columns of a message's row (escaped HTML)."""
    return [e(when(times.get("created_at"))), e(when(times.get("started_at"))),
            e(when(times.get("ended_at"))), e(seconds(times.get("wait_s"))),
            e(seconds(times.get("run_s")))]


def row_times(msg_dir: Path, msg: dict[str, Any]) -> list[str]:
    """A listed message's time columns, from its timeline file."""
    return time_cells(timeline.times(timeline.read(msg_dir), float(msg.get("due") or 0)))


def section(msg: dict[str, Any]) -> str:
    """The message page's Times and Timeline sections."""
    times = table(TIME_COLUMNS, [time_cells(msg)])
    events = msg.get("_timeline") or []
    if not events:
        return "<h2>Times</h2>" + times + '<p class="muted">No timeline recorded.</p>'
    rows = [[e(when(item.get("t"))), e(item.get("ev", "")), _text(item),
             f'<span class="mono">{e(_details(item))}</span>'] for item in events]
    return ("<h2>Times</h2>" + times + '<h2 id="timeline">Timeline</h2>'
            + table(["Time", "Event", "Text", "Details"], rows))


def _text(item: dict[str, Any]) -> str:
    """An event's text; a fold of status lines as "N status lines, last: …",
    opening on the ones before it that were kept."""
    text = f'<span class="mono">{e(item.get("text", ""))}</span>'
    folded = item.get("folded")
    if not isinstance(folded, int) or folded < 2:
        return text
    earlier = item.get("earlier") or []
    items = "".join(f'<li><span class="muted">{e(when(line.get("t")))}</span> '
                    f'<span class="mono">{e(line.get("text", ""))}</span></li>'
                    for line in earlier)
    more = folded - 1 - len(earlier)
    before = f'<li class="muted">{more:,} earlier not kept</li>' if more > 0 else ""
    return (f'<details class="fold"><summary>{folded:,} status lines, last: {text}</summary>'
            f"<ol>{before}{items}</ol></details>")


def _details(item: dict[str, Any]) -> str:
    rest = {k: v for k, v in item.items() if k not in SHOWN_KEYS}
    return " ".join(f"{k}={json.dumps(v)}" for k, v in rest.items())
