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
from rqsys.web import timeshtml
from rqsys.web.context import Resource, Web
from rqsys.web.html import badge, e, link, query, render, table

SHOWN = 25  # the newest matches shown, of all queues
MAX_TEXT = 500


class SearchAll(Resource):
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
        render(self.web, resp, f"Search {text}" if text else "Search",
               [(self.web.path("search"), "search")], _page(self.web, text, found))


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


def _page(web: Web, text: str, found: dict[str, Any]) -> str:
    form = (f'<form class="search" method="get" action="{e(web.path("search"))}" '
            'role="search"><input type="search" name="q" id="search-all" '
            f'value="{e(text)}" aria-label="search all queues" '
            'placeholder="words in params, status or tags"> '
            '<button class="primary">Search</button></form>')
    if not text:
        return "<h1>Search all queues</h1>" + form
    errors = "".join(f'<p class="error">{e(name)}: {e(why)}</p>'
                     for name, why in found["errors"].items())
    if not found["queues"]:
        return (f"<h1>Search all queues</h1>{form}{errors}"
                f'<p class="muted" id="no-matches">Nothing matches {e(text)} in any queue.</p>')
    counts = [[link(web.queue_path(name), name),
               *(_count(web, name, state, text, n.get(state, 0)) for state in STATES)]
              for name, n in found["queues"].items()]
    rows = [[link(web.queue_path(row["queue"]), row["queue"]),
             link(web.msg_path(row["queue"], row["id"]), row["id"], "mono"),
             badge(row["state"]), e(row["params"]), f'<span class="mono">{e(row["status"])}'
             "</span>", e(timeshtml.when(row["created"]))] for row in found["rows"]]
    return (f"<h1>Search all queues</h1>{form}{errors}"
            '<h2 id="matches-by-queue">Matches by queue and state</h2>'
            + table(["Queue", *STATES], counts, numeric=range(1, 1 + len(STATES)))
            + '<h2 id="newest">Newest matches</h2>'
            + table(["Queue", "Message", "State", "Params", "Status", "Created"], rows))


def _count(web: Web, name: str, state: str, text: str, n: int) -> str:
    if not n:
        return '<span class="muted">0</span>'
    return link(query(web.queue_path(name), state=state, text=text), f"{n:,}")
