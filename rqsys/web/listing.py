"""``/q/<q>/messages.json``: one state's message ids, a page at a time, by tag."""

from __future__ import annotations

from typing import Any

import falcon

from rqsys.errors import BadRequest
from rqsys.store import STATES, check_queue_name
from rqsys.web.context import Resource

MAX_LIMIT = 1000


class MessageList(Resource):
    """``?state=que&tag=T&offset=0&limit=50`` → ``{"ids": [...], "total": N}``
    (que in run order, run by id, the others newest first)."""

    def on_get(self, req: falcon.Request, resp: falcon.Response, name: str) -> None:
        state = req.get_param("state") or "que"
        if state not in STATES:
            raise BadRequest(f"state must be one of {', '.join(STATES)}, not {state[:40]!r}")
        args: dict[str, Any] = {"state": state,
                                "offset": _number(req, "offset", 0, 10**9),
                                "limit": _number(req, "limit", 50, MAX_LIMIT)}
        if req.get_param("tag"):
            args["tag"] = req.get_param("tag")
        got = self.web.call(check_queue_name(name), "list", **args)
        resp.media = {"ids": got["ids"], "total": got["total"]}


def _number(req: falcon.Request, field: str, default: int, most: int) -> int:
    text = req.get_param(field)
    if text is None or text == "":
        return default
    if not (text.isascii() and text.isdigit()) or int(text) > most:
        raise BadRequest(f"{field} must be an integer from 0 to {most}, not {text[:40]!r}")
    return int(text)
