"""``POST /q/<q>/new_messages``: bulk enqueue over HTTP, a JSON array or NDJSON.

``application/json``: an array of messages (at most ``MAX_BODY`` bytes);
``application/x-ndjson``: one message a line, read as it streams.  Sent to
the queue daemon ``create_many`` by batches; the answer lists every
message's result in order: ``{"created": N, "failed": M, "results":
[{"msg_id", "url"} | {"index", "error", "kind"}, ...]}``.  A message that
is refused fails alone; the others are created.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import falcon

from rqsys import bulkinput
from rqsys.errors import BadRequest, TooLarge
from rqsys.store import check_queue_name
from rqsys.web.context import Resource

MAX_BODY = 64 << 20  # a JSON array is read whole; NDJSON streams
MAX_LINE = 2 << 20  # one NDJSON line: a message is at most 1 MiB of JSON
NDJSON = ("application/x-ndjson", "application/jsonl", "application/json-seq")


class NewMessages(Resource):
    def on_post(self, req: falcon.Request, resp: falcon.Response, name: str) -> None:
        check_queue_name(name)

        def create_many(msgs: list[Any]) -> list[dict[str, Any]]:
            return list(self.web.call(name, "create_many", msgs=msgs,
                                      by=f"http {req.remote_addr}")["results"])

        results = list(bulkinput.send(_items(req), create_many))
        failed = sum(1 for got in results if "error" in got)
        resp.media = {"created": len(results) - failed, "failed": failed, "results": results}


def _items(req: falcon.Request) -> Iterator[Any]:
    ctype = (req.content_type or "").split(";")[0].strip().lower()
    if ctype in NDJSON:
        return bulkinput.ndjson(_lines(req))
    if ctype != "application/json":
        raise BadRequest(f"unsupported content type {ctype[:60]!r}: send a JSON array "
                         "(application/json) or NDJSON (application/x-ndjson)")
    if req.content_length is not None and req.content_length > MAX_BODY:
        raise TooLarge(f"request body of {req.content_length} bytes is over {MAX_BODY}")
    raw = req.bounded_stream.read(MAX_BODY + 1)
    if len(raw) > MAX_BODY:
        raise TooLarge(f"request body is over the limit of {MAX_BODY} bytes")
    try:
        data = json.loads(raw)
    except ValueError as exc:
        raise BadRequest(f"request body is not valid JSON: {exc}") from exc
    if not isinstance(data, list) or not data:
        raise BadRequest("new_messages takes a JSON array of messages (or NDJSON)")
    return iter(data)


def _lines(req: falcon.Request) -> Iterator[bytes]:
    """The body's lines as they stream in (64 KiB reads)."""
    tail = b""
    while chunk := req.bounded_stream.read(65536):
        *complete, tail = (tail + chunk).split(b"\n")
        yield from complete
        if len(tail) > MAX_LINE:
            raise TooLarge(f"an NDJSON line is over {MAX_LINE} bytes")
    if tail:
        yield tail
