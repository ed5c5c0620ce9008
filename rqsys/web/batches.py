"""``POST /batches`` (many new messages, with callbacks once all have ended),
``GET /batches/<id>.json`` and the batch's page: how far along it is."""

from __future__ import annotations

import functools
import json
from typing import Any

import falcon

from rqsys.batches import record
from rqsys.batches.create import create
from rqsys.config import base_url
from rqsys.errors import BadRequest, NotFound, TooLarge
from rqsys.web.auth import actor
from rqsys.web.context import Resource, Web, split_suffix
from rqsys.web.html import render

MAX_BODY = 64 << 20  # the batch is read whole (about 100,000 small messages)


class Batches(Resource):
    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        batch = _body(req)
        for dest in _dests(batch):  # an operator of each queue it puts messages in
            self.web.require(req, "operator", dest)
        report = create(self.web.layout, batch, functools.partial(self.web.act, req), actor(req))
        resp.status = falcon.HTTP_201
        resp.location = batch_path(self.web, report["id"])
        resp.media = with_links(self.web, report)


class Batch(Resource):
    every_queue = True  # its report names its queues (rqsys.web.access)
    def on_get(self, req: falcon.Request, resp: falcon.Response, bid: str) -> None:
        bid, suffix = split_suffix(bid, (".json",))
        path = self.web.layout.batches / bid
        if not record.BATCH_ID_RE.match(bid) or not (path / "batch.json").is_file():
            raise NotFound(f"no batch {bid[:80]}")
        report = with_links(self.web, record.progress(path).report())
        if suffix:
            resp.media = report
            return
        render(self.web, resp, "batch.html", f"Batch {bid}",
               [(batch_path(self.web, bid), f"batch {bid}")], batch=report,
               fraction=report["ended"] / report["total"] if report["total"] else 1.0)


def _dests(batch: Any) -> set[str]:
    """The queues a batch names (what is not a name is refused by its check)."""
    if not isinstance(batch, dict):
        return set()
    msgs = [*(batch.get("messages") or [] if isinstance(batch.get("messages"), list) else []),
            batch.get("on_done"), batch.get("on_err")]
    return {m["dest"] for m in msgs if isinstance(m, dict) and isinstance(m.get("dest"), str)}


def batch_path(web: Web, bid: str) -> str:
    return web.path("batches", bid)


def with_links(web: Web, report: dict[str, Any]) -> dict[str, Any]:
    """The report with its own URL."""
    return dict(report, url=f"{base_url(web.sysconfig)}batches/{report['id']}")


def _body(req: falcon.Request) -> Any:
    ctype = (req.content_type or "").split(";")[0].strip().lower()
    if ctype != "application/json":
        raise BadRequest(f"unsupported content type {ctype[:60]!r}: send the batch as "
                         "application/json")
    raw = req.bounded_stream.read(MAX_BODY + 1)
    if len(raw) > MAX_BODY:
        raise TooLarge(f"request body is over the limit of {MAX_BODY} bytes")
    try:
        return json.loads(raw)
    except ValueError as exc:
        raise BadRequest(f"request body is not valid JSON: {exc}") from exc
