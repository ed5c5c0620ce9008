"""The OpenAPI paths of batches (``POST /batches``, ``/batches/<id>``,
``/batches/<id>.json``), merged into ``rqsys.web.openapi``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rqsys.batches.record import ENDS

BATCH_ID = {"name": "bid", "in": "path", "required": True,
            "schema": {"type": "string", "pattern": "^b[0-9]{8}[.][0-9]{6}[.][0-9a-f]{8}$"}}
MEMBER = {"type": "object", "required": ["dest"],
          "description": "a message (its fields as a create takes them) for dest, a queue of "
                         "this host (a pool queue for a member, not a callback); no "
                         "unique_key"}
BATCH_IN = {"type": "object", "required": ["messages"], "additionalProperties": False,
            "properties": {"messages": {"type": "array", "minItems": 1, "items": MEMBER},
                           "on_done": MEMBER, "on_err": MEMBER}}
CALLBACK = {"type": ["object", "null"], "properties": {"queue": {"type": "string"},
                                                      "msg": {"type": "object"}}}
REPORT = {"type": "object", "required": ["id", "total", "counts", "ended", "complete"],
          "properties": {
              "id": {"type": "string"}, "url": {"type": "string"},
              "created": {"type": "number"}, "total": {"type": "integer"},
              "queues": {"type": "object", "additionalProperties": {"type": "integer"}},
              "counts": {"type": "object", "properties": {
                  state: {"type": "integer"} for state in ENDS}},
              "ended": {"type": "integer"}, "pending": {"type": "integer"},
              "sealed": {"type": "boolean", "description": "every member is in its queue"},
              "failed": {"type": ["string", "null"], "description": "why it was not made "
                         "(its members made were deleted)"},
              "complete": {"type": "boolean"},
              "callback": {"type": ["string", "null"], "description": "the callback's URL "
                           "once made (none: the batch names none for how it ended)"},
              "on_done": CALLBACK, "on_err": CALLBACK}}


def paths(get: Callable[..., Any], post: Callable[..., Any], html: dict[str, Any]
          ) -> dict[str, Any]:
    made = post([], BATCH_IN, "Make a batch: its members in their queues (all or none), "
                "answered 201 once every one is; on_done or on_err is made once every "
                "member has ended", REPORT, "application/json")
    made["post"]["responses"]["201"] = made["post"]["responses"].pop("200")
    return {
        "/batches": made,
        "/batches/{bid}.json": get([BATCH_ID], REPORT, "A batch: how many members ended "
                                   "and how, and its callback"),
        "/batches/{bid}": get([BATCH_ID], html, "A batch's page (HTML)", "text/html"),
    }
