"""The dashboard and a queue's page (templates ``dashboard.html`` and ``queue.html``)."""

from __future__ import annotations

from typing import Any

import falcon

from rqsys.errors import RQError
from rqsys.run.resources import room_text
from rqsys.store import STATES, room
from rqsys.web import access, failures, pools, queuepage
from rqsys.web import dashboard as observing
from rqsys.web.context import Web
from rqsys.web.html import render
from rqsys.wire.roles import Account

# the admin operations a queue's state offers: what changes it, and nothing that does not
ADMIN_BUTTONS = {"UP": ("pause", "down"), "PAUSE": ("resume", "down"), "DOWN": ("up",)}


def dashboard(web: Web, req: falcon.Request, resp: falcon.Response) -> None:
    user = access.account(req)
    names = [name for name in web.layout.queue_names() if user.sees(name)]
    queues = [_dashboard_row(web, name, user) for name in names]
    render(web, resp, "dashboard.html", "Queues", [], states=STATES, queues=queues,
           back=web.path(""), failure_groups=failures.section(web, names, user),
           pools=pools.section(web), unreachable=sum(bool(q["error"]) for q in queues),
           state_fs_full=room.full_figures(str(web.layout.root)))


def _dashboard_row(web: Web, name: str, user: Account) -> dict[str, Any]:
    row: dict[str, Any] = {"name": name, "href": web.queue_path(name), "error": "",
                           "new_href": web.path("q", name, "new_message")
                           if user.may("operator", name) else "",
                           "admin_href": web.path("q", name, "adminoper")}
    try:
        got = web.call(name, "counts")
    except RQError as exc:
        return dict(row, admin="?", counts={}, sparks=None, oldest="", error=str(exc))
    stats = observing.stats_of(web, name)
    return dict(row, admin=got["admin"], counts=got["counts"], status=got["status"],
                opers=opers(got["admin"]) if user.may("admin", name) else (),
                **observing.stat_cells(stats))


def opers(admin: str) -> tuple[str, ...]:
    """The operations that change a queue's admin state from ``admin`` (a paused
    queue offers resume, not pause again)."""
    return ADMIN_BUTTONS.get(admin, ("up", "pause", "down"))


def queue_page(web: Web, req: falcon.Request, resp: falcon.Response, name: str) -> None:
    got, user = web.call(name, "counts"), access.account(req)
    here, acts = web.queue_path(name), user.may("operator", name)
    page = queuepage.context(web, req, name, got["counts"])
    if not acts:  # what it may not do is not shown
        page = dict(page, others=[], listing=dict(page["listing"], choosing=False, bulk=None))
    render(web, resp, "queue.html", f"Queue {name}", [(here, name)], name=name, here=here,
           admin=got["admin"], status=got["status"], room=room_text(got["room"]),
           opers=opers(got["admin"]) if user.may("admin", name) else (),
           new_href=web.path("q", name, "new_message") if acts else "",
           trends_href=web.path("q", name, "trends"),
           admin_href=web.path("q", name, "adminoper"), **page,
           failure_groups=failures.section(web, [name], user, None)
           if got["counts"].get("err") else None,
           state_fs_full=room.full_figures(str(web.layout.root)))
