"""Search across queues and states: ``/search?q=`` (the header's box), ``/search.json``,
and ``POST /search`` (retry or delete all that match, in every queue).

``q`` is the filter language of ``rqsys.search.filters`` (``state:err
queue:etl-* tag:nightly param1:~2026-11 priority:>5 since:1h "ValueError"``).
Each queue it names answers from its own search index (``rqsys.search``):
the matches counted in each state, and its newest few; the page shows the
counts per queue and state, each linked to the same search narrowed to that
queue and state (a URL to bookmark), the newest matches of all queues, and
the bulk actions on all that match (their counts in the buttons, asked first).
"""

from __future__ import annotations

from typing import Any

import falcon

from rqsys.errors import BadRequest, RQError
from rqsys.search import filters
from rqsys.store import STATES
from rqsys.web import body, queuepage, timeshtml
from rqsys.web.answers import redirect
from rqsys.web.auth import acting
from rqsys.web.context import Resource, Web
from rqsys.web.html import query, render
from rqsys.web.search import BULK_TIMEOUT
from rqsys.wire.client import QueueClient

SHOWN = 25  # the newest matches shown, of all queues
MAX_TEXT = 500


class SearchAll(Resource):
    every_queue = True  # a user of some queues does not see them (rqsys.web.access)

    """``GET /search?q=TEXT`` (HTML) and ``/search.json?q=TEXT``."""

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        text = _text(req.get_param("q"))
        found = search_all(self.web, filters.parse(text)) if text else {
            "queues": {}, "rows": [], "errors": {}}
        if req.path.endswith(".json"):
            resp.media = found
            return
        render(self.web, resp, "search.html", f"Search {text}" if text else "Search",
               [(self.web.path("search"), "search")], text=text, found=found,
               action=self.web.path("search"), states=STATES,
               counts=_counts(self.web, text, found), rows=_rows(self.web, found),
               bulk=_bulk(found), flash=req.get_param("done") or "")

    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        """``action=retry|delete`` and ``q``: every queue's matches (retry: in err),
        queue by queue; a 303 back to the search saying how many."""
        params = body.text_of(dict(body.read_pairs(req)))
        action, text = params("action") or "", _text(params("q"))
        if action not in ("retry", "delete") or not text:
            raise BadRequest("action must be retry or delete, with the search q")
        wanted = filters.parse(text)
        found = search_all(self.web, wanted)
        targets = [name for name, n in found["queues"].items() if _acted_on(action, n)]
        done = matched = 0
        for name in targets:
            args = dict(wanted.args, **({"state": "err"} if action == "retry" else {}))
            with QueueClient(self.web.layout, name, timeout=BULK_TIMEOUT) as client:
                got = client.call("bulk", action=action, actor=acting(req), **args)
            done, matched = done + got["count"], matched + got["matched"]
        said = f"{action}: {done} of {matched} matching, in {len(targets)} queue(s)"
        redirect(resp, query(self.web.path("search"), q=text, done=said))


def _text(text: str | None) -> str:
    text = (text or "").strip()
    if len(text) > MAX_TEXT:
        raise BadRequest(f"q: at most {MAX_TEXT} characters")
    return text


def _acted_on(action: str, counts: dict[str, int]) -> int:
    """How many of a queue's matches the action takes (a running one is destroyed
    one at a time, so a delete passes it over)."""
    if action == "retry":
        return counts.get("err", 0)
    return sum(n for state, n in counts.items() if state != "run")


def _bulk(found: dict[str, Any]) -> dict[str, int]:
    """The bulk actions' counts over every queue."""
    return {action: sum(_acted_on(action, n) for n in found["queues"].values())
            for action in ("retry", "delete")}


def search_all(web: Web, wanted: filters.Filter) -> dict[str, Any]:
    """Every queue's matches by state, the newest ``SHOWN`` of all, and the
    queues that could not answer (why)."""
    counts: dict[str, dict[str, int]] = {}
    errors: dict[str, str] = {}
    rows: list[dict[str, Any]] = []
    for name in web.layout.queue_names():
        if not wanted.takes(name):
            continue
        try:
            got = web.call(name, "search", **wanted.args, by_state=True, limit=SHOWN)
        except BadRequest:
            raise
        except RQError as exc:
            errors[name] = str(exc)
            continue
        state = wanted.args.get("state")  # the index counts every state: the one asked
        counts[name] = {s: n for s, n in got["states"].items() if not state or s == state}
        rows += [dict(row, queue=name) for row in got["rows"]]
    rows.sort(key=lambda row: row.get("created") or 0, reverse=True)
    return {"queues": {n: c for n, c in counts.items() if any(c.values())},
            "rows": rows[:SHOWN], "errors": errors}


def _counts(web: Web, text: str, found: dict[str, Any]) -> list[dict[str, Any]]:
    """Per queue, each state's matches, linked to that queue's tab with the words
    kept when words are all the filter says (its bulk actions and chosen rows are
    there), else to this search narrowed to the queue and state."""
    wanted = filters.parse(text) if text else filters.Filter()
    words = set(wanted.args) <= {"text", "state"}

    def href(name: str, state: str) -> str:
        if words:
            return query(web.queue_path(name), state=state, text=wanted.args.get("text", ""))
        return query(web.path("search"), q=f"{text} queue:{name} state:{state}")
    return [{"name": name, "href": web.queue_path(name),
             "cells": [{"state": state, "n": n.get(state, 0), "href": href(name, state)}
                       for state in STATES]}
            for name, n in found["queues"].items()]


def _rows(web: Web, found: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"queue": row["queue"], "queue_href": web.queue_path(row["queue"]),
             "id": row["id"], "href": web.msg_path(row["queue"], row["id"]),
             "state": row["state"], "params": row["params"], "status": row["status"],
             "why": queuepage.why(web.store(row["queue"]), row["state"], row["id"]),
             "created": timeshtml.when(row["created"])} for row in found["rows"]]
