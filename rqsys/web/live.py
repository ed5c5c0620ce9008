"""Live parts pushed: ``GET /live?page=PATH&every=N``, server-sent events, one stream a tab.

A tab showing a page with live parts (the dashboard, a queue, a message)
opens one stream.  The stream renders that page as the tab's own user
would get it, through the app itself (so the same access rules answer),
every ``every`` seconds (1 to 15; once for all the tabs of one user on one
page), and sends ``changed`` with the page's ETag when it differs from the
last; the tab then fetches the page (its ETag makes an unchanged one a
304) and swaps its live parts in place, the
focus and the scroll kept (``static/rq.js``).  Nothing changes: nothing is
sent but a comment every ``KEEP_ALIVE`` seconds, which is how a closed tab
is noticed.  Polling stays the fallback: a browser without EventSource, a
stream refused (more than ``MAX_STREAMS`` open: 503), or one that breaks.

Each open stream holds one of waitress's threads while it sleeps between
renders, so the server has ``MAX_STREAMS`` threads more than the pages and
the API use (``rqsys.web.app``): open streams never queue a page or an API
request behind them (``bench/bench_console.py`` measures 20 open tabs).
"""

from __future__ import annotations

import io
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import urlsplit

import falcon

from rqsys.errors import BadRequest, Unavailable
from rqsys.web.context import Resource, Web
from rqsys.web.etags import tag_of

MAX_STREAMS = 32  # open at once; one more is refused (the tab polls instead)
KEEP_ALIVE = 15.0  # seconds between comments while nothing changes
LASTS = 3600.0  # seconds a stream lasts; the browser opens the next one itself
RETRY_MS = 5000  # the browser's wait before it reopens a broken stream
LIVE_PAGES = ("", "/q/", "/search")  # what a tab may follow (after the web's prefix)
App = Callable[[dict[str, Any], Callable[..., Any]], Any]  # a WSGI app (falcon's)


class Live(Resource):
    """The stream of one tab."""

    def __init__(self, web: Web, app: App) -> None:
        super().__init__(web)
        self.app = app  # the falcon app the pages are rendered by
        self.open = threading.BoundedSemaphore(MAX_STREAMS)
        self._seen: dict[tuple[str, str], tuple[float, str]] = {}  # (page, who) -> (at, tag)
        self._lock = threading.Lock()

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        page, every = self._asked(req)
        if not self.open.acquire(blocking=False):
            raise Unavailable(f"{MAX_STREAMS} live streams are open: this tab polls instead")
        try:
            first = self._tag(req, page, 0.0)
        except BaseException:
            self.open.release()
            raise
        resp.content_type = "text/event-stream"
        resp.set_header("Cache-Control", "no-cache")
        resp.set_header("X-Accel-Buffering", "no")  # a proxy in front: do not hold events
        resp.stream = self._events(req, page, every, first)

    def _asked(self, req: falcon.Request) -> tuple[str, float]:
        page = req.get_param("page") or ""
        parts = urlsplit(page)
        rest = parts.path[len(self.web.prefix):] if parts.path.startswith(
            self.web.prefix) else None
        if (parts.scheme or parts.netloc or rest is None or not page.startswith("/")
                or not (rest in ("", "/") or rest.startswith(LIVE_PAGES[1:]))):
            raise BadRequest("page: a path of this console with live parts "
                             f"(the dashboard, a queue, a message), not {page[:80]!r}")
        text = req.get_param("every") or "5"
        if not text.isdigit() or not 1 <= int(text) <= 15:
            raise BadRequest(f"every: seconds from 1 to 15, not {text[:20]!r}")
        return page, float(text)

    def _events(self, req: falcon.Request, page: str, every: float,
                first: str) -> Iterator[bytes]:
        """The stream: its first tag, then ``changed`` each time the page does."""
        try:
            yield f"retry: {RETRY_MS}\nevent: tag\ndata: {first}\n\n".encode()
            last, said, ends = first, time.monotonic(), time.monotonic() + LASTS
            while time.monotonic() < ends:
                time.sleep(every)
                tag = self._tag(req, page, every)
                if tag != last:
                    last, said = tag, time.monotonic()
                    yield f"event: changed\ndata: {tag}\n\n".encode()
                elif time.monotonic() - said >= KEEP_ALIVE:
                    said = time.monotonic()
                    yield b": still here\n\n"
        finally:
            self.open.release()

    def _tag(self, req: falcon.Request, page: str, every: float) -> str:
        """The page's tag, rendered at most once an ``every`` for all the tabs of
        one user that follow it (20 tabs of the dashboard: one render a second)."""
        key = (page, req.get_header("Authorization") or "")
        now = time.monotonic()
        with self._lock:
            at, tag = self._seen.get(key, (-every, ""))
        if every and now - at < every * 0.9:
            return tag
        tag = self._render(req, page)
        with self._lock:
            if len(self._seen) > 4 * MAX_STREAMS:  # pages no longer followed
                self._seen.clear()
            self._seen[key] = (time.monotonic(), tag)
        return tag

    def _render(self, req: falcon.Request, page: str) -> str:
        """The page's ETag as the tab's user gets it now ('' when it is not a 200)."""
        parts = urlsplit(page)
        env = {k: v for k, v in req.env.items() if k not in ("HTTP_IF_NONE_MATCH",
                                                              "HTTP_ACCEPT_ENCODING")}
        env.update(REQUEST_METHOD="GET", PATH_INFO=parts.path, QUERY_STRING=parts.query,
                   HTTP_ACCEPT="text/html", CONTENT_LENGTH="0")
        env["wsgi.input"] = io.BytesIO()
        got: list[str] = []
        answer = self.app(env, lambda status, _headers, *_: got.append(status))
        try:
            body = b"".join(answer)
        finally:
            if hasattr(answer, "close"):
                answer.close()
        return tag_of(body) if got and got[0].startswith("200") else ""
