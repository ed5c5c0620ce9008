"""Failure groups in the console: the groups of the dashboard and a queue page, a
group's own page with its messages, ``groups.json``, and the whole-group retry
and delete (``rqsys.observe.failures`` groups them in the queue daemon)."""

from __future__ import annotations

from typing import Any

import falcon

from rqsys.errors import BadRequest, NotFound, RQError
from rqsys.web import body, timeshtml
from rqsys.web.answers import ok
from rqsys.web.context import Resource, Web
from rqsys.web.html import e, link, post_button, query, render, table

GROUPS_SHOWN = 5  # per queue on the dashboard (the queue page lists them all)
PAGE_SIZE = 25  # a group page's messages


def section(web: Web, names: list[str], shown: int | None = GROUPS_SHOWN) -> str:
    """The largest failure groups of each queue in ``names`` (``shown`` of
    each; None: all), each linked to its page, with retry and delete."""
    rows = []
    for name in names:
        try:
            groups = web.call(name, "groups")["groups"][:shown]
        except RQError:
            continue
        rows += [_row(web, name, g, len(names) > 1) for g in groups]
    if not rows:
        return '<h2 id="groups">Failure groups</h2><p class="muted">No err messages.</p>'
    heads = ["Queue"] * (len(names) > 1) + ["Reason", "Count", "Last seen", "Actions"]
    return '<h2 id="groups">Failure groups</h2>' + table(
        heads, rows, numeric=range(len(heads) - 3, len(heads) - 2))


def _row(web: Web, name: str, group: dict[str, Any], with_queue: bool) -> list[str]:
    page = web.path("q", name, "groups", group["key"])
    said = (f'<div class="mono small">{e(group["last_line"])}</div>'
            if group.get("last_line") else "")
    cells = [link(page, group["reason"], "mono") + said, e(f"{group['count']:,}"),
             e(timeshtml.when(group["last_seen"])),
             _buttons(web, name, group, web.path(""))]
    return [link(web.queue_path(name), name), *cells] if with_queue else cells


def _buttons(web: Web, name: str, group: dict[str, Any], back: str) -> str:
    action = web.path("q", name, "groups", group["key"])
    return ('<div class="actions">'
            + post_button(action, "retry all", {"_method": "retry", "back": back})
            + post_button(action, "delete all", {"_method": "delete", "back": back},
                          danger=True, confirm=f"Delete all {group['count']:,}?")
            + "</div>")


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
        group = got["groups"][0]
        here = self.web.path("q", name, "groups", key)
        crumbs = [(self.web.queue_path(name), name), (here, "failure group")]
        render(self.web, resp, f"Failure group of {name}", crumbs,
               _page(self.web, name, group, got["ids"], offset, got["total"]))

    def on_post(self, req: falcon.Request, resp: falcon.Response, name: str,
                key: str) -> None:
        self.web.existing(name)
        params = body.read_params(req)
        method = params.get("_method")
        if method not in ("retry", "delete"):
            raise BadRequest("_method must be retry or delete")
        got = self.web.call(name, "group", group=_key(key), action=method)
        ok(req, resp, got["count"], params, page=self.web.queue_path(name))


def _page(web: Web, name: str, group: dict[str, Any], ids: list[str], offset: int,
          total: int) -> str:
    store = web.store(name)
    rows = []
    for msg_id in ids:
        try:
            status = store.read_status("err", msg_id)
        except (NotFound, OSError):
            continue  # retried or deleted since it was listed
        rows.append([link(web.msg_path(name, msg_id), msg_id, "mono"),
                     f'<span class="mono">{e(status)}</span>'])
    said = (f'<p>Last line it wrote: <span class="mono" id="group-line">'
            f'{e(group["last_line"])}</span></p>' if group.get("last_line") else "")
    here = web.path("q", name, "groups", group["key"])
    pager = _pager(here, offset, total)
    return (f'<h1>Failure group of {e(name)}</h1>'
            f'<p class="mono" id="group-reason">{e(group["reason"])}</p>{said}'
            f'<p>Example status: <span class="mono">{e(group["example"])}</span></p>'
            f'<p class="muted">{total:,} message(s); first seen '
            f'{e(timeshtml.when(group["first_seen"]))}, last seen '
            f'{e(timeshtml.when(group["last_seen"]))}</p>'
            + _buttons(web, name, group, web.queue_path(name))
            + table(["Message", "Status"], rows) + pager)


def _pager(here: str, offset: int, total: int) -> str:
    parts = [f'<span class="muted">{offset + 1 if total else 0}–'
             f"{min(offset + PAGE_SIZE, total)} of {total:,}</span>"]
    if offset > 0:
        parts.append(link(query(here, offset=max(0, offset - PAGE_SIZE)), "« previous"))
    if offset + PAGE_SIZE < total:
        parts.append(link(query(here, offset=offset + PAGE_SIZE), "next »"))
    return f'<div class="pager">{"".join(parts)}</div>'


def _key(key: str) -> str:
    if len(key) != 12 or any(c not in "0123456789abcdef" for c in key):
        raise BadRequest(f"invalid failure group: {key[:40]!r}")
    return key
