"""A small HTTP client for RQ's web API, as a relay peer uses it (stdlib only).

Requests are form posts answered with RQ's ``["ok", x]`` / ``["fail", why]``
JSON, JSON gets, and multipart attachment uploads that stream the file with
``sendfile(2)`` (a 1 GB attachment is never read into memory), on kept-alive
connections (``relayconn``).  Every post
carries ``x_format=json``: RQ answers HTML (a redirect) without it.
"""

from __future__ import annotations

import base64
import json
import os
import threading
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlencode, urlsplit

from rqsys.errors import RQError
from rqsys.scripts.relayconn import BadAnswer, Closed, HTTPConn

DEFAULT_TIMEOUT = 60.0
# A kept-alive connection the far end closed meanwhile fails like this before any answer.
STALE = (Closed, BrokenPipeError, ConnectionResetError)


class PeerError(RQError):
    """The far end could not be reached or answered something unexpected (retry)."""


class PeerRefused(RQError):
    """The far end answered ``fail`` (or a 4xx): retrying the same request won't help."""


class PeerUnknown(RQError):
    """The far end does not know this message (404)."""


@dataclass
class Reply:
    status: int
    body: bytes

    def json(self) -> Any:
        try:
            return json.loads(self.body)
        except ValueError as exc:
            raise PeerError(f"HTTP {self.status}: not JSON: {self.body[:120]!r}") from exc


Key = tuple[str, str, int | None, float]


class Connections:
    """Idle kept-alive connections to far ends, shared by a relay worker's threads."""

    def __init__(self) -> None:
        self._idle: dict[Key, list[HTTPConn]] = {}
        self._lock = threading.Lock()

    def take(self, key: Key) -> HTTPConn | None:
        with self._lock:
            idle = self._idle.get(key)
            return idle.pop() if idle else None

    def give(self, key: Key, conn: HTTPConn) -> None:
        with self._lock:
            self._idle.setdefault(key, []).append(conn)


class Peer:
    """One far end, reached at the scheme/host/port of a URL (with optional user:pass@).

    With ``conns``, requests reuse its kept-alive connections (a relay worker's
    threads share one, a relay script has its own); without, each request has a
    connection of its own, closed after its answer."""

    def __init__(self, url: str, timeout: float = DEFAULT_TIMEOUT,
                 conns: Connections | None = None) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise PeerRefused(f"not an http(s) URL: {url!r}")
        self.scheme, self.host, self.port = parts.scheme, parts.hostname, parts.port
        self.timeout = timeout
        self.conns = conns
        self.key: Key = (self.scheme, self.host, self.port, self.timeout)
        self.auth = ""
        if parts.username is not None:
            pair = f"{parts.username}:{parts.password or ''}".encode()
            self.auth = "Basic " + base64.b64encode(pair).decode()

    def _connect(self) -> HTTPConn:
        return HTTPConn(self.scheme, self.host, self.port, self.timeout)

    def _headers(self, extra: dict[str, str]) -> dict[str, str]:
        headers = {"Accept": "application/json", **extra}
        if self.auth:
            headers["Authorization"] = self.auth
        return headers

    def request(self, method: str, url: str, body: bytes | None = None,
                headers: dict[str, str] | None = None) -> Reply:
        """One request; on a kept-alive connection the far end had closed, once more
        on a new one (a request it never answered: at worst a second ``prep``,
        never committed, or a second commit, which the relay checks)."""
        while True:
            pooled = self.conns.take(self.key) if self.conns is not None else None
            conn = pooled or self._connect()
            try:
                status, data, will_close = conn.request(
                    method, _target(url), self._headers(headers or {}), body)
            except (OSError, BadAnswer) as exc:
                conn.close()
                if pooled is not None and isinstance(exc, STALE):
                    continue
                raise PeerError(f"{method} {url}: {exc or type(exc).__name__}") from exc
            if will_close or self.conns is None:
                conn.close()
            else:
                self.conns.give(self.key, conn)
            return Reply(status, data)

    def post_form(self, url: str, fields: dict[str, str],
                  headers: dict[str, str] | None = None) -> Any:
        """POST a form; the ``x`` of an ``["ok", x]`` answer."""
        body = urlencode(dict(fields, x_format="json")).encode()
        reply = self.request("POST", url, body,
                             {"Content-Type": "application/x-www-form-urlencoded",
                              **(headers or {})})
        return rq_answer(reply, url)

    def get_json(self, url: str) -> Any:
        reply = self.request("GET", url)
        if reply.status == 404:
            raise PeerUnknown(f"{url}: not found")
        if reply.status != 200:
            raise PeerError(f"GET {url}: HTTP {reply.status}: {reply.body[:200]!r}")
        return reply.json()

    def upload(self, url: str, path: Path, field: str = "filedata") -> Any:
        """POST ``path`` as multipart ``field`` (after ``x_format=json``: RQ answers
        HTML without it), streamed on a connection of its own; the ``x`` of ``["ok", x]``."""
        boundary = uuid.uuid4().hex
        head = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"x_format\"\r\n\r\n"
                f"json\r\n--{boundary}\r\nContent-Disposition: form-data; name=\"{field}\"; "
                f"filename=\"{path.name}\"\r\nContent-Type: application/octet-stream\r\n\r\n"
                ).encode()
        tail = f"\r\n--{boundary}--\r\n".encode()
        conn = self._connect()
        try:
            with open(path, "rb") as src:
                size = os.fstat(src.fileno()).st_size
                headers = self._headers(
                    {"Content-Type": f"multipart/form-data; boundary={boundary}"})
                conn.connect().sendall(conn.head("POST", _target(url), headers,
                                                 len(head) + size + len(tail)) + head)
                conn.send_file(src)
            conn.connect().sendall(tail)
            status, data, _ = conn.answer("POST")
        except (OSError, BadAnswer) as exc:
            raise PeerError(f"upload {path.name} to {url}: {exc}") from exc
        finally:
            conn.close()
        return rq_answer(Reply(status, data), url)


def rq_answer(reply: Reply, url: str) -> Any:
    """The ``x`` of RQ's ``["ok", x]``; PeerRefused for ``fail``, PeerError otherwise."""
    if reply.status == 404:
        raise PeerUnknown(f"{url}: not found")
    if reply.status >= 500 or reply.status == 429:
        raise PeerError(f"{url}: HTTP {reply.status}: {reply.body[:200]!r}")
    try:
        answer = reply.json()
    except PeerError:
        if reply.status >= 400:  # e.g. 401/403 from a proxy or bad credentials
            raise PeerRefused(f"{url}: HTTP {reply.status}: {reply.body[:200]!r}") from None
        raise
    if isinstance(answer, list) and len(answer) == 2 and answer[0] == "ok":
        return answer[1]
    if isinstance(answer, list) and answer and answer[0] == "fail":
        raise PeerRefused(f"{url}: {answer[1] if len(answer) > 1 else 'fail'}")
    if reply.status >= 400:
        raise PeerRefused(f"{url}: HTTP {reply.status}: {reply.body[:200]!r}")
    raise PeerError(f"{url}: unexpected answer {reply.body[:200]!r}")


def _target(url: str) -> str:
    parts = urlsplit(url)
    return (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
