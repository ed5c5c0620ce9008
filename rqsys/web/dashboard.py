"""The dashboard's observing parts: per-queue sparklines of throughput and
latency (last hour by minute, last day by hour), oldest-queued age, and the
failure groups with their retry/delete buttons."""

from __future__ import annotations

from typing import Any

from rqsys.errors import RQError
from rqsys.web import timeshtml
from rqsys.web.context import Web
from rqsys.web.html import e, link, post_button, table
from rqsys.web.sparkline import sparkline

GROUPS_SHOWN = 5  # per queue on the dashboard (the queue page lists them all)
HEADERS = ["Oldest queued", "Ended / min (1 h)", "Ended / h (24 h)", "Wait p50 (1 h)",
           "Run p50 (24 h)"]


def stats_of(web: Web, name: str) -> dict[str, Any] | None:
    try:
        return web.call(name, "stats")
    except RQError:
        return None  # the counts cell says why


def stat_cells(stats: dict[str, Any] | None) -> list[str]:
    """The dashboard row's extra cells (empty when the daemon did not answer)."""
    if stats is None or "series" not in stats:
        return ["" for _ in HEADERS]
    hour, day = stats["series"]["hour"], stats["series"]["day"]
    oldest = stats.get("oldest_queued_s")
    return [e(timeshtml.seconds(oldest)) if oldest is not None else '<span class="muted">—</span>',
            _spark(hour["ended"], "ended per minute, last hour", "count"),
            _spark(day["ended"], "ended per hour, last 24 hours", "count"),
            _spark(hour["wait_p50"], "median wait per minute, last hour", "latency", "s"),
            _spark(day["run_p50"], "median run time per hour, last 24 hours", "latency", "s")]


def _spark(values: list[Any], what: str, cls: str, unit: str = "") -> str:
    known = [v for v in values if v is not None]
    last = f"{known[-1]:g}{unit}" if known else "none"
    peak = f"{max(known):g}{unit}" if known else "none"
    title = f"{what}: latest {last}, peak {peak}"
    return sparkline(values, title, cls) + f'<span class="sparknum">{e(last)}</span>'


def groups_section(web: Web, names: list[str]) -> str:
    """Every queue's largest failure groups, each with retry and delete."""
    rows = []
    for name in names:
        try:
            groups = web.call(name, "groups")["groups"][:GROUPS_SHOWN]
        except RQError:
            continue
        rows += [_group_row(web, name, g) for g in groups]
    if not rows:
        return '<h2>Failure groups</h2><p class="muted">No err messages.</p>'
    return ('<h2>Failure groups</h2>' + table(
        ["Queue", "Reason", "Count", "First seen", "Last seen", "Actions"], rows,
        numeric=range(2, 3)))


def _group_row(web: Web, name: str, group: dict[str, Any]) -> list[str]:
    action = web.path("q", name, "groups", group["key"])
    back = web.path("")
    buttons = (post_button(action, "retry all", {"_method": "retry", "back": back})
               + post_button(action, "delete all", {"_method": "delete", "back": back},
                             danger=True, confirm=f"Delete all {group['count']}?"))
    return [link(web.queue_path(name), name),
            f'<span class="mono" title="{e(group["example"])}">{e(group["reason"])}</span>',
            e(group["count"]), e(timeshtml.when(group["first_seen"])),
            e(timeshtml.when(group["last_seen"])), f'<div class="actions">{buttons}</div>']
