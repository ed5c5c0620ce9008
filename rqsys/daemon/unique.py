"""Unique messages: which message of the queue holds each unique key.

A message with ``unique_key`` holds its key from the moment it is staged
until it ends (``done``, ``err``, ``relayed``) or is deleted; with
``unique_for`` it keeps holding it that many seconds after it ended.  A
create whose key is held gets the holder's URL instead of a new message.
Lookups are one dict access (O(1)); expired keys leave through a heap.

Durability: a key held by a message in ``prep``, ``que`` or ``run`` is
rebuilt at start from those messages themselves (recovery puts ``run/``
back in ``que/``).  A key held after its message ended is one line of
``unique.ended`` in the queue directory (key, id, until), appended when the
message ends (not synced, like ``status``: the message's own move to done
is batched too) and compacted to the live lines at each start.
"""

from __future__ import annotations

import heapq
import json
import time
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rqsys.errors import BadRequest
from rqsys.store import durable

if TYPE_CHECKING:
    from rqsys.daemon.context import QueueContext
    from rqsys.daemon.server import Reply, Request
    from rqsys.store import Staged

ENDED_FILE = "unique.ended"
PARAMS_KEY = "params"  # unique_key "params": the key is made of param1..4


def key_of(msg: dict[str, Any]) -> str | None:
    """The effective unique key of a message (None without ``unique_key``).

    A JSON list, so a literal key can never equal a params key."""
    given = msg.get("unique_key")
    if not isinstance(given, str) or not given:
        return None
    if given == PARAMS_KEY:
        return json.dumps([PARAMS_KEY] + [str(msg.get(f"param{n}", "")) for n in range(1, 5)])
    return json.dumps(["key", given])


class UniqueIndex:
    """The keys held in one queue: by a live message, or for a while after it ended."""

    def __init__(self, qdir: Path) -> None:
        self.path = qdir / ENDED_FILE
        self._holder: dict[str, str] = {}  # key -> id of the message holding it
        self._of: dict[str, tuple[str, float]] = {}  # holder id -> (key, unique_for)
        self._until: dict[str, float] = {}  # key -> when an ended holder lets it go
        self._expiry: list[tuple[float, str]] = []  # heap of (until, key); may be stale

    def __len__(self) -> int:
        return len(self._holder)

    def holder(self, key: str, now: float) -> str | None:
        """The id of the message holding ``key`` now, if any."""
        self._expire(now)
        return self._holder.get(key)

    def hold(self, msg_id: str, msg: dict[str, Any]) -> str | None:
        """``msg_id`` holds its message's key (if it has one); returns the key."""
        key = key_of(msg)
        if key is not None:
            self._free(key)  # a message made anyway (prep commit, dup): the newest holds it
            self._holder[key] = msg_id
            self._of[msg_id] = (key, float(msg.get("unique_for") or 0))
        return key

    def hold_again(self, msg_id: str, msg: dict[str, Any], now: float) -> None:
        """An ended message queued again (err → que) holds its key once more,
        unless another message took it meanwhile."""
        key = key_of(msg)
        if key is not None and self.holder(key, now) in (None, msg_id):
            self.hold(msg_id, msg)

    def forget(self, msg_id: str) -> None:
        """The message is gone (deleted, or never stored): its key is free."""
        key, _for = self._of.get(msg_id, (None, 0.0))
        if key is not None:
            self._free(key)

    def ended(self, msg_id: str, now: float) -> None:
        """The message ended: its key is free, or held ``unique_for`` more seconds."""
        key, hold_for = self._of.get(msg_id, (None, 0.0))
        if key is None:
            return
        if hold_for <= 0:
            self._free(key)
            return
        self._keep(key, msg_id, now + hold_for)
        line = json.dumps([key, msg_id, now + hold_for]) + "\n"
        try:
            with open(self.path, "a", encoding="utf-8") as out:
                out.write(line)
        except OSError:
            pass  # held in memory all the same; only a restart would free it early

    # ------------------------------------------------------------ its moments
    def on_placed(self, msg_id: str, msg: dict[str, Any], _state: str) -> None:
        self.hold(msg_id, msg)

    def on_ended(self, msg_id: str, _state: str) -> None:
        self.ended(msg_id, time.time())

    def on_removed(self, msg_id: str) -> None:
        self.forget(msg_id)

    def load(self, live: Iterable[tuple[str, dict[str, Any]]], now: float) -> None:
        """At start: keys of the messages still in prep/que, then the ended
        window from ``unique.ended``, which is rewritten with the live lines."""
        for msg_id, msg in live:
            self.hold(msg_id, msg)
        kept = [e for e in self._read_ended() if e[2] > now and e[0] not in self._holder]
        for key, msg_id, until in kept:
            self._keep(key, msg_id, until)
        if kept or self.path.exists():
            text = "".join(json.dumps(list(e)) + "\n" for e in kept)
            durable.write_file_durably(self.path, text.encode())

    def _read_ended(self) -> list[tuple[str, str, float]]:
        try:
            # garbage blocks after a power cut (ext4 without a journal) are not
            # UTF-8: replaced, their lines fail alone below (it failed every start)
            lines = self.path.read_text(encoding="utf-8", errors="replace").splitlines()
        except FileNotFoundError:
            return []
        entries = []
        for line in lines:
            try:
                key, msg_id, until = json.loads(line)
                entries.append((str(key), str(msg_id), float(until)))
            except (ValueError, TypeError):
                continue  # a line torn by a crash: that key is free early
        return entries

    def _keep(self, key: str, msg_id: str, until: float) -> None:
        self._holder[key] = msg_id
        self._of[msg_id] = (key, 0.0)
        self._until[key] = until
        heapq.heappush(self._expiry, (until, key))

    def _free(self, key: str) -> None:
        holder = self._holder.pop(key, None)
        self._of.pop(holder or "", None)
        self._until.pop(key, None)

    def _expire(self, now: float) -> None:
        while self._expiry and self._expiry[0][0] <= now:
            until, key = heapq.heappop(self._expiry)
            if self._until.get(key) == until:
                self._free(key)


