"""Failure groups in the console: the groups of the dashboard and a queue page, a
group's own page with its messages, ``groups.json``, and the whole-group retry
and delete (``rqsys.observe.failures`` groups them in the queue daemon)."""

from __future__ import annotations

from typing import Any

import falcon

from rqsys.errors import BadRequest, RQError
from rqsys.web import access, body, queuepage, timeshtml
from rqsys.web.answers import ok
from rqsys.web.context import Resource, Web
from rqsys.web.html import pager, render
from rqsys.wire.roles import Account

GROUPS_SHOWN = 5  # per queue on the dashboard (the queue page lists them all)
PAGE_SIZE = 25  # a group page's messages
PARAMS = ("param1", "param2", "param3", "param4")


def section(web: Web, names: list[str], user: Account,
            shown: int | None = GROUPS_SHOWN) -> dict[str, Any]:
    """The largest failure groups of each queue in ``names`` (``shown`` of
    each; None: all), each linked to its page (``macros.html``'s ``groups``),
    with its buttons if ``user`` may use them."""
    rows = []
    for name in names:
        try:
            groups = web.call(name, "groups")["groups"][:shown]
        except RQError:
            continue
        rows += [dict(_row(web, name, g), acts=user.may("operator", name)) for g in groups]
    return {"rows": rows, "with_queue": len(names) > 1,
            "back": web.queue_path(names[0]) if len(names) == 1 else web.path("")}


def _row(web: Web, name: str, group: dict[str, Any]) -> dict[str, Any]:
    return {"queue": name, "queue_href": web.queue_path(name),
            "href": web.path("q", name, "groups", group["key"]), "reason": group["reason"],
            "last_line": group.get("last_line", ""), "count": group["count"],
            "example": group["example"], "first_seen": timeshtml.when(group["first_seen"]),
            "last_seen": timeshtml.when(group["last_seen"])}


class GroupsJSON(Resource):
    """``/q/<q>/groups.json``: the err messages by normalised reason, largest first."""

    def on_get(self, req: falcon.Request, resp: falcon.Response, name: str) -> None:
        self.web.existing(name)
        resp.media = self.web.call(name, "groups")["groups"]


class Group(Resource):
    """``/q/<q>/groups/<key>``: the group's page (its messages, a page at a time);
    POST ``_method`` retry | delete: the whole group."""

    def on_get(self, req: falcon.Request, resp: falcon.Response, name: str,
               key: str) -> None:
        self.web.existing(name)
        offset = req.get_param_as_int("offset", min_value=0, default=0)
        got = self.web.call(name, "groups", group=_key(key), offset=offset, limit=PAGE_SIZE)
        here = self.web.path("q", name, "groups", key)
        crumbs = [(self.web.queue_path(name), name), (here, "failure group")]
        render(self.web, resp, "group.html", f"Failure group of {name}", crumbs, queue=name,
               group=dict(_row(self.web, name, got["groups"][0]),
                          acts=access.account(req).may("operator", name)), total=got["total"],
               rows=_members(self.web, name, got["ids"]), back=self.web.queue_path(name),
               bulk_href=self.web.path("q", name, "bulk"),
               page=pager(here, {}, offset, PAGE_SIZE, got["total"]))

    def on_post(self, req: falcon.Request, resp: falcon.Response, name: str,
                key: str) -> None:
        self.web.existing(name)
        params = body.read_params(req)
        method = params.get("_method")
        if method not in ("retry", "delete"):
            raise BadRequest("_method must be retry or delete")
        got = self.web.act(req, name, "group", group=_key(key), action=method)
        ok(req, resp, got["count"], params, page=self.web.queue_path(name))


def _members(web: Web, name: str, ids: list[str]) -> list[dict[str, Any]]:
    """The group's messages as rows: params, when, status and last line."""
    store, rows = web.store(name), []
    for msg_id in ids:
        try:
            msg = store.read_msg("err", msg_id)
        except RQError:
            continue  # retried or deleted since it was listed
        rows.append({"id": msg_id, "href": web.msg_path(name, msg_id),
                     "params": " ".join(str(msg[k]) for k in PARAMS if msg.get(k)),
                     "status": store.read_status("err", msg_id),
                     "why": queuepage.why(store, "err", msg_id),
                     "times": timeshtml.row_times(store.msg_dir("err", msg_id), msg)})
    return rows


def _key(key: str) -> str:
    if len(key) != 12 or any(c not in "0123456789abcdef" for c in key):
        raise BadRequest(f"invalid failure group: {key[:40]!r}")
    return key
