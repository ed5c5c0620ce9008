"""The audit trail in the console: ``GET /audit`` and ``/audit.json``, and the web's own records.

The queue daemons record what reaches them (``rqsys.daemon.audit``); the
web records only what does not: a new queue (``new_queue``) and the
requests it refuses itself (a 403 before any daemon is asked), in
``<root>/audit/web.jsonl``, each record written and fdatasynced before the
answer (waitress's threads share one file: a lock).  Reading needs an admin
of every queue (``read_role``, ``every_queue``: ``rqsys.web.access``).
"""

from __future__ import annotations

import threading
import time
from typing import Any
from urllib.parse import urlencode

import falcon

from rqsys.observe import audit, auditread
from rqsys.store import QUEUE_NAME_RE, Layout
from rqsys.web.auth import acting
from rqsys.web.context import Resource, Web
from rqsys.web.html import render

PAGE_SIZE = 100  # records on a page, and /audit.json's default limit
FILTERS = ("actor", "action", "queue", "since", "until")


class WebAudit:
    """The web's own audit file (made at its first record) and its journal entries."""

    def __init__(self, layout: Layout) -> None:
        self.layout = layout
        self._lock = threading.Lock()
        self._file: audit.AuditFile | None = None
        self._send = audit.journal_sender()

    def record(self, req: falcon.Request, action: str, queue: str, result: str,
               **target: Any) -> None:
        who = acting(req)
        rec = audit.record(who["user"] or f"http {who['address']}", who["address"], action,
                           queue, result, time.time(), **target)
        if self._send is not None:
            self._send(audit.text(rec), **audit.journal_fields(rec))
        with self._lock:
            if self._file is None:
                self._file = audit.AuditFile(self.layout.audit_dir / (audit.WEB + audit.SUFFIX))
            self._file.write(audit.line(rec))
            self._file.sync_now()

    def refused(self, req: falcon.Request, params: dict[str, Any], why: str) -> None:
        """A change the web refused (403) before asking any daemon."""
        queue = params.get("name")
        self.record(req, f"{req.method} {req.path}", queue if isinstance(queue, str) else "",
                    "refused", error=f"Forbidden: {why}")


def query(req: falcon.Request) -> tuple[auditread.Filter, int, int]:
    """The filter, offset and limit a request asks for (400 naming a bad field)."""
    text = {key: str(req.get_param(key) or "") for key in (*FILTERS, "offset", "limit")}
    flt = auditread.Filter(
        text["actor"], text["action"], text["queue"],
        auditread.parse_time(text["since"], "since") if text["since"] else None,
        auditread.parse_time(text["until"], "until") if text["until"] else None)
    return (flt, auditread.parse_count(text["offset"], "offset", 0),
            auditread.parse_count(text["limit"], "limit", PAGE_SIZE, auditread.MAX_LIMIT))


class AuditJSON(Resource):
    """``GET /audit.json?actor=&action=&queue=&since=&until=&offset=&limit=``:
    ``{"records": [...], "total", "offset", "limit"}``, newest first."""

    read_role = "admin"
    every_queue = True

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        flt, offset, limit = query(req)
        resp.media = auditread.page(self.web.layout.audit_dir, flt, offset, limit)


class AuditPage(Resource):
    """``GET /audit``: the records as a table, newest first, a page at a time."""

    read_role = "admin"
    every_queue = True

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        flt, offset, limit = query(req)
        got = auditread.page(self.web.layout.audit_dir, flt, offset, limit)
        asked = {k: str(req.get_param(k)) for k in FILTERS if req.get_param(k)}
        render(self.web, resp, "audit.html", "Audit", [(self.web.path("audit"), "audit")],
               rows=[_row(self.web, rec) for rec in got["records"]], asked=asked,
               total=got["total"],
               first=offset + 1, last=offset + len(got["records"]),
               newer=_link(self.web.path("audit"), asked, max(offset - limit, 0), limit)
               if offset else "",
               older=_link(self.web.path("audit"), asked, offset + limit, limit)
               if offset + limit < got["total"] else "")


def _row(web: Web, rec: audit.Record) -> dict[str, Any]:
    """A record as the page's row: its messages (the first 5) and queue as links."""
    ids, queue = rec.get("msg_ids") or [], str(rec.get("queue", ""))
    target = f" (+{len(ids) - 5})" if len(ids) > 5 else ""
    if "filter" in rec:
        target += " " + " ".join(f"{k}={v}" for k, v in sorted(rec["filter"].items()))
    if "count" in rec:
        target += f" ({rec['count']} messages)"
    return {"time": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(float(rec["time"]))),
            "actor": rec.get("actor", ""), "from": rec.get("from", ""),
            "action": rec.get("action", ""), "queue": queue,
            "queue_href": web.queue_path(queue) if _named(queue) else "",
            "ids": [(i, web.msg_path(queue, i) if _named(queue) else "") for i in ids[:5]],
            "target": target.strip(), "result": rec.get("result", ""),
            "error": rec.get("error", "")}


def _named(queue: str) -> bool:
    """A queue's name (the web's own records name none, or ``web``)."""
    return bool(QUEUE_NAME_RE.match(queue)) and queue != audit.WEB


def _link(path: str, asked: dict[str, str], offset: int, limit: int) -> str:
    return path + "?" + urlencode({**asked, "offset": offset, "limit": limit})
