"""Failure groups: a queue's err messages grouped by a normalised reason.

The reason is the message's status text with what differs from one failure
to the next masked (for RQ's "PROCESS EXITED IMPROPERLY", which says only
how it exited, the last line the run wrote comes first:
``rqsys.observe.lastlines``): URLs, paths, message ids, long hex or uuids, quoted
strings' digits, and numbers (``connect to db01:5432 failed after 3.2s`` →
``connect to dbN:N failed after Ns``).  A group's key is a short hash of
its reason.  :class:`FailureGroups` is an EventLog sink: built from
``err/`` the first time it is asked, then kept up to date per event in
O(1): an ``err`` end adds, a delete or a retry takes away; a prune (which
names no message) makes it walk again when next asked.

The walk reads every err message's status and end time: seconds for
100,000, so it runs on a background lane of its own (``LANE``) and the
request that asked is answered when it ends.  Meanwhile the sink keeps the
events in a journal, applied on top of the walk's groups on the loop before
anyone is answered.  Each event makes its message's membership what the
event says (in, with its reason; or out), so an event the walk already saw
applied again changes nothing, and the last event of a message decides,
as it did in the store: exactly the live updates, whatever the walk saw.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable
from typing import Any

from rqsys.background import Background
from rqsys.errors import StoreError
from rqsys.observe import lastlines
from rqsys.store import QueueView
from rqsys.store.view import read_whole

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
MASKED = 1000  # characters of a status masked: the URL pattern is quadratic in a long word
LANE = "failures"  # the walk of err/: long, so it holds up no other lane's jobs
IMPROPER = "PROCESS EXITED IMPROPERLY"  # RQ's text that says how, not why
Event = tuple[str, str, str, str, float, str]  # kind, text, msg id, RQ_STATE, when, last line
Ready = Callable[["BaseException | None"], None]  # on the loop, once built (or failed)


def normalise(text: str) -> str:
    """The reason of a status text: what varies masked, whitespace squeezed."""
    text = text[:MASKED]  # 4,096 characters (protocol.MAX_TEXT) of one word took 70 ms
    for pattern, word in MASKS:
        text = pattern.sub(word, text)
    return " ".join(text.split())[:MAX_REASON]


def says_only_how(status: str) -> bool:
    """The status says how the run ended, not why (or nothing)."""
    return status.startswith(IMPROPER) or not status.strip()


def telling(status: str, last_line: str) -> str:
    """The last line a run wrote when its status only says how it exited, else ""."""
    return last_line if says_only_how(status) else ""


def reason_of(status: str, last_line: str = "") -> str:
    """A failure's reason: its status normalised, after the line that says why
    (``telling``) when there is one."""
    if line := telling(status, last_line):
        return f"{normalise(line)} — {normalise(status)}"[:MAX_REASON]
    return normalise(status)


def group_key(reason: str) -> str:
    import hashlib  # here: OpenSSL's libcrypto is 3.5 MiB of a daemon's RSS, for err only

    return hashlib.sha1(reason.encode()).hexdigest()[:12]


class Groups:
    """The groups themselves: which err message is in which, and each group's times."""

    def __init__(self) -> None:
        self.groups: dict[str, dict[str, Any]] = {}  # key -> reason, ids, first, last
        self.group_of: dict[str, str] = {}  # msg id -> key

    def add(self, msg_id: str, status: str, at: float, last_line: str = "") -> None:
        """The message is in the group of ``status`` and ``last_line`` (and in no other)."""
        self.remove(msg_id)
        reason = reason_of(status, last_line)
        key = group_key(reason)
        group = self.groups.setdefault(key, {"key": key, "reason": reason, "ids": set(),
                                             "first": at, "last": at, "example": status,
                                             "last_line": telling(status, last_line)})
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

    def apply(self, event: Event) -> bool:
        """One event of the queue; False for a prune (which names no message)."""
        kind, text, msg_id, state, at, last_line = event
        if kind == "err" and state == "err":
            self.add(msg_id, text, at, last_line)
        elif kind in ("deleted", "retried") and msg_id:
            self.remove(msg_id)
        elif kind == "deleted":
            return False
        return True

    def listing(self) -> list[dict[str, Any]]:
        rows = [{"key": g["key"], "reason": g["reason"], "count": len(g["ids"]),
                 "first_seen": round(g["first"], 3), "last_seen": round(g["last"], 3),
                 "example": g["example"], "last_line": g["last_line"]}
                for g in self.groups.values()]
        return sorted(rows, key=lambda row: (-row["count"], row["reason"]))

    def members(self, key: str) -> list[str]:
        group = self.groups.get(key)
        return sorted(group["ids"]) if group else []


