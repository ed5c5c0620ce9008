"""Search across queues and states: ``/search?q=`` (the header's box) and ``/search.json``.

Each queue daemon answers from its own search index (``rqsys.search``): the
matches counted in each state, and its newest few; the page shows the counts
per queue and state, each linked to that queue's tab with the search kept
(where its bulk actions are), and the newest matches of all queues.
"""

from __future__ import annotations

from typing import Any

import falcon

from rqsys.errors import BadRequest, RQError
from rqsys.store import STATES
from rqsys.web import queuepage, timeshtml
from rqsys.web.context import Resource, Web
from rqsys.web.html import query, render

SHOWN = 25  # the newest matches shown, of all queues
MAX_TEXT = 500


class SearchAll(Resource):
    every_queue = True  # a user of some queues does not see them (rqsys.web.access)

    """``GET /search?q=TEXT`` (HTML) and ``/search.json?q=TEXT``."""

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        text = (req.get_param("q") or "").strip()
        if len(text) > MAX_TEXT:
            raise BadRequest(f"q: at most {MAX_TEXT} characters")
        found = search_all(self.web, text) if text else {"queues": {}, "rows": [],
                                                           "errors": {}}
        if req.path.endswith(".json"):
            resp.media = found
            return
        render(self.web, resp, "search.html", f"Search {text}" if text else "Search",
               [(self.web.path("search"), "search")], text=text, found=found,
               action=self.web.path("search"), states=STATES,
               counts=_counts(self.web, text, found), rows=_rows(self.web, found))


def search_all(web: Web, text: str) -> dict[str, Any]:
    """Every queue's matches by state, the newest ``SHOWN`` of all, and the
    queues that could not answer (why)."""
    counts: dict[str, dict[str, int]] = {}
    errors: dict[str, str] = {}
    rows: list[dict[str, Any]] = []
    for name in web.layout.queue_names():
        try:
            got = web.call(name, "search", text=text, by_state=True, limit=SHOWN)
        except BadRequest:
            raise
        except RQError as exc:
            errors[name] = str(exc)
            continue
        counts[name] = got["states"]
        rows += [dict(row, queue=name) for row in got["rows"]]
    rows.sort(key=lambda row: row.get("created") or 0, reverse=True)
    return {"queues": {n: c for n, c in counts.items() if any(c.values())},
            "rows": rows[:SHOWN], "errors": errors}


def _counts(web: Web, text: str, found: dict[str, Any]) -> list[dict[str, Any]]:
    """Per queue, each state's matches, linked to that tab with the search kept."""
    return [{"name": name, "href": web.queue_path(name),
             "cells": [{"state": state, "n": n.get(state, 0),
                        "href": query(web.queue_path(name), state=state, text=text)}
                       for state in STATES]}
            for name, n in found["queues"].items()]


def _rows(web: Web, found: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"queue": row["queue"], "queue_href": web.queue_path(row["queue"]),
             "id": row["id"], "href": web.msg_path(row["queue"], row["id"]),
             "state": row["state"], "params": row["params"], "status": row["status"],
             "why": queuepage.why(web.store(row["queue"]), row["state"], row["id"]),
             "created": timeshtml.when(row["created"])} for row in found["rows"]]
