"""The OpenAPI paths of the audit trail (``GET /audit``, ``/audit.json``), merged
into ``rqsys.web.openapi``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rqsys.observe.auditread import MAX_LIMIT


def _param(name: str, text: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {"name": name, "in": "query", "required": False, "description": text,
            "schema": schema}


WHEN = {"type": "string", "description": "epoch seconds, or ISO 8601 (UTC unless zoned)"}
PARAMS = [
    _param("actor", "only this actor's records", {"type": "string"}),
    _param("action", "only this action (create, delete, retry, pause, bulk_delete, "
           "group_retry, new_queue, ...)", {"type": "string"}),
    _param("queue", "only this queue's records", {"type": "string"}),
    _param("since", "records at or after this time", WHEN),
    _param("until", "records before this time", WHEN),
    _param("offset", "records skipped (newest first)", {"type": "integer", "minimum": 0}),
    _param("limit", "records on the page (default 100)",
           {"type": "integer", "minimum": 0, "maximum": MAX_LIMIT}),
]
RECORD = {"type": "object", "required": ["time", "actor", "from", "action", "queue", "result"],
          "properties": {
              "time": {"type": "number", "description": "epoch seconds (ms)"},
              "actor": {"type": "string", "description": "the HTTP user; a socket client's "
                        "user name (else 'uid N')"},
              "from": {"type": "string", "description": "the HTTP client's address, or "
                       "'pid N (program)' of a socket client: its executable's path, "
                       "or 'calls itself NAME' where that cannot be read"},
              "action": {"type": "string"}, "queue": {"type": "string"},
              "msg_ids": {"type": "array", "items": {"type": "string"}},
              "filter": {"type": "object", "description": "a bulk action's search"},
              "count": {"type": "integer", "description": "messages acted on"},
              "result": {"enum": ["ok", "failed", "refused"]},
              "error": {"type": "string", "description": "why, when not ok"}}}
PAGE = {"type": "object", "required": ["records", "total", "offset", "limit"],
        "properties": {"records": {"type": "array", "items": RECORD},
                       "total": {"type": "integer"}, "offset": {"type": "integer"},
                       "limit": {"type": "integer"}}}


def paths(get: Callable[..., Any], html: dict[str, Any]) -> dict[str, Any]:
    return {
        "/audit.json": get(PARAMS, PAGE, "The audit trail, newest first (an admin of all "
                           "queues only; 400 naming a bad filter)"),
        "/audit": get(PARAMS, html, "The audit trail's page (HTML)", "text/html"),
    }