def walk(view: QueueView) -> Groups:
    """The groups of what is in err/ now: on a lane's thread, never the loop.
    Read relative to err/'s descriptor (``QueueView.ids_at``, as ``read_all``
    loads que/): 19 against 50 us of CPU a message through paths."""
    groups = Groups()
    try:
        for dfd, msg_id in view.ids_at("err"):
            if (got := _status_at(dfd, msg_id)) is not None:
                groups.add(msg_id, *got)
    except FileNotFoundError:  # no err/ (each message's own misses are caught below)
        pass
    return groups


def _status_at(dfd: int, msg_id: str) -> tuple[str, float, str] | None:
    """A message's status, when it ended (the newer mtime of its directory
    and ``status``) and the last line its run wrote; None once it has moved
    on (its event tells the loop)."""
    try:
        at = os.stat(msg_id, dir_fd=dfd).st_mtime
    except OSError:
        return None
    try:
        fd = os.open(f"{msg_id}/status", os.O_RDONLY | os.O_CLOEXEC, dir_fd=dfd)
    except FileNotFoundError:
        return "", at, lastlines.read_at(dfd, msg_id)  # no status line yet
    except OSError:
        return None
    try:
        at = max(at, os.fstat(fd).st_mtime)
        data = read_whole(fd)
    finally:
        os.close(fd)
    status = data.decode("utf-8", "replace")
    return status, at, lastlines.read_at(dfd, msg_id) if says_only_how(status) else ""


class FailureGroups:
    """The err messages of one queue by reason: built off the loop, then per event."""

    kinds = frozenset({"err", "deleted", "retried"})  # the events it is told (EventLog)

    def __init__(self, view: QueueView, background: Background) -> None:
        self.view, self.background = view, background
        self.current: Groups | None = None  # None: not built (or a prune since)
        self.journal: list[Event] | None = None  # a list while the walk runs
        self.waiting: list[Ready] = []  # the requests a walk will answer

    def __call__(self, kind: str, text: str, msg_id: str, fields: dict[str, Any]) -> None:
        """The sink: O(1)."""
        event = (kind, text, msg_id, fields.get("RQ_STATE") or "", time.time(),
                 fields.get("RQ_LAST_LINE") or "")
        if self.journal is not None:
            self.journal.append(event)
        elif self.current is not None and not self.current.apply(event):
            self.current = None  # a prune: walk again when next asked

    def ready(self) -> bool:
        return self.current is not None

    def when_built(self, then: Ready) -> None:
        """Call ``then`` on the loop once the groups are built (walking err/
        on the lane if no walk is under way); at once if they are."""
        if self.ready():
            then(None)
            return
        self.waiting.append(then)
        if self.journal is None:
            self._walk()

    def listing(self) -> list[dict[str, Any]]:
        """The groups, largest first: key, reason, count, first and last seen,
        an example (once :meth:`ready`)."""
        return self.current.listing() if self.current else []

    def members(self, key: str) -> list[str]:
        return self.current.members(key) if self.current else []

    def _walk(self) -> None:
        self.journal = []
        view = self.view
        self.background.submit(lambda: walk(view), self._walked, LANE)

    def _walked(self, groups: Groups | None, error: BaseException | None) -> None:
        """On the loop: the walk's groups, with the events since it began."""
        journal, self.journal = self.journal or [], None
        if groups is None or error is not None:
            self._tell(StoreError(f"failure groups of {self.view.name}: {error}"))
            return
        if any(not groups.apply(event) for event in journal):
            self._walk()  # a prune meanwhile: which it took is not told
            return
        self.current = groups
        self._tell(None)

    def _tell(self, error: BaseException | None) -> None:
        waiting, self.waiting = self.waiting, []
        for then in waiting:
            then(error)
