"""What ``rq triggers`` and ``GET /triggers.json`` show: each trigger and its record.

Each entry: ``name``, ``kind``, ``dest``, ``made``, ``duplicate``, ``refused``,
``last_fire``, ``last_error`` (and ``last_msg_id``, ``last_queue`` once a
message was made); a webhook's ``path`` (``/hooks/<name>``, without
``relative_root``); a file that is refused has ``error`` instead of its kind
and queue.  A trigger whose queue does not exist says so in ``error`` too.
"""

from __future__ import annotations

import time
from typing import Any

from rqsys.errors import ConfigError, RQError
from rqsys.store import Layout
from rqsys.triggers import record, spec
from rqsys.triggers.journalwork import match_terms

SERVED = ("webhook", "files", "journal")  # files and journal: rq-scan's
NOT_SERVED = "not served yet (webhook, files and journal triggers are)"


def list_triggers(layout: Layout) -> list[dict[str, Any]]:
    """Every trigger file of ``<root>/triggers/``, by name."""
    where = spec.triggers_dir(layout)
    return [_entry(layout, name, record.read(where, name)) for name in spec.names(layout)]


def _entry(layout: Layout, name: str, fires: dict[str, Any]) -> dict[str, Any]:
    entry: dict[str, Any] = {"name": name, **fires}
    try:
        trigger = spec.load(layout, name)
    except RQError as exc:
        entry["error"] = shown(layout, str(exc))
        return entry
    entry.update(kind=trigger.kind, dest=trigger.dest)
    if trigger.kind == "webhook":
        entry["path"] = f"/hooks/{name}"
    if trigger.kind not in SERVED:
        entry["error"] = NOT_SERVED
    if not layout.queue_dir(trigger.dest).is_dir():
        entry["error"] = f"no queue named {trigger.dest}"
    if trigger.kind == "journal":  # a PRIORITY range the schema cannot check
        try:
            match_terms(dict(trigger.settings["match"]))
        except ConfigError as exc:
            entry["error"] = f"journal: match: {exc}"
    return entry


def shown(layout: Layout, text: str) -> str:
    """An error as shown: the root's path cut out (no answer shows a server path)."""
    return text.replace(f"{layout.root}/", "")


def lines(entries: list[dict[str, Any]]) -> list[str]:
    """One tab-separated line a trigger: name, kind, queue, made, duplicate,
    refused, last fire, last error (``-`` for none)."""
    return ["\t".join([e["name"], e.get("kind", "-"), e.get("dest", "-"),
                       f"made={e['made']}", f"duplicate={e['duplicate']}",
                       f"refused={e['refused']}", _when(e.get("last_fire")),
                       e.get("error") or e.get("last_error") or "-"])
            for e in entries]


def _when(stamp: Any) -> str:
    if not isinstance(stamp, int | float):
        return "-"
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(stamp))
