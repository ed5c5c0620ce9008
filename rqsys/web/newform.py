"""The new-message form (template ``new_message.html``): typed inputs, the queue's
``form.json`` (labels, help, hidden fields), and an error shown beside the
field it names with what was typed kept."""

from __future__ import annotations

import re
from typing import Any

import falcon

from rqsys import config
from rqsys.errors import ConfigError
from rqsys.web.context import Web
from rqsys.web.html import render

FORM_FIELDS = ("dest", "src", "param1", "param2", "param3", "param4", "due", "max_count",
               "orig_msg_id", "force_remote", "priority", "timeout", "retry_max", "tags",
               "unique_key", "unique_for", "after", "after_policy")
# the form's inputs that are not text: (input type, what it takes)
FIELD_TYPES = {
    "due": ("datetime-local", "when it may run, in UTC (empty: now)"),
    "max_count": ("number", "runs before it ends in err (RQ's default: 15)"),
    "priority": ("number", "lower runs first (default 0)"),
    "timeout": ("number", "seconds a run may take"),
    "retry_max": ("number", "retries after a failure"),
    "unique_for": ("number", "seconds the unique key holds"),
    "force_remote": ("checkbox", "relay it even when dest is this host"),
    "tags": ("text", "words, by commas or spaces"),
    "after": ("text", "message URLs it runs after, by spaces"),
}
STEPS = {"number": "any", "datetime-local": "1"}
NAMED = re.compile(r"\b(?:mesg_)?(" + "|".join(FORM_FIELDS) + r")\b")


def new_message_page(web: Web, req: falcon.Request, resp: falcon.Response, queue: str,
                     kept: dict[str, Any] | None = None, error: str = "") -> None:
    """The form (``kept``: what was typed, shown again with ``error`` beside
    the field it names, or above the form when it names none)."""
    web.existing(queue)
    form, warning = _load_form(web, queue)
    shown_default = form.get("default", "shown") != "hidden"
    found = NAMED.search(error)
    wrong = found.group(1) if found else ""
    inputs = [field for f in FORM_FIELDS
              if (field := _field(f, form.get(f"mesg_{f}"), shown_default, kept,
                                  error if f == wrong else "")) is not None]
    action = web.path("q", queue, "new_message")
    render(web, resp, "new_message.html", f"New message for {queue}",
           [(web.queue_path(queue), queue), (action, "new")], queue=queue, action=action,
           form_warning=warning, error="" if wrong else error, inputs=inputs,
           prep=(kept or {}).get("_method") == "prep")


def _load_form(web: Web, queue: str) -> tuple[dict[str, Any], str]:
    path = web.layout.queue_dir(queue) / "form.json"
    if not path.exists():
        return {}, ""
    try:
        return config.load_checked("form", path), ""
    except ConfigError as exc:
        return {}, str(exc)


def _field(field: str, spec: dict[str, Any] | None, shown_default: bool,
           kept: dict[str, Any] | None, error: str) -> dict[str, Any] | None:
    if spec is None and not shown_default:
        return None
    spec = spec or {}
    name = f"mesg_{field}"
    value = kept.get(name, "") if kept is not None else spec.get("value", "")
    kind, hint = FIELD_TYPES.get(field, ("text", ""))
    return {"name": name, "value": value, "hidden": bool(spec.get("hidden")),
            "label": spec.get("label", field), "help": spec.get("help") or hint,
            "kind": kind, "step": STEPS.get(kind, ""), "error": error,
            "checked": str(value).lower() in ("1", "true", "on", "yes")}
