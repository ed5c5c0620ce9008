"""The OpenAPI paths of searching a queue and acting on all that match, or on
chosen ones (``/q/<q>/search.json``, ``/q/<q>/bulk``), and of searching all
queues (``/search``, ``/search.json``), merged into ``rqsys.web.openapi``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rqsys.search.query import MAX_LIMIT, SORTS, WHENS
from rqsys.store import STATES

WHEN_TEXT = "2h, 3d, 90m ago, a Unix time or an ISO date/date-time (UTC unless it says)"
FILTERS: dict[str, dict[str, Any]] = {
    "text": {"type": "string", "maxLength": 500,
             "description": "words in params, tags or status text (all of them; "
                            "word* as a prefix)"},
    "state": {"enum": list(STATES)},
    "tag": {"type": "string", "maxLength": 200},
    "since": {"type": "string", "description": WHEN_TEXT},
    "until": {"type": "string", "description": WHEN_TEXT},
    "when": {"enum": list(WHENS), "description": "the time since/until apply to"},
    "sort": {"enum": list(SORTS)},
    "desc": {"enum": ["1", "0"], "description": "newest/largest first (default 1)"},
}
ROW = {"type": "object", "properties": {
    "id": {"type": "string"}, "state": {"enum": list(STATES)},
    **{k: {"type": ["number", "null"]} for k in ("created", "started", "ended", "run_s",
                                                  "wait_s")},
    "status": {"type": "string"}, "params": {"type": "string"},
    "tags": {"type": "array", "items": {"type": "string"}}}}
FOUND = {"type": "object", "required": ["rows", "total", "more", "partial"], "properties": {
    "rows": {"type": "array", "items": ROW}, "total": {"type": "integer"},
    "more": {"type": "boolean", "description": "more than total (counted up to 10,000)"},
    "partial": {"type": "boolean", "description": "the index is being rebuilt"}}}

SEARCH_Q = {"name": "q", "in": "query", "required": False,
            "schema": {"type": "string", "maxLength": 500},
            "description": "the filter language (rqsys.search.filters): words found in "
                           "params, tags, status or last line (all of them), and any of "
                           "state:S, queue:GLOB (repeated: any), tag:T, paramN:V "
                           "(paramN:~V: holds V; N 1-4), priority:>N (>, >=, <, <=, =), "
                           "since:W, until:W (90m, 2h, 3d ago, Unix seconds, ISO dates); "
                           "a key that is none of these is a 400"}
LIVE = [{"name": "page", "in": "query", "required": True,
         "schema": {"type": "string", "maxLength": 2000},
         "description": "the path (and query) of a page with live parts: the dashboard, "
                        "a queue's, a message's, a search"},
        {"name": "every", "in": "query", "schema": {"type": "string",
                                                    "pattern": "^[0-9]{1,2}$"},
         "description": "seconds between renders, 1 to 15 (5)"}]
SEARCH_ALL = {"type": "object", "required": ["queues", "rows", "errors"], "properties": {
    "queues": {"type": "object", "description": "queue -> state -> matches (queues with "
               "none left out)", "additionalProperties": {
                   "type": "object", "additionalProperties": {"type": "integer"}}},
    "rows": {"type": "array", "items": {"type": "object", "required": ["queue", "id", "state"]}},
    "errors": {"type": "object", "additionalProperties": {"type": "string"},
               "description": "queues whose daemon did not answer, and why"}}}


def paths(queue: dict[str, Any], get: Callable[..., Any], post: Callable[..., Any],
          form: Callable[[dict[str, Any]], dict[str, Any]], html: dict[str, Any]
          ) -> dict[str, Any]:
    query = [{"name": k, "in": "query", "schema": v} for k, v in FILTERS.items()]
    query += [{"name": "offset", "in": "query", "schema": {"type": "string",
                                                           "pattern": "^[0-9]{1,9}$"}},
              {"name": "limit", "in": "query", "schema": {
                  "type": "string", "pattern": "^[0-9]{1,4}$",
                  "description": f"1 to {MAX_LIMIT} (25)"}}]
    return {
        "/q/{name}/search.json": get([queue, *query], FOUND, "A page of the queue's messages "
                                     "matching a search (from the daemon's search index)"),
        "/q/{name}/bulk": post([queue], form({"action": {"enum": ["retry", "delete", "move"]},
                                              "dest": {"type": "string",
                                                       "description": "move: the queue"},
                                              "id": {"type": "string", "description":
                                                     "a chosen message (repeated, at most "
                                                     f"{MAX_LIMIT}): these instead of a "
                                                     "search's, those no longer in state "
                                                     "passed over"},
                                              **FILTERS}),
                               "Retry, delete or move (to dest) every message matching a "
                               "search, or the chosen ones, by the daemon in steps",
                               {"type": "array"}),
        "/search": {**get([SEARCH_Q], html, "Search across queues and states (HTML)",
                          "text/html"),
                    **post([], form({"action": {"enum": ["retry", "delete"]},
                                     "q": SEARCH_Q["schema"]}),
                           "Retry (the err ones) or delete every message the search q "
                           "matches, in each queue it names, by their daemons in steps; "
                           "a 303 back to the search saying how many (an operator of "
                           "every queue)", {"type": "array"})},
        "/search.json": get([SEARCH_Q], SEARCH_ALL, "Search across queues and states: each "
                            "queue's matches by state, the newest 25 of all"),
        "/live": get(LIVE, {"type": "string"}, "Server-sent events, one stream a tab: "
                     "'tag' with the page's ETag, then 'changed' with the new one each time "
                     "the page changes (a comment every 15 s meanwhile); 503 past 32 open "
                     "streams (the tab polls)", "text/event-stream"),
    }
