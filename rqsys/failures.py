"""Failure groups: a queue's err messages grouped by a normalised reason.

The reason is the message's status text with what differs from one failure
to the next masked: URLs, paths, message ids, long hex or uuids, quoted
strings' digits, and numbers (``connect to db01:5432 failed after 3.2s`` →
``connect to dbN:N failed after Ns``).  A group's key is a short hash of
its reason.  :class:`FailureGroups` is an EventLog sink: built from
``err/`` the first time it is asked (a walk, once per daemon), then kept up
to date per event in O(1): an ``err`` end adds, a delete or a retry takes
away; a prune (which names no message) makes it walk again when next asked.
"""

from __future__ import annotations

import hashlib
import re
import time
from typing import Any

from rqsys.store import QueueView

MASKS = [
    (re.compile(r"[a-z][a-z0-9+.-]*://\S+", re.I), "URL"),
    (re.compile(r"\b\d{8}\.\d{4}\.\d{2}\.\d{3}(\.\d+)?\b"), "ID"),
    (re.compile(r"(?<![\w.])/[^\s:'\"]+"), "PATH"),
    (re.compile(r"\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b", re.I),
     "UUID"),
    (re.compile(r"\b(?=[0-9a-f]*\d)[0-9a-f]{8,}\b", re.I), "HEX"),
    (re.compile(r"\d+(\.\d+)?"), "N"),
]
MAX_REASON = 300


def normalise(text: str) -> str:
    """The reason of a status text: what varies masked, whitespace squeezed."""
    for pattern, word in MASKS:
        text = pattern.sub(word, text)
    return " ".join(text.split())[:MAX_REASON]


def group_key(reason: str) -> str:
    return hashlib.sha1(reason.encode()).hexdigest()[:12]


class FailureGroups:
    """The err messages of one queue by reason; built lazily, then per event."""

    def __init__(self, view: QueueView) -> None:
        self.view = view
        self.built = False
        self.groups: dict[str, dict[str, Any]] = {}  # key -> reason, ids, first, last
        self.group_of: dict[str, str] = {}  # msg id -> key

    def __call__(self, kind: str, text: str, msg_id: str, fields: dict[str, Any]) -> None:
        if not self.built:
            return  # the walk at the first request sees it
        if kind == "err" and fields.get("RQ_STATE") == "err":
            self.add(msg_id, text, time.time())
        elif kind in ("deleted", "retried") and msg_id:
            self.remove(msg_id)
        elif kind == "deleted":  # a prune: which ones is not told
            self.built = False

    def add(self, msg_id: str, status: str, at: float) -> None:
        reason = normalise(status)
        key = group_key(reason)
        group = self.groups.setdefault(key, {"key": key, "reason": reason, "ids": set(),
                                             "first": at, "last": at, "example": status})
        group["ids"].add(msg_id)
        group["first"], group["last"] = min(group["first"], at), max(group["last"], at)
        self.group_of[msg_id] = key

    def remove(self, msg_id: str) -> None:
        key = self.group_of.pop(msg_id, None)
        if key is None:
            return
        group = self.groups[key]
        group["ids"].discard(msg_id)
        if not group["ids"]:
            del self.groups[key]

    def build(self) -> None:
        """Walk err/ (once, or after a prune)."""
        self.groups, self.group_of = {}, {}
        for msg_id in self.view.ids("err"):
            try:
                status = self.view.read_status("err", msg_id)
                at = self.view.ended_at("err", msg_id)
            except OSError:
                continue  # moved on meanwhile
            self.add(msg_id, status, at)
        self.built = True

    def listing(self) -> list[dict[str, Any]]:
        """The groups, largest first: key, reason, count, first and last seen, an example."""
        if not self.built:
            self.build()
        rows = [{"key": g["key"], "reason": g["reason"], "count": len(g["ids"]),
                 "first_seen": round(g["first"], 3), "last_seen": round(g["last"], 3),
                 "example": g["example"]} for g in self.groups.values()]
        return sorted(rows, key=lambda row: (-row["count"], row["reason"]))

    def members(self, key: str) -> list[str]:
        if not self.built:
            self.build()
        group = self.groups.get(key)
        return sorted(group["ids"]) if group else []
