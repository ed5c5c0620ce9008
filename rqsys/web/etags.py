"""Cheap polling: a GET answered with an ETag of its body, and a 304 with no body when unchanged.

The console's live parts fetch their page again every few seconds
(``rq.js``); a browser's ``fetch`` sends the ``If-None-Match`` of the copy it
holds (the answers say ``Cache-Control: no-cache``: use it only once checked),
so an unchanged dashboard costs its headers, not its page.  The tag is a
hash of the body as it would be sent: computed per request, nothing is kept.
Streamed answers (logs, attachments: they have their own ``Range``) are
left alone.
"""

from __future__ import annotations

import hashlib
from typing import Any

import falcon

from rqsys.web import compress

TAGGED = ("GET", "HEAD")


def tag_of(body: bytes) -> str:
    return '"' + hashlib.blake2b(body, digest_size=12).hexdigest() + '"'


class ETags:
    """falcon middleware: an ETag on each whole GET answer, 304 when the client has it."""

    def process_response(self, req: falcon.Request, resp: falcon.Response, resource: Any,
                         req_succeeded: bool) -> None:
        if (req.method not in TAGGED or not req_succeeded or resp.stream is not None
                or falcon.http_status_to_code(resp.status) != 200):  # (falcon 3: no status_code)
            return
        body = resp.render_body()
        if body is None:
            return
        tag = tag_of(body)
        resp.set_header("ETag", tag)
        resp.set_header("Cache-Control", "no-cache")
        plain = tag.strip('"')  # the compressed answer's tag is this and a suffix (compress)
        if any(str(held) in (plain, plain + compress.SUFFIX) or held == "*"
               for held in req.if_none_match or ()):
            resp.status = falcon.HTTP_304
            resp.text = resp.media = resp.data = None
            resp.content_type = None  # a 304 has no content, nor its type
        else:
            resp.data = body  # rendered once
            resp.text = resp.media = None
