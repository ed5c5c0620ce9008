"""The OpenAPI paths of triggers (`POST /hooks/<name>`, `/triggers`, `/triggers.json`),
merged into openapi."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

TRIGGER = {"name": "trigger", "in": "path", "required": True,
           "schema": {"type": "string", "pattern": "^[A-Za-z0-9][A-Za-z0-9_-]{0,99}$"}}
HTML = {"type": "string"}
SIGNATURES = ["X-Hub-Signature-256", "X-Gitlab-Token", "Stripe-Signature"]
ENTRY = {"type": "object", "required": ["name", "made", "duplicate", "refused"],
         "properties": {
             "name": {"type": "string"}, "kind": {"enum": ["files", "webhook", "journal"]},
             "dest": {"type": "string"}, "path": {"type": "string"},
             "made": {"type": "integer"}, "duplicate": {"type": "integer"},
             "refused": {"type": "integer"},
             "last_fire": {"type": ["number", "null"], "description": "epoch seconds"},
             "last_error": {"type": ["string", "null"]},
             "last_error_at": {"type": "number"}, "last_msg_id": {"type": "string"},
             "last_queue": {"type": "string"},
             "error": {"type": "string", "description": "why the trigger is refused now "
                       "(its file, its queue missing, a kind not served yet)"}}}


def _hook(answers: Callable[..., dict[str, Any]], ok: dict[str, Any]) -> dict[str, Any]:
    responses = answers(ok)
    responses["200"]["headers"] = {"RQ-Duplicate": {
        "description": "true when the delivery id made its message before: the URL is that "
                       "message's and none was made", "schema": {"enum": ["true"]}}}
    responses["401"] = {**responses["401"], "description": "a missing, malformed, wrong or "
                        "(Stripe) out-of-date signature: nothing was made"}
    headers = [{"name": name, "in": "header", "required": False, "schema": {"type": "string"}}
               for name in SIGNATURES]
    return {"post": {
        "summary": "A signed webhook delivery: one message in the trigger's queue, the body "
                   "attached (body.json for JSON, else body); no basic auth (the signature "
                   "is the authentication; docs/TRIGGERS.md)",
        "parameters": [TRIGGER, *headers],
        "requestBody": {"required": False, "content": {
            "application/json": {"schema": {}},
            "application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}},
        "responses": responses}}


def paths(get: Callable[..., Any], answers: Callable[..., dict[str, Any]],
          ok: dict[str, Any]) -> dict[str, Any]:
    return {
        "/hooks/{trigger}": _hook(answers, ok),
        "/triggers": get([], HTML, "Triggers (HTML): each one's kind, queue, counts, "
                         "last fire and last error", "text/html"),
        "/triggers.json": get([], {"type": "array", "items": ENTRY},
                              "Every trigger: its kind, queue, counts of messages made, "
                              "duplicate deliveries and refusals, last fire and last error"),
    }
