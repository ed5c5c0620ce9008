"""HTTP answers in RQ's formats, and the one map from RQError to HTTP status.

JSON answers are ``["ok", value]`` or ``["fail", why]``; a form post that
names ``back`` is answered with a 303 to it; a browser (a page, or a form it
posts) gets the error as a page of the console, with its header.
"""

from __future__ import annotations

from typing import Any

import falcon

from rqsys.errors import (
    BadRequest,
    ConfigError,
    Forbidden,
    NoSpace,
    NotFound,
    ProtocolError,
    QueueDown,
    RQError,
    TooLarge,
    Unavailable,
)
from rqsys.store import room
from rqsys.web.context import Web
from rqsys.web.html import render

STATUS_OF: list[tuple[type[RQError], str]] = [
    (NotFound, falcon.HTTP_404),
    (TooLarge, falcon.HTTP_413),
    (BadRequest, falcon.HTTP_400),
    (ConfigError, falcon.HTTP_400),
    (Forbidden, falcon.HTTP_403),
    (QueueDown, falcon.HTTP_503),
    (Unavailable, falcon.HTTP_503),
    (ProtocolError, falcon.HTTP_502),
    (NoSpace, falcon.HTTP_507),  # the state file system is full: nothing was taken
]


def status_for(exc: RQError) -> str:
    for cls, status in STATUS_OF:
        if isinstance(exc, cls):
            return status
    return falcon.HTTP_500


FORMS = ("application/x-www-form-urlencoded", "multipart/form-data")


def wants_html(req: falcon.Request) -> bool:
    """A browser asking for a page, or posting one of its forms (not a .json or
    .txt route, not an API client: those do not accept text/html)."""
    if req.path.endswith((".json", ".txt")) or "text/html" not in (req.accept or ""):
        return False
    return req.method in ("GET", "HEAD") or (
        req.method == "POST" and (req.content_type or "").startswith(FORMS))


class Errors:
    """The app's error handlers: RQ's ``["fail", why]``, or for a browser a
    page of the console saying what went wrong and where to go from there."""

    def __init__(self, web: Web) -> None:
        self.web = web

    def rq_error(self, req: falcon.Request, resp: falcon.Response, exc: RQError,
                 _params: dict[str, Any]) -> None:
        self.fail(req, resp, status_for(exc), self._shown(exc))

    def _shown(self, exc: RQError) -> str:
        """The error's text; a full disk's names the state file system, not
        its mount point (no answer shows a server path)."""
        if not isinstance(exc, NoSpace):
            return str(exc)
        try:
            mount = room.mount_point(str(self.web.layout.root))
        except OSError:
            return str(exc)
        return str(exc).replace(f": {mount} has ", ": the state file system has ", 1)

    def http_error(self, req: falcon.Request, resp: falcon.Response,
                   exc: falcon.HTTPError) -> None:
        """falcon's own errors (no route, wrong method, bad auth) in the same format."""
        why = exc.title or exc.status
        if exc.description:
            why = f"{why}: {exc.description}"
        self.fail(req, resp, exc.status, why)  # type: ignore[arg-type]

    def fail(self, req: falcon.Request, resp: falcon.Response, status: str, why: str) -> None:
        resp.status = status
        if not wants_html(req) or falcon.http_status_to_code(status) == 401:  # the browser asks
            resp.content_type = falcon.MEDIA_JSON
            resp.media = ["fail", why]
            return
        title = status.split(" ", 1)[-1] if " " in status else status
        render(self.web, resp, "error.html", title, [], why=why, posted=req.method == "POST")


def ok(req: falcon.Request, resp: falcon.Response, value: Any, params: dict[str, str],
       page: str | None = None) -> None:
    """``["ok", value]``, or a 303 to ``back`` (or to ``page`` for an HTML form)."""
    back = params.get("back")
    if back:
        redirect(resp, safe_back(back))
    elif page and params.get("x_format") == "html":
        redirect(resp, page)
    else:
        resp.media = ["ok", value]


def redirect(resp: falcon.Response, location: str) -> None:
    resp.status = falcon.HTTP_303
    resp.location = location
    resp.content_type = falcon.MEDIA_TEXT
    resp.text = f"See {location}\n"


def safe_back(back: str) -> str:
    """Only same-site paths: ``back`` must not lead the browser elsewhere."""
    if not back.startswith("/") or back.startswith("//") or "\\" in back:
        raise BadRequest(f"back must be a path on this site: {back[:100]!r}")
    if any(ord(c) < 32 for c in back):
        raise BadRequest("back contains control characters")
    return back
