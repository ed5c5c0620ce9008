"""``POST /q/<q>/new_messages``: bulk enqueue over HTTP, a JSON array or NDJSON.

``application/json``: an array of messages (at most ``MAX_BODY`` bytes);
``application/x-ndjson``: one message a line, read as it streams.  Sent to
the queue daemon ``create_many`` by batches; the answer lists every
message's result in order: ``{"created": N, "failed": M, "results":
[{"msg_id", "url"} | {"index", "error", "kind"}, ...]}``.  A message that
is refused fails alone (an NDJSON line over MAX_LINE too); the others are
created.  When the daemon fails after earlier batches were created, the
answer is still 200 with their results and ``"stopped": {"index", "error",
"kind"}``: the messages from ``index`` on were not sent (a failure status
would have had a client send the created ones again).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import falcon

from rqsys.errors import BadRequest, RQError, TooLarge
from rqsys.store import check_queue_name
from rqsys.web.context import Resource
from rqsys.wire import bulk as bulkinput

MAX_BODY = 64 << 20  # a JSON array is read whole; NDJSON streams
MAX_LINE = 2 << 20  # one NDJSON line: a message is at most 1 MiB of JSON
NDJSON = ("application/x-ndjson", "application/jsonl", "application/json-seq")


class NewMessages(Resource):
    def on_post(self, req: falcon.Request, resp: falcon.Response, name: str) -> None:
        check_queue_name(name)

        def create_many(msgs: list[Any]) -> list[dict[str, Any]]:
            return list(self.web.act(req, name, "create_many", msgs=msgs,
                                      by=f"http {req.remote_addr}")["results"])

        results: list[dict[str, Any]] = []
        answer: dict[str, Any] = {}
        try:
            results.extend(bulkinput.send(_items(req), create_many))
        except RQError as exc:
            if not results:
                raise  # nothing was created: the failure is the answer
            answer["stopped"] = {"index": len(results), "error": str(exc),
                                 "kind": type(exc).__name__}
        failed = sum(1 for got in results if "error" in got)
        resp.media = {"created": len(results) - failed, "failed": failed, "results": results,
                      **answer}


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


def _lines(req: falcon.Request) -> Iterator[bytes | TooLarge]:
    """The body's lines as they stream in (64 KiB reads); a line over
    MAX_LINE is a TooLarge in its place (it fails alone) and is skipped."""
    tail, skipping = b"", False
    while chunk := req.bounded_stream.read(65536):
        *complete, tail = (tail + chunk).split(b"\n")
        if skipping and complete:  # the over-long line ends in this chunk
            complete, skipping = complete[1:], False
        yield from complete
        if len(tail) > MAX_LINE and not skipping:
            yield TooLarge(f"an NDJSON line is over {MAX_LINE} bytes")
            skipping = True
        if skipping:
            tail = b""
    if tail and not skipping:
        yield tail
