"""``GET /q/<q>/search.json`` (a page of a queue's messages matching a search)
and ``POST /q/<q>/bulk`` (retry or delete every match, by the queue daemon in
batches): both answered from the daemon's search index (``rqsys.search.query``)."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

import falcon

from rqsys.errors import BadRequest
from rqsys.search import query as searchquery
from rqsys.search.query import ACTIONS
from rqsys.store import check_msg_id, check_queue_name
from rqsys.web import body
from rqsys.web.answers import redirect, safe_back
from rqsys.web.auth import acting
from rqsys.web.context import Resource, Web
from rqsys.wire.client import QueueClient

BULK_TIMEOUT = 600.0  # a bulk action over 100,000 messages takes seconds, not minutes


def page_args(req: falcon.Request, limit: int = 25) -> dict[str, Any]:
    """A search from the query string: filters, order, offset and limit, checked."""
    args = searchquery.from_params(req.get_param)
    for field, most, default in (("offset", 10**9, 0), ("limit", searchquery.MAX_LIMIT, limit)):
        text = req.get_param(field)
        if text in (None, ""):
            args[field] = default
        elif (not (text.isascii() and text.isdigit()) or int(text) > most
              or not (field == "offset" or int(text) >= 1)):
            raise BadRequest(f"{field} must be an integer up to {most}, not {text[:40]!r}")
        else:
            args[field] = int(text)
    return args


def run_search(web: Web, name: str, args: dict[str, Any]) -> dict[str, Any]:
    return web.call(check_queue_name(name), "search", **args)


class SearchJSON(Resource):
    """``?text=&state=&tag=&since=&until=&when=&sort=&desc=&offset=&limit=`` →
    ``{"rows": [...], "total": N, "more": bool, "partial": bool}``."""

    def on_get(self, req: falcon.Request, resp: falcon.Response, name: str) -> None:
        got = run_search(self.web, name, page_args(req))
        resp.media = {k: got[k] for k in ("rows", "total", "more", "partial")}


class BulkAction(Resource):
    """``action=retry|delete|move`` (``dest=Q`` to move to) and a search's fields,
    or ``id=`` the chosen messages (repeated, with their ``state``):
    ``["ok", {"matched", "count", "passed_over"}]``, or a 303 to ``back``."""

    def on_post(self, req: falcon.Request, resp: falcon.Response, name: str) -> None:
        check_queue_name(name)
        pairs = body.read_pairs(req)
        params = dict(pairs)
        action = params.get("action", "")
        if action not in ACTIONS:
            raise BadRequest(f"action must be one of {', '.join(ACTIONS)}, "
                             f"not {str(action)[:40]!r}")
        text = body.text_of(params)
        args = searchquery.from_params(text)
        if dest := text("dest"):
            args["dest"] = check_queue_name(dest)
            self.web.require(req, "operator", args["dest"])  # it makes messages there
        if "id" in params:
            args["ids"] = chosen_ids(pairs)
        with QueueClient(self.web.layout, name, timeout=BULK_TIMEOUT) as client:
            got = client.call("bulk", action=action, actor=acting(req), **args)
        result = {k: got[k] for k in ("action", "matched", "count", "passed_over")}
        if params.get("back"):
            back = safe_back(str(params["back"]))
            said = f"{action}: {result['count']} of {result['matched']} matching"
            redirect(resp, back + ("&" if "?" in back else "?") + urlencode({"done": said}))
        else:
            resp.media = ["ok", result]


def chosen_ids(pairs: body.Pairs) -> list[str]:
    """The ``id`` fields, each a message id (at most ``MAX_LIMIT``: a page's)."""
    ids = [check_msg_id(str(value)) for key, value in pairs if key == "id"]
    if len(ids) > searchquery.MAX_LIMIT:
        raise BadRequest(f"at most {searchquery.MAX_LIMIT} chosen messages, not {len(ids)}")
    return ids
