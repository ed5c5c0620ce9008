"""The dashboard and a queue's page (templates ``dashboard.html`` and ``queue.html``)."""

from __future__ import annotations

from typing import Any

import falcon

from rqsys.errors import RQError
from rqsys.run.resources import room_text
from rqsys.store import STATES
from rqsys.web import dashboard as observing
from rqsys.web import failures, pools, queuepage
from rqsys.web.context import Web
from rqsys.web.html import render

# the admin operations a queue's state offers: what changes it, and nothing that does not
ADMIN_BUTTONS = {"UP": ("pause", "down"), "PAUSE": ("resume", "down"), "DOWN": ("up",)}


def dashboard(web: Web, req: falcon.Request, resp: falcon.Response) -> None:
    names = web.layout.queue_names()
    queues = [_dashboard_row(web, name) for name in names]
    render(web, resp, "dashboard.html", "Queues", [], states=STATES, queues=queues,
           back=web.path(""), failure_groups=failures.section(web, names),
           pools=pools.section(web), unreachable=sum(bool(q["error"]) for q in queues))


def _dashboard_row(web: Web, name: str) -> dict[str, Any]:
    row: dict[str, Any] = {"name": name, "href": web.queue_path(name), "error": "",
                           "new_href": web.path("q", name, "new_message"),
                           "admin_href": web.path("q", name, "adminoper")}
    try:
        got = web.call(name, "counts")
    except RQError as exc:
        return dict(row, admin="?", counts={}, sparks=None, oldest="", error=str(exc))
    stats = observing.stats_of(web, name)
    return dict(row, admin=got["admin"], counts=got["counts"], status=got["status"],
                opers=opers(got["admin"]), **observing.stat_cells(stats))


def opers(admin: str) -> tuple[str, ...]:
    """The operations that change a queue's admin state from ``admin`` (a paused
    queue offers resume, not pause again)."""
    return ADMIN_BUTTONS.get(admin, ("up", "pause", "down"))


def queue_page(web: Web, req: falcon.Request, resp: falcon.Response, name: str) -> None:
    got = web.call(name, "counts")
    here = web.queue_path(name)
    render(web, resp, "queue.html", f"Queue {name}", [(here, name)], name=name, here=here,
           admin=got["admin"], status=got["status"], opers=opers(got["admin"]),
           room=room_text(got["room"]),
           new_href=web.path("q", name, "new_message"),
           trends_href=web.path("q", name, "trends"),
           admin_href=web.path("q", name, "adminoper"),
           **queuepage.context(web, req, name, got["counts"]),
           failure_groups=failures.section(web, [name], None)
           if got["counts"].get("err") else None)