def refuse_unique_in_pool(msg: Any) -> None:
    """A pool queue's keys are claimed in the pool as a message is published
    (``rqsys.pool.unique``); a prep message, made here, is refused one rather
    than silently not keeping it."""
    if isinstance(msg, dict) and "unique_key" in msg:
        raise BadRequest("unique_key: not taken by a pool queue's prep messages (a "
                         "pool's keys are claimed in the pool at create)")


class Duplicates:
    """Creates whose key is held: answered with the holder's URL and
    ``duplicate``; while the holder is still on its way to disk (same group
    commit), they wait for it and share its fate."""

    def __init__(self, ctx: QueueContext, index: UniqueIndex) -> None:
        self.ctx, self.index = ctx, index
        self._waiting: dict[str, list[Request]] = {}  # unpublished holder -> its duplicates

    def holder_of(self, msg: dict[str, Any]) -> str | None:
        key = key_of(msg)
        return None if key is None else self.index.holder(key, time.time())

    def answer_for(self, holder: str, r: Request) -> Reply | None:
        """The duplicate's answer now, or None: it comes when the holder is stored."""
        if holder in self._waiting:
            self._waiting[holder].append(r)
            return None
        return self.reply(holder)

    def reply(self, holder: str) -> Reply:
        return {"ok": True, "msg_id": holder, "url": self.ctx.url(holder), "duplicate": True}

    def hold(self, staged: Staged) -> None:
        """A new message, staged: it holds its key from now on."""
        if self.index.hold(staged.msg_id, staged.msg) is not None:
            self._waiting[staged.msg_id] = []

    def published(self, msg_id: str, error: BaseException | None) -> None:
        """The holder's group commit is over: answer its duplicates alike."""
        waiting = self._waiting.pop(msg_id, None)
        if waiting is None:
            return
        if error is not None:
            self.index.forget(msg_id)
        for r in waiting:
            r.fail(error) if error else r.answer(self.reply(msg_id))

    dropped = published  # never stored (its files failed): the same, with the error
