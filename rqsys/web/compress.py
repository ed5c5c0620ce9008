"""Pages and JSON answers gzip-compressed for a client that accepts it.

A whole answer (not a stream: logs and attachments have their own ``Range``)
of a text type, over ``MIN_SIZE`` bytes, goes out gzip-encoded when the
request's ``Accept-Encoding`` takes gzip, with ``Vary: Accept-Encoding``.
It runs after ``rqsys.web.etags``: the tag is the plain body's, and the
compressed answer's is that tag with ``-gzip`` (another representation, so
another strong tag), which ``etags`` takes back in ``If-None-Match``.
"""

from __future__ import annotations

import gzip
from typing import Any

import falcon

MIN_SIZE = 1024  # smaller answers gain less than gzip's header and CPU cost
LEVEL = 6
TYPES = ("text/", "application/json", "application/javascript", "image/svg+xml",
         "application/openmetrics-text")
SUFFIX = "-gzip"  # the compressed answer's ETag: the plain one's, and this


def accepts_gzip(header: str | None) -> bool:
    """Whether an ``Accept-Encoding`` takes gzip (``gzip;q=0`` refuses it)."""
    for part in (header or "").split(","):
        coding, _, params = part.strip().partition(";")
        if coding.strip().lower() in ("gzip", "*"):
            q = params.strip().lower()
            return not (q.startswith("q=") and _zero(q[2:]))
    return False


def _zero(text: str) -> bool:
    try:
        return float(text) == 0.0
    except ValueError:
        return False


class Compress:
    """falcon middleware: gzip for whole text answers a client accepts it for."""

    def process_response(self, req: falcon.Request, resp: falcon.Response, resource: Any,
                         req_succeeded: bool) -> None:
        if resp.stream is not None or resp.get_header("Content-Encoding"):
            return
        kind = (resp.content_type or "").lower()
        if not kind.startswith(TYPES):
            return
        resp.append_header("Vary", "Accept-Encoding")
        if not accepts_gzip(req.get_header("Accept-Encoding")):
            return
        body = resp.render_body()
        if body is None or len(body) < MIN_SIZE:
            return
        resp.data = gzip.compress(body, LEVEL, mtime=0)
        resp.text = resp.media = None
        resp.set_header("Content-Encoding", "gzip")
        tag = resp.get_header("ETag")
        if tag and tag.endswith('"'):
            resp.set_header("ETag", tag[:-1] + SUFFIX + '"')
