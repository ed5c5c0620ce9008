"""Folding a batch of search-index events into one row write per message.

A drained message brings four events (created, started, exit, its end), and
applied one by one each is a row write that touches the six state indexes
(and the end rewrites the full-text entry).  Within one batch the events of a
message are folded: a message created in the batch is inserted once with its
final values; one already indexed gets one UPDATE of the columns that changed,
and its full-text entry is rewritten only when its text changed.  Any other
event of a message (a retry, a move) first writes what was folded for it, so
each message's events still apply in their order.  ``RQ_SEARCH_FOLD=0`` turns
the old event-at-a-time path back on (for a same-run A/B in bench/).
"""

from __future__ import annotations

import os
import sqlite3
from dataclasses import dataclass, field
from typing import Any

from rqsys.search.rows import (
    ENDS,
    STATE_OF,
    Event,
    add,
    apply,
    insert,
    last_line,
    row_text,
)
from rqsys.store import QueueView

ENABLED = os.environ.get("RQ_SEARCH_FOLD", "1") != "0"


@dataclass
class Pending:
    """What a batch's events set in one message's row, not yet written."""

    state: str = ""
    made: dict[str, Any] | None = None  # created in this batch (its msg from memory)
    cols: dict[str, Any] = field(default_factory=dict)  # started, run_s, status, ended


def apply_batch(db: sqlite3.Connection, view: QueueView, batch: list[Event]) -> bool:
    """A batch into the index (inside the caller's transaction); True when a
    walk is needed (a prune)."""
    if not ENABLED:
        return any([apply(db, view, event) for event in batch])
    pending: dict[str, Pending] = {}
    rebuild = False
    for event in batch:
        kind, msg_id = event[0], event[2]
        if kind == "deleted":
            pending.pop(msg_id, None)  # nothing folded for it needs writing
        elif _fold(pending, event):
            continue
        elif msg_id in pending:
            _write(db, view, msg_id, pending.pop(msg_id))
        rebuild = apply(db, view, event) or rebuild
    for msg_id, row in pending.items():
        _write(db, view, msg_id, row)
    return rebuild


def _fold(pending: dict[str, Pending], event: Event) -> bool:
    """Keep the event's effect in its message's Pending; False if it must be
    applied as it is (a creation read from disk, a retry, a move)."""
    kind, text, msg_id, state, run_s, at, made = event
    if kind == "created" and made is not None and msg_id not in pending:
        pending[msg_id] = Pending(state, made, {"created_at": at})
    elif kind == "started":
        row = pending.setdefault(msg_id, Pending())
        row.state = "run"
        row.cols.setdefault("started_at", at)  # the first start stays (coalesce)
    elif kind == "exit" and run_s is not None:
        pending.setdefault(msg_id, Pending()).cols["run_s"] = run_s
    elif kind in ENDS and state in ENDS:
        row = pending.setdefault(msg_id, Pending())
        row.state = state
        row.cols["ended_at"] = at
        if text is not None:
            row.cols["status"] = text
    else:  # what apply() passes over needs nothing written
        return kind not in ("created", *STATE_OF)
    return True


def _write(db: sqlite3.Connection, view: QueueView, msg_id: str, row: Pending) -> None:
    if row.made is not None:
        insert(db, msg_id, row.state, row.made, row.cols.get("status", ""), row.cols,
               last_line(view, row.state, msg_id))
    elif "ended_at" in row.cols:
        _end(db, view, msg_id, row)
    else:
        _update(db, msg_id, row, {})


def _end(db: sqlite3.Connection, view: QueueView, msg_id: str, row: Pending) -> None:
    """An indexed message that ended: its new values, and its text only if it
    changed (an UPDATE of text rewrites the full-text entry).  First one
    UPDATE that leaves the text alone, guarded by the text being what
    ``row_text`` makes of the row with the new status (most runs: a bare
    ``done`` keeps a blank status); only when it is not is the row read."""
    status = row.cols.get("status")
    extra = {"ended": row.cols["ended_at"]}
    if status is not None:
        extra["status"] = status
    if row.state != "err" and _update(  # a failure's text takes its last line: read it
            db, msg_id, row, extra, (_SAME_TEXT.format("status" if status is None else "?"),
                                     () if status is None else (status,))):
        return
    found = db.execute("SELECT params, tags, status, text FROM msgs WHERE id=?",
                       (msg_id,)).fetchone()
    if found is None:  # its creation was not indexed (it moved on before it was read)
        add(db, view, msg_id, row.state)
        return
    params, tags, old, old_text = found
    status = row.cols.get("status", old)
    extra = {"status": status, "ended": row.cols["ended_at"]}
    text = row_text(params, tags.split(), status, last_line(view, row.state, msg_id))
    if text != old_text:
        extra["text"] = text
    _update(db, msg_id, row, extra)


# the row's text already row_text(params, tags, <the status>): tags are stored joined by spaces
_SAME_TEXT = " AND text = params || ' ' || CASE WHEN tags = '' THEN '' ELSE tags || ' ' END || {}"


def _update(db: sqlite3.Connection, msg_id: str, row: Pending, extra: dict[str, Any],
            where: tuple[str, tuple[Any, ...]] = ("", ())) -> bool:
    """One UPDATE of what the batch changed in an indexed message's row (and
    matched ``where``, more conditions and their values); False if none was."""
    sets: list[str] = []
    values: list[Any] = []
    for sql, key in (("state=?", "state"), ("started=coalesce(started, ?)", "started_at"),
                     ("run_s=?", "run_s")):
        value = row.state if key == "state" else row.cols.get(key)
        if value is not None and value != "":
            sets.append(sql)
            values.append(value)
    for name, value in extra.items():
        sets.append(f"{name}=?")
        values.append(value)
    if not sets:
        return True
    sql = f"UPDATE msgs SET {', '.join(sets)} WHERE id=?{where[0]}"
    return db.execute(sql, [*values, msg_id, *where[1]]).rowcount > 0
